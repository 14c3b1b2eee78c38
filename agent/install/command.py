"""``fleetlet agent install`` and ``fleetlet agent uninstall``: flags in, objects out.

The files the flags name are read here (the edge); :mod:`agent.install.manifests` builds the
objects and :mod:`agent.install.installer` applies or removes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from agent.install.manifests import (
    Credentials,
    InstallConfig,
    InstallConfigError,
    install_objects,
    left_out_objects,
)
from agent.options import kubeconfig_of
from agent.report.logs import mask
from agent.upgrade.rights import SelfUpgrade, SelfUpgradeError, parse


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
        self_upgrade=_self_upgrade(args),
    )


def _self_upgrade(args: argparse.Namespace) -> SelfUpgrade:
    """``--self-upgrade`` (argparse checked it; a caller building ``args`` may not have)."""
    try:
        return parse(getattr(args, "self_upgrade", None))
    except SelfUpgradeError as exc:
        raise InstallConfigError(str(exc)) from exc


def _left_out_note(config: InstallConfig) -> None:
    """``--dry-run``: what ``agent install`` would delete, said on stderr (not a manifest)."""
    for obj in left_out_objects(config):
        meta = obj["metadata"]
        print(
            f"# --self-upgrade={config.self_upgrade}: {obj['kind']} {meta['namespace']}/"
            f"{meta['name']} is left out; `agent install` deletes it (prune it in GitOps)",
            file=sys.stderr,
        )


def run_install(args: argparse.Namespace) -> int:
    """Handler of ``fleetlet agent install``."""
    args.output = args.output or ("yaml" if args.dry_run else "table")
    if getattr(args, "enroll", None):
        return _run_enroll(args)
    config = config_from_args(args)
    if args.dry_run:
        sys.stdout.write(_dump(install_objects(config), args.output))
        _left_out_note(config)
        return 0
    from agent.install.narrowing import apply_installation
    from agent.kube import KubeClient

    with KubeClient(kubeconfig=kubeconfig_of(args), context=args.context) as kube:
        changes = apply_installation(
            kube, config, report=None if args.output != "table" else _print
        )
    return _summary(args, config, changes)


def _run_enroll(args: argparse.Namespace) -> int:
    """``agent install --enroll``: ask the hub (:mod:`agent.install.enroll`), then install
    what its acceptance says."""
    from agent.install.enroll import enroll
    from agent.install.narrowing import apply_installation
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

    rights = _self_upgrade(args)
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
        config = dataclasses.replace(config, self_upgrade=rights)
        changes = apply_installation(
            kube, config, report=None if args.output != "table" else _print
        )
    return _summary(args, config, changes)


def _summary(args: argparse.Namespace, config: InstallConfig, changes: list[Any]) -> int:
    if args.output != "table":
        sys.stdout.write(_dump_changes(changes, args.output))
    else:
        counts = {
            a: sum(c.action == a for c in changes)
            for a in ("created", "configured", "unchanged", "skipped", "deleted")
        }
        rights = "" if config.self_upgrade == "on" else f", self-upgrade {config.self_upgrade}"
        print(
            f"cluster {config.cluster} is in the fleet: agent {config.image} in namespace "
            f"{config.namespace}{rights} ("
            + ", ".join(f"{n} {a}" for a, n in counts.items() if n)
            + ")"
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


# The flags live in agent.install.flags (imported by the CLI without this module's imports).
from agent.install.flags import add_install_arguments, add_uninstall_arguments  # noqa: E402

__all__ = ["add_install_arguments", "add_uninstall_arguments", "run_install", "run_uninstall"]
