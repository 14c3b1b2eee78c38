"""The agent's subcommands and their flags, registered on :mod:`fleetlet.cli`'s parser
(:func:`register`), with the argument types they parse (sizes, durations).

Part of :mod:`agent.cli`; cheap to import: each subcommand's handler (``_commands``) imports
what it needs only when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from agent.cli._commands import _approve, _deny, _health, _preview, _render, _run, _sync


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
        "--verify-sources",
        "FLEETLET_SOURCE_POLICY",
        "this cluster's own source signature policy: image sources are verified by the agent "
        "before use (docs/supply-chain.md)",
        metavar="FILE",
    )
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
        "--agent-sealing-key",
        "FLEETLET_AGENT_SEALING_KEY",
        "this agent's sealing key (from `fleetlet hub agent-key`): the hub can then tell the "
        "sensitive outputs it sealed from any sealed with the hub's public key alone",
        metavar="FILE",
    )
    flag(
        "--max-publication-validity",
        "FLEETLET_MAX_PUBLICATION_VALIDITY",
        "refuse a publication whose expiresAt is further away than this, e.g. 30d, 36h "
        "(a set signed to stay valid for years would defeat the freeze protection)",
        default="30d",
        type=_duration,
        metavar="DURATION",
    )
    flag(
        "--clock-skew",
        "FLEETLET_CLOCK_SKEW",
        "how far this cluster's clock may be off when a publication's issuedAt and expiresAt "
        "are judged, e.g. 5m",
        default="5m",
        type=_duration,
        metavar="DURATION",
    )
    flag(
        "--heartbeat",
        "FLEETLET_HEARTBEAT",
        "seconds between status heartbeats",
        default=60.0,
        type=float,
        metavar="SECONDS",
    )
    flag(
        "--git-protocol",
        "FLEETLET_GIT_PROTOCOL",
        "git protocol of the poll: 2 (one ls-refs of this cluster's branch) or 0 (libgit2's "
        "listing of every branch, for servers without v2)",
        default="2",
        choices=["0", "2"],
    )
    flag(
        "--parallel-groups",
        "FLEETLET_PARALLEL_GROUPS",
        "independent lockstep groups moved at once",
        default=4,
        type=int,
        metavar="N",
    )
    flag(
        "--retry-backoff",
        "FLEETLET_RETRY_BACKOFF",
        "seconds before a target refused for a reason the cluster caused (a missing "
        "namespace or CRD, a webhook down) is tried again by itself (doubling, up to 10 min)",
        default=30.0,
        type=float,
        metavar="SECONDS",
    )
    flag(
        "--connect-timeout",
        "FLEETLET_CONNECT_TIMEOUT",
        "seconds to wait for a connection to the API server, git, a registry or an http server",
        default=5.0,
        type=float,
        metavar="SECONDS",
    )
    flag(
        "--read-timeout",
        "FLEETLET_READ_TIMEOUT",
        "seconds to wait for an answer from a server that accepted the connection (each "
        "request is bounded by it; a failed sync is retried by the poll's backoff)",
        default=30.0,
        type=float,
        metavar="SECONDS",
    )
    flag(
        "--fetch-attempts",
        "FLEETLET_FETCH_ATTEMPTS",
        "requests made to a registry or an http server per fetch before the sync fails "
        "(with backoff and jitter between them)",
        default=3,
        type=int,
        metavar="N",
    )
    for name, var, default, what in (
        ("--max-bundle-bytes", "FLEETLET_MAX_BUNDLE_BYTES", "128Mi",
         "bytes of one bundle's files unpacked, all its sources together"),
        ("--max-bundle-files", "FLEETLET_MAX_BUNDLE_FILES", "10000",
         "files, directories and links of one bundle"),
        ("--max-file-bytes", "FLEETLET_MAX_FILE_BYTES", "16Mi", "bytes of one file of a bundle"),
        ("--max-download-bytes", "FLEETLET_MAX_DOWNLOAD_BYTES", "64Mi",
         "bytes of one download (an OCI layer, an http archive)"),
        ("--cache-max-bytes", "FLEETLET_CACHE_MAX_BYTES", "1Gi",
         "size of the content cache (least recently used content goes first)"),
    ):  # fmt: skip
        flag(name, var, f"{what}; a bundle over it is refused", default=default, type=_size,
             metavar="SIZE")  # fmt: skip
    flag(
        "--allow-agent-objects",
        "FLEETLET_ALLOW_AGENT_OBJECTS",
        "bundles (comma-separated) allowed to manage the agent's own objects: its namespace, "
        "the fleetlet.io API and CRDs, its cluster RBAC and admission policies (e.g. a bundle "
        "that upgrades the agent); off limits to every other bundle",
        metavar="BUNDLE[,BUNDLE...]",
    )
    p.add_argument("--no-status", action="store_true", help="do not push status to git")
    p.add_argument(
        "--uninstall-failed-install",
        action="store_true",
        help="delete what a failed first install created (default: leave it for inspection; "
        "removing the bundle deletes it)",
    )


def _size(text: str) -> int:
    """``64Mi``, ``1Gi``, ``500k``, ``2M`` (or bare bytes) as bytes; argparse's type."""
    units = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2,
             "gi": 1024**3}  # fmt: skip
    value = text.strip().lower()
    number = value.rstrip("kmgi")
    unit = value[len(number) :]
    try:
        size = int(float(number) * units[unit])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size (bytes, or a number with k, M, G, Ki, Mi or Gi)"
        ) from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected more than 0")
    return size


