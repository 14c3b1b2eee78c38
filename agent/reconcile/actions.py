"""What the reconcile's steps do to the cluster and its bookkeeping, as small functions of the
:class:`~agent.reconcile.context.GroupContext`: apply (a move's, or drift correction's),
prune as each bundle's identity, what a bundle owns (its stored revision and what a failed
install left), and each bundle's health counts. The pipeline (:mod:`agent.reconcile.group`)
reads as its steps; the details are here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.api import BundleDeploymentSpec, Revision
from agent.api.reasons import Reason
from agent.apply import (
    ApplyError,
    ApplyResult,
    ApplySettings,
    BundleInput,
    CrdNotEstablishedError,
    Inventory,
    PruneOutcome,
    PrunePlan,
    Skipped,
    apply_group,
    plan_group,
    prune,
)
from agent.apply.intent import Intent
from agent.apply.plan import identity
from agent.apply.store import HealthyRevision
from agent.health import HealthReport, ObjectHealth, Status
from agent.health.group import checks_of
from agent.kube import ObjectRef
from agent.reconcile.context import (
    GroupContext,
    Manifest,
    MoveFailed,
)
from agent.report.view import BundleView


def current_digest(ctx: GroupContext, bundle: str) -> str | None:
    stored = ctx.store.latest(bundle)
    return stored.digest if stored is not None else None


def number_of(stored: HealthyRevision | None) -> int | None:
    return stored.number if stored is not None else None


def target_revision(ctx: GroupContext, name: str, serial: int) -> Revision | None:
    entry = next((e for e in ctx.members if e.name == name), None)
    return ctx.revision(entry, serial) if entry is not None else None


def previous_of(ctx: GroupContext, intent: Intent) -> dict[str, HealthyRevision | None]:
    """Each bundle's revision the intent moves from (None: it had none)."""
    return {
        name: (ctx.store.get(name, move.from_revision) if move.from_revision is not None else None)
        for name, move in intent.bundles.items()
    }


def leftovers_of(ctx: GroupContext) -> Mapping[str, Inventory]:
    return ctx.records.load(ctx.group).leftovers


def owned(stored: HealthyRevision | None, leftovers: Inventory | None) -> Inventory | None:
    """What a bundle owns in the cluster: its stored revision's objects and what a failed
    first install left."""
    return union(stored.inventory if stored else None, leftovers) if (stored or leftovers) else None


def union(a: Inventory | None, b: Inventory | None) -> Inventory:
    return Inventory.of([*(a or Inventory()), *(b or Inventory())])


def claimed_elsewhere(ctx: GroupContext, new: Mapping[str, Inventory]) -> dict[Any, str]:
    return {k: b for k, b in ctx.claims.items() if b not in new}


def apply_input(
    name: str,
    objects: Sequence[Manifest],
    spec: BundleDeploymentSpec | None,
    owned: Inventory | None,
) -> BundleInput:
    """How to apply a bundle: its spec's settings, and the objects it applied before (their
    fields are taken back when someone edited them: that is drift)."""
    settings = ApplySettings.from_spec(spec) if spec is not None else ApplySettings()
    reclaim = frozenset(identity(e.ref) for e in owned) if owned is not None else frozenset()
    return BundleInput(name=name, objects=objects, settings=replace(settings, reclaim=reclaim))


def apply_steady(ctx: GroupContext, inputs: list[BundleInput]) -> ApplyResult:
    """Dry-run and apply (drift correction). Raises ApplyError, CrdNotEstablishedError."""
    return apply_group(
        ctx.kube,
        inputs,
        agent_namespace=ctx.settings.agent_namespace,
        workers=ctx.settings.workers,
        establish_timeout=ctx.settings.establish_timeout,
        guard=ctx.settings.guard,
    )


def apply_moving(
    ctx: GroupContext,
    inputs: list[BundleInput],
    *,
    between_waves: Callable[[ApplyResult], None] | None = None,
) -> ApplyResult:
    """Plan and apply as part of a move; failures become MoveFailed (``written`` False when
    the whole group's dry run refused it before anything was written)."""
    try:
        plan = plan_group(inputs, ctx.kube, guard=ctx.settings.guard)
    except ApplyError as exc:
        raise MoveFailed.of_apply(exc, reason=exc.reason, written=False) from exc
    deferred = {(p.bundle, p.target) for p in plan.objects if p.deferred}
    try:
        return apply_group(
            ctx.kube,
            inputs,
            agent_namespace=ctx.settings.agent_namespace,
            workers=ctx.settings.workers,
            establish_timeout=ctx.settings.establish_timeout,
            plan=plan,
            on_progress=lambda message: ctx.failpoint(f"apply:{message}"),
            between_waves=between_waves,
        )
    except ApplyError as exc:
        # The first dry run covers every object that is not deferred, before any write.
        written = not exc.dry_run or any(f in deferred for f in exc.where)
        raise MoveFailed.of_apply(exc, reason=Reason.APPLY_FAILED, written=written) from exc
    except CrdNotEstablishedError as exc:
        raise MoveFailed(Reason.APPLY_FAILED, str(exc), causes=[exc.reason]) from exc


def prune_as_owners(
    ctx: GroupContext, plan: PrunePlan, specs: Mapping[str, BundleDeploymentSpec | None]
) -> dict[str, int]:
    """Carry out a prune plan, each bundle's deletions as the bundle's own identity; returns
    objects deleted per bundle."""
    outcomes: list[PruneOutcome] = []
    for bundle in sorted({i.bundle for i in plan.items}):
        mine = PrunePlan(tuple(i for i in plan.items if i.bundle == bundle))
        outcomes.extend(prune(ctx.identities(specs.get(bundle)), mine))
    counts: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.done == "deleted":
            counts[outcome.bundle] = counts.get(outcome.bundle, 0) + 1
    return counts


def remember_owners(ctx: GroupContext, objects: Mapping[str, Sequence[Manifest]]) -> None:
    ctx.owners.clear()
    for name, manifests in objects.items():
        for obj in manifests:
            ctx.owners.setdefault(ObjectRef.of(obj), name)
        spec = next((e.spec for e in ctx.members if e.name == name), None)
        for check in checks_of(spec) if spec else ():
            t = check.object
            ctx.owners.setdefault(ObjectRef(t.api_version, t.kind, t.name, t.namespace), name)


def set_health(ctx: GroupContext, view: BundleView, report: HealthReport, *, total: int) -> None:
    from agent.api.status import HealthSummary

    mine = [r for r in report.results if ctx.owners.get(r.ref) == view.name]
    ready = sum(1 for r in mine if r.status is Status.CURRENT)
    bad: list[ObjectHealth] = [r for r in mine if r.status is not Status.CURRENT]
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


def healthy_message(revision: Revision | None, skipped: Sequence[str] = ()) -> str:
    text = f"serial {revision.serial} applied and healthy" if revision else "healthy"
    if skipped:
        text += f"; skipped (API not served, optional): {', '.join(skipped)}"
    return text


def without_skipped(
    objects: Mapping[str, Sequence[Manifest]], skipped: Sequence[Skipped]
) -> dict[str, list[Manifest]]:
    """The objects minus the optional ones that were skipped (they are not health-checked)."""
    gone = {(s.bundle, s.ref) for s in skipped}
    return {
        name: [o for o in manifests if (name, ObjectRef.of(o)) not in gone]
        for name, manifests in objects.items()
    }
