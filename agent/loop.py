"""The agent of one cluster: inbound, outbound, status back to git.

:meth:`Agent.tick` is one whole reconcile (``fleetlet agent sync --once`` runs it once):

1. **inbound** (:class:`agent.inbound.InboundPipeline`): poll this cluster's branch; when it
   moved, fetch, verify and render the new set, and accept it (kept in the cluster);
2. **outbound** (:class:`agent.reconcile.Reconciler`): move the accepted set's groups in
   lockstep, or resume interrupted work and correct drift. This runs even when the inbound
   half failed (git server down, a refused publication): the cluster keeps running, and keeps
   correcting, what it accepted last;
3. **status** (:class:`agent.report.push.StatusPusher`): the status document, pushed when it
   changed or the heartbeat is due; kept pending while the git server is away.

``fleetlet agent run`` splits the same work into scheduled jobs (:mod:`agent.schedule`):
:meth:`Agent.poll` (inbound, and outbound only when there is something to do),
:meth:`Agent.correct_drift` (the outbound pass) and :meth:`Agent.heartbeat` (status).

The first error of a tick is raised at its end, after all three steps, so the caller backs
off (temporary) or waits for the branch to move (permanent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from agent import __version__
from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    format_time,
    parse_time,
    set_digest,
)
from agent.api.facts import ReportedFacts
from agent.api.models import Condition
from agent.api.reasons import Reason
from agent.api.status import (
    SCHEMA_VERSION,
    BundleStatusReport,
    ClusterStatus,
    Refusal,
    RequestReport,
)
from agent.approve.approvals import WaitingOn
from agent.approve.summary import reports
from agent.errors import FleetletError, TemporaryError
from agent.inbound import InboundPipeline, SyncResult
from agent.kube import ApiUnavailableError
from agent.reconcile import PassResult, Reconciler
from agent.reconcile.context import Manifest
from agent.report.bundles import ConditionSpec
from agent.report.metrics import Metrics
from agent.report.push import StatusPusher
from agent.secrets.keys import Keyring
from agent.source.signed import signed_sources
from agent.state import AgentState, ClusterState

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TickResult:
    """What one tick did: the inbound outcome, the serial running, the outbound pass."""

    inbound: str
    """``unchanged``, ``rendered``, ``serial-advanced``, ``refused-before``, ``skipped`` or
    ``failed``."""
    serial: int | None
    outbound: PassResult | None
    error: FleetletError | None = None
    inbound_seconds: float | None = None
    """How long the inbound half took (None: it did not run)."""

    @property
    def failed_now(self) -> bool:
        """Something failed in this tick (not a failure kept from an earlier one)."""
        return self.error is not None or bool(self.outbound and self.outbound.failed_now)


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
        metrics: Metrics | None = None,
    ) -> None:
        """``metrics``: the agent's Prometheus metrics (recorded by the jobs and the steps)."""
        self.cluster = cluster
        self.pipeline = pipeline
        self.reconciler = reconciler
        self.state = state
        self.pusher = pusher
        self.clock = clock
        self.metrics = metrics or Metrics(cluster=cluster, version=__version__)
        self.accepted: BundleDeploymentSet | None = None
        self.last: TickResult | None = None
        self.ticks = 0
        self._pending_work = True
        """The outbound half has something to do without a new set: first pass after a
        start, a temporary failure to retry, a failed target to retry later."""
        self._awaiting: tuple[WaitingOn, ...] = ()
        """What the groups whose move awaits a decision wait on, as the last pass read it."""
        self._work = threading.Lock()  # one inbound/outbound at a time
        self._inbound_problem: ConditionSpec | None = None
        """Why the last inbound run failed (a server away, a refusal), said on every bundle."""
        self._state_seen: AgentState | None = None
        """The agent state as last read from the cluster (reported while it is away)."""
        self._reported_requests: tuple[RequestReport, ...] = ()

    @property
    def pending_work(self) -> bool:
        """Whether the outbound half has something to do without a new set (a temporary
        failure to retry, a failed target retried later, a decision awaited)."""
        return self._pending_work or bool(self._awaiting)

    @property
    def retry_pending(self) -> bool:
        """:attr:`pending_work` but for the decisions awaited: a retry the outbound half has
        to make whatever happens outside."""
        return self._pending_work

    @property
    def awaiting(self) -> tuple[WaitingOn, ...]:
        """What the groups whose move awaits a decision wait on (the last pass's view):
        another pass decides the same until one of these changed."""
        return self._awaiting

    # -- the whole reconcile ----------------------------------------------------------------

    def tick(self) -> TickResult:
        """One reconcile: inbound, outbound (always), status.

        Raises the first error met, after doing what could be done: ApiUnavailableError and
        other TemporaryErrors (back off), or PermanentErrors (a refused publication: retried
        when the branch moves).
        """
        return self._run(outbound="always")

    def poll(self) -> TickResult:
        """The poll job: inbound; outbound only when a new set was accepted or work is
        pending (see :meth:`tick` for what it raises)."""
        return self._run(outbound="when-needed")

    def correct_drift(self) -> TickResult:
        """The drift job: the outbound pass over the accepted set, without polling."""
        return self._run(outbound="always", inbound=False)

    def heartbeat(self) -> None:
        """The heartbeat job: push the status document when it changed or is due."""
        self._report(self.state.load())

    def note_inbound_problem(self, reason: str, message: str) -> None:
        """What the inbound half met last, when another process polled (``agent run``'s
        supervisor): said on every bundle by the next outbound pass, as :meth:`poll` would."""
        self._inbound_problem = ConditionSpec(
            "Degraded", "True", reason, f"inbound: {message} (retrying with backoff)"
        )

    def _run(self, *, outbound: str, inbound: bool = True) -> TickResult:
        with self._work:
            self.ticks += 1
            error: FleetletError | None = None
            result: SyncResult | None = None
            inbound_seconds: float | None = None
            if inbound:
                started = time.perf_counter()
                try:
                    result = self.pipeline.sync()
                except FleetletError as exc:
                    log.warning("%s: inbound: %s", self.cluster, exc)
                    error = exc
                inbound_seconds = time.perf_counter() - started
                # What the inbound half met last is said on every bundle until it does better.
                self._inbound_problem = _problem_condition(error, "inbound")
            try:
                if isinstance(error, ApiUnavailableError):
                    raise error  # nothing more can be done without the API server
                outbound_result, state = self._outbound(result, outbound)
            except ApiUnavailableError as exc:
                self._report_unreachable(exc)
                raise
            if error is None and outbound_result is not None:
                error = outbound_result.temporary
            self._report(state)
            self.last = TickResult(
                inbound=(result.outcome if result is not None else "failed")
                if inbound
                else "skipped",
                serial=self.accepted.serial if self.accepted else None,
                outbound=outbound_result,
                error=error,
                inbound_seconds=inbound_seconds,
            )
        if error is not None:
            raise error
        return self.last

    def _outbound(
        self, result: SyncResult | None, outbound: str
    ) -> tuple[PassResult | None, AgentState]:
        """The outbound half of a tick, with the overlays every bundle shows (a refused or
        expired publication, a server away). Raises ApiUnavailableError."""
        rendered: Mapping[str, list[Manifest]] | None = None
        if result is not None and result.deployment_set is not None:
            self.accepted = result.deployment_set
            if result.outcome in ("rendered", "serial-advanced"):
                self._pending_work = True
            if result.outcome == "rendered":
                rendered = {b.name: b.objects for b in result.bundles}
        if self.accepted is None:
            self.accepted = self.state.load_set()
        state = self.state.load()
        self._state_seen = state
        views = self.reconciler.views
        views.refusal = _refusal_condition(state) or self._expiry_condition()
        views.degraded = self._inbound_problem
        outbound_result: PassResult | None = None
        wanted = outbound == "always" or self.pending_work or rendered is not None
        if self.accepted is not None and wanted:
            outbound_result = self.reconciler.reconcile(
                self.accepted,
                render=self._render,
                rendered=rendered,
                set_digest=set_digest(self.accepted),
            )
            # A retry due later, or a decision awaited: the poll job keeps looking.
            self._pending_work = outbound_result.temporary is not None or bool(
                outbound_result.failed and _retry_due_later(self.reconciler)
            )
            self._awaiting = outbound_result.waiting_on
            for what, groups in (
                ("moved to serial", outbound_result.moved),
                ("rolled back from serial", outbound_result.rolled_back),
            ):
                for group in groups:
                    log.info("%s: group %s %s %s", self.cluster, group, what, self.accepted.serial)
        if self.accepted is not None:
            # The overlays changed (a server came back, the publication expired): said on
            # every bundle, also those no step of this pass wrote.
            for entry in self.accepted.bundle_deployments:
                views.view(entry.name, entry.group)
            views.write_all()
        return outbound_result, state

    def _expiry_condition(self) -> ConditionSpec | None:
        """Ready False, reason Expired, once the running publication would be refused as
        expired if it arrived now (the verification's clock-skew allowance included)."""
        running = self.accepted
        if running is None or self.clock() - self.pipeline.clock_skew <= running.expires_at:
            return None
        return ConditionSpec(
            "Ready",
            "False",
            Reason.EXPIRED,
            f"the publication running here (serial {running.serial}) expired at "
            f"{format_time(running.expires_at)} and no newer one was accepted (is the hub "
            "publishing, is the git server reachable?): still running and correcting it",
        )

    def _report_unreachable(self, exc: ApiUnavailableError) -> None:
        """The API server does not answer: the status document says so (the git server may
        well be there), from what the agent knew last; nothing is said before the agent knew
        anything (an empty document would tell the hub this cluster runs nothing)."""
        views = self.reconciler.views
        known = self.accepted is not None and any(
            views.get(e.name) is not None for e in self.accepted.bundle_deployments
        )
        if self._state_seen is None or not known:
            return
        views.degraded = _problem_condition(exc, "the cluster's API server")
        try:
            self._report(self._state_seen)
        finally:
            views.degraded = self._inbound_problem

    def _render(
        self, deployment_set: BundleDeploymentSet, entries: Sequence[BundleDeploymentEntry]
    ) -> dict[str, list[Manifest]]:
        return {b.name: b.objects for b in self.pipeline.render(deployment_set, entries)}

    # -- status back to git -----------------------------------------------------------------

    def status_document(self, state: AgentState | None = None) -> ClusterStatus:
        """The cluster's status document as the agent sees it now (``heartbeat`` and
        ``sequence`` are set by the pusher)."""
        state = state if state is not None else self.state.load()
        now = self.clock()
        views = self.reconciler.views
        entries = {e.name: e for e in self.accepted.bundle_deployments} if self.accepted else {}
        names = list(entries)
        bundles = []
        for name in names:
            view = views.get(name)
            if view is None:
                continue
            since = dict(view.since)
            conditions = tuple(
                Condition(
                    type=c.type,
                    status=c.status,  # type: ignore[arg-type]
                    reason=c.reason,
                    message=c.message[:4096],
                    last_transition_time=since.get(c.type, now),
                )
                for c in views.shown(dict(view.conditions)).values()
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
                    signed_sources=signed_sources(entries[name], self.pipeline.source_policy),
                )
            )
        refusal = None
        if state.refused_commit:
            refusal = Refusal(
                reason=state.refusal_reason or "VerificationFailed",
                message=(state.refusal_message or "")[:4096],
                commit=state.refused_commit,
                at=parse_time(state.refused_at or "") or now,
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
            requests=self._requests(),
        )

    def _requests(self) -> tuple[RequestReport, ...]:
        """The approval requests to report (the last ones read when the API server does not
        answer now)."""
        try:
            self._reported_requests = reports(self.reconciler.approvals.requests.all())
        except FleetletError as exc:
            log.warning("%s: approval requests not read: %s", self.cluster, exc)
        return self._reported_requests

    def reported_facts(self, document: ClusterStatus) -> ReportedFacts | None:
        """What ``hub diff`` needs to render as this agent does: the facts of its last render
        and the bundles with a healthy revision (an upgrade next time); and the public halves of
        the cluster's age keys (``hub recipients``); None before the first render since the
        start (the pusher keeps what it reported before)."""
        if self.pipeline.facts is None:
            return None
        installed = frozenset(b.name for b in document.bundles if b.last_healthy_revision)
        try:
            # Read at each report, so a rotation an admin asked for is done and reported
            # without waiting for a render.
            keyring: Keyring | None = self.pipeline.read_keyring()
        except FleetletError:
            keyring = self.pipeline.keyring  # the API server is away: the last one read
        return ReportedFacts(
            cluster=self.cluster,
            facts=self.pipeline.facts,
            installed=installed,
            age_recipients=keyring.recipients if keyring is not None else (),
        )

    def _report(self, state: AgentState) -> None:
        if self.pusher is None:
            return
        try:
            document = self.status_document(state)
            self.pusher.update(document, facts=self.reported_facts(document))
            self.pusher.tick()
        except FleetletError as exc:
            # Kept pending (also across restarts) and pushed when the server is back.
            log.warning("%s: status not pushed yet: %s", self.cluster, exc)


def _problem_condition(error: FleetletError | None, where: str) -> ConditionSpec | None:
    """Degraded, with the error's reason: a server the agent needs is away (or the inbound
    half failed another way); None without an error."""
    if error is None:
        return None
    retry = " (retrying with backoff)" if isinstance(error, TemporaryError) else ""
    return ConditionSpec("Degraded", "True", error.reason, f"{where}: {error}{retry}")


def _refusal_condition(state: AgentState) -> ConditionSpec | None:
    if not state.refused_commit:
        return None
    return ConditionSpec(
        "Ready",
        "False",
        state.refusal_reason or "VerificationFailed",
        f"publication at commit {state.refused_commit[:12]} refused (still running "
        f"serial {state.last_serial}): {state.refusal_message or ''}",
    )


def _retry_due_later(reconciler: Reconciler) -> bool:
    """Whether a failed group will retry by itself (a refusal the cluster caused): the poll
    job keeps running the outbound pass so the retry happens on time."""
    views = reconciler.views
    return any(
        view.conditions.get("Progressing", ConditionSpec("", "False", "")).status == "True"
        for view in (views.get(n) for n in views.names())
        if view is not None
    )


__all__ = ["Agent", "TickResult"]
