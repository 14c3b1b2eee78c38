"""The outbound reconcile: the accepted set, group by group, in lockstep.

For each group of the set, in the set's order (every group after the groups it depends on):

1. **resume** an intent left by a crash (:mod:`agent.apply.intent`): finish the move, or
   return the group to where it came from;
2. **gate**: paused bundles are held out (reported, drift only reported); a group whose
   dependencies are not healthy waits (``WaitingForDependency``); a target that already
   failed is not retried until it changes or a BundleDeployment asks (``fleetlet.io/retry``);
3. **move** when a bundle's target differs from its last healthy revision: render, record the
   intent, dry-run and apply the whole group (:func:`agent.apply.apply_group`), health-check
   the whole group together, then prune what the new revisions dropped, store the new healthy
   revisions, read outputs and clear the intent; if anything fails, **roll back** the whole
   group: re-apply every bundle's previous healthy revision (from the revision store in the
   cluster: no hub, git server or registry needed), delete what the failed revision added,
   health-check again;
4. otherwise **drift**: re-apply the stored healthy revisions (a dry-run diff; only changed
   objects are written) and assess health once.

Status goes to each BundleDeployment between stages (Progressing "applying group shop
(2/3)", then Ready or Degraded with the stage's reason), and each move is a run in the
bundle's history. Bundles gone from the set are removed by their ``deletionPolicy``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent.api import (
    BundleDeploymentSet,
    BundleDeploymentSpec,
    Revision,
    format_time,
    from_dict,
    to_dict,
)
from agent.apply import Inventory, Key, RevisionStore, plan_prune, prune
from agent.apply.intent import GroupRecords
from agent.bundles import BundleDeployments, ConditionSpec
from agent.errors import FleetletError, TemporaryError
from agent.kube import ApiUnavailableError, KubeClient
from agent.lockstep import (
    PAUSED_ANNOTATION,
    RETRY_ANNOTATION,
    GroupStep,
    Kept,
    Manifest,
    ReconcileSettings,
    RenderFn,
    spec_digest,
)
from agent.report.outputs import OutputsStage
from agent.report.runs import RunLog
from agent.report.view import BundleView, now

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PassResult:
    """What one pass over the set did."""

    moved: tuple[str, ...] = ()
    """Groups moved to their target."""
    rolled_back: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    """Groups that failed (rolled back or not) or are still failing."""
    waiting: tuple[str, ...] = ()
    drift_corrected: int = 0
    temporary: TemporaryError | None = None
    """The first temporary failure (the poll loop backs off on it)."""


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
        bundles: BundleDeployments,
        outputs: OutputsStage | None = None,
        clock: Callable[[], datetime] = now,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.store = store
        self.records = records
        self.runs = runs
        self.bundles = bundles
        self.outputs = outputs
        self.clock = clock
        self.views: dict[str, BundleView] = {}
        self.refusal: ConditionSpec | None = None
        """The newest publication's refusal (reason, message), shown on every bundle until
        the branch moves: they keep running what they have."""
        self._published_serial: int | None = None
        self._kept: dict[str, dict[tuple[int, str], Kept]] = {}
        self._written: dict[str, Any] = {}

    # -- the pass ---------------------------------------------------------------------------

    def reconcile(
        self,
        deployment_set: BundleDeploymentSet,
        *,
        render: RenderFn,
        rendered: Mapping[str, list[Manifest]] | None = None,
        set_digest: str | None = None,
    ) -> PassResult:
        """One pass over every group of the set. ``rendered`` holds bundles already rendered
        for this set (the inbound pipeline renders a new set whole); others are rendered
        with ``render`` when their group has to move.

        Raises ApiUnavailableError (the API server is down: nothing more can be done now);
        every other failure is recorded on the bundles and in the result.
        """
        entries = list(deployment_set.bundle_deployments)
        annotations = self.bundles.annotations()
        missing = any(e.name not in annotations for e in entries)
        if self._published_serial != deployment_set.serial or missing:
            # A new set, or a BundleDeployment someone deleted: (re)write the specs.
            self.bundles.publish(deployment_set)
            self._published_serial = deployment_set.serial
            self._written.clear()
            annotations = self.bundles.annotations()
        for entry in entries:
            self._view(entry.name, entry.group)
        healthy: set[str] = set()
        moved: list[str] = []
        rolled_back: list[str] = []
        failed: list[str] = []
        waiting: list[str] = []
        drift = 0
        temporary: TemporaryError | None = None
        claims = self._claims(deployment_set, rendered or {})
        total = len(deployment_set.groups)
        for index, group in enumerate(deployment_set.groups, start=1):
            members = [e for e in entries if e.group == group]
            step = GroupStep(
                reconciler=self,
                deployment_set=deployment_set,
                group=group,
                members=members,
                annotations=annotations,
                rendered=rendered or {},
                render=render,
                set_digest=set_digest,
                position=f"{index}/{total}",
                claims=claims,
            )
            try:
                outcome = step.run(healthy)
            except ApiUnavailableError:
                raise
            except TemporaryError as exc:
                temporary = temporary or exc
                failed.append(group)
                continue
            if outcome.healthy:
                healthy.add(group)
            if outcome.moved:
                moved.append(group)
            if outcome.rolled_back:
                rolled_back.append(group)
            if outcome.failed:
                failed.append(group)
            if outcome.waiting:
                waiting.append(group)
            drift += outcome.drift
        try:
            self._remove_absent(deployment_set)
        except TemporaryError as exc:
            temporary = temporary or exc
        return PassResult(
            moved=tuple(moved),
            rolled_back=tuple(rolled_back),
            failed=tuple(failed),
            waiting=tuple(waiting),
            drift_corrected=drift,
            temporary=temporary,
        )

    # -- views and status -------------------------------------------------------------------

    def _view(self, name: str, group: str) -> BundleView:
        view = self.views.get(name)
        if view is None:
            view = BundleView(name=name, group=group)
            live = self.bundles.status_of(name)
            if live:
                view.drift_count = int(live.get("driftCount") or 0)
                for key, attr in (
                    ("appliedRevision", "applied"),
                    ("lastHealthyRevision", "last_healthy"),
                ):
                    if isinstance(live.get(key), dict):
                        with contextlib.suppress(FleetletError):
                            setattr(view, attr, from_dict(Revision, live[key]))
                for c in live.get("conditions") or []:
                    view.set(c["type"], c["status"], c["reason"], c.get("message", ""))
            view.runs = self.runs.runs(name)
            self.views[name] = view
        view.group = group
        return view

    def write(self, view: BundleView) -> None:
        """Write a bundle's view to its BundleDeployment's status."""
        status: dict[str, Any] = {"driftCount": view.drift_count}
        if view.applied is not None:
            status["appliedRevision"] = to_dict(view.applied)
        if view.last_healthy is not None:
            status["lastHealthyRevision"] = to_dict(view.last_healthy)
        if view.resources:
            status["resources"] = dict(view.resources)
        if view.runs:
            last = view.runs[0]
            status["lastRun"] = {
                "id": last.id,
                "result": _RUN_RESULT[last.result],
                "startedAt": format_time(last.started_at),
                "message": last.message[:32768],
                **({"finishedAt": format_time(last.finished_at)} if last.finished_at else {}),
            }
        conditions = dict(view.conditions)
        if self.refusal is not None:
            for kind, state in (("Ready", "False"), ("Degraded", "True")):
                conditions[kind] = self.refusal._replace(type=kind, status=state)
        # An idle poll changes nothing: write only what changed (or a new spec generation).
        written = (self._published_serial, sorted(conditions.items()), repr(status))
        if self._written.get(view.name) == written:
            return
        self.bundles.set_conditions(view.name, list(conditions.values()), **status)
        self._written[view.name] = written

    def progress(self, names: Sequence[str], message: str) -> None:
        """Mark bundles Progressing with ``message`` (written between stages)."""
        for name in names:
            view = self.views[name]
            view.set("Progressing", "True", "Progressing", message)
            self.write(view)

    # -- helpers used by the group step -----------------------------------------------------

    def client_for(self, spec: BundleDeploymentSpec | None) -> KubeClient:
        """The identity a bundle acts as: its ServiceAccount when it names one (for applying,
        health-checking, pruning and reading outputs alike), else the agent's own."""
        account = spec.service_account_name if spec is not None else None
        if account:
            return self.kube.impersonating(account, self.settings.agent_namespace)
        return self.kube

    def stored(self, bundle: str, number: int | None = None) -> Kept | None:
        """A bundle's latest (or numbered) stored revision, None when there is none. Read
        once per revision: the index (one small Secret) says whether the one in memory is
        still the one stored, by number and sha256."""
        chosen = next(
            (e for e in self.store.entries(bundle) if number is None or e.number == number),
            None,
        )
        if chosen is None:
            return None
        key = (chosen.number, chosen.sha256)
        cached = self._kept.get(bundle, {})
        if key in cached:
            return cached[key]
        revision = self.store.load(bundle, chosen.number)
        if revision is None:
            return None
        info = dict(revision.info)
        spec = None
        if isinstance(info.get("spec"), dict):
            spec = from_dict(BundleDeploymentSpec, info["spec"])
        rev = (
            from_dict(Revision, info["revision"])
            if isinstance(info.get("revision"), dict)
            else None
        )
        kept = Kept(
            number=revision.number,
            manifests=[dict(m) for m in revision.manifests],
            inventory=revision.inventory,
            digest=str(info.get("digest") or ""),
            spec=spec,
            revision=rev,
        )
        # The latest and the one before (what a rollback returns to) are what passes use.
        self._kept[bundle] = {**dict(list(cached.items())[-1:]), key: kept}
        return kept

    def latest_number(self, bundle: str) -> int | None:
        entries = self.store.entries(bundle)
        return entries[0].number if entries else None

    def _claims(
        self, deployment_set: BundleDeploymentSet, rendered: Mapping[str, list[Manifest]]
    ) -> dict[Key, str]:
        """Which bundle owns (or will own) each object: the rendered targets of this set, then
        the stored revisions. Pruning hands such objects over instead of deleting them."""
        claims: dict[Key, str] = {}
        names = {e.name for e in deployment_set.bundle_deployments}
        for name, objects in rendered.items():
            for key in Inventory.from_objects(objects).entries:
                claims.setdefault(key, name)
        for name in sorted(names):
            entries = self.store.entries(name)
            if not entries:
                continue
            stored = self.stored(name)
            if stored is None:
                continue
            for key in stored.inventory.entries:
                claims.setdefault(key, name)
        return claims

    def _remove_absent(self, deployment_set: BundleDeploymentSet) -> None:
        """Remove bundles that left the set, by their ``deletionPolicy``."""
        wanted = {e.name for e in deployment_set.bundle_deployments}
        present = set(self.store.bundles()) | set(self.bundles.names())
        gone = sorted(present - wanted)
        if not gone:
            return
        claims: dict[Key, str] = {}
        for name in sorted(wanted):
            stored = self.stored(name) if self.store.entries(name) else None
            for key in stored.inventory.entries if stored else ():
                claims.setdefault(key, name)
        for name in gone:
            stored = self.stored(name) if self.store.entries(name) else None
            if stored is not None:
                spec = stored.spec
                policy = spec.deletion_policy if spec else "Delete"
                keep_crds = spec.keep_crds if spec else True
                if policy == "Delete":
                    plan = plan_prune(
                        {name: stored.inventory},
                        {},
                        keep_crds={name: keep_crds},
                        claimed_elsewhere=claims,
                    )
                    outcomes = prune(self.client_for(spec), plan)
                    log.info(
                        "bundle %s removed from the set: %d objects deleted",
                        name,
                        sum(1 for o in outcomes if o.done == "deleted"),
                    )
                self.store.delete(name)
            self.runs.delete(name)
            if self.outputs is not None:
                self.outputs.forget(name)
            self.bundles.delete(name)
            self.views.pop(name, None)


_RUN_RESULT = {
    "succeeded": "Succeeded",
    "failed": "Failed",
    "rolledBack": "RolledBack",
    "inProgress": "Running",
}


__all__ = [
    "PAUSED_ANNOTATION",
    "RETRY_ANNOTATION",
    "BundleView",
    "Manifest",
    "PassResult",
    "ReconcileSettings",
    "Reconciler",
    "RenderFn",
    "spec_digest",
]
