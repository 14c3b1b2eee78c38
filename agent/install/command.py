"""``fleetlet agent install`` and ``fleetlet agent uninstall``: flags in, objects out.

The files the flags name are read here (the edge); :mod:`agent.install.manifests` builds the
objects and :mod:`agent.install.installer` applies or removes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agent.install.manifests import (
    DEFAULT_NAMESPACE,
    Credentials,
    InstallConfig,
    InstallConfigError,
    install_objects,
)
from agent.options import add_cluster_options, add_output_option, kubeconfig_of
from agent.report.logs import mask


def _read(flag: str, path: str | None) -> str | None:
    """The text of the file a flag names (None when the flag is not given).

    Raises InstallConfigError naming the flag and the file.
    """
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallConfigError(f"{flag} {path}: {getattr(exc, 'strerror', None) or exc}") from exc


def _secret_file(flag: str, path: str | None) -> str | None:
    value = _read(flag, path)
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise InstallConfigError(f"{flag} {path}: the file is empty")
    mask(value)
    return value


def _credentials(args: argparse.Namespace, prefix: str) -> Credentials | None:
    flag = f"--{prefix}"
    username = getattr(args, f"{prefix.replace('-', '_')}_username")
    password = _secret_file(
        f"{flag}-password-file", getattr(args, f"{prefix.replace('-', '_')}_password_file")
    )
    token = _secret_file(
        f"{flag}-token-file", getattr(args, f"{prefix.replace('-', '_')}_token_file")
    )
    key = _read(f"{flag}-ssh-key-file", getattr(args, f"{prefix.replace('-', '_')}_ssh_key_file"))
    hosts = _read(
        f"{flag}-known-hosts-file", getattr(args, f"{prefix.replace('-', '_')}_known_hosts_file")
    )
    if key is not None:
        mask(key)
    if password is not None and token is not None:
        raise InstallConfigError(f"{flag}-password-file and {flag}-token-file: give one, not both")
    if password is not None and not username:
        raise InstallConfigError(f"{flag}-password-file needs {flag}-username")
    if not any((password, token, key)):
        if username:
            raise InstallConfigError(f"{flag}-username needs {flag}-password-file or -token-file")
        return None
    return Credentials(
        username=username or None,
        password=password,
        token=token,
        ssh_private_key=key,
        known_hosts=hosts,
    )


def _registry_config(args: argparse.Namespace) -> str | None:
    """The docker config JSON of ``--registry-config``. Raises InstallConfigError."""
    registry = _read("--registry-config", args.registry_config)
    if registry is not None:
        try:
            auths = json.loads(registry).get("auths")
        except (ValueError, AttributeError) as exc:
            raise InstallConfigError(f"--registry-config {args.registry_config}: not JSON") from exc
        if not isinstance(auths, dict):
            raise InstallConfigError(
                f"--registry-config {args.registry_config}: not a docker config JSON (no auths)"
            )
        mask(registry)
    return registry


def _source_policy(path: str | None) -> dict[str, Any]:
    """``--verify-sources FILE``, checked now and made self-contained for the Secret."""
    if not path:
        return {}
    import yaml

    from agent.install.manifests import SOURCE_TRUSTED_ROOT
    from agent.source.signed import SourcePolicyError, load_cluster_policy

    try:
        policy = load_cluster_policy(Path(path))
    except SourcePolicyError as exc:
        raise InstallConfigError(f"--verify-sources {exc}") from exc
    root = policy.trusted_root.decode() if policy.trusted_root is not None else None
    return {
        "source_policy": yaml.safe_dump(policy.document(SOURCE_TRUSTED_ROOT), sort_keys=False),
        "source_trusted_root": root,
    }


def config_from_args(args: argparse.Namespace) -> InstallConfig:
    """The installation the flags describe. Raises InstallConfigError."""
    for flag in ("repo", "cluster", "identity", "issuer"):
        if not getattr(args, flag):
            raise InstallConfigError(
                f"--{flag} is required (or --enroll HUB_URL --token-file FILE)"
            )
    trusted_root = _read("--trusted-root", args.trusted_root)
    if trusted_root is None:
        raise InstallConfigError(
            "--trusted-root FILE is required: the agent verifies every publication against it"
        )
    try:
        json.loads(trusted_root)
    except ValueError as exc:
        raise InstallConfigError(f"--trusted-root {args.trusted_root}: not JSON ({exc})") from exc
    shared = bool(getattr(args, "shared_status_repo", False))
    if (not args.status_repo or args.status_repo == args.repo) and not shared:
        raise InstallConfigError(
            "--status-repo GIT_URL is required, a repository other than --repo: with one "
            "repository a cluster's status credential could push the hub's refs too (see "
            "docs/operations.md, 'Who may push what'); --shared-status-repo keeps status in "
            "--repo knowingly"
        )
    registry = _registry_config(args)
    return InstallConfig(
        image=args.image,
        repo=args.repo,
        cluster=args.cluster,
        identity=args.identity,
        issuer=args.issuer,
        trusted_root=trusted_root,
        namespace=args.namespace,
        status_repo=args.status_repo,
        git=_credentials(args, "git"),
        status_git=_credentials(args, "status-git"),
        registry_config=registry,
        hub_public_key=_read("--hub-public-key", args.hub_public_key),
        **_source_policy(args.verify_sources),
        poll_interval=args.interval,
        log_format=args.agent_log_format,
        service_monitor=args.service_monitor,
    )


def run_install(args: argparse.Namespace) -> int:
    """Handler of ``fleetlet agent install``."""
    args.output = args.output or ("yaml" if args.dry_run else "table")
    if getattr(args, "enroll", None):
        return _run_enroll(args)
    config = config_from_args(args)
    objects = install_objects(config)
    if args.dry_run:
        sys.stdout.write(_dump(objects, args.output))
        return 0
    from agent.install.installer import install
    from agent.kube import KubeClient

    with KubeClient(kubeconfig=kubeconfig_of(args), context=args.context) as kube:
        changes = install(kube, objects, report=None if args.output != "table" else _print)
    return _summary(args, config, changes)


def _run_enroll(args: argparse.Namespace) -> int:
    """``agent install --enroll``: ask the hub (:mod:`agent.install.enroll`), then install
    what its acceptance says."""
    from agent.install.enroll import enroll
    from agent.install.installer import install
    from agent.kube import KubeClient

    given = [f"--{f.replace('_', '-')}" for f in ("repo", "identity", "issuer", "trusted_root",
             "status_repo") if getattr(args, f, None)]  # fmt: skip
    if given:
        raise InstallConfigError(
            f"--enroll: the hub says where and whom to trust; drop {', '.join(given)}"
        )
    if args.dry_run:
        raise InstallConfigError("--enroll cannot be a --dry-run: enrolling sends a request")
    token = _secret_file("--token-file", args.token_file)
    if token is None:
        raise InstallConfigError(
            "--enroll needs --token-file FILE (a `hub enroll-token create` token)"
        )
    from agent.install.enroll import parse_labels

    with KubeClient(kubeconfig=kubeconfig_of(args), context=args.context) as kube:
        config = enroll(
            kube,
            hub=args.enroll,
            token=token,
            image=args.image,
            namespace=args.namespace,
            cluster=args.cluster,
            labels=parse_labels(args.labels),
            wait=args.enroll_wait,
            report=lambda line: print(line, file=sys.stderr),
            registry_config=_registry_config(args),
            poll_interval=args.interval,
            log_format=args.agent_log_format,
            service_monitor=args.service_monitor,
            **_source_policy(args.verify_sources),
        )
        changes = install(
            kube, install_objects(config), report=None if args.output != "table" else _print
        )
    return _summary(args, config, changes)


def _summary(args: argparse.Namespace, config: InstallConfig, changes: list[Any]) -> int:
    if args.output != "table":
        sys.stdout.write(_dump_changes(changes, args.output))
    else:
        counts = {
            a: sum(c.action == a for c in changes)
            for a in ("created", "configured", "unchanged", "skipped")
        }
        print(
            f"cluster {config.cluster} is in the fleet: agent {config.image} in namespace "
            f"{config.namespace} (" + ", ".join(f"{n} {a}" for a, n in counts.items() if n) + ")"
        )
    return 0


def run_uninstall(args: argparse.Namespace) -> int:
    """Handler of ``fleetlet agent uninstall``."""
    from agent.install.installer import uninstall
    from agent.kube import KubeClient

    with KubeClient(kubeconfig=kubeconfig_of(args), context=args.context) as kube:
        changes = uninstall(
            kube,
            namespace=args.namespace,
            remove_crds=args.crds,
            report=None if args.output != "table" else _print,
        )
    if args.output != "table":
        sys.stdout.write(_dump_changes(changes, args.output))
    else:
        kept = "" if args.crds else "; CRDs and BundleDeployments kept (--crds removes them)"
        print(f"agent removed from namespace {args.namespace}{kept}")
    return 0


def _print(change: Any) -> None:
    print(f"{change} {change.action}")


def _dump(objects: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    import yaml

    from agent.api.yamlio import KUBE_DUMPER

    return yaml.dump_all(objects, Dumper=KUBE_DUMPER, sort_keys=False, default_flow_style=False)


def _dump_changes(changes: list[Any], output: str) -> str:
    items = [
        {
            "apiVersion": c.ref.api_version,
            "kind": c.ref.kind,
            "name": c.ref.name,
            "namespace": c.ref.namespace,
            "action": c.action,
        }
        for c in changes
    ]
    if output == "json":
        return json.dumps({"items": items}, indent=2) + "\n"
    import yaml

    return str(yaml.safe_dump({"items": items}, sort_keys=False))


def add_install_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``agent install``."""

    def cred_flags(prefix: str, what: str) -> None:
        p.add_argument(f"--{prefix}-username", metavar="USER", help=f"{what}: user (basic auth)")
        p.add_argument(f"--{prefix}-password-file", metavar="FILE", help=f"{what}: password")
        p.add_argument(f"--{prefix}-token-file", metavar="FILE", help=f"{what}: token")
        p.add_argument(f"--{prefix}-ssh-key-file", metavar="FILE", help=f"{what}: ssh private key")
        p.add_argument(
            f"--{prefix}-known-hosts-file", metavar="FILE", help=f"{what}: ssh known_hosts"
        )

    p.add_argument(
        "--image",
        required=True,
        metavar="REPOSITORY@sha256:DIGEST",
        help="the agent image, pinned by digest",
    )
    enrolling = p.add_argument_group(
        "enrollment",
        "instead of --repo, --identity, --issuer, --trusted-root, --status-repo and the git "
        "credentials: ask the hub (docs/operations.md, 'Enrollment')",
    )
    enrolling.add_argument(
        "--enroll", metavar="HUB_URL", help="enroll this cluster with the hub at HUB_URL"
    )
    enrolling.add_argument(
        "--token-file", metavar="FILE", help="the enrollment token (`hub enroll-token create`)"
    )
    enrolling.add_argument(
        "--labels", metavar="K=V,...", help="labels this cluster claims (within the token's scope)"
    )
    enrolling.add_argument(
        "--enroll-wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for a manual acceptance (600)",
    )
    p.add_argument("--repo", metavar="GIT_URL", help="the desired-state repo")
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="this cluster's name (with --enroll, default: derived from the kube-system UID)",
    )
    p.add_argument(
        "--identity",
        metavar="SUBJECT",
        help="the signer identity the agent accepts (certificate SAN of `hub publish`)",
    )
    p.add_argument("--issuer", metavar="URL", help="its OIDC issuer")
    p.add_argument(
        "--trusted-root",
        metavar="FILE",
        help="Sigstore trusted_root.json the agent verifies against (stored in Secret "
        "fleetlet-trust with the identity and issuer)",
    )
    p.add_argument(
        "--status-repo",
        metavar="GIT_URL",
        help="where status goes: a repository of its own (required unless --shared-status-repo)",
    )
    p.add_argument(
        "--shared-status-repo",
        action="store_true",
        help="push status to --repo itself (one repository: the status credential can then "
        "push every ref of it; the hub refuses rollout state it did not seal)",
    )
    cred_flags("git", "desired-state repo (read-only credential)")
    cred_flags("status-git", "status repo (write credential)")
    p.add_argument(
        "--registry-config",
        metavar="FILE",
        help="docker config JSON: Secret fleetlet-registry-credentials, named by bundle "
        "sources' `auth`",
    )
    p.add_argument(
        "--hub-public-key",
        metavar="FILE",
        help="the hub's X25519 public key: sensitive outputs are sealed to it",
    )
    p.add_argument(
        "--verify-sources",
        metavar="FILE",
        help="this cluster's own source signature policy (YAML: keys, identities, "
        "trustedRoot): the agent verifies every image source's cosign signature itself "
        "before using it, whatever the hub vouched for (docs/supply-chain.md)",
    )
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the agent's namespace")
    p.add_argument("--interval", type=float, metavar="SECONDS", help="poll interval (30)")
    p.add_argument(
        "--agent-log-format",
        choices=["json", "text"],
        default="json",
        help="the agent's log format (json)",
    )
    p.add_argument(
        "--service-monitor",
        action="store_true",
        help="also a Prometheus Operator ServiceMonitor (skipped if its API is not served)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the manifests instead of applying them (for kustomize or GitOps)",
    )
    add_output_option(p, default=None)  # table; the objects as YAML with --dry-run
    add_cluster_options(p)


def add_uninstall_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``agent uninstall``."""
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the agent's namespace")
    p.add_argument(
        "--crds",
        action="store_true",
        help="also delete fleetlet's CRDs, and with them every BundleDeployment and "
        "BundleOutputs (what was applied keeps running)",
    )
    add_output_option(p)
    add_cluster_options(p)
