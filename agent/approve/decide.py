"""Deciding a request: ``Approved`` or ``Denied``, as the user the client authenticates as.

The decision is written to the request's status subresource (server-side apply, with the
resourceVersion read, so a concurrent decision makes this one fail instead of overwriting it).
The API server is the authority: its ValidatingAdmissionPolicy refuses a user without the verb
``approve`` on the request, a ``decidedBy`` that is not the requesting user, a second decision
and a decision on a superseded request, each with its own message, which reaches the caller
unchanged (:class:`~agent.kube.ForbiddenError`, :class:`~agent.kube.InvalidError`). The checks
here only make the common mistakes clearer before asking.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from agent.api import format_time
from agent.api.approvals import Decision
from agent.approve.request import Request, RequestError, read, ref
from agent.kube import KubeClient

DECISION_FIELD_MANAGER = "fleetlet-approve"


def decide(
    kube: KubeClient,
    name: str,
    *,
    decision: Decision,
    reason: str = "",
    user: str | None = None,
    policy: str | None = None,
    rule: str | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Request:
    """Record ``decision`` on request ``name`` as the user ``kube`` authenticates as
    (``user``: that name when known, else asked with a SelfSubjectReview); ``policy`` and
    ``rule``: the ApprovalPolicy rule that approved it. Returns the request as decided.

    Raises RequestError (no such request, already decided, superseded, a denial without a
    reason), ForbiddenError or InvalidError (the API server refused: its message says why),
    ApiUnavailableError.
    """
    if decision == "Denied" and not reason.strip():
        raise RequestError(f"denying {name} needs a reason (--reason)")
    request = read(kube, name)
    if request.state in ("Approved", "Denied"):
        raise RequestError(
            f"BundleDeploymentRequest {name} is already {request.state} by "
            f"{request.status.decided_by} (a decision is final)"
        )
    if request.state == "Superseded":
        raise RequestError(
            f"BundleDeploymentRequest {name} is superseded: a newer publication replaced it; "
            f"decide the group's newer request (kubectl get bdr -l fleetlet.io/group="
            f"{request.spec.group})"
        )
    who = user or kube.whoami()
    now = format_time(clock().replace(microsecond=0))
    message = reason.strip() or (
        f"approved by ApprovalPolicy {policy}, rule {rule}" if policy else f"{decision} by {who}"
    )
    status: dict[str, object] = {
        "conditions": [
            {
                "type": decision,
                "status": "True",
                "reason": "ApprovedByPolicy" if policy else decision,
                "message": message[:32768],
                "lastTransitionTime": now,
            }
        ],
        "decision": decision,
        "decidedBy": who,
        "decidedAt": now,
        "reason": message[:1024],
    }
    if policy is not None:
        status["policy"] = policy
        status["rule"] = rule
    answer = kube.apply(
        {
            **ref(name),
            "metadata": {"name": name, "resourceVersion": request.resource_version},
            "status": status,
        },
        field_manager=DECISION_FIELD_MANAGER,
        force=True,
        subresource="status",
    )
    return Request.of(answer)


__all__ = ["DECISION_FIELD_MANAGER", "decide"]
