"""The agent's subcommands: ``agent run``, ``agent sync``, ``render`` and ``health``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

_OUTPUTS = ["table", "json", "yaml"]


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


def _build_agent(args: argparse.Namespace) -> Any:
    """The agent's objects, built here at the edge from flags and the environment; nothing
    below reads configuration."""
    import os
    from pathlib import Path

    from agent.apply import RevisionStore
    from agent.apply.intent import GroupRecords
    from agent.bundles import BundleDeployments
    from agent.errors import TrustConfigError
    from agent.kube import KubeClient
    from agent.loop import Agent
    from agent.reconcile import Reconciler, ReconcileSettings
    from agent.report.push import StatusPusher
    from agent.report.runs import RunLog
    from agent.source.branch import BranchWatcher
    from agent.source.cache import ContentCache
    from agent.source.compose import ContentStore
    from agent.source.credentials import GitCredentials
    from agent.source.oci import OciFetcher, OciSettings
    from agent.sync import ClusterState, InboundPipeline
    from agent.verify import IdentityPolicy, TrustPolicy

    if not (args.trusted_root and args.identity and args.issuer):
        raise TrustConfigError(
            "--trusted-root, --identity and --issuer are required: the agent never applies "
            "an unverified publication"
        )
    creds_dir = os.environ.get("FLEETLET_GIT_CREDENTIALS_DIR")
    creds = GitCredentials.from_files(Path(creds_dir)) if creds_dir else GitCredentials.from_env()
    credentials = None if creds.kind == "none" else creds
    cache = Path(args.cache_dir)
    kube = KubeClient(kubeconfig=args.kubeconfig)
    namespace = args.namespace
    _check_crds(kube)
    state = ClusterState(kube=kube, namespace=namespace)
    bundles = BundleDeployments(kube=kube, owner=namespace)
    pipeline = InboundPipeline(
        cluster=args.cluster,
        watcher=BranchWatcher(
            repo_url=args.repo, cluster=args.cluster, cache_dir=cache, credentials=credentials
        ),
        trust=TrustPolicy(
            trusted_root=Path(args.trusted_root),
            identity=IdentityPolicy(issuer=args.issuer, subject=args.identity),
        ),
        content=ContentStore(
            cache=ContentCache(root=cache / "content", max_bytes=1 << 30),
            oci=OciFetcher(settings=OciSettings(plain_http=args.plain_http_registries)),
        ),
        kube=kube,
        state=state,
        agent_namespace=namespace,
        workdir=cache / "work",
        bundles=bundles,
    )
    reconciler = Reconciler(
        kube=kube,
        settings=ReconcileSettings(
            agent_namespace=namespace,
            uninstall_failed_install=args.uninstall_failed_install,
            failpoint=_failpoint(os.environ.get("FLEETLET_FAILPOINT")),
        ),
        store=RevisionStore(kube, namespace=namespace),
        records=GroupRecords(kube, namespace=namespace),
        runs=RunLog(kube, namespace=namespace),
        bundles=bundles,
        outputs=_outputs(kube, namespace, args.hub_public_key),
    )
    pusher = None
    if not args.no_status:
        # The status repository may have its own (write) credentials.
        status_dir = os.environ.get("FLEETLET_STATUS_GIT_CREDENTIALS_DIR")
        status_creds = credentials
        if status_dir and Path(status_dir).is_dir() and any(Path(status_dir).iterdir()):
            found = GitCredentials.from_files(Path(status_dir))
            status_creds = None if found.kind == "none" else found
        pusher = StatusPusher(
            repo_url=args.status_repo or args.repo,
            cluster=args.cluster,
            credentials=status_creds,
            workdir=cache / "status",
            heartbeat_interval=args.heartbeat,
        )
    return Agent(
        cluster=args.cluster,
        pipeline=pipeline,
        reconciler=reconciler,
        state=state,
        pusher=pusher,
    )


def _failpoint(spec: str | None) -> Any:
    """``FLEETLET_FAILPOINT=<step prefix>[#n]``: the agent kills itself (SIGKILL, as the OOM
    killer or a node failure would) at the n-th step whose name starts with the prefix. For
    crash-safety tests; unset in production."""
    if not spec:
        return None
    import os
    import signal

    prefix, _, nth = spec.partition("#")
    wanted = int(nth) if nth.isdigit() else 1
    hits = 0

    def failpoint(name: str) -> None:
        nonlocal hits
        if name.startswith(prefix):
            hits += 1
            if hits == wanted:
                os.kill(os.getpid(), signal.SIGKILL)

    return failpoint


def _check_crds(kube: Any) -> None:
    """Fail at once, and clearly, on a cluster without fleetlet's CRDs."""
    from agent.bundles import GROUP_VERSION, KIND
    from agent.errors import PermanentError
    from agent.kube import ApiNotServedError

    try:
        kube.resource_for(GROUP_VERSION, KIND)
    except ApiNotServedError as exc:
        raise PermanentError(
            f"{kube.server}: the fleetlet CRDs are not installed ({KIND} {GROUP_VERSION} is not "
            "served): apply crds/ first (kubectl apply --server-side -f crds/)"
        ) from exc


