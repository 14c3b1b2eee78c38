"""One tick of the agent: inbound, outbound, status back to git.

:class:`Agent.tick` is what the poll loop runs (``fleetlet agent run``) and what ``fleetlet
agent sync --once`` runs once:

1. **inbound** (:class:`agent.sync.InboundPipeline`): poll this cluster's branch; when it
   moved, fetch, verify and render the new set, and accept it (kept in the cluster);
2. **outbound** (:class:`agent.reconcile.Reconciler`): move the accepted set's groups in
   lockstep, or, when nothing moved, resume interrupted work and correct drift. This runs
   even when the inbound half failed (git server down, a refused publication): the cluster
   keeps running, and keeps correcting, what it accepted last;
3. **status** (:class:`agent.report.push.StatusPusher`): the status document, pushed when it
   changed or the heartbeat is due; kept pending while the git server is away.

The first error of the tick is raised at the end, after all three, so the poll loop backs off
(temporary) or waits for the branch to move (permanent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent import __version__
from agent.api import BundleDeploymentEntry, BundleDeploymentSet, set_digest
from agent.api.models import Condition
from agent.api.status import SCHEMA_VERSION, BundleStatusReport, ClusterStatus, Refusal
from agent.bundles import ConditionSpec
from agent.errors import FleetletError
from agent.kube import ApiUnavailableError
from agent.reconcile import Manifest, PassResult, Reconciler
from agent.report.push import StatusPusher
from agent.sync import ClusterState, InboundPipeline, SyncResult

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TickResult:
    """What one tick did: the inbound outcome, the serial running, the outbound pass."""

    inbound: str
    """``unchanged``, ``rendered``, ``serial-advanced``, ``refused-before`` or ``failed``."""
    serial: int | None
    outbound: PassResult | None
    error: FleetletError | None = None


class Agent:
    """The agent of one cluster: see the module docstring."""

    def __init__(
        self,
        *,
        cluster: str,
        pipeline: InboundPipeline,
        reconciler: Reconciler,
        state: ClusterState,
        pusher: StatusPusher | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC).replace(microsecond=0),
    ) -> None:
        self.cluster = cluster
        self.pipeline = pipeline
        self.reconciler = reconciler
        self.state = state
        self.pusher = pusher
        self.clock = clock
        self.accepted: BundleDeploymentSet | None = None
        self.last: TickResult | None = None
        self.ticks = 0

    def tick(self) -> TickResult:
        """One reconcile (see the module docstring).

        Raises the first error met, after doing what could be done: ApiUnavailableError and
        other TemporaryErrors (the poll loop backs off), or PermanentErrors (a refused
        publication, a group that cannot be rendered: retried when the branch moves).
        """
        self.ticks += 1
        error: FleetletError | None = None
        result: SyncResult | None = None
        try:
            result = self.pipeline.sync()
        except ApiUnavailableError:
            raise
        except FleetletError as exc:
            log.warning("%s: inbound: %s", self.cluster, exc)
            error = exc
        rendered: Mapping[str, list[Manifest]] | None = None
        if result is not None and result.deployment_set is not None:
            self.accepted = result.deployment_set
            if result.outcome == "rendered":
                rendered = {b.name: b.objects for b in result.bundles}
        if self.accepted is None:
            self.accepted = self.state.load_set()
        state = self.state.load()
        self.reconciler.refusal = (
            ConditionSpec(
                "Ready",
                "False",
                state.refusal_reason or "VerificationFailed",
                f"publication at commit {state.refused_commit[:12]} refused (still running "
                f"serial {state.last_serial}): {state.refusal_message or ''}",
            )
            if state.refused_commit
            else None
        )
        outbound: PassResult | None = None
        if self.accepted is not None:
            outbound = self.reconciler.reconcile(
                self.accepted,
                render=self._render,
                rendered=rendered,
                set_digest=set_digest(self.accepted),
            )
            if error is None and outbound.temporary is not None:
                error = outbound.temporary
            for what, groups in (
                ("moved to serial", outbound.moved),
                ("rolled back from serial", outbound.rolled_back),
            ):
                for group in groups:
                    log.info("%s: group %s %s %s", self.cluster, group, what, self.accepted.serial)
        self._report(state)
        self.last = TickResult(
            inbound=result.outcome if result is not None else "failed",
            serial=self.accepted.serial if self.accepted else None,
            outbound=outbound,
            error=error,
        )
        if error is not None:
            raise error
        return self.last

    def _render(
        self, deployment_set: BundleDeploymentSet, entries: Sequence[BundleDeploymentEntry]
    ) -> dict[str, list[Manifest]]:
        return {b.name: b.objects for b in self.pipeline.render(deployment_set, entries)}

    # -- status back to git -----------------------------------------------------------------

    def status_document(self, state: Any = None) -> ClusterStatus:
        """The cluster's status document as the agent sees it now (``heartbeat`` and
        ``sequence`` are set by the pusher)."""
        state = state if state is not None else self.state.load()
        now = self.clock()
        names = [e.name for e in self.accepted.bundle_deployments] if self.accepted else []
        bundles = []
        for name in names:
            view = self.reconciler.views.get(name)
            if view is None:
                continue
            conditions = tuple(
                Condition(
                    type=c.type,
                    status=c.status,  # type: ignore[arg-type]
                    reason=c.reason,
                    message=c.message[:4096],
                    last_transition_time=view.since.get(c.type, now),
                )
                for c in self._conditions(view.conditions).values()
            )
            bundles.append(
                BundleStatusReport(
                    name=name,
                    group=view.group,
                    conditions=conditions,
                    applied_revision=view.applied,
                    last_healthy_revision=view.last_healthy,
                    health=view.health,
                    drift_count=view.drift_count,
                    runs=tuple(view.runs),
                )
            )
        refusal = None
        if state.refused_commit:
            refusal = Refusal(
                reason=state.refusal_reason or "VerificationFailed",
                message=(state.refusal_message or "")[:4096],
                commit=state.refused_commit,
                at=_parse(state.refused_at) or now,
            )
        return ClusterStatus(
            schema_version=SCHEMA_VERSION,
            cluster=self.cluster,
            agent_version=__version__,
            heartbeat=now,
            sequence=0,
            last_accepted_serial=state.last_serial or 0,
            last_refusal=refusal,
            bundles=tuple(bundles),
        )

    def _conditions(self, conditions: Mapping[str, ConditionSpec]) -> dict[str, ConditionSpec]:
        shown = dict(conditions)
        refusal = self.reconciler.refusal
        if refusal is not None:
            for kind, value in (("Ready", "False"), ("Degraded", "True")):
                shown[kind] = refusal._replace(type=kind, status=value)
        return shown

    def _report(self, state: Any) -> None:
        if self.pusher is None:
            return
        try:
            self.pusher.update(self.status_document(state))
            self.pusher.tick()
        except FleetletError as exc:
            # Kept pending (also across restarts) and pushed when the server is back.
            log.warning("%s: status not pushed yet: %s", self.cluster, exc)


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
