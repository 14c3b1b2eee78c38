"""One lockstep group's part of a reconcile pass, as a pipeline read top to bottom.

    resume   a move a crash interrupted: finish it, or return the group (agent.apply.intent)
    gate     paused, approval, dependsOn, a failed target (agent.gate)
    move     render -> intent -> dry run + staged apply -> health of the whole group
    finish   prune -> revision store -> outputs -> runs -> intent cleared
    or       roll back: the one way back to the previous healthy revisions
    keep     nothing to move: correct drift, assess health once

Each step is a function of the :class:`~agent.reconcile.context.GroupContext`; a step that
cannot go on raises :class:`~agent.reconcile.context.MoveFailed`, which :func:`roll_back`
handles. Status goes to the BundleDeployments between steps (``views.progress``), and each
move is a run in every bundle's history. The intent is recorded in the cluster before the
first write and cleared last, so a crash anywhere is resumed at the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.api import BundleDeploymentEntry, BundleDeploymentSpec, Revision, format_time
from agent.api.reasons import FAILED, ROLLED_BACK, SUCCEEDED, Phase, Reason, RunResult
from agent.api.status import OutputValue, RunCounts
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
    plan_prune,
    prune,
)
from agent.apply.intent import BundleMove, FailedTarget, GroupRecord, Intent
from agent.apply.plan import identity
from agent.apply.store import HealthyRevision
from agent.errors import FleetletError, PermanentError, TemporaryError
from agent.gate import (
    RETRY_ANNOTATION,
    Decision,
    Verdict,
    decide,
    group_target,
    retry_at,
    retry_tokens,
    spec_digest,
)
from agent.health import HealthReport, ObjectHealth, Status
from agent.health.group import checks_of, group_health
from agent.kube import ApiUnavailableError, ObjectRef
from agent.reconcile.context import (
    GroupContext,
    GroupOutcome,
    GroupState,
    Manifest,
    MoveFailed,
)
from agent.report.view import BundleView

log = logging.getLogger(__name__)


def reconcile_group(ctx: GroupContext, healthy_groups: set[str]) -> GroupOutcome:
    """The group's part of a pass (see the module docstring).

    Raises TemporaryError (ApiUnavailableError among them) for what a later pass may fix;
    every other failure is recorded on the bundles and in the outcome.
    """
    record = ctx.records.load(ctx.group)
    if record.intent is not None:
        resumed = resume(ctx, record.intent)
        if resumed is not None:
            return resumed
        record = ctx.records.load(ctx.group)
    decision = decide(
        members=ctx.members,
        annotations=ctx.annotations,
        healthy_groups=healthy_groups,
        current={e.name: _current_digest(ctx, e.name) for e in ctx.members},
        failure=record.failure,
        now=ctx.clock(),
    )
    report_held(ctx, decision)
    match decision.verdict:
        case Verdict.HELD:
            return GroupOutcome(
                group=ctx.group, state=GroupState.HELD, healthy=not decision.approval
            )
        case Verdict.WAITING:
            message = f"waiting for group(s) {', '.join(decision.waiting_for)} to be healthy"
            for entry in decision.active:
                view = ctx.view(entry.name)
                view.mark_waiting(Reason.WAITING_FOR_DEPENDENCY, message)
                ctx.views.write(view)
            return GroupOutcome(group=ctx.group, state=GroupState.WAITING)
        case Verdict.STEADY:
            return keep(ctx, decision.active)
        case Verdict.BLOCKED:
            return keep(ctx, decision.active, failure=decision.failure)
    return move(ctx, decision)


# -- gate -----------------------------------------------------------------------------------


def report_held(ctx: GroupContext, decision: Decision) -> None:
    """Say on each held bundle why it is held: paused (with any drift found, not corrected),
    or waiting for an approval."""
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
    for entry in decision.approval:
        view = ctx.view(entry.name)
        view.unpause()
        view.mark_waiting(
            Reason.APPROVAL_REQUIRED,
            "approval: manual is not supported by this agent yet: the bundle is not applied",
        )
        ctx.views.write(view)
    for entry in decision.active:
        ctx.view(entry.name).unpause()


def _drifted(ctx: GroupContext, stored: HealthyRevision) -> list[str]:
    """Objects of a stored revision that differ from the cluster (a dry run, nothing
    written). Raises ApplyError, ApiUnavailableError."""
    from agent.apply.drift import drifted_objects

    found = drifted_objects(
        ctx.kube,
        [_input(stored.bundle, stored.manifests, stored.spec, stored.inventory)],
        agent_namespace=ctx.settings.agent_namespace,
    )
    return [str(ref) for ref in found]


# -- keep: nothing to move ------------------------------------------------------------------


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
        result = _apply(
            ctx, [_input(n, s.manifests, s.spec, s.inventory) for n, s in present.items()]
        )
    except (ApplyError, CrdNotEstablishedError) as exc:
        for name in present:
            view = ctx.view(name)
            view.mark_failed(exc.reason, f"drift correction failed: {exc}")
            view.set("Progressing", "False", Reason.DRIFT_CORRECTION_FAILED, str(exc))
            ctx.views.write(view)
        return GroupOutcome(group=ctx.group, state=GroupState.FAILED)
    drift = 0
    for name, kept in present.items():
        counts = result.counts_of(name)
        changed = counts.created + counts.configured
        if changed:
            drift += changed
            _record_drift(ctx, kept, counts)
        view = ctx.view(name)
        view.skipped = [str(s) for s in result.skipped if s.bundle == name]
        view.resources = {**view.resources, "skipped": len(view.skipped)}
    report = group_health(
        ctx.identities,
        _without({n: s.manifests for n, s in present.items()}, result.skipped),
        {n: s.spec for n, s in present.items()},
        wait=False,
    )
    _remember_owners(ctx, {n: s.manifests for n, s in present.items()})
    for name, kept in present.items():
        view = ctx.view(name)
        view.applied = view.last_healthy = kept.revision
        _set_health(ctx, view, report, total=len(kept.manifests))
        if failure is not None:
            view.target = _target_revision(ctx, name, failure.serial)
            view.mark_failed(
                failure.reason,
                _blocked_message(failure, kept.revision),
                phase=Phase.ROLLED_BACK if failure.reason == Reason.ROLLED_BACK else Phase.FAILED,
                retrying=failure.retry_at is not None,
            )
        elif report.healthy:
            view.mark_ready(_healthy_message(kept.revision, view.skipped))
        else:
            view.mark_failed(Reason.HEALTH_CHECK_FAILED, report.summary())
        ctx.views.write(view)
    return GroupOutcome(
        group=ctx.group, state=failed, healthy=report.healthy and failure is None, drift=drift
    )


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


# -- move -----------------------------------------------------------------------------------


def move(ctx: GroupContext, decision: Decision) -> GroupOutcome:
    """Render the targets, record the intent, then :func:`advance`."""
    active = decision.active
    names = [e.name for e in active]
    for name in names:
        ctx.view(name).target = _target_revision(ctx, name, ctx.serial)
    try:
        objects = render_targets(ctx, active)
    except TemporaryError as exc:
        # The group stays where it is; the next poll tries again (with backoff).
        for name in names:
            view = ctx.view(name)
            view.mark_failed(
                Reason.FETCH_FAILED,
                f"serial {ctx.serial} cannot be fetched yet: {exc} (retrying)",
                phase=Phase.PENDING,
                retrying=True,
            )
            ctx.views.write(view)
        raise
    except PermanentError as exc:
        reason = (
            exc.reason
            if exc.reason in (Reason.FETCH_FAILED, Reason.RENDER_FAILED)
            else Reason.RENDER_FAILED
        )
        failure = _failure(ctx, decision.targets, reason, str(exc))
        record = ctx.records.load(ctx.group)
        ctx.records.save(ctx.group, replace(record, failure=failure))
        for name in names:
            view = ctx.view(name)
            view.mark_failed(reason, f"serial {ctx.serial} cannot be rendered: {exc}")
            ctx.views.write(view)
        return GroupOutcome(group=ctx.group, state=GroupState.FAILED, failed_now=True)
    previous = {name: ctx.store.latest(name) for name in names}
    intent = begin(ctx, active, objects, previous, decision.targets)
    return advance(ctx, intent, active, objects)


def render_targets(
    ctx: GroupContext, active: Sequence[BundleDeploymentEntry]
) -> dict[str, list[Manifest]]:
    """The targets' objects: rendered already by the inbound pipeline, or now.

    Raises the render function's errors (FetchError: temporary; refusals: permanent).
    """
    missing = [e for e in active if e.name not in ctx.rendered]
    objects = {e.name: list(ctx.rendered[e.name]) for e in active if e.name in ctx.rendered}
    if missing:
        ctx.views.progress(
            [e.name for e in missing],
            Phase.APPLYING,
            f"fetching and rendering serial {ctx.serial} (group {ctx.group}, {ctx.position})",
        )
        fresh = ctx.render(ctx.deployment_set, missing)
        for e in missing:
            objects[e.name] = list(fresh[e.name])
    return objects


def begin(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    objects: Mapping[str, list[Manifest]],
    previous: Mapping[str, HealthyRevision | None],
    targets: Mapping[str, str],
) -> Intent:
    """Start a run per bundle and record the intent: from here on a crash is resumed."""
    now = ctx.clock()
    run_ids = {}
    for entry in active:
        view = ctx.view(entry.name)
        view.runs = ctx.runs.start(
            entry.name,
            operation="upgrade" if previous[entry.name] is not None else "install",
            serial=ctx.serial,
            sources=tuple(s.pin for s in entry.spec.sources if s.pin),
            at=now,
            message=f"moving group {ctx.group} to serial {ctx.serial}",
            history=view.runs,
        )
        run_ids[entry.name] = view.runs[0].id
    intent = Intent(
        group=ctx.group,
        phase="applying",
        run_ids=run_ids,
        started_at=format_time(now),
        bundles={
            e.name: BundleMove(
                from_revision=_number(previous[e.name]),
                target_serial=ctx.serial,
                target_digest=targets[e.name],
                target_inventory=Inventory.from_objects(objects[e.name]),
            )
            for e in active
        },
    )
    record = ctx.records.load(ctx.group)
    ctx.records.save(ctx.group, replace(record, intent=intent))
    ctx.failpoint("intent")
    return intent


def advance(
    ctx: GroupContext,
    intent: Intent,
    active: Sequence[BundleDeploymentEntry],
    objects: Mapping[str, list[Manifest]],
) -> GroupOutcome:
    """Apply the targets and check the group's health; then :func:`finish`, or
    :func:`roll_back` when a step fails."""
    previous = _previous(ctx, intent)
    try:
        result = apply_targets(ctx, active, objects, previous)
        report = check_health(ctx, active, objects, result.skipped)
    except MoveFailed as failed:
        return roll_back(ctx, intent, failed)
    finish(ctx, intent, active, objects, previous, result, report)
    return GroupOutcome(group=ctx.group, state=GroupState.MOVED, healthy=True)


def apply_targets(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    objects: Mapping[str, list[Manifest]],
    previous: Mapping[str, HealthyRevision | None],
) -> ApplyResult:
    """Dry-run the whole group, then apply it in stages. Raises MoveFailed (ApplyFailed;
    ``written`` False when the dry run refused it before anything was written)."""
    names = [e.name for e in active]
    _remember_owners(ctx, objects)
    ctx.views.progress(
        names, Phase.APPLYING, f"applying serial {ctx.serial} (group {ctx.group}, {ctx.position})"
    )
    result = _apply_moving(
        ctx,
        [
            _input(
                e.name,
                objects[e.name],
                e.spec,
                _owned(previous[e.name], _leftovers(ctx).get(e.name)),
            )
            for e in active
        ],
    )
    ctx.failpoint("applied")
    for entry in active:
        view = ctx.view(entry.name)
        view.applied = ctx.revision(entry)
        view.skipped = [str(s) for s in result.skipped if s.bundle == entry.name]
        view.resources = {**view.resources, "skipped": len(view.skipped)}
    return result


def check_health(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    objects: Mapping[str, list[Manifest]],
    skipped: Sequence[Skipped],
) -> HealthReport:
    """Wait for the whole group to be healthy. Raises MoveFailed (HealthCheckFailed)."""
    ctx.views.progress(
        [e.name for e in active],
        Phase.HEALTH_CHECKING,
        f"health-checking serial {ctx.serial} (group {ctx.group}, {ctx.position})",
    )
    ctx.failpoint("health")
    report = group_health(
        ctx.identities,
        _without(objects, skipped),
        {e.name: e.spec for e in active},
        wait=True,
        interval=ctx.settings.health_interval,
    )
    if not report.healthy:
        bad = report.failed or report.unhealthy
        culprit = bad[0] if bad else None
        raise MoveFailed(
            Reason.HEALTH_CHECK_FAILED,
            report.summary(),
            bundle=ctx.owners.get(culprit.ref) if culprit else None,
            target=culprit.name if culprit else None,
        )
    return report


def finish(
    ctx: GroupContext,
    intent: Intent,
    active: Sequence[BundleDeploymentEntry],
    objects: Mapping[str, list[Manifest]],
    previous: Mapping[str, HealthyRevision | None],
    result: ApplyResult,
    report: HealthReport,
) -> None:
    """The group is healthy: prune what the new revisions dropped, keep them in the store,
    read outputs, close the runs. The record goes last, so a crash anywhere before it redoes
    these steps (each is idempotent)."""
    ctx.failpoint("healthy")
    names = [e.name for e in active]
    ctx.views.progress(names, Phase.APPLYING, f"pruning group {ctx.group} ({ctx.position})")
    leftovers = _leftovers(ctx)
    old = {n: _owned(previous.get(n), leftovers.get(n)) for n in names}
    new = {e.name: result.inventory_of(e.name) for e in active}
    pruned = _prune(
        ctx,
        plan_prune(
            {n: inv for n, inv in old.items() if inv is not None},
            new,
            keep_crds={e.name: e.spec.keep_crds for e in active},
            claimed_elsewhere=_claimed_elsewhere(ctx, new),
        ),
        {e.name: e.spec for e in active},
    )
    ctx.failpoint("pruned")
    for entry in active:
        target = intent.bundles[entry.name].target_digest
        if _current_digest(ctx, entry.name) == target:
            continue  # saved before a crash
        ctx.store.keep(
            entry.name,
            manifests=objects[entry.name],
            inventory=new[entry.name],
            digest=target,
            spec=entry.spec,
            revision=ctx.revision(entry, intent.bundles[entry.name].target_serial),
        )
        ctx.failpoint("stored")
    for entry in active:
        _close_success(
            ctx, entry, intent, result, pruned.get(entry.name, 0), report, len(objects[entry.name])
        )
    ctx.failpoint("finished")
    ctx.records.save(ctx.group, GroupRecord())


def _close_success(
    ctx: GroupContext,
    entry: BundleDeploymentEntry,
    intent: Intent,
    result: ApplyResult,
    pruned: int,
    report: HealthReport,
    total: int,
) -> None:
    """Read the bundle's outputs and close its run; the bundle is Ready (or says which
    output could not be read)."""
    view = ctx.view(entry.name)
    serial = intent.bundles[entry.name].target_serial
    revision = ctx.revision(entry, serial)
    run_id = intent.run_ids.get(entry.name) or ctx.runs.next_id(entry.name, view.runs)
    counts = replace(result.counts_of(entry.name), pruned=pruned)
    outputs: tuple[OutputValue, ...] = ()
    outcome: RunResult = SUCCEEDED
    message = (
        f"serial {serial} applied and healthy: {counts.created} created, "
        f"{counts.configured} configured, {counts.unchanged} unchanged, {pruned} pruned"
    )
    output_error: str | None = None
    if ctx.outputs is not None:
        options = entry.spec.format_options
        try:
            outputs = ctx.outputs.collect(
                bundle=entry.name,
                outputs=entry.spec.outputs,
                reader=ctx.identities(entry.spec),
                default_namespace=options.target_namespace if options else None,
                run_id=run_id,
                serial=serial,
                now=ctx.clock(),
            )
        except PermanentError as exc:
            outcome = FAILED
            output_error = str(exc)
            message = f"serial {serial} applied and healthy, but outputs failed: {exc}"
    view.runs = ctx.runs.finish(
        entry.name,
        run_id,
        result=outcome,
        serial=serial,
        at=ctx.clock(),
        message=message,
        counts=counts,
        outputs=outputs,
    )
    view.applied = view.last_healthy = view.target = revision
    _set_health(ctx, view, report, total=total)
    if output_error is not None:
        view.mark_failed(Reason.OUTPUT_FAILED, output_error)
    else:
        view.mark_ready(_healthy_message(revision, view.skipped))
    ctx.views.write(view)


# -- roll back: the one way back ------------------------------------------------------------


def roll_back(ctx: GroupContext, intent: Intent, failed: MoveFailed) -> GroupOutcome:
    """Return every bundle of the group to its previous healthy revision.

    Nothing written (the dry run refused the group): only the failure is recorded. A first
    install (nothing to return to) is left as it is for inspection, and what it wrote is
    remembered so that removing the bundle deletes it (unless the agent is configured to
    uninstall failed installs). Otherwise the previous revisions are re-applied from the
    revision store (no hub, git server or registry needed), what the target added is deleted
    and the group's health is checked again.

    Raises TemporaryError when the rollback itself failed (the intent stays: the next pass
    tries again).
    """
    names = list(intent.bundles)
    serial = max(m.target_serial for m in intent.bundles.values())
    targets = {n: m.target_digest for n, m in intent.bundles.items()}
    why = failed.describe()
    interrupted = failed.reason == Reason.INTERRUPTED
    record = ctx.records.load(ctx.group)
    failure = (
        None
        if interrupted
        else _failure(ctx, targets, failed.reason, why, serial, record, causes=failed.causes)
    )
    if not failed.written:
        ctx.records.save(ctx.group, replace(record, intent=None, failure=failure))
        _close_runs(ctx, intent, FAILED, f"serial {serial} not applied: {why}", failed.culprit)
        for name in names:
            view = ctx.view(name)
            view.applied = view.last_healthy
            view.mark_failed(
                failed.reason,
                f"serial {serial} not applied (nothing was written): {why}" + _retry_note(failure),
                retrying=failure is not None and failure.retry_at is not None,
            )
            ctx.views.write(view)
        return GroupOutcome(group=ctx.group, state=GroupState.FAILED, failed_now=True)
    previous = _previous(ctx, intent)
    back = {n: s for n, s in previous.items() if s is not None}
    # What every bundle may have written: this target and what failed installs left.
    if not back and not ctx.settings.uninstall_failed_install:
        leftovers = dict(record.leftovers)
        for name, move in intent.bundles.items():
            leftovers[name] = _union(leftovers.get(name), move.target_inventory)
        ctx.records.save(ctx.group, GroupRecord(failure=failure, leftovers=leftovers))
        _close_runs(
            ctx, intent, FAILED, f"first install of serial {serial} failed: {why}", failed.culprit
        )
        for name in names:
            view = ctx.view(name)
            view.mark_failed(
                failed.reason,
                f"first install failed, nothing to roll back to (left as is for inspection; "
                f"removing the bundle deletes it): {why}" + _retry_note(failure),
                retrying=failure is not None and failure.retry_at is not None,
            )
            ctx.views.write(view)
        return GroupOutcome(group=ctx.group, state=GroupState.FAILED, failed_now=True)
    rolling = replace(intent, phase="rolling-back", failure=why, failure_reason=failed.reason)
    ctx.records.save(ctx.group, replace(record, intent=rolling))
    ctx.failpoint("rollback")
    ctx.views.progress(
        names, Phase.ROLLING_BACK, f"rolling back group {ctx.group} ({ctx.position}): {why}"
    )
    try:
        report = _return_to(ctx, intent, back, record.leftovers)
    except (MoveFailed, ApplyError, CrdNotEstablishedError) as exc:
        message = (
            f"rollback of group {ctx.group} failed ({exc}); retrying. It rolled back because {why}"
        )
        for name in names:
            view = ctx.view(name)
            view.mark_failed(
                Reason.ROLLBACK_FAILED, message, phase=Phase.ROLLING_BACK, retrying=True
            )
            ctx.views.write(view)
        raise TemporaryError(message) from exc
    ctx.records.save(ctx.group, GroupRecord(failure=failure))
    _close_runs(ctx, intent, ROLLED_BACK, f"serial {serial} rolled back: {why}", failed.culprit)
    for name in names:
        view = ctx.view(name)
        kept = back.get(name)
        view.applied = view.last_healthy = kept.revision if kept else None
        if report is not None and kept is not None:
            _set_health(ctx, view, report, total=len(kept.manifests))
        to = kept.revision.serial if kept and kept.revision else "-"
        if interrupted:
            view.mark_progressing(
                Phase.PENDING,
                f"serial {serial} was interrupted and rolled back to serial {to}; trying it again",
            )
        else:
            view.mark_failed(
                Reason.ROLLED_BACK,
                f"serial {serial} rolled back to serial {to}: {why}" + _retry_note(failure),
                phase=Phase.ROLLED_BACK,
                retrying=failure is not None and failure.retry_at is not None,
            )
        ctx.views.write(view)
    return GroupOutcome(group=ctx.group, state=GroupState.ROLLED_BACK, failed_now=True)


def _return_to(
    ctx: GroupContext,
    intent: Intent,
    back: Mapping[str, HealthyRevision],
    leftovers: Mapping[str, Inventory],
) -> HealthReport | None:
    """Re-apply the previous revisions, delete what the target added, check health; make the
    store's latest what runs now. Raises MoveFailed, ApplyError, CrdNotEstablishedError."""
    if back:
        _remember_owners(ctx, {n: s.manifests for n, s in back.items()})
        _apply_moving(ctx, [_input(n, s.manifests, s.spec, s.inventory) for n, s in back.items()])
        ctx.failpoint("rollback:applied")
    old = {n: _union(m.target_inventory, leftovers.get(n)) for n, m in intent.bundles.items()}
    new = {n: s.inventory for n, s in back.items()}
    plan = plan_prune(
        old,
        new,
        keep_crds={n: (s.spec.keep_crds if s.spec else True) for n, s in back.items()},
        claimed_elsewhere={k: b for k, b in ctx.claims.items() if b not in intent.bundles},
    )
    _prune(ctx, plan, {n: s.spec for n, s in back.items()})
    ctx.failpoint("rollback:pruned")
    report: HealthReport | None = None
    if back:
        report = group_health(
            ctx.identities,
            {n: s.manifests for n, s in back.items()},
            {n: s.spec for n, s in back.items()},
            wait=True,
            interval=ctx.settings.health_interval,
        )
        if not report.healthy:
            raise MoveFailed(Reason.ROLLBACK_FAILED, report.summary())
    # The store's latest must be what runs now (a crash may have saved the target).
    for name, kept in back.items():
        if ctx.store.latest_number(name) != kept.number:
            ctx.store.keep(
                name,
                manifests=kept.manifests,
                inventory=kept.inventory,
                digest=kept.digest,
                spec=kept.spec,
                revision=kept.revision,
            )
    return report


