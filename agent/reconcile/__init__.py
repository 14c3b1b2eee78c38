"""The outbound reconcile: the accepted set, group by group, in lockstep.

One pass (:meth:`Reconciler.reconcile`):

1. the BundleDeployments are written from the set when it is new (their specs);
2. every group runs its pipeline (:mod:`agent.reconcile.group`: resume → gate → move →
   finish or roll back, or keep), each group once the groups it depends on have run, and
   independent groups concurrently (``ReconcileSettings.parallel_groups``): one group's health
   wait never holds an unrelated group back;
3. bundles gone from the set are removed by their ``deletionPolicy``
   (:mod:`agent.reconcile.removal`).

A failure belongs to its group: an object refused (by the API server, a webhook, RBAC), a
group that does not become healthy, even an unexpected error, fails that group alone, with a
reason on its bundles, and the pass goes on. Only an API server that does not answer at all
stops the pass (nothing more can be done), and the poll loop backs off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime

from agent.api import BundleDeploymentSet
from agent.api.reasons import Reason
from agent.apply import Inventory, Key
from agent.apply.intent import GroupRecords
from agent.apply.store import RevisionStore
from agent.apply.verified import VerifiedObjects
from agent.approve.approvals import Approvals, WaitingOn
from agent.errors import TemporaryError
from agent.fanout import each
from agent.kube import ApiUnavailableError, KubeClient
from agent.reconcile.context import (
    GroupContext,
    GroupOutcome,
    GroupState,
    Identities,
    Manifest,
    MoveFailed,
    ReconcileSettings,
    RenderFn,
)
from agent.reconcile.group import reconcile_group
from agent.reconcile.removal import remove_absent
from agent.render.manifests import is_hook
from agent.report.logs import log_context
from agent.report.metrics import Metrics
from agent.report.outputs import OutputsStage
from agent.report.runs import RunLog
from agent.report.view import BundleView, BundleViews, now

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PassResult:
    """What one pass over the set did, group by group (in the set's order)."""

    outcomes: tuple[GroupOutcome, ...] = ()
    removed: tuple[str, ...] = ()
    temporary: TemporaryError | None = None
    """The first temporary failure (the poll loop backs off on it)."""

    def _groups(self, *states: GroupState) -> tuple[str, ...]:
        return tuple(o.group for o in self.outcomes if o.state in states)

    @property
    def moved(self) -> tuple[str, ...]:
        """Groups moved to their target."""
        return self._groups(GroupState.MOVED)

    @property
    def rolled_back(self) -> tuple[str, ...]:
        return self._groups(GroupState.ROLLED_BACK)

    @property
    def failed(self) -> tuple[str, ...]:
        """Groups that failed (rolled back or not) or are still failing."""
        return self._groups(GroupState.FAILED, GroupState.ROLLED_BACK)

    @property
    def failed_now(self) -> tuple[str, ...]:
        """Groups that failed in this pass (not a failure kept from an earlier one)."""
        return tuple(o.group for o in self.outcomes if o.failed_now or o.error is not None)

    @property
    def waiting(self) -> tuple[str, ...]:
        return self._groups(GroupState.WAITING)

    @property
    def held(self) -> tuple[str, ...]:
        """Groups paused, or whose move was denied."""
        return self._groups(GroupState.HELD)

    @property
    def awaiting_approval(self) -> tuple[str, ...]:
        """Groups whose move waits for a decision on its BundleDeploymentRequest."""
        return self._groups(GroupState.AWAITING_APPROVAL)

    @property
    def waiting_on(self) -> tuple[WaitingOn, ...]:
        """What the groups awaiting approval wait on (see :class:`~agent.approve.approvals.WaitingOn`)."""
        return tuple(o.waiting_on for o in self.outcomes if o.waiting_on is not None)

    @property
    def drift_corrected(self) -> int:
        return sum(o.drift for o in self.outcomes)

    @property
    def converged(self) -> bool:
        """Every group healthy and on its target."""
        return all(
            o.healthy and o.state in (GroupState.MOVED, GroupState.STEADY) for o in self.outcomes
        )


class Reconciler:
    """Moves an accepted set's groups in lockstep; see the module docstring."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        settings: ReconcileSettings,
        store: RevisionStore,
        records: GroupRecords,
        runs: RunLog,
        views: BundleViews,
        outputs: OutputsStage | None = None,
        clock: Callable[[], datetime] = now,
        metrics: Metrics | None = None,
        verified: VerifiedObjects | None = None,
        approvals: Approvals | None = None,
    ) -> None:
        """``verified``: objects applied or found unchanged before, whose dry run is skipped
        while they and their manifests stay the same (None: every object is dry-run).
        ``approvals``: default, this agent's requests and the cluster's ApprovalPolicies
        through ``kube``."""
        self.kube = kube
        self.settings = settings
        self.store = store
        self.records = records
        self.runs = runs
        self.views = views
        self.outputs = outputs
        self.clock = clock
        self.metrics = metrics
        self.verified = verified
        self.identities = Identities(kube=kube, agent_namespace=settings.agent_namespace)
        self.approvals = approvals or Approvals(kube=kube, agent_namespace=settings.agent_namespace)

    def reconcile(
        self,
        deployment_set: BundleDeploymentSet,
        *,
        render: RenderFn,
        rendered: Mapping[str, list[Manifest]] | None = None,
        set_digest: str | None = None,
    ) -> PassResult:
        """One pass over every group of the set. ``rendered`` holds bundles already rendered
        for this set (the inbound pipeline renders a new set, leaving out a group with a
        bundle that failed to render, and its dependents); others are rendered with ``render``
        when their group has to move (for a bundle that failed in the inbound pipeline,
        ``render`` raises that failure again: the group fails alone, RenderFailed).

        Raises ApiUnavailableError when the API server does not answer (nothing more can be
        done now); every other failure is recorded on its group's bundles and in the result.
        """
        entries = list(deployment_set.bundle_deployments)
        annotations = self.views.bundles.annotations()
        missing = any(e.name not in annotations for e in entries)
        if self.views.generation != deployment_set.serial or missing:
            # A new set, or a BundleDeployment someone deleted: (re)write the specs.
            self.views.bundles.publish(deployment_set)
            self.views.rewrite_all(deployment_set.serial)
            annotations = self.views.bundles.annotations()
        # Each bundle's view (its BundleDeployment and run history), side by side.
        each(lambda e: self.views.view(e.name, e.group), entries)
        claims = self._claims(deployment_set, rendered or {})
        total = len(deployment_set.groups)

        def context(group: str, index: int) -> GroupContext:
            return GroupContext(
                group=group,
                position=f"{index + 1} of {total}",
                deployment_set=deployment_set,
                set_digest=set_digest,
                members=tuple(e for e in entries if e.group == group),
                annotations=annotations,
                claims=claims,
                rendered=rendered or {},
                render=render,
                kube=self.kube,
                identities=self.identities,
                settings=self.settings,
                store=self.store,
                records=self.records,
                runs=self.runs,
                views=self.views,
                outputs=self.outputs,
                clock=self.clock,
                metrics=self.metrics,
                verified=self.verified,
                approvals=self.approvals,
            )

        # Each group's record as the pass starts, one LIST (each group's first read takes it).
        self.records.prefetch(deployment_set.groups)
        try:
            outcomes = self._run_groups(deployment_set, context)
        finally:
            self.records.forget_listed()
        temporary = next((o.error for o in outcomes if o.error is not None), None)
        removed: list[str] = []
        try:
            removed = remove_absent(
                deployment_set,
                store=self.store,
                records=self.records,
                runs=self.runs,
                views=self.views,
                outputs=self.outputs,
                identities=self.identities,
            )
        except ApiUnavailableError:
            if not self.kube.reachable():
                raise
            log.warning("removing bundles gone from the set failed; retrying", exc_info=True)
        except TemporaryError as exc:
            temporary = temporary or exc
        order = {g: i for i, g in enumerate(deployment_set.groups)}
        return PassResult(
            outcomes=tuple(sorted(outcomes, key=lambda o: order[o.group])),
            removed=tuple(removed),
            temporary=temporary,
        )

    # -- groups, concurrently where independent --------------------------------------------

    def _run_groups(
        self,
        deployment_set: BundleDeploymentSet,
        context: Callable[[str, int], GroupContext],
    ) -> list[GroupOutcome]:
        """Run every group's pipeline, each once every group it depends on has run; at most
        ``parallel_groups`` at a time. Raises ApiUnavailableError (after the running groups
        ended) when the API server does not answer."""
        needs: dict[str, set[str]] = {g: set() for g in deployment_set.groups}
        for entry in deployment_set.bundle_deployments:
            needs[entry.group] |= set(entry.spec.depends_on) & needs.keys()
        index = {g: i for i, g in enumerate(deployment_set.groups)}
        healthy: set[str] = set()
        done: dict[str, GroupOutcome] = {}
        down: ApiUnavailableError | None = None
        workers = max(1, self.settings.parallel_groups)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="group") as pool:
            running: dict[Future[GroupOutcome], str] = {}
            while len(done) < len(needs) and down is None:
                for group in deployment_set.groups:
                    ready = group not in done and group not in running.values()
                    if ready and needs[group] <= done.keys() and len(running) < workers:
                        snapshot = set(healthy)
                        ctx = context(group, index[group])
                        running[pool.submit(self._one_group, ctx, snapshot)] = group
                if not running:
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in finished:
                    group = running.pop(future)
                    try:
                        outcome = future.result()
                    except ApiUnavailableError as exc:
                        down = down or exc
                        continue
                    done[group] = outcome
                    if outcome.healthy:
                        healthy.add(group)
            for future in list(running):
                try:
                    done[running[future]] = future.result()
                except ApiUnavailableError as exc:
                    down = down or exc
        if down is not None:
            raise down
        return list(done.values())

    def _one_group(self, ctx: GroupContext, healthy: set[str]) -> GroupOutcome:
        """One group's pipeline; a failure stays with the group. Raises ApiUnavailableError
        only when the API server itself does not answer."""
        try:
            with log_context(group=ctx.group, serial=ctx.serial):
                return reconcile_group(ctx, healthy)
        except ApiUnavailableError as exc:
            if not self.kube.reachable():
                raise
            # The API server answers: an aggregated API or a webhook is away, not the server.
            self._mark(ctx, Reason.API_UNAVAILABLE, f"{exc} (retrying)", retrying=True)
            return GroupOutcome(
                group=ctx.group, state=GroupState.FAILED, failed_now=True, error=exc
            )
        except TemporaryError as exc:
            return GroupOutcome(
                group=ctx.group, state=GroupState.FAILED, failed_now=True, error=exc
            )
        except MoveFailed as exc:
            self._mark(ctx, exc.reason, exc.describe())
            return GroupOutcome(group=ctx.group, state=GroupState.FAILED, failed_now=True)
        except Exception as exc:
            # A bug or an unconverted library error: this group fails, the others go on.
            log.exception("group %s failed unexpectedly", ctx.group)
            self._mark(ctx, "InternalError", f"unexpected error: {type(exc).__name__}: {exc}")
            return GroupOutcome(group=ctx.group, state=GroupState.FAILED, failed_now=True)

    def _mark(
        self, ctx: GroupContext, reason: str, message: str, *, retrying: bool = False
    ) -> None:
        for entry in ctx.members:
            try:
                view: BundleView = ctx.view(entry.name)
                view.mark_failed(reason, message, retrying=retrying)
                self.views.write(view)
            except Exception:
                log.warning("cannot report %s on %s", reason, entry.name, exc_info=True)

    def _claims(
        self, deployment_set: BundleDeploymentSet, rendered: Mapping[str, list[Manifest]]
    ) -> dict[Key, str]:
        """Which bundle owns (or will own) each object: the rendered targets of this set, then
        the stored revisions. Pruning hands such objects over instead of deleting them."""
        claims: dict[Key, str] = {}
        for name, objects in rendered.items():
            # Hooks are created, never owned: they claim nothing.
            owned = [o for o in objects if not is_hook(o)]
            for key in Inventory.from_objects(owned).entries:
                claims.setdefault(key, name)
        stored_of = self.store.latest_of(sorted(e.name for e in deployment_set.bundle_deployments))
        for name, stored in stored_of.items():
            for key in stored.inventory.entries if stored else ():
                claims.setdefault(key, name)
        return claims


__all__ = [
    "GroupOutcome",
    "GroupState",
    "PassResult",
    "ReconcileSettings",
    "Reconciler",
    "RenderFn",
]
