"""A group that does not move: paused bundles say why, and a
group on its target keeps it — drifted objects are put back and its health is assessed once;
a group whose target failed stays on its previous revision and says how it is tried again; a
group whose move awaits an approval (or was denied) keeps its running revisions too, drift put
back, while its bundles say what they wait for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agent.api import BundleDeploymentEntry, Revision
from agent.api.reasons import SUCCEEDED, Phase, Reason
from agent.api.status import RunCounts
from agent.apply import (
    ApplyError,
    ApplyResult,
    CrdNotEstablishedError,
)
from agent.apply.intent import FailedTarget
from agent.apply.store import HealthyRevision
from agent.gate import (
    RETRY_ANNOTATION,
    Decision,
)
from agent.health.group import group_health
from agent.reconcile.actions import (
    apply_input,
    apply_steady,
    healthy_message,
    remember_owners,
    set_health,
    target_revision,
    without_skipped,
)
from agent.reconcile.context import (
    GroupContext,
    GroupOutcome,
    GroupState,
)
from agent.report import events

log = logging.getLogger(__name__)


def report_held(ctx: GroupContext, decision: Decision) -> None:
    """Say on each paused bundle why it is held (with any drift found, not corrected)."""
    for entry, why in decision.paused:
        view = ctx.view(entry.name)
        stored = ctx.store.latest(entry.name)
        drifted: list[str] = []
        if stored is not None:
            try:
                drifted = _drifted(ctx, stored)
            except ApplyError as exc:
                drifted = [f"(drift unknown: {exc})"]
        message = why + (
            f"; drift not corrected: {len(drifted)} object(s) differ ({', '.join(drifted[:5])})"
            if drifted
            else ""
        )
        view.mark_paused(message)
        ctx.views.write(view)
    for entry in decision.active:
        ctx.view(entry.name).unpause()


def _drifted(ctx: GroupContext, stored: HealthyRevision) -> list[str]:
    """Objects of a stored revision that differ from the cluster (a dry run, nothing
    written). Raises ApplyError, ApiUnavailableError."""
    from agent.apply.drift import drifted_objects

    found = drifted_objects(
        ctx.kube,
        [apply_input(stored.bundle, stored.manifests, stored.spec, stored.inventory)],
        agent_namespace=ctx.settings.agent_namespace,
        guard=ctx.settings.guard,
    )
    return [str(ref) for ref in found]


def keep(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    *,
    failure: FailedTarget | None = None,
) -> GroupOutcome:
    """The group stays on its stored revisions: put drifted objects back and assess health
    once. ``failure``: the target that failed and keeps the group here (said on each bundle,
    with how it will be tried again)."""
    stored = {e.name: ctx.store.latest(e.name) for e in active}
    present = {n: s for n, s in stored.items() if s is not None}
    failed = GroupState.FAILED if failure is not None else GroupState.STEADY
    if failure is not None:
        for name in stored.keys() - present.keys():
            view = ctx.view(name)
            view.mark_failed(failure.reason, _blocked_message(failure, None))
            ctx.views.write(view)
    if not present:
        return GroupOutcome(group=ctx.group, state=failed)
    try:
        result, drift = _put_back(ctx, present)
    except (ApplyError, CrdNotEstablishedError) as exc:
        for name in present:
            view = ctx.view(name)
            view.mark_failed(exc.reason, f"drift correction failed: {exc}")
            view.set("Progressing", "False", Reason.DRIFT_CORRECTION_FAILED, str(exc))
            ctx.views.write(view)
        return GroupOutcome(group=ctx.group, state=GroupState.FAILED)
    for name in present:
        view = ctx.view(name)
        view.skipped = [str(s) for s in result.skipped if s.bundle == name]
        view.resources = {**view.resources, "skipped": len(view.skipped)}
    report = group_health(
        ctx.identities,
        without_skipped({n: s.manifests for n, s in present.items()}, result.skipped),
        {n: s.spec for n, s in present.items()},
        wait=False,
    )
    remember_owners(ctx, {n: s.manifests for n, s in present.items()})
    for name, kept in present.items():
        view = ctx.view(name)
        view.applied = view.last_healthy = kept.revision
        set_health(ctx, view, report, total=len(kept.manifests))
        if failure is not None:
            view.target = target_revision(ctx, name, failure.serial)
            view.mark_failed(
                failure.reason,
                _blocked_message(failure, kept.revision),
                phase=Phase.ROLLED_BACK if failure.reason == Reason.ROLLED_BACK else Phase.FAILED,
                retrying=failure.retry_at is not None,
            )
        elif report.healthy:
            view.mark_ready(healthy_message(kept.revision, view.skipped))
        else:
            view.mark_failed(Reason.HEALTH_CHECK_FAILED, report.summary())
        ctx.views.write(view)
    return GroupOutcome(
        group=ctx.group, state=failed, healthy=report.healthy and failure is None, drift=drift
    )


def keep_running(ctx: GroupContext, active: Sequence[BundleDeploymentEntry]) -> int:
    """A group whose move waits for a decision (or was denied) keeps what runs: drifted
    objects of its stored revisions are put back (and recorded), the target is not touched.
    The bundles' conditions stay as the approval step set them; a correction that fails says
    so in Degraded. Returns the objects put back.

    Raises ApiUnavailableError and the other TemporaryErrors of the apply."""
    stored = {e.name: ctx.store.latest(e.name) for e in active}
    present = {n: s for n, s in stored.items() if s is not None}
    if not present:
        return 0
    try:
        _, drift = _put_back(ctx, present)
    except (ApplyError, CrdNotEstablishedError) as exc:
        for name in present:
            view = ctx.view(name)
            view.set(
                "Degraded",
                "True",
                Reason.DRIFT_CORRECTION_FAILED,
                f"drift correction of the running revision failed: {exc}",
            )
            ctx.views.write(view)
        return 0
    if drift:
        # Only what the correction recorded changes (the runs, driftCount): a pass that
        # found nothing writes nothing, so the supervisor's drift checks stay quiet.
        for name in present:
            ctx.views.write(ctx.view(name))
    return drift


def _put_back(ctx: GroupContext, present: dict[str, HealthyRevision]) -> tuple[ApplyResult, int]:
    """Apply the stored revisions (drifted objects put back, each bundle's run history and
    drift count recording it); the result and how many objects were put back. Raises ApplyError,
    CrdNotEstablishedError, the apply's TemporaryErrors."""
    result = apply_steady(
        ctx, [apply_input(n, s.manifests, s.spec, s.inventory) for n, s in present.items()]
    )
    drift = 0
    for name, kept in present.items():
        counts = result.counts_of(name)
        changed = counts.created + counts.configured
        if changed:
            drift += changed
            _record_drift(ctx, kept, counts)
    return result, drift


