"""The agent's subcommands: ``agent run``, ``agent sync``, ``render`` and ``health``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from agent.errors import NotImplementedYetError

_OUTPUTS = ["table", "json", "yaml"]


def _not_yet(what: str, issue: str) -> Any:
    def handler(args: argparse.Namespace) -> int:
        raise NotImplementedYetError(f"{what} is not implemented yet ({issue})")

    return handler


def _render(args: argparse.Namespace) -> int:
    # Imported here: rendering pulls in YAML and format plugins the other commands never need.
    from agent.render.command import run_render

    sys.stdout.write(
        run_render(bundle_dir=args.bundle_dir, format=args.format, namespace=args.namespace)
    )
    return 0


def _health(args: argparse.Namespace) -> int:
    from agent.health.command import run_health

    text, code = run_health(
        filename=args.filename,
        output=args.output,
        kubeconfig=args.kubeconfig,
        context=args.context,
        offline=args.offline,
    )
    print(text)
    return code


def _add_agent_connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", required=True, metavar="GIT_URL", help="desired-state git repo")
    p.add_argument("--cluster", required=True, metavar="NAME", help="this cluster's name")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    p.add_argument("--trusted-root", metavar="FILE", help="Sigstore trusted_root.json")
    p.add_argument("--identity", metavar="SUBJECT", help="expected signer identity (SAN)")
    p.add_argument("--issuer", metavar="URL", help="expected OIDC issuer of the signer")


def register(sub: Any) -> None:
    agent = sub.add_parser(
        "agent",
        help="run the in-cluster agent",
        description="Pull this cluster's set from git, verify it, apply it group by group.",
    )
    agent_sub = agent.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    run = agent_sub.add_parser("run", help="poll and reconcile until stopped")
    _add_agent_connection(run)
    run.add_argument("--interval", type=float, default=30.0, help="poll interval in seconds")
    run.set_defaults(handler=_not_yet("fleetlet agent run", "the agent issues"))
    sync = agent_sub.add_parser("sync", help="reconcile once; the exit code is the result")
    _add_agent_connection(sync)
    sync.add_argument("--once", action="store_true", help="one reconcile, then exit")
    sync.set_defaults(handler=_not_yet("fleetlet agent sync", "the agent issues"))

    render = sub.add_parser(
        "render",
        help="print the rendered manifests of a bundle directory",
        description="Render a bundle directory with its format and print the objects as YAML.",
    )
    render.add_argument("bundle_dir", metavar="BUNDLE_DIR")
    render.add_argument("--format", default="plain", help="plain|kustomize|helm|registry+v1")
    render.add_argument("--namespace", help="target namespace for namespaced objects")
    render.set_defaults(handler=_render)

    health = sub.add_parser(
        "health",
        help="kstatus-style health of the objects in a file",
        description="Print Current/InProgress/Failed/... for each object in FILE, and why.",
    )
    health.add_argument("-f", "--filename", required=True, metavar="FILE")
    health.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
    health.add_argument("--kubeconfig", metavar="FILE", help="assess the live objects here")
    health.add_argument("--context", metavar="NAME", help="kubeconfig context")
    health.add_argument(
        "--offline", action="store_true", help="assess the objects as written in FILE"
    )
    health.set_defaults(handler=_health)