def _retry_note(failure: FailedTarget | None) -> str:
    if failure is None:
        return ""
    if failure.retry_at:
        return f" (the cluster caused it: retried by itself at {failure.retry_at})"
    return f" (tried again only with a new serial or a changed {RETRY_ANNOTATION} annotation)"


def _failure(
    ctx: GroupContext,
    targets: Mapping[str, str],
    reason: str,
    message: str,
    serial: int | None = None,
    record: GroupRecord | None = None,
    causes: Iterable[str] = (),
) -> FailedTarget:
    """The failed target to record: a failure the cluster caused gets a time to retry, later
    with each attempt at the same target."""
    target = group_target(targets)
    before = record.failure if record is not None else None
    attempts = before.attempts + 1 if before is not None and before.target == target else 1
    when = retry_at(causes or [reason], attempts, ctx.clock(), backoff=ctx.settings.retry_backoff)
    return FailedTarget(
        target=target,
        serial=serial if serial is not None else ctx.serial,
        reason=reason,
        message=message[:4000],
        retry_tokens=retry_tokens(targets, ctx.annotations),
        attempts=attempts,
        retry_at=format_time(when) if when is not None else None,
    )


def _close_runs(
    ctx: GroupContext,
    intent: Intent,
    result: RunResult,
    message: str,
    culprit: tuple[str, str] | None,
) -> None:
    """End the intent's runs; the run of the culprit's bundle names the failed object."""
    for name, run_id in intent.run_ids.items():
        view = ctx.view(name)
        view.runs = ctx.runs.finish(
            name,
            run_id,
            result=result,
            serial=intent.bundles[name].target_serial,
            at=ctx.clock(),
            message=message,
            failed_object=culprit[1] if culprit and culprit[0] == name else None,
        )