def _blocked_message(failure: FailedTarget, running: Revision | None) -> str:
    now_running = f"running serial {running.serial}" if running else "nothing applied before it"
    again = (
        f"retried by itself at {failure.retry_at} (attempt {failure.attempts + 1}), or at once "
        f"with a new serial or a changed {RETRY_ANNOTATION} annotation"
        if failure.retry_at
        else f"tried again only with a new serial or a changed {RETRY_ANNOTATION} annotation"
    )
    return f"serial {failure.serial} failed ({failure.message}); {now_running}; {again}"


def _record_drift(ctx: GroupContext, kept: HealthyRevision, counts: RunCounts) -> None:
    view = ctx.view(kept.bundle)
    view.drift_count += counts.created + counts.configured
    ctx.event(
        kept.bundle,
        events.DRIFT_CORRECTED,
        f"{counts.created + counts.configured} drifted object(s) put back",
    )
    serial = kept.revision.serial if kept.revision else 0
    now = ctx.clock()
    history = ctx.runs.start(
        kept.bundle,
        operation="driftCorrection",
        serial=serial,
        sources=kept.revision.sources if kept.revision else (),
        at=now,
        message="correcting drift",
        history=view.runs,
    )
    view.runs = ctx.runs.finish(
        kept.bundle,
        history[0].id,
        result=SUCCEEDED,
        serial=serial,
        at=now,
        message=(
            f"drift corrected: {counts.created} object(s) re-created, {counts.configured} put back"
        ),
        counts=counts,
    )