def _outputs(kube: Any, namespace: str, hub_key_file: str | None) -> Any:
    from pathlib import Path

    from agent.report.outputs import OutputsStage
    from agent.report.seal import read_public_key

    hub_key = read_public_key(Path(hub_key_file)) if hub_key_file else None
    return OutputsStage(kube=kube, agent_namespace=namespace, hub_key=hub_key)


def _summary(cluster: str, result: Any) -> str:
    out = result.outbound
    parts = [f"{cluster}: {result.inbound}, serial {result.serial}"]
    if out is not None:
        for label, groups in (
            ("moved", out.moved),
            ("rolled back", out.rolled_back),
            ("failed", out.failed),
            ("waiting", out.waiting),
        ):
            if groups:
                parts.append(f"{label}: {', '.join(groups)}")
        if out.drift_corrected:
            parts.append(f"{out.drift_corrected} drifted objects corrected")
    return "; ".join(parts)


def _sync(args: argparse.Namespace) -> int:
    # One clear line on failure (the error itself); progress warnings would repeat it.
    _setup_logging(args)
    agent = _build_agent(args)
    result = agent.tick()
    print(_summary(args.cluster, result))
    if result.inbound == "refused-before":
        state = agent.state.load()
        print(
            f"{args.cluster}: commit {(state.refused_commit or '-')[:12]} was refused and the "
            f"branch has not moved since ({state.refusal_reason}: {state.refusal_message})",
            file=sys.stderr,
        )
        return 1
    if result.outbound is not None and result.outbound.failed:
        return 1
    return 0


def _run(args: argparse.Namespace) -> int:
    import logging
    import signal

    from agent.probe import ProbeServer
    from agent.schedule import Poller

    _setup_logging(args)
    # The scheduler logs every run; the poller reports outcomes itself.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    agent = _build_agent(args)
    poller = Poller(
        interval=args.interval,
        jitter=args.jitter,
        max_backoff=max(args.max_backoff, args.interval),
        reconcile=agent.tick,
    )
    probe = (
        ProbeServer(args.probe_address, agent=agent, poller=poller) if args.probe_address else None
    )

    def stop(signum: int, frame: Any) -> None:
        poller.stop(wait=False)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if probe is not None:
        probe.start()
    poller.start()
    try:
        poller.wait()
    finally:
        poller.stop(wait=True)
        if probe is not None:
            probe.stop()
    return 0


def _setup_logging(args: argparse.Namespace) -> None:
    from agent.report.logs import setup_logging

    setup_logging(level=args.log_level, format=args.log_format, cluster=args.cluster)


def add_logging_arguments(p: argparse.ArgumentParser, *, default_level: str) -> None:
    """``--log-level`` and ``--log-format`` (also for the hub's commands)."""
    import os

    from agent.report.logs import FORMATS, LEVELS

    p.add_argument(
        "--log-level",
        choices=LEVELS,
        default=os.environ.get("FLEETLET_LOG_LEVEL") or default_level,
        help=f"least severe level logged ($FLEETLET_LOG_LEVEL, default {default_level})",
    )
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get("FLEETLET_LOG_FORMAT") or "text",
        help="text lines, or one JSON object per line with cluster, bundle, group, serial and "
        "run where they apply ($FLEETLET_LOG_FORMAT, default text)",
    )


