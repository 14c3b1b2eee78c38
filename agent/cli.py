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


def _sync(args: argparse.Namespace) -> int:
    # The pipeline is built here, at the edge, from flags; nothing below reads configuration.
    from pathlib import Path

    from agent.errors import TrustConfigError
    from agent.kube import KubeClient
    from agent.source.branch import BranchWatcher
    from agent.source.cache import ContentCache
    from agent.source.compose import ContentStore
    from agent.source.oci import OciFetcher, OciSettings
    from agent.sync import ClusterState, InboundPipeline
    from agent.verify import IdentityPolicy, TrustPolicy

    if not (args.trusted_root and args.identity and args.issuer):
        raise TrustConfigError(
            "--trusted-root, --identity and --issuer are required: the agent never applies "
            "an unverified publication"
        )
    cache = Path(args.cache_dir)
    kube = KubeClient(kubeconfig=args.kubeconfig)
    pipeline = InboundPipeline(
        cluster=args.cluster,
        watcher=BranchWatcher(repo_url=args.repo, cluster=args.cluster, cache_dir=cache),
        trust=TrustPolicy(
            trusted_root=Path(args.trusted_root),
            identity=IdentityPolicy(issuer=args.issuer, subject=args.identity),
        ),
        content=ContentStore(
            cache=ContentCache(root=cache / "content", max_bytes=1 << 30),
            oci=OciFetcher(settings=OciSettings(plain_http=args.plain_http_registries)),
        ),
        kube=kube,
        state=ClusterState(kube=kube, namespace=args.namespace),
        agent_namespace=args.namespace,
        workdir=cache / "work",
    )
    result = pipeline.sync()
    if result.outcome == "refused-before":
        print(
            f"{args.cluster}: commit {(result.commit or '-')[:12]} was refused and the branch "
            f"has not moved since ({result.refusal})",
            file=sys.stderr,
        )
        return 1
    objects = sum(len(b.objects) for b in result.bundles)
    print(
        f"{args.cluster}: {result.outcome}, serial {result.serial}, commit "
        f"{(result.commit or '-')[:12]}, {len(result.bundles)} bundles, {objects} objects "
        "rendered (applying them is not implemented yet)"
    )
    return 0


def _add_agent_connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", required=True, metavar="GIT_URL", help="desired-state git repo")
    p.add_argument("--cluster", required=True, metavar="NAME", help="this cluster's name")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    p.add_argument("--trusted-root", metavar="FILE", help="Sigstore trusted_root.json")
    p.add_argument("--identity", metavar="SUBJECT", help="expected signer identity (SAN)")
    p.add_argument("--issuer", metavar="URL", help="expected OIDC issuer of the signer")
    p.add_argument(
        "--namespace",
        default="fleetlet-system",
        help="the agent's own namespace (its state, credentials Secrets)",
    )
    p.add_argument(
        "--cache-dir", default="/var/cache/fleetlet", metavar="DIR", help="branch + content cache"
    )
    p.add_argument(
        "--plain-http-registries",
        action="store_true",
        help="talk plain HTTP to OCI registries (local registries only)",
    )


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
    sync.set_defaults(handler=_sync)

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
