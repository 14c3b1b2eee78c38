"""What the hub learns of a request: its :class:`~agent.api.status.RequestReport` in the status
document (who decided what, when and why, and the preview without diffs, bounded).

The status document stays small whatever the requests hold: at most :data:`MAX_OBJECTS`
objects and :data:`MAX_FINDINGS` findings per category are carried (the counts stay whole),
per group only the pending request and the newest decided ones, and :data:`MAX_BYTES` for all
of them (pending ones first), so requests never crowd the bundles out of the document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from agent.api.approvals import RequestPreview, SecuritySummary
from agent.api.canonical import canonical_bytes
from agent.api.status import MAX_REQUESTS, RequestReport
from agent.approve.request import Request

MAX_OBJECTS = 20
MAX_FINDINGS = 10
PER_GROUP = 3
MAX_BYTES = 64 * 1024


def brief(preview: RequestPreview) -> RequestPreview:
    """The preview without diffs, bounded."""
    security = preview.security
    objects = tuple(replace(o, diff="", truncated=False) for o in preview.objects[:MAX_OBJECTS])
    return replace(
        preview,
        objects=objects,
        omitted=preview.omitted + max(0, len(preview.objects) - MAX_OBJECTS),
        full_diff=None,
        security=SecuritySummary(
            rbac=security.rbac[:MAX_FINDINGS],
            crds=security.crds[:MAX_FINDINGS],
            webhooks=security.webhooks[:MAX_FINDINGS],
            privileged=security.privileged[:MAX_FINDINGS],
            namespaces=security.namespaces[:MAX_FINDINGS],
        ),
    )


def request_report(request: Request) -> RequestReport:
    status = request.status
    return RequestReport(
        name=request.name,
        group=request.spec.group,
        serial=request.spec.serial,
        bundles=tuple(p.name for p in request.spec.bundles),
        state=request.state,
        created_at=request.created,
        decided_by=status.decided_by,
        decided_at=status.decided_at,
        reason=status.reason,
        policy=status.policy,
        rule=status.rule,
        preview=brief(request.spec.preview),
    )


def reports(requests: Iterable[Request]) -> tuple[RequestReport, ...]:
    """Reports of the newest requests of each group (``requests`` newest first), pending ones
    first; at most :data:`~agent.api.status.MAX_REQUESTS` in all."""
    kept: dict[str, list[Request]] = {}
    for request in requests:
        mine = kept.setdefault(request.spec.group, [])
        if len(mine) < PER_GROUP or request.state == "Pending":
            mine.append(request)
    chosen = [r for group in sorted(kept) for r in kept[group]]
    chosen.sort(key=lambda r: r.state != "Pending")
    out: list[RequestReport] = []
    budget = MAX_BYTES
    for request in chosen[:MAX_REQUESTS]:
        report = request_report(request)
        size = len(canonical_bytes(report))
        if size > budget:
            break
        budget -= size
        out.append(report)
    return tuple(out)


__all__ = ["brief", "reports", "request_report"]