def _add_agent_connection(p: argparse.ArgumentParser) -> None:
    # Each flag's default comes from its FLEETLET_* variable (the Deployment's ConfigMaps).
    import os

    env = os.environ

    def flag(name: str, var: str, help: str, **kw: Any) -> None:
        # Pop first: a set variable must not leave a second ``default`` in ``kw``.
        fallback = kw.pop("default", None)
        default = env.get(var) or fallback
        required = kw.pop("required", False) and default is None
        p.add_argument(name, default=default, required=required, help=f"{help} (${var})", **kw)

    flag("--repo", "FLEETLET_REPO", "desired-state git repo", metavar="GIT_URL", required=True)
    flag("--cluster", "FLEETLET_CLUSTER", "this cluster's name", metavar="NAME", required=True)
    flag("--kubeconfig", "FLEETLET_KUBECONFIG", "kubeconfig (default: in-cluster)", metavar="FILE")
    flag("--trusted-root", "FLEETLET_TRUSTED_ROOT", "Sigstore trusted_root.json", metavar="FILE")
    flag("--identity", "FLEETLET_IDENTITY", "expected signer identity (SAN)", metavar="SUBJECT")
    flag("--issuer", "FLEETLET_ISSUER", "expected OIDC issuer of the signer", metavar="URL")
    flag(
        "--namespace",
        "FLEETLET_NAMESPACE",
        "the agent's own namespace (state, revision store, credentials Secrets)",
        default="fleetlet-system",
    )
    flag(
        "--cache-dir",
        "FLEETLET_CACHE_DIR",
        "branch + content cache",
        default="/var/cache/fleetlet",
        metavar="DIR",
    )
    p.add_argument(
        "--plain-http-registries",
        action="store_true",
        default=env.get("FLEETLET_PLAIN_HTTP_REGISTRIES", "").lower() in ("1", "true", "yes"),
        help="talk plain HTTP to OCI registries (local registries only; "
        "$FLEETLET_PLAIN_HTTP_REGISTRIES=true)",
    )
    flag(
        "--status-repo",
        "FLEETLET_STATUS_REPO",
        "where status goes, on fleetlet/status/<cluster> (default: --repo; a separate "
        "repository keeps the desired-state repository read-only to agents)",
        metavar="GIT_URL",
    )
    flag(
        "--hub-public-key",
        "FLEETLET_HUB_PUBLIC_KEY",
        "the hub's X25519 public key: sensitive outputs are sealed to it (without it they "
        "are omitted from the status)",
        metavar="FILE",
    )
    flag(
        "--heartbeat",
        "FLEETLET_HEARTBEAT",
        "seconds between status heartbeats",
        default=60.0,
        type=float,
        metavar="SECONDS",
    )
    p.add_argument("--no-status", action="store_true", help="do not push status to git")
    p.add_argument(
        "--uninstall-failed-install",
        action="store_true",
        help="delete what a failed first install created (default: leave it for inspection)",
    )


def _lazy(parser: argparse.ArgumentParser, add: str, run: str) -> None:
    """Flags and handler from :mod:`agent.install.command` (imported only by these commands'
    registration, which is cheap: the Kubernetes client is imported when they run)."""
    from agent.install import command

    getattr(command, add)(parser)
    parser.set_defaults(handler=getattr(command, run))


def register(sub: Any) -> None:
    agent = sub.add_parser(
        "agent",
        help="run the in-cluster agent",
        description="Pull this cluster's set from git, verify it, apply it group by group.",
    )
    agent_sub = agent.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    run = agent_sub.add_parser("run", help="poll and reconcile until stopped")
    _add_agent_connection(run)
    env = __import__("os").environ
    run.add_argument(
        "--interval",
        type=float,
        default=float(env.get("FLEETLET_POLL_INTERVAL") or 30.0),
        help="poll interval in seconds ($FLEETLET_POLL_INTERVAL)",
    )
    run.add_argument(
        "--jitter",
        type=float,
        default=float(env.get("FLEETLET_POLL_JITTER") or 5.0),
        help="up to this many seconds added to each wait ($FLEETLET_POLL_JITTER)",
    )
    run.add_argument(
        "--max-backoff", type=float, default=300.0, help="cap of the backoff after errors"
    )
    run.add_argument(
        "--probe-address",
        metavar="ADDR",
        default=env.get("FLEETLET_PROBE_ADDRESS"),
        help="serve /healthz and /readyz on HOST:PORT, e.g. :8081 ($FLEETLET_PROBE_ADDRESS)",
    )
    add_logging_arguments(run, default_level="info")
    run.set_defaults(handler=_run)
    sync = agent_sub.add_parser("sync", help="reconcile once; the exit code is the result")
    _add_agent_connection(sync)
    sync.add_argument("--once", action="store_true", help="one reconcile, then exit")
    add_logging_arguments(sync, default_level="error")
    sync.set_defaults(handler=_sync)
    install = agent_sub.add_parser(
        "install",
        help="put this cluster into a fleet (idempotent)",
        description="Apply everything the agent needs to this cluster, in order: fleetlet's "
        "CRDs, the agent's namespace, least-privilege RBAC, its configuration (repository, "
        "cluster, trusted root and identity policy, credentials), and the Deployment pinned to "
        "an image digest. Running it again changes nothing; with another --image it upgrades. "
        "--dry-run -o yaml prints the objects instead (for kustomize or GitOps).",
    )
    _lazy(install, "add_install_arguments", "run_install")
    uninstall = agent_sub.add_parser(
        "uninstall",
        help="take this cluster out of the fleet",
        description="Remove the agent, its configuration and RBAC, and its namespace if install "
        "created it. fleetlet's CRDs (and so every BundleDeployment) stay unless --crds; what "
        "the agent applied keeps running.",
    )
    _lazy(uninstall, "add_uninstall_arguments", "run_uninstall")

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
