"""One lockstep group's part of a reconcile pass: resume, gate, move or keep, roll back.

:class:`GroupStep` is what :class:`agent.reconcile.Reconciler` runs for each group of the set,
in the set's order (see that module for the whole pass). A **move** records its intent in the
cluster before the first write (:mod:`agent.apply.intent`), dry-runs and applies the whole group
(:func:`agent.apply.apply_group`), health-checks it as one, and only then prunes, stores the new
healthy revisions (:mod:`agent.apply.store`), reads outputs, closes the runs and clears the
intent. Any failure after the first write **rolls the whole group back** to the revision
store's previous healthy revisions: no hub, git server or registry needed. A crash anywhere is
**resumed** from the intent at the next start. A group with nothing to move **keeps** its
stored revisions: drift is corrected (our own fields taken back) and health assessed once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    BundleDeploymentSpec,
    HealthCheck,
    Revision,
    canonical_bytes,
    digest_of,
    format_time,
    to_dict,
)
from agent.api.status import HealthSummary, OutputValue, Run, RunCounts
from agent.apply import (
    ApplyError,
    ApplySettings,
    BundleInput,
    GroupResult,
    Inventory,
    Key,
    PruneOutcome,
    PrunePlan,
    Skipped,
    apply_group,
    plan_group,
    plan_prune,
    prune,
)
from agent.apply.group import CrdNotEstablishedError
from agent.apply.intent import BundleMove, Failure, GroupRecord, Intent
from agent.apply.plan import identity
from agent.errors import FleetletError, PermanentError, TemporaryError
from agent.health import HealthReport, ObjectHealth, Status, assess_live, wait_healthy
from agent.kube import ApiUnavailableError, KubeClient, ObjectRef
from agent.report.view import BundleView

if TYPE_CHECKING:
    from agent.reconcile import Reconciler

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
RenderFn = Callable[
    [BundleDeploymentSet, Sequence[BundleDeploymentEntry]], Mapping[str, list[Manifest]]
]
"""Renders some entries of a set: bundle name -> finished objects. Raises the inbound
pipeline's errors (FetchError: temporary; ContentRefusedError, InvalidManifestError: not)."""

PAUSED_ANNOTATION = "fleetlet.io/paused"
RETRY_ANNOTATION = "fleetlet.io/retry"
_DEFAULT_HEALTH_TIMEOUT = 300


@dataclass(frozen=True, kw_only=True)
class ReconcileSettings:
    """How the agent moves groups."""

    agent_namespace: str
    """Where its own objects live (revision store, intents, runs, credentials)."""
    health_interval: float = 1.0
    """Seconds between two health assessments while waiting for a group."""
    uninstall_failed_install: bool = False
    """A first install that fails has no previous revision: leave it as it is (default, for
    inspection) or delete what it created."""
    workers: int = 8
    """Objects of a stage applied concurrently."""
    establish_timeout: float = 60.0
    """Seconds a group's CRDs may take to become Established."""
    failpoint: Callable[[str], None] | None = None
    """Called with the name of each step of a move (``intent``, ``apply:<progress>``,
    ``applied``, ``health``, ``healthy``, ``pruned``, ``stored``, ``finished``, ``rollback``,
    ``rollback:applied``, ``rollback:pruned``): fault injection for crash tests
    (``FLEETLET_FAILPOINT``); None in production."""


def spec_digest(entry: BundleDeploymentEntry) -> str:
    """What makes a bundle's revision the same or another: its spec and group, not the
    serial (a refreshed publication with the same content moves nothing)."""
    return digest_of(canonical_bytes({"group": entry.group, "spec": to_dict(entry.spec)}))


def _revision(serial: int, entry: BundleDeploymentEntry, set_digest: str | None) -> Revision:
    return Revision(
        serial=serial,
        sources=tuple(s.pin for s in entry.spec.sources if s.pin),
        set_digest=set_digest,
    )


def _group_target(targets: Mapping[str, str]) -> str:
    return digest_of(canonical_bytes(dict(sorted(targets.items()))))


@dataclass(kw_only=True)
class Kept:
    """A bundle's last healthy revision as the store keeps it."""

    number: int
    manifests: list[Manifest]
    inventory: Inventory
    digest: str
    spec: BundleDeploymentSpec | None
    revision: Revision | None