# -- resume after a crash -------------------------------------------------------------------


def resume(ctx: GroupContext, intent: Intent) -> GroupOutcome | None:
    """Finish what a crashed agent left: go on to the target when the set still wants it
    and it can still be rendered, else return the group to its previous revisions. Returns
    how that ended, or None when the group is back where it was and the gate decides anew
    (a move that was only interrupted is tried again at once)."""
    wanted = {e.name: e for e in ctx.members}
    same = all(
        name in wanted and spec_digest(wanted[name]) == move.target_digest
        for name, move in intent.bundles.items()
    )
    if intent.phase == "applying" and same:
        active = [wanted[n] for n in intent.bundles]
        try:
            objects = render_targets(ctx, active)
        except FleetletError as exc:
            if isinstance(exc, ApiUnavailableError):
                raise
            log.warning(
                "resuming group %s: the target cannot be rendered (%s): rolling back",
                ctx.group,
                exc,
            )
        else:
            log.info("resuming group %s: completing the move to serial %s", ctx.group, ctx.serial)
            return advance(ctx, intent, active, objects)
    if intent.phase == "rolling-back":
        # Said as it was when the rollback began: each retry must not wrap it once more.
        failed = MoveFailed.recorded(intent.failure_reason or Reason.ROLLED_BACK, intent.failure)
    else:
        failed = MoveFailed(Reason.INTERRUPTED, "the agent stopped in the middle of the move")
    outcome = roll_back(ctx, intent, failed)
    return None if failed.reason == Reason.INTERRUPTED else outcome


