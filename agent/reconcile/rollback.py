"""The one way back: a failed move returns the whole group to its previous healthy revisions.

:func:`roll_back` is called wherever a move cannot go on (the apply, the health check, a hook,
a crash found by :func:`agent.reconcile.group.resume`). Nothing written (the dry run refused
the group): only the failure is recorded. A first install has nothing to return to: it is left
for inspection and remembered, so removing the bundle deletes it. Otherwise the previous
revisions are re-applied from the revision store (no hub, git server or registry needed), what
the target added is deleted, and the group's health is checked again. The failed target is
recorded with how it is tried again (:func:`failed_target`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace

from agent.api import format_time
from agent.api.reasons import FAILED, ROLLED_BACK, Phase, Reason, RunResult
from agent.apply import (
    ApplyError,
    CrdNotEstablishedError,
    Inventory,
    plan_prune,
)
from agent.apply.intent import FailedTarget, GroupRecord, Intent
from agent.apply.store import HealthyRevision
from agent.errors import TemporaryError
from agent.gate import (
    RETRY_ANNOTATION,
    group_target,
    retry_at,
    retry_tokens,
)
from agent.health import HealthReport
from agent.health.group import group_health
from agent.reconcile.actions import (
    apply_input,
    apply_moving,
    previous_of,
    prune_as_owners,
    remember_owners,
    set_health,
    union,
)
from agent.reconcile.context import (
    GroupContext,
    GroupOutcome,
    GroupState,
    MoveFailed,
)
from agent.report import events

log = logging.getLogger(__name__)


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
        else failed_target(ctx, targets, failed.reason, why, serial, record, causes=failed.causes)
    )
    if not failed.written:
        ctx.records.save(ctx.group, replace(record, intent=None, failure=failure))
        close_runs(ctx, intent, FAILED, f"serial {serial} not applied: {why}", failed.culprit)
        for name in names:
            view = ctx.view(name)
            view.applied = view.last_healthy
            view.mark_failed(
                failed.reason,
                f"serial {serial} not applied (nothing was written): {why}" + retry_note(failure),
                retrying=failure is not None and failure.retry_at is not None,
            )
            ctx.views.write(view)
        return GroupOutcome(group=ctx.group, state=GroupState.FAILED, failed_now=True)
    previous = previous_of(ctx, intent)
    back = {n: s for n, s in previous.items() if s is not None}
    # What every bundle may have written: this target and what failed installs left.
    if not back and not ctx.settings.uninstall_failed_install:
        leftovers = dict(record.leftovers)
        for name, move in intent.bundles.items():
            leftovers[name] = union(leftovers.get(name), move.target_inventory)
        ctx.records.save(ctx.group, GroupRecord(failure=failure, leftovers=leftovers))
        close_runs(
            ctx, intent, FAILED, f"first install of serial {serial} failed: {why}", failed.culprit
        )
        for name in names:
            view = ctx.view(name)
            view.mark_failed(
                failed.reason,
                f"first install failed, nothing to roll back to (left as is for inspection; "
                f"removing the bundle deletes it): {why}" + retry_note(failure),
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
            ctx.event(name, Reason.ROLLBACK_FAILED, message, warning=True)
            view = ctx.view(name)
            view.mark_failed(
                Reason.ROLLBACK_FAILED, message, phase=Phase.ROLLING_BACK, retrying=True
            )
            ctx.views.write(view)
        raise TemporaryError(message) from exc
    ctx.records.save(ctx.group, GroupRecord(failure=failure))
    close_runs(ctx, intent, ROLLED_BACK, f"serial {serial} rolled back: {why}", failed.culprit)
    for name in names:
        view = ctx.view(name)
        kept = back.get(name)
        view.applied = view.last_healthy = kept.revision if kept else None
        if report is not None and kept is not None:
            set_health(ctx, view, report, total=len(kept.manifests))
        to = kept.revision.serial if kept and kept.revision else "-"
        ctx.event(
            name,
            events.ROLLED_BACK,
            f"serial {serial} rolled back to serial {to}: {why}",
            warning=not interrupted,
        )
        if interrupted:
            view.mark_progressing(
                Phase.PENDING,
                f"serial {serial} was interrupted and rolled back to serial {to}; trying it again",
            )
        else:
            view.mark_failed(
                Reason.ROLLED_BACK,
                f"serial {serial} rolled back to serial {to}: {why}" + retry_note(failure),
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
        remember_owners(ctx, {n: s.manifests for n, s in back.items()})
        apply_moving(
            ctx, [apply_input(n, s.manifests, s.spec, s.inventory) for n, s in back.items()]
        )
        ctx.failpoint("rollback:applied")
    old = {n: union(m.target_inventory, leftovers.get(n)) for n, m in intent.bundles.items()}
    new = {n: s.inventory for n, s in back.items()}
    plan = plan_prune(
        old,
        new,
        keep_crds={n: (s.spec.keep_crds if s.spec else True) for n, s in back.items()},
        claimed_elsewhere={k: b for k, b in ctx.claims.items() if b not in intent.bundles},
    )
    prune_as_owners(ctx, plan, {n: s.spec for n, s in back.items()})
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
                delete_hooks=kept.delete_hooks,
            )
    return report


def retry_note(failure: FailedTarget | None) -> str:
    if failure is None:
        return ""
    if failure.retry_at:
        return f" (the cluster caused it: retried by itself at {failure.retry_at})"
    return f" (tried again only with a new serial or a changed {RETRY_ANNOTATION} annotation)"


def failed_target(
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


def close_runs(
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