class GroupFailed(Exception):
    """A move failed: ``reason`` (ApplyFailed, HealthCheckFailed, ...), which bundle and
    object, and whether anything may have been written."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        bundle: str | None = None,
        target: str | None = None,
        written: bool = True,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.bundle = bundle
        self.target = target
        self.written = written


@dataclass(frozen=True, kw_only=True)
class Outcome:
    healthy: bool = False
    moved: bool = False
    rolled_back: bool = False
    failed: bool = False
    waiting: bool = False
    drift: int = 0


@dataclass(kw_only=True)
class GroupStep:
    """One group's part of a pass (see the module docstring)."""

    reconciler: Reconciler
    deployment_set: BundleDeploymentSet
    group: str
    members: list[BundleDeploymentEntry]
    annotations: Mapping[str, Mapping[str, str]]
    rendered: Mapping[str, list[Manifest]]
    render: RenderFn
    set_digest: str | None
    position: str
    claims: Mapping[Key, str]
    owners: dict[ObjectRef, str] = field(default_factory=dict)
    """Which bundle of the group each object (and checked object) belongs to."""

    @property
    def r(self) -> Reconciler:
        return self.reconciler

    @property
    def kube(self) -> KubeClient:
        return self.reconciler.kube

    def view(self, name: str) -> BundleView:
        return self.r.views[name]

    def now(self) -> datetime:
        return self.r.clock()

    # -- the step ---------------------------------------------------------------------------

    def run(self, healthy_groups: set[str]) -> Outcome:
        record = self.r.records.load(self.group)
        if record.intent is not None:
            self.resume(record)
            record = self.r.records.load(self.group)
        paused = [e for e in self.members if self.paused(e) is not None]
        approval = [e for e in self.members if e.spec.approval == "manual" and e not in paused]
        active = [e for e in self.members if e not in paused and e not in approval]
        for entry in paused:
            self.report_paused(entry)
        for entry in approval:
            view = self.view(entry.name)
            message = (
                "approval: manual is not supported by this agent yet: the bundle is not applied"
            )
            view.set("Ready", "False", "ApprovalRequired", message)
            view.set("Progressing", "False", "ApprovalRequired", message)
            view.set("Degraded", "False", "ApprovalRequired", message)
            view.conditions.pop("Paused", None)
            self.r.write(view)
        if not active:
            return Outcome(healthy=not approval)
        for entry in active:
            self.view(entry.name).conditions.pop("Paused", None)
        needs = sorted({d for e in active for d in e.spec.depends_on} - healthy_groups)
        if needs:
            message = f"waiting for group(s) {', '.join(needs)} to be healthy"
            for entry in active:
                view = self.view(entry.name)
                view.set("Ready", "False", "WaitingForDependency", message)
                view.set("Progressing", "True", "WaitingForDependency", message)
                view.set("Degraded", "False", "WaitingForDependency", message)
                self.r.write(view)
            return Outcome(waiting=True)
        targets = {e.name: spec_digest(e) for e in active}
        current = {e.name: self.current_digest(e.name) for e in active}
        if all(current[n] == targets[n] for n in targets):
            drift, healthy = self.keep(active, failure=None)
            return Outcome(healthy=healthy, drift=drift)
        failure = record.failure
        if failure is not None and failure.target == _group_target(targets):
            retry = {
                e.name: self.annotations.get(e.name, {}).get(RETRY_ANNOTATION, "") for e in active
            }
            if all(retry[n] == failure.retry_tokens.get(n, "") for n in retry):
                drift, _ = self.keep(active, failure=failure)
                return Outcome(failed=True, drift=drift)
        return self.move(active, targets)

    def paused(self, entry: BundleDeploymentEntry) -> str | None:
        if entry.spec.paused:
            return "the set pauses this bundle (spec.paused)"
        value = self.annotations.get(entry.name, {}).get(PAUSED_ANNOTATION, "")
        if value.strip().lower() in ("true", "1", "yes"):
            return f"paused by a cluster admin (annotation {PAUSED_ANNOTATION})"
        return None

    def current_digest(self, bundle: str) -> str | None:
        number = self.r.latest_number(bundle)
        if number is None:
            return None
        stored = self.r.stored(bundle, number)
        return stored.digest if stored else None

    # -- paused and steady state ------------------------------------------------------------

    def report_paused(self, entry: BundleDeploymentEntry) -> None:
        view = self.view(entry.name)
        why = self.paused(entry) or "paused"
        stored = self.r.stored(entry.name) if self.r.latest_number(entry.name) else None
        drifted: list[str] = []
        if stored is not None:
            try:
                drifted = self.detect_drift(entry.name, stored)
            except ApplyError as exc:
                drifted = [f"(drift unknown: {exc})"]
        message = why + (
            f"; drift not corrected: {len(drifted)} object(s) differ ({', '.join(drifted[:5])})"
            if drifted
            else ""
        )
        view.set("Paused", "True", "Paused", message)
        view.set("Progressing", "False", "Paused", message)
        self.r.write(view)

    def detect_drift(self, bundle: str, stored: Kept) -> list[str]:
        """Objects of a stored revision that differ from the cluster (a dry run, nothing
        written). Raises ApplyError, ApiUnavailableError."""
        from agent.apply.drift import drifted_objects

        settings = _settings(stored.spec, stored.inventory)
        found = drifted_objects(
            self.kube,
            [BundleInput(name=bundle, objects=stored.manifests, settings=settings)],
            agent_namespace=self.r.settings.agent_namespace,
        )
        return [str(ref) for ref in found]

    def keep(
        self, active: list[BundleDeploymentEntry], *, failure: Failure | None
    ) -> tuple[int, bool]:
        """The group stays where it is: correct drift of its stored revisions and assess
        health once. Returns (objects corrected, healthy)."""
        stored = {e.name: self.r.stored(e.name) for e in active}
        present = {n: s for n, s in stored.items() if s is not None}
        if not present:
            return 0, False
        inputs = [
            BundleInput(
                name=name,
                objects=s.manifests,
                settings=_settings(s.spec, s.inventory),
            )
            for name, s in present.items()
        ]
        drift = 0
        try:
            result = apply_group(
                self.kube,
                inputs,
                agent_namespace=self.r.settings.agent_namespace,
                workers=self.r.settings.workers,
                establish_timeout=self.r.settings.establish_timeout,
            )
        except (ApplyError, CrdNotEstablishedError) as exc:
            for name in present:
                view = self.view(name)
                view.set(
                    "Ready",
                    "False",
                    getattr(exc, "reason", "ApplyFailed"),
                    f"drift correction failed: {exc}",
                )
                view.set(
                    "Degraded",
                    "True",
                    getattr(exc, "reason", "ApplyFailed"),
                    f"drift correction failed: {exc}",
                )
                view.set("Progressing", "False", "DriftCorrectionFailed", str(exc))
                self.r.write(view)
            return 0, False
        for name in present:
            counts = _counts(result, name)
            changed = counts["created"] + counts["configured"]
            if changed:
                drift += changed
                self.record_drift(name, present[name], counts)
            view = self.view(name)
            view.skipped = [str(s) for s in result.skipped if s.bundle == name]
            view.resources = {**view.resources, "skipped": len(view.skipped)}
        report = self.health(
            _without({n: s.manifests for n, s in present.items()}, result.skipped),
            {n: s.spec for n, s in present.items()},
            wait=False,
        )
        healthy = report.healthy
        for name, s in present.items():
            view = self.view(name)
            view.applied = s.revision
            view.last_healthy = s.revision
            self.set_health(view, report, name, total=len(s.manifests))
            if failure is not None:
                message = (
                    f"serial {failure.serial} was rolled back ({failure.message}); running "
                    f"serial {s.revision.serial if s.revision else '?'}; waiting for a newer "
                    f"target or a {RETRY_ANNOTATION} annotation"
                )
                reason = failure.reason
                view.set("Ready", "False", reason, message)
                view.set("Degraded", "True", reason, message)
                view.set("Progressing", "False", reason, message)
            elif healthy:
                view.set("Ready", "True", "Healthy", _healthy_message(s.revision, view.skipped))
                view.set("Degraded", "False", "Healthy", "")
                view.set("Progressing", "False", "Healthy", "")
            else:
                message = report.summary()
                view.set("Ready", "False", "HealthCheckFailed", message)
                view.set("Degraded", "True", "HealthCheckFailed", message)
                view.set("Progressing", "False", "HealthCheckFailed", message)
            self.r.write(view)
        return drift, healthy

    def record_drift(self, name: str, stored: Kept, counts: dict[str, int]) -> None:
        view = self.view(name)
        view.drift_count += counts["created"] + counts["configured"]
        now = self.now()
        run = Run(
            id=self.r.runs.next_id(name, view.runs),
            operation="driftCorrection",
            serial=stored.revision.serial if stored.revision else 0,
            source_digests=stored.revision.sources if stored.revision else (),
            started_at=now,
            finished_at=now,
            result="succeeded",
            message=(
                f"drift corrected: {counts['created']} object(s) re-created, "
                f"{counts['configured']} put back"
            ),
            counts=RunCounts(
                created=counts["created"],
                configured=counts["configured"],
                unchanged=counts["unchanged"],
            ),
        )
        view.runs = self.r.runs.record(name, run)

    # -- health -----------------------------------------------------------------------------

    def checks_of(self, spec: BundleDeploymentSpec) -> list[HealthCheck]:
        """The bundle's own checks, references completed with its target namespace."""
        namespace = spec.format_options.target_namespace if spec.format_options else None
        out = []
        for check in spec.health_checks.checks:
            target = check.object
            if target.namespace is None and namespace:
                target = replace(target, namespace=namespace)
            out.append(replace(check, object=target))
        return out

    def health(
        self,
        objects: Mapping[str, Sequence[Manifest]],
        specs: Mapping[str, BundleDeploymentSpec | None],
        *,
        wait: bool,
    ) -> HealthReport:
        """Assess the group: every object of bundles with the built-in assessment and every
        bundle's own checks, each bundle read as its own identity. ``wait``: until all are
        Current, one is Failed, or the longest of the bundles' timeouts passed; else once.
        """
        by_identity: dict[str | None, tuple[list[Manifest], list[HealthCheck]]] = {}
        timeout = 0.0
        for name, manifests in objects.items():
            spec = specs.get(name)
            account = spec.service_account_name if spec is not None else None
            assessed, checks = by_identity.setdefault(account, ([], []))
            if spec is None or spec.health_checks.builtin:
                assessed.extend(manifests)
            if spec is not None:
                checks.extend(self.checks_of(spec))
                timeout = max(timeout, float(spec.health_checks.timeout_seconds))
        deadline = time.monotonic() + (timeout or _DEFAULT_HEALTH_TIMEOUT)
        results: list[ObjectHealth] = []
        timed_out = False
        for account, (assessed, checks) in by_identity.items():
            client = (
                self.kube.impersonating(account, self.r.settings.agent_namespace)
                if account
                else self.kube
            )
            if wait:
                # Identities one after another under one deadline: the objects become
                # healthy concurrently in the cluster, so this waits no longer than needed.
                report = wait_healthy(
                    client,
                    assessed,
                    checks=checks,
                    timeout=max(0.0, deadline - time.monotonic()),
                    interval=self.r.settings.health_interval,
                )
                results.extend(report.results)
                timed_out = timed_out or report.timed_out
                if not report.healthy:
                    break
            else:
                results.extend(assess_live(client, assessed, checks=checks))
        failed = tuple(r for r in results if r.status is Status.FAILED)
        return HealthReport(tuple(results), timed_out=timed_out, failed=failed)

    def set_health(self, view: BundleView, report: HealthReport, name: str, *, total: int) -> None:
        mine = _bundle_results(report, self.owners, name)
        ready = sum(1 for r in mine if r.status is Status.CURRENT)
        bad = [r for r in mine if r.status is not Status.CURRENT]
        view.resources = {
            "total": total,
            "ready": ready,
            "notReady": len(bad),
            "skipped": view.resources.get("skipped", 0),
        }
        if not bad:
            view.health = HealthSummary(status="Current", message=f"{ready} objects healthy")
        else:
            worst = next((r for r in bad if r.status is Status.FAILED), bad[0])
            view.health = HealthSummary(status=str(worst.status), message=worst.describe()[:4096])

    # -- the move ---------------------------------------------------------------------------

    def move(self, active: list[BundleDeploymentEntry], targets: Mapping[str, str]) -> Outcome:
        names = [e.name for e in active]
        specs = {e.name: e.spec for e in active}
        serial = self.deployment_set.serial
        try:
            objects = self.render_targets(active)
        except TemporaryError as exc:
            # The group stays where it is; the next poll tries again (with backoff).
            for name in names:
                view = self.view(name)
                message = f"serial {serial} cannot be fetched yet: {exc} (retrying)"
                view.set("Progressing", "True", "FetchFailed", message)
                view.set("Ready", "False", "FetchFailed", message)
                self.r.write(view)
            raise
        except PermanentError as exc:
            reason = getattr(exc, "reason", "RenderFailed")
            if reason not in ("FetchFailed", "RenderFailed"):
                reason = "RenderFailed"
            self.record_failure(targets, serial, reason, str(exc))
            for name in names:
                view = self.view(name)
                message = f"serial {serial} cannot be rendered: {exc}"
                view.set("Ready", "False", reason, message)
                view.set("Degraded", "True", reason, message)
                view.set("Progressing", "False", reason, message)
                self.r.write(view)
            return Outcome(failed=True)
        previous = {name: self.r.stored(name) for name in names}
        now = self.now()
        run_ids = {}
        for entry in active:
            view = self.view(entry.name)
            prev = previous[entry.name]
            run = Run(
                id=self.r.runs.next_id(entry.name, view.runs),
                operation="upgrade" if prev is not None else "install",
                serial=serial,
                source_digests=tuple(s.pin for s in entry.spec.sources if s.pin)[:16],
                started_at=now,
                result="inProgress",
                message=f"moving group {self.group} to serial {serial}",
            )
            run_ids[entry.name] = run.id
            view.runs = self.r.runs.record(entry.name, run)
        intent = Intent(
            group=self.group,
            phase="applying",
            run_ids=run_ids,
            started_at=format_time(now),
            bundles={
                e.name: BundleMove(
                    from_revision=_number(previous[e.name]),
                    target_serial=serial,
                    target_digest=targets[e.name],
                    target_inventory=Inventory.from_objects(objects[e.name]),
                )
                for e in active
            },
        )
        # Recorded before the first write: a crash from here on is resumed at the next start.
        self.r.records.save(self.group, GroupRecord(intent=intent))
        self.failpoint("intent")
        return self.forward(intent, active, objects, specs, previous)

    def render_targets(self, active: list[BundleDeploymentEntry]) -> dict[str, list[Manifest]]:
        missing = [e for e in active if e.name not in self.rendered]
        objects = {e.name: list(self.rendered[e.name]) for e in active if e.name in self.rendered}
        if missing:
            self.r.progress(
                [e.name for e in missing],
                f"fetching and rendering group {self.group} ({self.position})",
            )
            fresh = self.render(self.deployment_set, missing)
            for e in missing:
                objects[e.name] = list(fresh[e.name])
        return objects

    def forward(
        self,
        intent: Intent,
        active: list[BundleDeploymentEntry],
        objects: Mapping[str, list[Manifest]],
        specs: Mapping[str, BundleDeploymentSpec],
        previous: Mapping[str, Kept | None],
    ) -> Outcome:
        """Apply the target, health-check it, then commit it or roll the group back."""
        names = [e.name for e in active]
        serial = self.deployment_set.serial
        inputs = [
            BundleInput(
                name=e.name,
                objects=objects[e.name],
                settings=_settings(e.spec, _inventory(previous[e.name])),
            )
            for e in active
        ]
        self.remember_owners(objects)
        try:
            self.r.progress(
                names, f"applying group {self.group} ({self.position}), serial {serial}"
            )
            result, skipped = self.apply(inputs)
            self.failpoint("applied")
            for name in names:
                view = self.view(name)
                view.applied = _revision(serial, _entry(active, name), self.set_digest)
                view.skipped = [str(s) for s in skipped if s.bundle == name]
                view.resources = {**view.resources, "skipped": len(view.skipped)}
            self.r.progress(
                names, f"health-checking group {self.group} ({self.position}), serial {serial}"
            )
            self.failpoint("health")
            report = self.health(_without(objects, skipped), specs, wait=True)
            if not report.healthy:
                bad = report.failed or report.unhealthy
                culprit = bad[0] if bad else None
                bundle = self.owners.get(culprit.ref) if culprit else None
                raise GroupFailed(
                    "HealthCheckFailed",
                    report.summary(),
                    bundle=bundle,
                    target=culprit.name if culprit else None,
                )
        except GroupFailed as failed:
            return self.rollback(intent, active, previous, failed)
        # Healthy: prune, keep the new revisions, read outputs, close the runs; the intent goes
        # last, so a crash anywhere before it redoes these steps (each is idempotent).
        self.failpoint("healthy")
        self.r.progress(names, f"pruning group {self.group} ({self.position})")
        pruned = self.prune_after(active, result, previous)
        self.failpoint("pruned")
        for entry in active:
            target = intent.bundles[entry.name].target_digest
            if self.current_digest(entry.name) == target:
                continue  # saved before a crash
            self.r.store.save(
                entry.name,
                manifests=objects[entry.name],
                inventory=Inventory.from_result(result, entry.name),
                info={
                    "digest": target,
                    "spec": to_dict(entry.spec),
                    "revision": to_dict(_revision(serial, entry, self.set_digest)),
                },
            )
            self.failpoint("stored")
        for entry in active:
            self.finish_success(
                entry, intent, result, pruned.get(entry.name, 0), report, len(objects[entry.name])
            )
        self.failpoint("finished")
        self.r.records.save(self.group, GroupRecord())
        return Outcome(healthy=True, moved=True)

    def failpoint(self, name: str) -> None:
        if self.r.settings.failpoint is not None:
            self.r.settings.failpoint(name)

    def apply(self, inputs: list[BundleInput]) -> tuple[GroupResult, tuple[Any, ...]]:
        """Plan and apply; failures become GroupFailed (``written`` False when the whole
        group's dry run refused it before anything was written)."""
        try:
            plan = plan_group(inputs, self.kube)
        except ApplyError as exc:
            raise GroupFailed(
                exc.reason if exc.reason != "ApplyFailed" else "ApplyFailed",
                str(exc),
                bundle=exc.bundle,
                target=exc.target,
                written=False,
            ) from exc
        deferred = {(p.bundle, p.target) for p in plan.objects if p.deferred}
        try:
            result = apply_group(
                self.kube,
                inputs,
                agent_namespace=self.r.settings.agent_namespace,
                workers=self.r.settings.workers,
                establish_timeout=self.r.settings.establish_timeout,
                plan=plan,
                on_progress=lambda message: self.failpoint(f"apply:{message}"),
            )
        except ApplyError as exc:
            # The first dry run covers every object that is not deferred, before any write.
            written = (
                not exc.server_message.startswith("dry run refused")
                or (exc.bundle, exc.target) in deferred
            )
            raise GroupFailed(
                "ApplyFailed", str(exc), bundle=exc.bundle, target=exc.target, written=written
            ) from exc
        except CrdNotEstablishedError as exc:
            raise GroupFailed("ApplyFailed", str(exc)) from exc
        return result, plan.skipped

    def remember_owners(self, objects: Mapping[str, Sequence[Manifest]]) -> None:
        owners: dict[ObjectRef, str] = {}
        for name, manifests in objects.items():
            for obj in manifests:
                owners.setdefault(ObjectRef.of(obj), name)
            spec = next((e.spec for e in self.members if e.name == name), None)
            for check in self.checks_of(spec) if spec else ():
                t = check.object
                owners.setdefault(ObjectRef(t.api_version, t.kind, t.name, t.namespace), name)
        self.owners = owners

    def prune_after(
        self,
        active: list[BundleDeploymentEntry],
        result: GroupResult,
        previous: Mapping[str, Kept | None],
    ) -> dict[str, int]:
        old = {name: s.inventory for name, s in previous.items() if s is not None}
        new = {e.name: Inventory.from_result(result, e.name) for e in active}
        elsewhere = {k: b for k, b in self.claims.items() if b not in new}
        plan = plan_prune(
            old,
            new,
            keep_crds={e.name: e.spec.keep_crds for e in active},
            claimed_elsewhere=elsewhere,
        )
        counts: dict[str, int] = {}
        for outcome in self.prune(plan, {e.name: e.spec for e in active}):
            if outcome.done == "deleted":
                counts[outcome.bundle] = counts.get(outcome.bundle, 0) + 1
        return counts

    def prune(
        self, plan: PrunePlan, specs: Mapping[str, BundleDeploymentSpec | None]
    ) -> list[PruneOutcome]:
        """Carry out a prune plan, each bundle's deletions as the bundle's own identity."""
        outcomes: list[PruneOutcome] = []
        for bundle in sorted({i.bundle for i in plan.items}):
            mine = PrunePlan(tuple(i for i in plan.items if i.bundle == bundle))
            outcomes.extend(prune(self.r.client_for(specs.get(bundle)), mine))
        return outcomes

    def finish_success(
        self,
        entry: BundleDeploymentEntry,
        intent: Intent,
        result: GroupResult,
        pruned: int,
        report: HealthReport,
        total: int,
    ) -> None:
        view = self.view(entry.name)
        serial = intent.bundles[entry.name].target_serial
        revision = _revision(serial, entry, self.set_digest)
        run_id = intent.run_ids.get(entry.name) or self.r.runs.next_id(entry.name, view.runs)
        counts = _counts(result, entry.name)
        outputs: tuple[OutputValue, ...] = ()
        outcome = "succeeded"
        message = (
            f"serial {serial} applied and healthy: {counts['created']} created, "
            f"{counts['configured']} configured, {counts['unchanged']} unchanged, {pruned} pruned"
        )
        output_error: str | None = None
        if self.r.outputs is not None:
            options = entry.spec.format_options
            try:
                outputs = self.r.outputs.collect(
                    bundle=entry.name,
                    outputs=entry.spec.outputs,
                    reader=self.r.client_for(entry.spec),
                    default_namespace=options.target_namespace if options else None,
                    run_id=run_id,
                    serial=serial,
                    now=self.now(),
                )
            except PermanentError as exc:
                outcome = "failed"
                output_error = str(exc)
                message = f"serial {serial} applied and healthy, but outputs failed: {exc}"
        started = next((r.started_at for r in view.runs if r.id == run_id), self.now())
        run = Run(
            id=run_id,
            operation="upgrade" if intent.bundles[entry.name].from_revision else "install",
            serial=serial,
            source_digests=revision.sources[:16],
            started_at=started,
            finished_at=self.now(),
            result=outcome,  # type: ignore[arg-type]
            message=message,
            counts=RunCounts(
                created=counts["created"],
                configured=counts["configured"],
                unchanged=counts["unchanged"],
                pruned=pruned,
            ),
            outputs=outputs,
        )
        view.runs = self.r.runs.record(entry.name, run)
        view.applied = revision
        view.last_healthy = revision
        self.set_health(view, report, entry.name, total=total)
        if output_error is not None:
            view.set("Ready", "False", "OutputFailed", output_error)
            view.set("Degraded", "True", "OutputFailed", output_error)
        else:
            view.set("Ready", "True", "Healthy", _healthy_message(revision, view.skipped))
            view.set("Degraded", "False", "Healthy", "")
        view.set(
            "Progressing", "False", "Healthy" if output_error is None else "OutputFailed", message
        )
        self.r.write(view)

    # -- rollback ---------------------------------------------------------------------------

    def rollback(
        self,
        intent: Intent,
        active: list[BundleDeploymentEntry],
        previous: Mapping[str, Kept | None],
        failed: GroupFailed,
    ) -> Outcome:
        """Return every bundle of the group to its previous healthy revision."""
        names = list(intent.bundles)
        serial = max(m.target_serial for m in intent.bundles.values())
        targets = {n: m.target_digest for n, m in intent.bundles.items()}
        where = f" ({failed.bundle}: {failed.target})" if failed.bundle and failed.target else ""
        why = f"{failed.reason}{where}: {failed.message}"
        if not failed.written:
            # The whole group's dry run refused it: nothing was written, nothing to undo.
            self.r.records.save(
                self.group, GroupRecord(failure=self.failure(targets, serial, failed.reason, why))
            )
            self.close_runs(
                intent, "failed", f"serial {serial} not applied: {why}", culprit=_culprit(failed)
            )
            for name in names:
                view = self.view(name)
                message = f"serial {serial} not applied (nothing was written): {why}"
                view.set("Ready", "False", failed.reason, message)
                view.set("Degraded", "True", failed.reason, message)
                view.set("Progressing", "False", failed.reason, message)
                if view.last_healthy is not None:
                    view.applied = view.last_healthy
                self.r.write(view)
            return Outcome(failed=True)
        rolling = replace(intent, phase="rolling-back", failure=why)
        self.r.records.save(self.group, GroupRecord(intent=rolling))
        self.failpoint("rollback")
        return self.roll_back_to(rolling, previous, failed.reason, why, culprit=_culprit(failed))

    def roll_back_to(
        self,
        intent: Intent,
        previous: Mapping[str, Kept | None],
        reason: str,
        why: str,
        *,
        culprit: tuple[str, str] | None = None,
    ) -> Outcome:
        """Re-apply the previous revisions, delete what the target added, health-check.
        ``culprit``: the bundle and object that failed, when known (named in that run)."""
        names = list(intent.bundles)
        serial = max(m.target_serial for m in intent.bundles.values())
        targets = {n: m.target_digest for n, m in intent.bundles.items()}
        back = {n: s for n, s in previous.items() if s is not None}
        if not back and not self.r.settings.uninstall_failed_install:
            # A first install has nothing to return to: leave it for inspection.
            self.r.records.save(
                self.group, GroupRecord(failure=self.failure(targets, serial, reason, why))
            )
            self.close_runs(
                intent,
                "failed",
                f"first install of serial {serial} failed: {why}",
                culprit=culprit,
            )
            for name in names:
                view = self.view(name)
                message = f"first install failed, nothing to roll back to (left as is): {why}"
                view.set("Ready", "False", reason, message)
                view.set("Degraded", "True", reason, message)
                view.set("Progressing", "False", reason, message)
                self.r.write(view)
            return Outcome(failed=True)
        self.r.progress(names, f"rolling back group {self.group} ({self.position}): {why}")
        try:
            if back:
                inputs = [
                    BundleInput(
                        name=n,
                        objects=s.manifests,
                        settings=_settings(s.spec, s.inventory),
                    )
                    for n, s in back.items()
                ]
                self.remember_owners({n: s.manifests for n, s in back.items()})
                self.apply(inputs)
                self.failpoint("rollback:applied")
            old = {n: m.target_inventory for n, m in intent.bundles.items()}
            new = {n: s.inventory for n, s in back.items()}
            elsewhere = {k: b for k, b in self.claims.items() if b not in intent.bundles}
            plan = plan_prune(
                old,
                new,
                keep_crds={n: (s.spec.keep_crds if s.spec else True) for n, s in back.items()},
                claimed_elsewhere=elsewhere,
            )
            self.prune(plan, {n: s.spec for n, s in back.items()})
            self.failpoint("rollback:pruned")
            report: HealthReport | None = None
            if back:
                report = self.health(
                    {n: s.manifests for n, s in back.items()},
                    {n: s.spec for n, s in back.items()},
                    wait=True,
                )
                if not report.healthy:
                    raise GroupFailed("RollbackFailed", report.summary())
            # The store's latest must be what runs now (a crash may have saved the target).
            for name, s in back.items():
                if self.r.latest_number(name) != s.number:
                    self.r.store.save(
                        name,
                        manifests=s.manifests,
                        inventory=s.inventory,
                        info={
                            "digest": s.digest,
                            **({"spec": to_dict(s.spec)} if s.spec else {}),
                            **({"revision": to_dict(s.revision)} if s.revision else {}),
                        },
                    )
        except (GroupFailed, ApplyError, CrdNotEstablishedError) as exc:
            message = f"rollback of group {self.group} failed ({exc}); retrying. It rolled back because {why}"
            for name in names:
                view = self.view(name)
                view.set("Ready", "False", "RollbackFailed", message)
                view.set("Degraded", "True", "RollbackFailed", message)
                view.set("Progressing", "True", "RollbackFailed", message)
                self.r.write(view)
            # The intent stays (rolling-back): the next pass tries again, with backoff.
            raise TemporaryError(message) from exc
        self.r.records.save(
            self.group, GroupRecord(failure=self.failure(targets, serial, "RolledBack", why))
        )
        self.close_runs(
            intent, "rolledBack", f"serial {serial} rolled back: {why}", culprit=culprit
        )
        for name in names:
            view = self.view(name)
            kept = back.get(name)
            view.applied = kept.revision if kept else None
            view.last_healthy = kept.revision if kept else None
            if report is not None and kept is not None:
                self.set_health(view, report, name, total=len(kept.manifests))
            to = kept.revision.serial if kept and kept.revision else "-"
            message = f"serial {serial} rolled back to serial {to}: {why}"
            view.set("Ready", "False", "RolledBack", message)
            view.set("Degraded", "True", "RolledBack", message)
            view.set("Progressing", "False", "RolledBack", message)
            self.r.write(view)
        return Outcome(rolled_back=True, failed=True)

    def failure(
        self, targets: Mapping[str, str], serial: int, reason: str, message: str
    ) -> Failure:
        return Failure(
            target=_group_target(targets),
            serial=serial,
            reason=reason,
            message=message[:4000],
            retry_tokens={
                n: self.annotations.get(n, {}).get(RETRY_ANNOTATION, "") for n in targets
            },
        )

    def record_failure(
        self, targets: Mapping[str, str], serial: int, reason: str, message: str
    ) -> None:
        record = self.r.records.load(self.group)
        self.r.records.save(
            self.group, replace(record, failure=self.failure(targets, serial, reason, message))
        )

    def close_runs(
        self,
        intent: Intent,
        result: str,
        message: str,
        *,
        culprit: tuple[str, str] | None = None,
    ) -> None:
        """End the intent's runs; the run of the culprit's bundle names the failed object."""
        now = self.now()
        for name, run_id in intent.run_ids.items():
            view = self.r.views.get(name) or self.r._view(name, self.group)
            started = next((r for r in view.runs if r.id == run_id), None)
            run = Run(
                id=run_id,
                operation=started.operation if started else "upgrade",
                serial=intent.bundles[name].target_serial,
                source_digests=started.source_digests if started else (),
                started_at=started.started_at if started else now,
                finished_at=now,
                result=result,  # type: ignore[arg-type]
                message=message,
                failed_object=culprit[1] if culprit and culprit[0] == name else None,
            )
            view.runs = self.r.runs.record(name, run)

    # -- resume after a crash ---------------------------------------------------------------

    def resume(self, record: GroupRecord) -> None:
        """Finish what a crashed agent left: go on to the target when it can still be
        produced (the set still wants it), else return to the previous revisions."""
        intent = record.intent
        assert intent is not None
        previous = {
            name: (
                self.r.stored(name, move.from_revision) if move.from_revision is not None else None
            )
            for name, move in intent.bundles.items()
        }
        wanted = {e.name: e for e in self.members}
        same = all(
            name in wanted and spec_digest(wanted[name]) == move.target_digest
            for name, move in intent.bundles.items()
        )
        if intent.phase == "applying" and same:
            active = [wanted[n] for n in intent.bundles]
            try:
                objects = self.render_targets(active)
            except FleetletError as exc:
                if isinstance(exc, ApiUnavailableError):
                    raise
                log.warning(
                    "resuming group %s: the target cannot be rendered (%s): rolling back",
                    self.group,
                    exc,
                )
            else:
                log.info(
                    "resuming group %s: completing the move to serial %s",
                    self.group,
                    self.deployment_set.serial,
                )
                self.forward(intent, active, objects, {e.name: e.spec for e in active}, previous)
                return
        why = intent.failure or "the agent stopped in the middle of the move"
        rolling = replace(intent, phase="rolling-back", failure=why)
        self.r.records.save(self.group, GroupRecord(intent=rolling))
        for name in intent.bundles:
            self.r._view(name, self.group)
        outcome = self.roll_back_to(rolling, previous, "RolledBack", why)
        if outcome.rolled_back and intent.phase == "applying" and not intent.failure:
            # Interrupted, not failed: the target may be tried again.
            record = self.r.records.load(self.group)
            self.r.records.save(self.group, replace(record, failure=None))