# -- helpers of the steps -------------------------------------------------------------------


def _current_digest(ctx: GroupContext, bundle: str) -> str | None:
    stored = ctx.store.latest(bundle)
    return stored.digest if stored is not None else None


def _number(stored: HealthyRevision | None) -> int | None:
    return stored.number if stored is not None else None


def _target_revision(ctx: GroupContext, name: str, serial: int) -> Revision | None:
    entry = next((e for e in ctx.members if e.name == name), None)
    return ctx.revision(entry, serial) if entry is not None else None


def _previous(ctx: GroupContext, intent: Intent) -> dict[str, HealthyRevision | None]:
    """Each bundle's revision the intent moves from (None: it had none)."""
    return {
        name: (ctx.store.get(name, move.from_revision) if move.from_revision is not None else None)
        for name, move in intent.bundles.items()
    }


def _leftovers(ctx: GroupContext) -> Mapping[str, Inventory]:
    return ctx.records.load(ctx.group).leftovers


def _owned(stored: HealthyRevision | None, leftovers: Inventory | None) -> Inventory | None:
    """What a bundle owns in the cluster: its stored revision's objects and what a failed
    first install left."""
    return (
        _union(stored.inventory if stored else None, leftovers) if (stored or leftovers) else None
    )


def _union(a: Inventory | None, b: Inventory | None) -> Inventory:
    return Inventory.of([*(a or Inventory()), *(b or Inventory())])


