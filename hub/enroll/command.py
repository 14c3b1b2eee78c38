"""``fleetlet hub enroll-token create|list|revoke`` (the tokens file of an enrollment directory,
on the hub's machine) and ``fleetlet hub clusters list|accept|deny`` (through the hub API, with
an API token: admin for decisions)."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from agent.options import add_output_option


def _create(args: argparse.Namespace) -> int:
    from hub.enroll.tokens import create_token, parse_allow, parse_labels
    from hub.serve import parse_duration

    token = create_token(
        Path(args.dir),
        id=args.id,
        labels=parse_labels(args.labels),
        allow_labels=parse_allow(args.allow_labels) if args.allow_labels else None,
        max_clusters=args.max_clusters,
        expires=parse_duration(args.expires),
        approve=args.approve,
        policy=args.policy or "",
    )
    print(token)
    print(
        f"enrollment token {args.id!r} stored hashed in {args.dir}/tokens.yaml; this is the only "
        "time it is shown",
        file=sys.stderr,
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from hub.cli import _emit
    from hub.enroll.tokens import EnrollTokens

    now = datetime.now(UTC)
    rows = []
    for t in EnrollTokens(Path(args.dir)).all():
        state = "revoked" if t.revoked else "expired" if now >= t.expires_at else "live"
        rows.append(
            {
                "id": t.id,
                "state": state,
                "labels": ",".join(f"{k}={v}" for k, v in sorted(t.labels.items())),
                "allowLabels": t.allow_labels,
                "maxClusters": t.max_clusters,
                "expiresAt": t.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "approve": t.approve,
                "policy": t.policy,
            }
        )
    if args.output == "table":
        print(f"{'ID':<24} {'STATE':<8} {'MAX':>4} {'APPROVE':<7} {'EXPIRES':<21} LABELS")
        for r in rows:
            print(
                f"{r['id']:<24} {r['state']:<8} {r['maxClusters']:>4} {r['approve']:<7} "
                f"{r['expiresAt']:<21} {r['labels']}"
            )
    else:
        _emit({"items": rows}, args.output)
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from hub.enroll.tokens import revoke_token

    revoke_token(Path(args.dir), args.id)
    print(f"enrollment token {args.id!r} revoked", file=sys.stderr)
    return 0


def _clusters_list(args: argparse.Namespace) -> int:
    from hub.cli import _emit
    from hub.rollout.command import _hub_call

    query = f"?state={urllib.parse.quote(args.state)}" if args.state else ""
    data = _hub_call(args, "GET", f"/enrollments{query}")
    if args.output == "table":
        print(f"{'CLUSTER':<32} {'STATE':<9} {'TOKEN':<20} {'REQUESTED':<21} {'LABELS':<24} WHY")
        for r in data["items"]:
            state = _state(r)
            labels = ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-"
            # Who decided and why, or why the token's policy left it waiting.
            why = r.get("waiting") or ""
            if r.get("decidedBy"):
                why = f"by {r['decidedBy']}" + (f": {r['reason']}" if r.get("reason") else "")
            print(
                f"{r['cluster']:<32} {state:<9} {r['token']:<20} {r['requestedAt']:<21} "
                f"{labels:<24} {why}".rstrip()
            )
    else:
        _emit(data, args.output)
    return 0


def _decide(args: argparse.Namespace) -> int:
    from hub.rollout.command import _hub_call

    verdict = args.clusters_command
    path = f"/enrollments/{urllib.parse.quote(args.cluster)}/{verdict}"
    done = _hub_call(args, "POST", path, {"reason": args.reason or ""})
    print(f"cluster {done['cluster']} {_state(done)}")
    return 0


def _state(request: dict[str, Any]) -> str:
    """``accepted (pending merge of enroll/NAME)`` while the inventory branch is not merged."""
    if request.get("pendingMerge"):
        return f"{request['state']} (pending merge of {request.get('inventoryBranch')})"
    return str(request["state"])


def register(hub_sub: Any) -> None:
    """``hub enroll-token`` and ``hub clusters`` under the ``hub`` command."""
    tokens = hub_sub.add_parser(
        "enroll-token",
        help="bootstrap tokens that let clusters enroll (stored hashed)",
        description="A token lets clusters ask to join the fleet (`fleetlet agent install "
        "--enroll`): which labels they get or may claim, how many clusters, until when. "
        "Stored hashed in ENROLL_DIR/tokens.yaml, read by `hub serve --enroll ENROLL_DIR`.",
    )
    sub = tokens.add_subparsers(dest="enroll_token_command", metavar="COMMAND", required=True)
    create = sub.add_parser("create", help="make a token, store its hash, print it once")
    create.add_argument("--dir", required=True, metavar="ENROLL_DIR")
    create.add_argument("--id", required=True, help="the token's name (shown instead of it)")
    create.add_argument(
        "--labels", metavar="K=V,...", help="labels every cluster enrolled with it gets"
    )
    create.add_argument(
        "--allow-labels",
        metavar="SELECTOR",
        help="labels a cluster may claim: `region in (eu-1,eu-2); store` (;-separated terms: "
        "key in (...), key notin (...), key=value, key)",
    )
    create.add_argument(
        "--max-clusters",
        type=int,
        default=1,
        metavar="N",
        help="clusters it may enroll (1; 0: any)",
    )
    create.add_argument("--expires", default="24h", metavar="DURATION", help="lifetime (24h)")
    create.add_argument(
        "--approve",
        choices=["auto", "manual"],
        default="auto",
        help="auto: a request within scope is accepted; manual: it waits for "
        "`hub clusters accept` (auto)",
    )
    create.add_argument(
        "--policy",
        metavar="CEL",
        help="accept automatically only when this CEL expression is true (else the request "
        "waits for a decision): over cluster, labels, claimed, facts, token; e.g. "
        "\"'apps/v1' in facts.apiGroupVersions\"",
    )
    create.set_defaults(handler=_create)
    lst = sub.add_parser("list", help="the tokens and their scope (never the tokens)")
    lst.add_argument("--dir", required=True, metavar="ENROLL_DIR")
    add_output_option(lst)
    lst.set_defaults(handler=_list)
    revoke = sub.add_parser("revoke", help="refuse every further request with this token")
    revoke.add_argument("--dir", required=True, metavar="ENROLL_DIR")
    revoke.add_argument("id")
    revoke.set_defaults(handler=_revoke)

    clusters = hub_sub.add_parser(
        "clusters",
        help="enrollment requests: pending, accepted, denied; accept or deny them",
        description="Through the hub API (`hub serve --enroll`): list enrollment requests, "
        "accept or deny a pending one (an admin token; recorded with its name).",
    )
    csub = clusters.add_subparsers(dest="clusters_command", metavar="COMMAND", required=True)
    for name, helptext in (
        ("list", "enrollment requests (--state pending shows the waiting ones)"),
        ("accept", "accept a pending request: the cluster joins the inventory"),
        ("deny", "deny a pending request"),
    ):
        p = csub.add_parser(name, help=helptext)
        if name == "list":
            p.add_argument("--state", choices=["pending", "accepted", "denied"])
            add_output_option(p)
            p.set_defaults(handler=_clusters_list)
        else:
            p.add_argument("cluster", metavar="NAME")
            p.add_argument("--reason", help="recorded with the decision")
            p.set_defaults(handler=_decide)
        p.add_argument(
            "--hub", required=True, metavar="URL", help="the hub (token: --token-file or "
            "$FLEETLET_HUB_TOKEN)"
        )  # fmt: skip
        p.add_argument("--token-file", metavar="FILE", help="the hub API token")