def _entry(active: Sequence[BundleDeploymentEntry], name: str) -> BundleDeploymentEntry:
    return next(e for e in active if e.name == name)


def _settings(spec: BundleDeploymentSpec | None, owned: Inventory | None) -> ApplySettings:
    """How to apply a bundle: its spec's settings, and the objects it applied before (their
    fields are taken back when someone edited them: that is drift)."""
    settings = ApplySettings.from_spec(spec) if spec is not None else ApplySettings()
    reclaim = frozenset(identity(e.ref) for e in owned) if owned is not None else frozenset()
    return replace(settings, reclaim=reclaim)


def _inventory(stored: Kept | None) -> Inventory | None:
    return stored.inventory if stored is not None else None


def _number(stored: Kept | None) -> int | None:
    return stored.number if stored is not None else None


def _counts(result: GroupResult, bundle: str) -> dict[str, int]:
    counts = {"created": 0, "configured": 0, "unchanged": 0}
    for r in result.for_bundle(bundle):
        counts[r.action] += 1
    return counts


def _bundle_results(
    report: HealthReport, owners: Mapping[ObjectRef, str], bundle: str
) -> list[Any]:
    return [r for r in report.results if owners.get(r.ref, bundle) == bundle]


def _healthy_message(revision: Revision | None, skipped: Sequence[str] = ()) -> str:
    text = f"serial {revision.serial} applied and healthy" if revision else "healthy"
    if skipped:
        text += f"; skipped (API not served, optional): {', '.join(skipped)}"
    return text


def _without(
    objects: Mapping[str, Sequence[Manifest]], skipped: Sequence[Skipped]
) -> dict[str, list[Manifest]]:
    """The objects minus the optional ones that were skipped (they are not health-checked)."""
    gone = {(s.bundle, s.ref) for s in skipped}
    return {
        name: [o for o in manifests if (name, ObjectRef.of(o)) not in gone]
        for name, manifests in objects.items()
    }


def _culprit(failed: GroupFailed) -> tuple[str, str] | None:
    """(bundle, object) that made the group fail, when the failure names one."""
    if failed.bundle and failed.target:
        return failed.bundle, failed.target
    return None
