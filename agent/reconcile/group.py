"""One lockstep group's part of a reconcile pass, as a pipeline read top to bottom.

    resume   a move a crash interrupted: finish it, or return the group (agent.apply.intent)
    gate     paused, dependsOn, a failed target (agent.gate; held and steady groups:
             agent.reconcile.steady)
    move     render -> request approval (when needed: agent.approve; while a decision is
             awaited, or after a denial, the running revisions are kept: drift put back)
             -> intent -> namespaces -> pre hooks
             -> dry run + staged apply, wave by wave -> Sync hooks -> health of the whole
             group -> post hooks
    finish   prune -> revision store -> outputs -> runs -> intent cleared
    or       roll back: the one way back to the previous healthy revisions
             (agent.reconcile.rollback)
    keep     nothing to move: correct drift, assess health once (agent.reconcile.steady)

Each step is a function of the :class:`~agent.reconcile.context.GroupContext`; a step that
cannot go on raises :class:`~agent.reconcile.context.MoveFailed`, which
:func:`~agent.reconcile.rollback.roll_back` handles. What the steps do to the cluster in detail
is in :mod:`agent.reconcile.actions`. Status goes to the BundleDeployments between steps
(``views.progress``), and each move is a run in every bundle's history. The intent is recorded
in the cluster before the first write and cleared last, so a crash anywhere is resumed at the
next start.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from agent.api import BundleDeploymentEntry, format_time
from agent.api.reasons import FAILED, SUCCEEDED, Phase, Reason, RunResult
from agent.api.status import OutputValue
from agent.apply import (
    ApplyResult,
    Inventory,
    Skipped,
    plan_prune,
)
from agent.apply.hooks import (
    FAIL,
    MOMENTS,
    POST,
    POST_DELETE,
    PRE,
    PRE_DELETE,
    SYNC,
    HookError,
    HookFailedError,
    Split,
    run_hooks,
    split,
)
from agent.apply.intent import BundleMove, GroupRecord, Intent
from agent.apply.store import HealthyRevision
from agent.approve.gate import approval_holds, request_approval
from agent.errors import FleetletError, PermanentError, TemporaryError
from agent.gate import (
    Decision,
    Verdict,
    decide,
    spec_digest,
)
from agent.health import HealthReport
from agent.health.group import group_health
from agent.kube import ApiUnavailableError, KubeApiError, ObjectRef
from agent.reconcile.actions import (
    apply_input,
    apply_moving,
    claimed_elsewhere,
    current_digest,
    healthy_message,
    leftovers_of,
    number_of,
    owned,
    previous_of,
    prune_as_owners,
    remember_owners,
    set_health,
    target_revision,
    without_skipped,
)
from agent.reconcile.context import (
    GroupContext,
    GroupOutcome,
    GroupState,
    Manifest,
    MoveFailed,
)
from agent.reconcile.rollback import failed_target, roll_back
from agent.reconcile.steady import keep, keep_running, report_held
from agent.report import events

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
        current={e.name: current_digest(ctx, e.name) for e in ctx.members},
        failure=record.failure,
        now=ctx.clock(),
    )
    report_held(ctx, decision)
    match decision.verdict:
        case Verdict.HELD:
            return GroupOutcome(group=ctx.group, state=GroupState.HELD, healthy=True)
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


def move(ctx: GroupContext, decision: Decision) -> GroupOutcome:
    """Render the targets, have them approved when they need it (only exactly these objects
    are applied under an approval), record the intent, then :func:`advance`."""
    active = decision.active
    names = [e.name for e in active]
    # Bundles that already wait for a decision on this very target render it again only to
    # find their request: their status does not flicker to "rendering" and back (a write,
    # and a change the supervisor's drift check would take for drift, every pass).
    waiting = {
        name
        for name in names
        if (view := ctx.view(name)).phase in (Phase.AWAITING_APPROVAL, Phase.DENIED)
        and view.target == target_revision(ctx, name, ctx.serial)
    }
    for name in names:
        ctx.view(name).target = target_revision(ctx, name, ctx.serial)
    try:
        objects = render_targets(ctx, active, quiet=waiting)
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
            if exc.reason
            in (Reason.FETCH_FAILED, Reason.RENDER_FAILED, Reason.SOURCE_SIGNATURE_REFUSED)
            else Reason.RENDER_FAILED
        )
        return _refuse_render(ctx, decision, reason, exc)
    previous = {name: ctx.store.latest(name) for name in names}
    try:
        splits = split_hooks(active, objects, previous)
    except HookError as exc:
        return _refuse_render(ctx, decision, Reason.RENDER_FAILED, exc)
    guarded = _guarded_hooks(ctx, splits)
    if guarded:
        return _refuse_render(ctx, decision, "ProtectedObject", "; ".join(guarded))
    held = request_approval(ctx, decision, objects, {n: s.main for n, s in splits.items()})
    if held is not None:
        # Not moving (a decision awaited, or a denial): what runs is still corrected.
        return replace(held, drift=keep_running(ctx, active))
    intent = begin(ctx, active, {n: s.main for n, s in splits.items()}, previous, decision.targets)
    return advance(ctx, intent, active, splits)


def _refuse_render(
    ctx: GroupContext, decision: Decision, reason: str, exc: Exception | str
) -> GroupOutcome:
    """The targets cannot be rendered (or their hooks cannot be honoured): recorded as a failed
    target, nothing written."""
    failure = failed_target(ctx, decision.targets, reason, str(exc))
    record = ctx.records.load(ctx.group)
    ctx.records.save(ctx.group, replace(record, failure=failure))
    for entry in decision.active:
        view = ctx.view(entry.name)
        view.mark_failed(reason, f"serial {ctx.serial} cannot be rendered: {exc}")
        ctx.views.write(view)
    return GroupOutcome(group=ctx.group, state=GroupState.FAILED, failed_now=True)


def _guarded_hooks(ctx: GroupContext, splits: Mapping[str, Split]) -> list[str]:
    """The hooks the guard refuses (hooks are created, not planned: checked here)."""
    guard = ctx.settings.guard
    if guard is None:
        return []
    found = []
    for name, split_of in splits.items():
        for moment in MOMENTS:
            for hook in split_of.of(moment):
                meta = hook.manifest.get("metadata") or {}
                ref = ObjectRef(
                    str(hook.manifest.get("apiVersion")),
                    str(hook.manifest.get("kind")),
                    str(meta.get("name") or meta.get("generateName") or ""),
                    meta.get("namespace"),
                )
                refusal = guard.refusal(name, ref)
                if refusal is not None:
                    found.append(f"bundle {name}: hook {hook.name}: {refusal}")
    return found


def split_hooks(
    active: Sequence[BundleDeploymentEntry],
    objects: Mapping[str, list[Manifest]],
    previous: Mapping[str, HealthyRevision | None],
) -> dict[str, Split]:
    """Each bundle's objects to apply and its hooks (Helm's install or upgrade hooks, by
    whether it has a healthy revision here). Raises HookError."""
    return {
        e.name: split(e.name, objects[e.name], install=previous.get(e.name) is None) for e in active
    }


def render_targets(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    *,
    quiet: Collection[str] = (),
) -> dict[str, list[Manifest]]:
    """The targets' objects: rendered already by the inbound pipeline, or now (said on the
    bundles, but those in ``quiet``).

    Raises the render function's errors (FetchError: temporary; refusals: permanent).
    """
    missing = [e for e in active if e.name not in ctx.rendered]
    objects = {e.name: list(ctx.rendered[e.name]) for e in active if e.name in ctx.rendered}
    if missing:
        ctx.views.progress(
            [e.name for e in missing if e.name not in quiet],
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
                from_revision=number_of(previous[e.name]),
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
    splits: Mapping[str, Split],
) -> GroupOutcome:
    """The Namespaces, pre hooks, apply the targets (wave by wave), Sync hooks, the group's
    health, post hooks; then :func:`finish`, or :func:`roll_back` when a step fails (after the group's
    SyncFail hooks)."""
    previous = previous_of(ctx, intent)
    objects = {n: s.main for n, s in splits.items()}
    try:
        namespaces_first(ctx, active, splits, previous)
        hooks = run_moment(ctx, active, splits, PRE)
        result = apply_targets(ctx, active, objects, previous)
        hooks += run_moment(ctx, active, splits, SYNC)
        report = check_health(ctx, active, objects, result.skipped)
        hooks += run_moment(ctx, active, splits, POST)
    except MoveFailed as failed:
        with contextlib.suppress(MoveFailed, FleetletError):
            run_moment(ctx, active, splits, FAIL)
        return roll_back(ctx, intent, failed)
    finish(ctx, intent, active, splits, previous, result, report, hooks)
    return GroupOutcome(group=ctx.group, state=GroupState.MOVED, healthy=True)


def namespaces_first(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    splits: Mapping[str, Split],
    previous: Mapping[str, HealthyRevision | None],
) -> None:
    """Apply the group's Namespaces (``createNamespace``'s and the bundles' own) before any
    hook, as ``helm install --create-namespace`` does: pre hooks live in them. Only when the
    group has hooks to run; the staged apply applies them again (unchanged).
    Raises MoveFailed (ApplyFailed)."""
    if not any(s.of(m) for s in splits.values() for m in (PRE, SYNC, POST)):
        return
    namespaces = {
        e.name: [o for o in splits[e.name].main if o.get("kind") == "Namespace"] for e in active
    }
    if not any(namespaces.values()):
        return
    leftovers = leftovers_of(ctx)
    apply_moving(
        ctx,
        [
            apply_input(
                e.name, namespaces[e.name], e.spec, owned(previous[e.name], leftovers.get(e.name))
            )
            for e in active
            if namespaces[e.name]
        ],
    )


def run_moment(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    splits: Mapping[str, Split],
    moment: str,
) -> list[str]:
    """Run the group's hooks of one moment (all bundles', as Helm runs them: see
    :func:`~agent.apply.hooks.run_hooks`), each as its bundle's identity and within its
    bundle's health timeout. Returns what ran. Raises MoveFailed (HookFailed)."""
    hooks = [h for e in active for h in splits[e.name].of(moment)]
    if not hooks:
        return []
    specs = {e.name: e.spec for e in active}
    ctx.views.progress(
        [e.name for e in active],
        Phase.APPLYING,
        f"running {len(hooks)} {moment} hook(s) of serial {ctx.serial} "
        f"(group {ctx.group}, {ctx.position})",
    )
    ctx.failpoint(f"hooks:{moment}")
    try:
        return run_hooks(
            hooks,
            client_for=lambda bundle: ctx.identities(specs[bundle]),
            timeout_for=lambda bundle: float(specs[bundle].health_checks.timeout_seconds),
        )
    except HookFailedError as exc:
        raise MoveFailed(Reason.HOOK_FAILED, str(exc), bundle=exc.bundle, target=exc.hook) from exc
    except KubeApiError as exc:
        raise MoveFailed(
            Reason.HOOK_FAILED, f"a {moment} hook cannot be created: {exc}", causes=[exc.reason]
        ) from exc