def _duration(text: str) -> Any:
    """``30d``, ``36h``, ``90m``, ``600s`` (or bare seconds) as a timedelta; argparse's type."""
    from datetime import timedelta

    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    value = text.strip()
    factor = units.get(value[-1:], 1) if value else 1
    number = value[:-1] if value[-1:] in units else value
    try:
        seconds = float(number) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (a number with d, h, m or s, e.g. 30d)"
        ) from None
    if not 0 < seconds < 10 * 365 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: expected more than 0 and under 10 years")
    return timedelta(seconds=seconds)


def _lazy(parser: argparse.ArgumentParser, add: str, run: str) -> None:
    """Flags and handler from :mod:`agent.install.flags` (the command's module, its
    manifests and the Kubernetes client are imported when one of these commands runs)."""
    from agent.install import flags as command

    getattr(command, add)(parser)
    parser.set_defaults(handler=getattr(command, run))


def register(sub: Any, only: str | None = None) -> None:
    """The agent's top-level commands; with ``only`` (the one being run), that one alone, so
    that ``fleetlet render`` does not build (nor import) the others' flags."""
    if only in (None, "agent"):
        _register_agent(sub)
    if only in (None, "render"):
        _register_render(sub)
    if only in (None, "health"):
        _register_health(sub)
    if only in (None, "preview", "approve", "deny"):
        _register_approvals(sub)


def _register_agent(sub: Any) -> None:
    from agent.options import add_logging_arguments

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
        "--drift-interval",
        type=float,
        default=float(env.get("FLEETLET_DRIFT_INTERVAL") or 300.0),
        metavar="SECONDS",
        help="seconds between drift checks of the accepted set ($FLEETLET_DRIFT_INTERVAL)",
    )
    run.add_argument(
        "--worker-timeout",
        type=float,
        default=float(env.get("FLEETLET_WORKER_TIMEOUT") or 3600.0),
        metavar="SECONDS",
        help="the longest one worker process may run (a move, its health wait and hooks); a "
        "worker still running then is killed and its job retried with backoff "
        "($FLEETLET_WORKER_TIMEOUT)",
    )
    run.add_argument(
        "--probe-address",
        metavar="ADDR",
        default=env.get("FLEETLET_PROBE_ADDRESS"),
        help="serve /healthz and /readyz on HOST:PORT, e.g. :8081 ($FLEETLET_PROBE_ADDRESS)",
    )
    run.add_argument(
        "--notify-url",
        metavar="URL",
        default=env.get("FLEETLET_NOTIFY_URL"),
        help="the hub's base URL: hold its notification channel for this cluster and poll "
        "when told; polling at --interval again while it is down ($FLEETLET_NOTIFY_URL)",
    )
    run.add_argument(
        "--notify-token-file",
        metavar="FILE",
        default=env.get("FLEETLET_NOTIFY_TOKEN_FILE"),
        help="this cluster's channel token (`fleetlet hub channel-token add`), read at each "
        "connection ($FLEETLET_NOTIFY_TOKEN_FILE)",
    )
    run.add_argument(
        "--notify-poll-interval",
        type=float,
        default=float(env.get("FLEETLET_NOTIFY_POLL_INTERVAL") or 600.0),
        metavar="SECONDS",
        help="the poll interval while the channel is up: the safety net "
        "($FLEETLET_NOTIFY_POLL_INTERVAL, 600)",
    )
    run.add_argument(
        "--warm-worker",
        action="store_true",
        default=env.get("FLEETLET_WARM_WORKER", "").lower() in ("1", "true", "yes"),
        help="keep the next worker started and loaded while idle: a move starts 1-2 s sooner, "
        "for about 90 MB more at rest ($FLEETLET_WARM_WORKER)",
    )
    run.add_argument(
        "--self-upgrade",
        choices=["on", "no-new-rules", "off"],
        default=env.get("FLEETLET_SELF_UPGRADE") or "on",
        help="what `agent install --self-upgrade` granted this agent for upgrading itself: "
        "on, no-new-rules (no rule a release adds), off (a release the set declares is "
        "reported UpgradeDisabled, not tried) ($FLEETLET_SELF_UPGRADE)",
    )
    add_logging_arguments(run, default_level="info")
    run.set_defaults(handler=_run)
    sync = agent_sub.add_parser(
        "sync",
        help="reconcile once; the exit code is the result",
        description="One reconcile: poll, verify and apply, then push status. Prints a "
        "summary line. Exit codes: 0 converged (everything Ready); 1 this sync failed (the "
        "reason on stderr); 2 usage or configuration error; 4 the sync went fine but not "
        "everything is Ready (a failure kept from an earlier sync, a group waiting).",
    )
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


