"""The flags of ``fleetlet agent install`` and ``agent uninstall``, apart from the commands
themselves (:mod:`agent.install.command`, which imports the manifests, the API types and the
Kubernetes client): building the command line's parser imports only this module, and the
handlers import the command when one of them runs."""

from __future__ import annotations

import argparse

from agent.install.names import DEFAULT_NAMESPACE
from agent.options import add_cluster_options, add_output_option
from agent.upgrade.rights import HELP, SelfUpgrade


def run_install(args: argparse.Namespace) -> int:
    from agent.install.command import run_install as run

    return run(args)


def run_uninstall(args: argparse.Namespace) -> int:
    from agent.install.command import run_uninstall as run

    return run(args)


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
        "--self-upgrade",
        choices=[m.value for m in SelfUpgrade],
        default=SelfUpgrade.ON.value,
        help="what the agent may do to upgrade itself to a release a signed set declares "
        "(docs/operations.md, 'Agent upgrades'): "
        + "; ".join(f"{m.value}: {HELP[m]}" for m in SelfUpgrade)
        + ". Run install again with another value to change it (on)",
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
