"""The hub's subcommands: ``hub render|publish|diff|serve``, ``installations``, ``approve|deny``."""

from __future__ import annotations

import argparse
from typing import Any

from agent.errors import NotImplementedYetError

_OUTPUTS = ["table", "json", "yaml"]


def _not_yet(what: str, issue: str) -> Any:
    def handler(args: argparse.Namespace) -> int:
        raise NotImplementedYetError(f"{what} is not implemented yet ({issue})")

    return handler


def register(sub: Any) -> None:
    hub = sub.add_parser(
        "hub",
        help="publish a fleet repo and serve fleet status",
        description="Turn a fleet repo into signed per-cluster sets in git; serve what agents report.",
    )
    hub_sub = hub.add_subparsers(dest="hub_command", metavar="COMMAND", required=True)

    render = hub_sub.add_parser("render", help="write per-cluster sets to a directory, unsigned")
    render.add_argument("fleet_dir", metavar="FLEET_DIR")
    render.add_argument("--out", required=True, metavar="DIR")
    render.add_argument("--cluster", metavar="NAME", help="only this cluster")
    render.set_defaults(handler=_not_yet("fleetlet hub render", "the hub issue"))

    publish = hub_sub.add_parser("publish", help="resolve, render, sign and push")
    publish.add_argument("fleet_dir", metavar="FLEET_DIR")
    publish.add_argument("--repo", required=True, metavar="GIT_URL")
    publish.add_argument("--trust-config", metavar="FILE", help="Sigstore client trust config")
    publish.add_argument("--identity-token", metavar="FILE", help="OIDC identity token file")
    publish.add_argument(
        "--no-sign", action="store_true", help="UNSAFE: publish unsigned (local experiments)"
    )
    publish.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
    publish.set_defaults(handler=_not_yet("fleetlet hub publish", "the hub issue"))

    diff = hub_sub.add_parser("diff", help="show what each cluster would receive")
    diff.add_argument("fleet_dir", metavar="FLEET_DIR")
    diff.add_argument("--repo", required=True, metavar="GIT_URL")
    diff.add_argument("--cluster", metavar="NAME")
    diff.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
    diff.set_defaults(handler=_not_yet("fleetlet hub diff", "the hub issue"))

    serve = hub_sub.add_parser("serve", help="API, dashboard and status aggregation")
    serve.add_argument("--repo", required=True, metavar="GIT_URL")
    serve.add_argument("--listen", default="127.0.0.1:8080", metavar="ADDR")
    serve.set_defaults(handler=_not_yet("fleetlet hub serve", "the status issue"))


def register_installations(sub: Any) -> None:
    inst = sub.add_parser(
        "installations",
        help="installations (cluster x bundle), their runs and outputs",
        description="Porter-style view of what each cluster runs, from the hub API or git.",
    )
    inst_sub = inst.add_subparsers(dest="inst_command", metavar="COMMAND", required=True)
    for name, helptext in [("list", "list installations"), ("show", "show one installation")]:
        p = inst_sub.add_parser(name, help=helptext)
        if name == "show":
            p.add_argument("installation", metavar="CLUSTER/BUNDLE")
        p.add_argument("--hub", metavar="URL")
        p.add_argument("--repo", metavar="GIT_URL")
        p.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
        p.set_defaults(handler=_not_yet(f"fleetlet installations {name}", "the status issue"))
    for group in ("runs", "outputs"):
        g = inst_sub.add_parser(group, help=f"{group} of an installation")
        g_sub = g.add_subparsers(dest=f"{group}_command", metavar="COMMAND", required=True)
        lst = g_sub.add_parser("list", help=f"list {group} of an installation")
        lst.add_argument("installation", metavar="CLUSTER/BUNDLE")
        if group == "outputs":
            lst.add_argument("--run", default="latest", metavar="ID|latest")
        lst.add_argument("--hub", metavar="URL")
        lst.add_argument("--repo", metavar="GIT_URL")
        lst.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
        lst.set_defaults(handler=_not_yet(f"fleetlet installations {group} list", "the status issue"))

    for verb in ("approve", "deny"):
        p = sub.add_parser(verb, help=f"{verb} a BundleDeploymentRequest")
        p.add_argument("request", metavar="REQUEST")
        p.add_argument("--kubeconfig", metavar="FILE")
        p.set_defaults(handler=_not_yet(f"fleetlet {verb}", "the approvals issue"))