def _register_render(sub: Any) -> None:
    render = sub.add_parser(
        "render",
        help="print the rendered manifests of a bundle directory",
        description=(
            "Render a bundle directory as the agent would and print the objects. Without "
            "--format the format is detected (Chart.yaml: helm; kustomization.yaml: kustomize; "
            "metadata/annotations.yaml of an OLM bundle: registry+v1; else plain) and the "
            "choice is said on stderr. Each option is the formatOptions field of the same name."
        ),
    )
    render.add_argument("bundle_dir", metavar="BUNDLE_DIR")
    render.add_argument(
        "--format",
        metavar="FORMAT",
        help="plain|kustomize|helm|registry+v1 or a plugin's name (default: detected)",
    )
    render.add_argument(
        "--path",
        metavar="SUBDIR",
        help="the directory of the tree to render (a kustomize overlay whose bases sit "
        "beside it, a chart); formatOptions.path",
    )
    render.add_argument(
        "--values",
        metavar="FILE",
        action="append",
        default=[],
        help="helm values file (repeatable, merged in order)",
    )
    render.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="helm value, helm's --set syntax (repeatable, after --values)",
    )
    render.add_argument(
        "--set-string",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="helm value, always a string (helm's --set-string)",
    )
    render.add_argument(
        "--set-json",
        metavar="KEY=JSON",
        action="append",
        default=[],
        help="helm value given as JSON (helm's --set-json)",
    )
    render.add_argument(
        "--set-file",
        metavar="KEY=FILE",
        action="append",
        default=[],
        help="helm value read from a file, as a string (helm's --set-file)",
    )
    render.add_argument("--namespace", metavar="NS", help="target namespace for namespaced objects")
    render.add_argument("--release-name", metavar="NAME", help="helm release name")
    render.add_argument(
        "--install-namespace", metavar="NS", help="registry+v1: namespace of the operator"
    )
    render.add_argument(
        "--watch-namespace", metavar="NS", help="registry+v1: the namespace it watches"
    )
    render.add_argument(
        "--kube-version",
        metavar="VERSION",
        help="Kubernetes version the cluster runs, e.g. v1.37.2 (helm's Capabilities)",
    )
    render.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    render.set_defaults(handler=_render)


def _register_health(sub: Any) -> None:
    from agent.options import add_cluster_options, add_output_option

    health = sub.add_parser(
        "health",
        help="kstatus-style health of the objects in a file",
        description="Print Current/InProgress/Failed/... for each object in FILE, and why.",
    )
    health.add_argument("-f", "--filename", required=True, metavar="FILE")
    add_output_option(health)
    add_cluster_options(health)
    health.add_argument(
        "--offline", action="store_true", help="assess the objects as written in FILE"
    )
    health.set_defaults(handler=_health)


def _register_approvals(sub: Any) -> None:
    """``fleetlet preview|approve|deny REQUEST`` (docs/approvals.md)."""
    from agent.options import add_cluster_options, add_output_option

    where = (
        " Your own kubeconfig is used (--kubeconfig, else $KUBECONFIG, else ~/.kube/config): "
        "the API server decides whether this user may (the verb approve on the request)."
    )
    preview = sub.add_parser(
        "preview",
        help="show what approving a BundleDeploymentRequest would do",
        description="Print a request's preview: the group, serial and pins, why it needs an "
        "approval, each object created, changed, deleted or refused by the server-side dry "
        "run with its diff, and the security summary (RBAC, CRDs, webhooks, privileged pods, "
        "namespaces)." + where,
    )
    approve = sub.add_parser(
        "approve",
        help="approve a BundleDeploymentRequest",
        description="Approve REQUEST as yourself (recorded as status.decidedBy); the agent "
        "then applies exactly what it pins. A decision is final." + where,
    )
    deny = sub.add_parser(
        "deny",
        help="deny a BundleDeploymentRequest",
        description="Deny REQUEST as yourself, with a reason: the group stays wholly on its "
        "current revision until a new publication. A decision is final." + where,
    )
    for p in (preview, approve, deny):
        p.add_argument("request", metavar="REQUEST", help="the BundleDeploymentRequest's name")
        add_cluster_options(p)
    approve.add_argument("--reason", metavar="TEXT", help="why (recorded on the request)")
    deny.add_argument("--reason", metavar="TEXT", required=True, help="why (required)")
    add_output_option(preview)
    preview.add_argument(
        "--full", action="store_true", help="whole diffs, from the agent's namespace"
    )
    preview.add_argument(
        "--namespace",
        metavar="NS",
        default="fleetlet-system",
        help="the agent's namespace, where whole diffs are kept (fleetlet-system)",
    )
    preview.set_defaults(handler=_preview)
    approve.set_defaults(handler=_approve)
    deny.set_defaults(handler=_deny)