def _claimed_elsewhere(ctx: GroupContext, new: Mapping[str, Inventory]) -> dict[Any, str]:
    return {k: b for k, b in ctx.claims.items() if b not in new}


def _input(
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


def _apply(ctx: GroupContext, inputs: list[BundleInput]) -> ApplyResult:
    """Dry-run and apply (drift correction). Raises ApplyError, CrdNotEstablishedError."""
    return apply_group(
        ctx.kube,
        inputs,
        agent_namespace=ctx.settings.agent_namespace,
        workers=ctx.settings.workers,
        establish_timeout=ctx.settings.establish_timeout,
    )


def _apply_moving(ctx: GroupContext, inputs: list[BundleInput]) -> ApplyResult:
    """Plan and apply as part of a move; failures become MoveFailed (``written`` False when
    the whole group's dry run refused it before anything was written)."""
    try:
        plan = plan_group(inputs, ctx.kube)
    except ApplyError as exc:
        raise MoveFailed(
            exc.reason,
            str(exc),
            bundle=exc.bundle,
            target=exc.target,
            written=False,
            causes=(f.reason for f in exc.failures),
        ) from exc
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
        )
    except ApplyError as exc:
        # The first dry run covers every object that is not deferred, before any write.
        written = not exc.dry_run or any(f in deferred for f in exc.where)
        raise MoveFailed(
            Reason.APPLY_FAILED,
            str(exc),
            bundle=exc.bundle,
            target=exc.target,
            written=written,
            causes=(f.reason for f in exc.failures),
        ) from exc
    except CrdNotEstablishedError as exc:
        raise MoveFailed(Reason.APPLY_FAILED, str(exc), causes=[exc.reason]) from exc


def _prune(
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


def _remember_owners(ctx: GroupContext, objects: Mapping[str, Sequence[Manifest]]) -> None:
    ctx.owners.clear()
    for name, manifests in objects.items():
        for obj in manifests:
            ctx.owners.setdefault(ObjectRef.of(obj), name)
        spec = next((e.spec for e in ctx.members if e.name == name), None)
        for check in checks_of(spec) if spec else ():
            t = check.object
            ctx.owners.setdefault(ObjectRef(t.api_version, t.kind, t.name, t.namespace), name)


def _set_health(ctx: GroupContext, view: BundleView, report: HealthReport, *, total: int) -> None:
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
