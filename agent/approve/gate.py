"""The "request approval" step of a group's move (between render and intent).

:func:`request_approval` decides whether the rendered move may go on now:

1. it needs no approval (no bundle says ``approval: manual`` and no ApprovalPolicy requires
   one): go on;
2. the group's requests are read; the one for exactly this set and these pins (each bundle's
   spec digest and the digest of the objects about to be applied) is the move's request, and
   every other pending request of the group is marked ``Superseded``;
3. none yet: the preview is computed (a server-side dry run of the whole group as each
   bundle's identity, and what pruning would delete) and the request is created;
4. a pending request is offered to the ApprovalPolicies' rules; the first that matches
   approves it as the policy's approver ServiceAccount;
5. ``Approved``: go on, with exactly these objects (nothing else is applied under this
   approval); ``Denied``: the group stays wholly where it is and says who denied it and why;
   pending: the group waits and says which request to decide, and its outcome says what
   it waits on (:class:`WaitingOn`: the request and the policies as read), so that ``agent
   run``'s supervisor starts a worker only once one of them changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agent.api import set_digest
from agent.api.reasons import Phase, Reason
from agent.apply import (
    ApplyError,
    ApplySettings,
    BundleInput,
    Inventory,
    dry_run_group,
    plan_prune,
)
from agent.apply.plan import identity
from agent.approve.approvals import Approvals, WaitingOn
from agent.approve.decide import decide
from agent.approve.policy import Policy, has_rules, judge, required_by
from agent.approve.preview import Change, Preview, build_preview, live_changes
from agent.approve.request import Request, RequestError, pins_of
from agent.kube import ForbiddenError, InvalidError, ObjectRef
from agent.report import events

if TYPE_CHECKING:
    from agent.gate import Decision
    from agent.reconcile.context import GroupContext, GroupOutcome

log = logging.getLogger(__name__)

Manifest = dict[str, Any]


def request_approval(
    ctx: GroupContext,
    decision: Decision,
    objects: Mapping[str, Sequence[Manifest]],
    applied: Mapping[str, Sequence[Manifest]] | None = None,
) -> GroupOutcome | None:
    """None when the move may go on with ``objects`` (every rendered object of each bundle,
    what the pins cover); else the group's outcome (waiting for an approval, or denied), said
    on its bundles. ``applied``: the objects the move applies (the rest are its hooks, shown
    in the preview as created, not dry-run); default all. See the module docstring.

    Raises MoveFailed (the group cannot even be dry-run: nothing is requested, nothing
    applied), RequestError, the KubeClient's errors (ApiUnavailableError: retried).
    """
    from agent.reconcile.context import GroupOutcome, GroupState, MoveFailed

    approvals = ctx.approvals
    if approvals is None:
        return None
    policies = approvals.policies()
    reasons = [
        f"bundle {e.name} asks for an approval (approval: manual)" for e in decision.approval
    ] + required_by(policies)
    if not reasons:
        return None
    names = [e.name for e in decision.active]
    digest = ctx.set_digest or set_digest(ctx.deployment_set)
    pins = pins_of(decision.targets, objects)
    requests = approvals.requests.of_group(ctx.group)
    mine = next(
        (r for r in requests if r.state != "Superseded" and r.covers(set_digest=digest, pins=pins)),
        None,
    )
    for other in requests:
        if other is not mine and other.state == "Pending":
            approvals.requests.supersede(other, serial=ctx.serial)
    if mine is None:
        ctx.views.progress(
            names,
            Phase.AWAITING_APPROVAL,
            f"previewing serial {ctx.serial} for an approval (group {ctx.group})",
        )
        try:
            preview = _preview(ctx, decision, objects, applied or objects)
        except ApplyError as exc:
            raise MoveFailed(
                exc.reason,
                f"the group cannot be dry-run for its approval preview: {exc}",
                written=False,
            ) from exc
        mine = approvals.requests.create(
            cluster=ctx.deployment_set.cluster,
            group=ctx.group,
            serial=ctx.serial,
            set_digest=digest,
            pins=pins,
            reasons=reasons,
            preview=preview,
        )
        requests = [mine, *requests]
        log.info("group %s: BundleDeploymentRequest %s made, waiting", ctx.group, mine.name)
        for name in names:
            ctx.event(
                name,
                events.APPROVAL_REQUESTED,
                f"serial {ctx.serial} of group {ctx.group} waits for an approval: "
                f"BundleDeploymentRequest {mine.name} ({_summary(mine)})",
            )
        approvals.requests.prune(ctx.group, requests)
    problems: list[str] = []
    if mine.state == "Pending" and has_rules(policies):
        mine, problems = _auto_approve(approvals, policies, mine)
    if mine.state == "Approved":
        ctx.failpoint("approved")
        approvals.requests.prune(ctx.group, requests)
        by = mine.status.decided_by
        rule = f" (ApprovalPolicy {mine.status.policy}, rule {mine.status.rule})"
        for name in names:
            ctx.event(
                name,
                events.APPROVED,
                f"BundleDeploymentRequest {mine.name} approved by {by}"
                + (rule if mine.status.policy else "")
                + f": moving group {ctx.group} to serial {ctx.serial}",
            )
        return None
    by = mine.status.decided_by
    running = _running(ctx, names)
    if mine.state == "Denied":
        message = (
            f"serial {ctx.serial} denied by {by}"
            f"{' at ' + str(mine.status.decided_at) if mine.status.decided_at else ''}: "
            f"{mine.status.reason} (BundleDeploymentRequest {mine.name}); {running}; a new "
            "publication makes a new request"
        )
        for name in names:
            view = ctx.view(name)
            if view.phase != Phase.DENIED:
                ctx.event(name, events.DENIED, message, warning=True)
            view.mark_stopped(Reason.DENIED, message, phase=Phase.DENIED)
            ctx.views.write(view)
        return GroupOutcome(group=ctx.group, state=GroupState.HELD)
    summary = _summary(mine)
    message = (
        f"serial {ctx.serial} waits for an approval of BundleDeploymentRequest {mine.name} "
        f"({summary}): `fleetlet preview {mine.name}`, then `fleetlet approve {mine.name}` or "
        f"`fleetlet deny {mine.name} --reason ...`; {running}"
    )
    if problems:
        message += "; " + "; ".join(problems)
    for name in names:
        view = ctx.view(name)
        view.mark_waiting(Reason.AWAITING_APPROVAL, message, phase=Phase.AWAITING_APPROVAL)
        ctx.views.write(view)
    waiting_on = WaitingOn(
        request=mine.name,
        request_version=mine.resource_version,
        policies={p.name: p.resource_version for p in policies},
    )
    return GroupOutcome(group=ctx.group, state=GroupState.AWAITING_APPROVAL, waiting_on=waiting_on)


def approval_holds(ctx: GroupContext, serials: Iterable[int]) -> bool:
    """Whether a move a crash interrupted (targeting ``serials``) may be finished with the
    set's current serial. Re-rendered at another serial its objects are not those approved,
    so a move that needs an approval is finished only at the serial it was approved for (else
    the group goes back and asks anew)."""
    if all(serial == ctx.serial for serial in serials) or ctx.approvals is None:
        return True
    manual = any(e.spec.approval == "manual" for e in ctx.members)
    return not (manual or required_by(ctx.approvals.policies()))


def _auto_approve(
    approvals: Approvals, policies: Sequence[Policy], request: Request
) -> tuple[Request, list[str]]:
    """The request approved by the first matching rule (as its approver), or as it was, and
    the problems met (rules that cannot be evaluated, an approver refused)."""
    verdict = judge(policies, request)
    problems = list(verdict.problems)
    for problem in problems:
        log.warning("%s", problem)
    match = verdict.match
    if match is None:
        return request, problems
    client, user = approvals.approver(match.approver)
    try:
        decided = decide(
            client,
            request.name,
            decision="Approved",
            user=user,
            policy=match.policy,
            rule=match.rule,
            reason=f"ApprovalPolicy {match.policy} rule {match.rule} matched",
        )
    except (ForbiddenError, InvalidError, RequestError) as exc:
        problem = (
            f"ApprovalPolicy {match.policy} rule {match.rule} matched, but its approver "
            f"{user} could not approve: {exc}"
        )
        log.warning("%s", problem)
        return request, [*problems, problem]
    log.info(
        "BundleDeploymentRequest %s approved by ApprovalPolicy %s rule %s",
        request.name,
        match.policy,
        match.rule,
    )
    return decided, problems


def _preview(
    ctx: GroupContext,
    decision: Decision,
    objects: Mapping[str, Sequence[Manifest]],
    applied: Mapping[str, Sequence[Manifest]],
) -> Preview:
    """The live preview of the move: the group's dry run of what it applies, its hooks (run
    during the move: created, not dry-run), and what pruning would delete. Raises ApplyError
    (objects that cannot be planned), ApiUnavailableError."""
    leftovers = ctx.records.load(ctx.group).leftovers
    inputs = []
    old: dict[str, Inventory] = {}
    for entry in decision.active:
        stored = ctx.store.latest(entry.name)
        owned = Inventory.of(
            [*(stored.inventory if stored else ()), *(leftovers.get(entry.name) or ())]
        )
        if stored is not None or entry.name in leftovers:
            old[entry.name] = owned
        # As the move will apply them: fields of objects the bundle applied before are its
        # own (taken back), others' only with takeOwnership.
        settings = replace(
            ApplySettings.from_spec(entry.spec),
            reclaim=frozenset(identity(e.ref) for e in owned),
        )
        inputs.append(BundleInput(name=entry.name, objects=applied[entry.name], settings=settings))
    results, _skipped = dry_run_group(
        ctx.kube,
        inputs,
        agent_namespace=ctx.settings.agent_namespace,
        workers=ctx.settings.workers,
        guard=ctx.settings.guard,
    )
    new = {n: Inventory.from_objects(applied[n]) for n in applied}
    deletions = plan_prune(
        old,
        new,
        keep_crds={e.name: e.spec.keep_crds for e in decision.active},
        claimed_elsewhere={k: b for k, b in ctx.claims.items() if b not in new},
    )
    return build_preview(
        [*live_changes(results, deletions), *_hooks(objects, applied)], source="live"
    )


def _hooks(
    objects: Mapping[str, Sequence[Manifest]], applied: Mapping[str, Sequence[Manifest]]
) -> list[Change]:
    """The objects of each bundle the move does not apply: its hooks, run (created) during
    the move. A hook named by ``generateName`` is shown under that prefix."""
    out = []
    for bundle, rendered in objects.items():
        kept = {id(o) for o in applied.get(bundle, ())}
        for obj in rendered:
            if id(obj) in kept:
                continue
            meta = obj.get("metadata") or {}
            name = str(meta.get("name") or str(meta.get("generateName") or "hook").rstrip("-."))
            namespace = meta.get("namespace")
            ref = ObjectRef(
                str(obj.get("apiVersion")),
                str(obj.get("kind")),
                name,
                namespace if isinstance(namespace, str) else None,
            )
            out.append(
                Change(
                    bundle=bundle,
                    ref=ref,
                    action="created",
                    after=obj,
                    note="a hook of the move: created while the group moves, not dry-run",
                )
            )
    return out


def _running(ctx: GroupContext, names: Sequence[str]) -> str:
    serials = sorted({str(v.applied.serial) for n in names if (v := ctx.view(n)).applied})
    return f"still running serial {', '.join(serials)}" if serials else "nothing applied yet"


def _summary(request: Request) -> str:
    p = request.spec.preview
    text = f"{p.created} created, {p.changed} changed, {p.deleted} deleted, {p.unchanged} unchanged"
    if p.refused:
        text += f", {p.refused} refused by the dry run"
    return text + (f"; {p.findings} security findings" if p.findings else "")


__all__ = ["Approvals", "WaitingOn", "approval_holds", "request_approval"]