def apply_targets(
    ctx: GroupContext,
    active: Sequence[BundleDeploymentEntry],
    objects: Mapping[str, list[Manifest]],
    previous: Mapping[str, HealthyRevision | None],
) -> ApplyResult:
    """Dry-run the whole group, then apply it in stages. Raises MoveFailed (ApplyFailed;
    ``written`` False when the dry run refused it before anything was written)."""
    names = [e.name for e in active]
    remember_owners(ctx, objects)
    ctx.views.progress(
        names, Phase.APPLYING, f"applying serial {ctx.serial} (group {ctx.group}, {ctx.position})"
    )
    specs = {e.name: e.spec for e in active}

    def wave_healthy(applied: ApplyResult) -> None:
        # The objects applied so far (earlier waves) must be healthy before the next wave.
        done = {(r.bundle, r.ref) for r in applied.objects}
        so_far = {n: [o for o in objects[n] if (n, ObjectRef.of(o)) in done] for n in objects}
        report = group_health(
            ctx.identities, so_far, specs, wait=True, interval=ctx.settings.health_interval
        )
        if not report.healthy:
            raise _unhealthy(ctx, report, "an earlier wave is not healthy: ")

    result = apply_moving(
        ctx,
        [
            apply_input(
                e.name,
                objects[e.name],
                e.spec,
                owned(previous[e.name], leftovers_of(ctx).get(e.name)),
            )
            for e in active
        ],
        between_waves=wave_healthy,
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
    started = time.monotonic()
    report = group_health(
        ctx.identities,
        without_skipped(objects, skipped),
        {e.name: e.spec for e in active},
        wait=True,
        interval=ctx.settings.health_interval,
    )
    if ctx.metrics is not None:
        ctx.metrics.health_waited(time.monotonic() - started, healthy=report.healthy)
    if not report.healthy:
        raise _unhealthy(ctx, report)
    return report


def _unhealthy(ctx: GroupContext, report: HealthReport, prefix: str = "") -> MoveFailed:
    bad = report.failed or report.unhealthy
    culprit = bad[0] if bad else None
    return MoveFailed(
        Reason.HEALTH_CHECK_FAILED,
        prefix + report.summary(),
        bundle=ctx.owners.get(culprit.ref) if culprit else None,
        target=culprit.name if culprit else None,
    )


def finish(
    ctx: GroupContext,
    intent: Intent,
    active: Sequence[BundleDeploymentEntry],
    splits: Mapping[str, Split],
    previous: Mapping[str, HealthyRevision | None],
    result: ApplyResult,
    report: HealthReport,
    hooks: Sequence[str] = (),
) -> None:
    """The group is healthy: prune what the new revisions dropped, keep them in the store,
    read outputs, close the runs. The record goes last, so a crash anywhere before it redoes
    these steps (each is idempotent)."""
    ctx.failpoint("healthy")
    objects = {n: s.main for n, s in splits.items()}
    names = [e.name for e in active]
    ctx.views.progress(names, Phase.APPLYING, f"pruning group {ctx.group} ({ctx.position})")
    leftovers = leftovers_of(ctx)
    old = {n: owned(previous.get(n), leftovers.get(n)) for n in names}
    new = {e.name: result.inventory_of(e.name) for e in active}
    pruned = prune_as_owners(
        ctx,
        plan_prune(
            {n: inv for n, inv in old.items() if inv is not None},
            new,
            keep_crds={e.name: e.spec.keep_crds for e in active},
            claimed_elsewhere=claimed_elsewhere(ctx, new),
        ),
        {e.name: e.spec for e in active},
    )
    ctx.failpoint("pruned")
    for entry in active:
        target = intent.bundles[entry.name].target_digest
        if current_digest(ctx, entry.name) == target:
            continue  # saved before a crash
        split_of = splits[entry.name]
        ctx.store.keep(
            entry.name,
            manifests=objects[entry.name],
            inventory=new[entry.name],
            digest=target,
            spec=entry.spec,
            revision=ctx.revision(entry, intent.bundles[entry.name].target_serial),
            delete_hooks=[h.manifest for h in split_of.of(PRE_DELETE) + split_of.of(POST_DELETE)],
        )
        ctx.failpoint("stored")
    for entry in active:
        mine = [
            h for h in hooks if h in {x.name for m in MOMENTS for x in splits[entry.name].of(m)}
        ]
        _close_success(
            ctx,
            entry,
            intent,
            result,
            pruned.get(entry.name, 0),
            report,
            len(objects[entry.name]),
            hooks=mine,
            not_run=splits[entry.name].not_run,
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
    *,
    hooks: Sequence[str] = (),
    not_run: Sequence[str] = (),
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
    if hooks:
        message += f"; hooks run: {', '.join(hooks)}"
    if not_run:
        message += f"; hooks not run (tests, rollback hooks, Skip): {', '.join(not_run)}"
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
    set_health(ctx, view, report, total=total)
    if output_error is not None:
        view.mark_failed(Reason.OUTPUT_FAILED, output_error)
    else:
        view.mark_ready(healthy_message(revision, view.skipped))
    ctx.views.write(view)
    ctx.event(entry.name, events.MOVED, f"group {ctx.group} moved to serial {serial}: {message}")


def resume(ctx: GroupContext, intent: Intent) -> GroupOutcome | None:
    """Finish what a crashed agent left: go on to the target when the set still wants it
    and it can still be rendered, else return the group to its previous revisions. Returns
    how that ended, or None when the group is back where it was and the gate decides anew
    (a move that was only interrupted is tried again at once)."""
    wanted = {e.name: e for e in ctx.members}
    same = all(
        name in wanted and spec_digest(wanted[name]) == move.target_digest
        for name, move in intent.bundles.items()
    ) and approval_holds(ctx, (m.target_serial for m in intent.bundles.values()))
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
            previous = previous_of(ctx, intent)
            with contextlib.suppress(HookError):
                return advance(ctx, intent, active, split_hooks(active, objects, previous))
    if intent.phase == "rolling-back":
        # Said as it was when the rollback began: each retry must not wrap it once more.
        failed = MoveFailed.recorded(intent.failure_reason or Reason.ROLLED_BACK, intent.failure)
    else:
        failed = MoveFailed(Reason.INTERRUPTED, "the agent stopped in the middle of the move")
    outcome = roll_back(ctx, intent, failed)
    return None if failed.reason == Reason.INTERRUPTED else outcome
