"""``fleetlet preview|approve|deny REQUEST``: a cluster admin's side of an approval.

Each command talks to the cluster with the user's own kubeconfig (``--kubeconfig``, else
``$KUBECONFIG`` or ``~/.kube/config``, as kubectl finds it): the API server authenticates the user, and its
ValidatingAdmissionPolicy decides whether they may decide (its refusal is printed as the server
wrote it). ``preview`` prints a request's preview (``-o table|json|yaml``; ``--full`` adds the
whole diffs kept in the agent's namespace).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.api import format_time, to_dict
from agent.api.approvals import RequestPreview
from agent.approve.decide import decide
from agent.approve.request import Request, read, read_full_diffs
from agent.kube import KubeClient
from agent.options import kubeconfig_of
from agent.output import render, table

DEFAULT_AGENT_NAMESPACE = "fleetlet-system"


def client(args: Any) -> KubeClient:
    """The user's client, from ``--kubeconfig``/``--context`` as kubectl resolves them.
    Raises KubeconfigError."""
    return KubeClient(kubeconfig=kubeconfig_of(args), context=args.context)


def document(request: Request, full_diffs: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The request as data (``-o json|yaml``): name, state, spec and status."""
    data: dict[str, Any] = {
        "name": request.name,
        "state": request.state,
        "spec": to_dict(request.spec),
        "status": to_dict(request.status),
    }
    if full_diffs is not None:
        data["fullDiffs"] = dict(full_diffs)
    return data


def preview_table(request: Request, full_diffs: Mapping[str, str] | None = None) -> str:
    """A person's view of a request: what, why, the decision, the objects, the findings and
    the diffs."""
    spec, status = request.spec, request.status
    decision: str = request.state
    if status.decision is not None:
        when = f" at {format_time(status.decided_at)}" if status.decided_at else ""
        decision += f" by {status.decided_by}{when}"
        if status.policy:
            decision += f" (ApprovalPolicy {status.policy}, rule {status.rule})"
        if status.reason:
            decision += f": {status.reason}"
    lines = [
        f"Request:      {request.name}",
        f"Cluster:      {spec.cluster}",
        f"Group:        {spec.group} (serial {spec.serial})",
        f"Set digest:   {spec.set_digest}",
        f"Requested by: {spec.requested_by}",
        f"State:        {decision}",
        "Why:          " + ("; ".join(spec.reasons) or "-"),
        "",
        table(
            [(p.name, p.spec_digest, p.content_digest) for p in spec.bundles],
            ["BUNDLE", "SPEC DIGEST", "CONTENT DIGEST"],
        ),
        "",
        *preview_lines(spec.preview),
    ]
    diffs = [
        (f"{o.bundle}: {o.target}", o.diff, o.truncated) for o in spec.preview.objects if o.diff
    ]
    if diffs:
        lines += ["", "Diffs:"]
        for name, text, truncated in diffs:
            whole = (full_diffs or {}).get(name) if truncated else None
            lines += [f"=== {name}", (whole or text).rstrip("\n")]
    if spec.preview.full_diff and full_diffs is None:
        lines += [
            "",
            f"Some diffs are cut: `fleetlet preview {request.name} --full` shows them whole "
            f"(ConfigMap {spec.preview.full_diff} of the agent's namespace).",
        ]
    return "\n".join(lines)


def preview_lines(preview: RequestPreview) -> list[str]:
    """The counts, the objects and the security summary of a preview, as text lines."""
    source = "server-side dry run" if preview.source == "live" else "rendered, not live"
    counts = (
        f"Objects ({source}): {preview.created} created, {preview.changed} changed, "
        f"{preview.deleted} deleted, {preview.unchanged} unchanged"
        + (f", {preview.refused} refused by the dry run" if preview.refused else "")
    )
    lines = [counts]
    if preview.objects:
        rows = [
            (
                o.action,
                o.bundle,
                o.target,
                ", ".join(o.paths[:4]) + (" ..." if len(o.paths) > 4 else ""),
            )
            for o in preview.objects
        ]
        lines += [table(rows, ["ACTION", "BUNDLE", "OBJECT", "FIELDS"])]
    if preview.omitted:
        lines.append(f"... and {preview.omitted} more objects (not listed)")
    security = preview.security
    lines += ["", f"Security: {preview.findings} finding(s)"]
    for category, found in (
        ("rbac", security.rbac),
        ("crds", security.crds),
        ("webhooks", security.webhooks),
        ("privileged", security.privileged),
        ("namespaces", security.namespaces),
    ):
        for f in found:
            lines.append(
                f"  {category:<10} {f.bundle}: {f.object} ({f.action}): " + "; ".join(f.details)
            )
    return lines


def run_preview(args: Any) -> int:
    """``fleetlet preview REQUEST``."""
    with client(args) as kube:
        request = read(kube, args.request)
        full = None
        if args.full and request.spec.preview.full_diff:
            full = read_full_diffs(kube, args.namespace, request.spec.preview.full_diff)
        elif args.full:
            full = {}
    print(
        render(
            document(request, full),
            args.output,
            table=lambda _data: preview_table(request, full),
        )
    )
    return 0


def run_decision(args: Any, decision: str) -> int:
    """``fleetlet approve|deny REQUEST``."""
    with client(args) as kube:
        decided = decide(
            kube,
            args.request,
            decision="Approved" if decision == "approve" else "Denied",
            reason=args.reason or "",
        )
    status = decided.status
    print(
        f"BundleDeploymentRequest {decided.name} {str(status.decision).lower()} by "
        f"{status.decided_by} (group {decided.spec.group}, serial {decided.spec.serial})"
    )
    return 0


__all__ = ["client", "document", "preview_lines", "preview_table", "run_decision", "run_preview"]
