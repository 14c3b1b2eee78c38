"""Every command run without what it needs (no cluster, no kubeconfig, a cluster that refuses
the credentials, no hub, a wrong hub token, an unreachable git server, wrong git credentials,
a missing directory) says in one line what is missing and how to provide it, with the exit code
of its kind (2: configuration, 1: failure)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from hub.api.tokens import write_clear_tokens
from tests.fleetlab import REPO_ROOT
from tests.realenv.gitserver import GitDaemon, GitHttpServer
from tests.realenv.hubserver import serving_hub
from tests.realenv.kube import Cluster
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_crds import crds as crds  # the fixture: the CRDs installed
from tests.test_hub_status import new_repo

DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: example/web:1}]}
"""


def fleetlet(
    tmp_path: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m fleetlet ...`` on a machine without a kubeconfig: no $KUBECONFIG, an empty
    home, not in a pod."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
        and not k.startswith("FLEETLET_")
    }
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**clean, "HOME": str(home), **(env or {})},
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("fleetlet:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def dead_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose API server is not there (connections refused)."""
    path = tmp_path / "dead.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "abc"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def agent_flags(repo: str, *, sigstore: MiniSigstore | None = None) -> list[str]:
    trusted = str(sigstore.trusted_root_path) if sigstore else "/nonexistent/trusted_root.json"
    issuer = sigstore.issuer if sigstore else "https://issuer.test"
    return ["--repo", repo, "--cluster", "edge-1", "--trusted-root", trusted,
            "--identity", DEFAULT_IDENTITY, "--issuer", issuer, "--no-status"]  # fmt: skip


# --- no cluster ------------------------------------------------------------------------------


def test_health_without_a_kubeconfig_says_to_give_one_or_to_go_offline(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(DEPLOYMENT)
    done = fleetlet(tmp_path, "health", "-f", "web.yaml")
    assert done.returncode == 2
    line = one_line(done)
    assert "--kubeconfig FILE" in line and "--offline" in line, line
    assert "Service host/port" not in line
    # What it suggests works.
    offline = fleetlet(tmp_path, "health", "-f", "web.yaml", "--offline")
    assert offline.returncode == 1 and "web" in offline.stdout  # InProgress as written


def test_health_with_a_missing_kubeconfig_file_or_a_cluster_that_is_down(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(DEPLOYMENT)
    missing = fleetlet(tmp_path, "health", "-f", "web.yaml", "--kubeconfig", "nope.kubeconfig")
    assert missing.returncode == 2
    assert one_line(missing) == "fleetlet: kubeconfig nope.kubeconfig: no such file"
    down = fleetlet(
        tmp_path, "health", "-f", "web.yaml", "--kubeconfig", str(dead_kubeconfig(tmp_path))
    )
    assert down.returncode == 1
    line = one_line(down)
    assert "https://127.0.0.1:1" in line and "Is the cluster of kubeconfig" in line, line
    assert "--offline" in line


def test_the_agent_without_a_kubeconfig_or_with_its_cluster_down(tmp_path: Path) -> None:
    flags = agent_flags("git://127.0.0.1:1/fleet.git")
    none = fleetlet(tmp_path, "agent", "sync", "--once", *flags)
    assert none.returncode == 2
    line = one_line(none)
    assert "not running in a pod" in line and "--kubeconfig FILE" in line, line
    down = fleetlet(
        tmp_path, "agent", "sync", "--once", *flags, "--kubeconfig", str(dead_kubeconfig(tmp_path))
    )
    assert down.returncode == 1
    line = one_line(down)
    assert "https://127.0.0.1:1 unreachable" in line and "Is the cluster" in line, line


def test_the_agent_with_credentials_the_cluster_refuses(crds: Cluster, tmp_path: Path) -> None:
    # Discovery of this cluster in the shared cache, as any earlier use leaves it: the check
    # must still make a request that needs the credentials (found in a full run).
    from agent.kube import KubeClient

    KubeClient(kubeconfig=str(crds.kubeconfig)).resource_for(
        "fleetlet.io/v1alpha1", "BundleDeployment"
    )
    config = yaml.safe_load(crds.kubeconfig.read_text())
    config["users"] = [{"name": config["users"][0]["name"], "user": {"token": "not-a-token"}}]
    refused = tmp_path / "refused.kubeconfig"
    refused.write_text(yaml.safe_dump(config))
    flags = agent_flags("git://127.0.0.1:1/fleet.git")
    done = fleetlet(tmp_path, "agent", "sync", "--once", *flags, "--kubeconfig", str(refused))
    assert done.returncode == 2
    line = one_line(done)
    assert "refused the credentials of kubeconfig" in line, line


# --- no git server, wrong git credentials ----------------------------------------------------


def test_the_agent_with_its_git_server_away_or_refusing_its_credentials(
    crds: Cluster, git_http: GitHttpServer, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    kubeconfig = ["--kubeconfig", str(crds.kubeconfig), "--namespace", "default"]
    away = fleetlet(
        tmp_path, "agent", "sync", "--once", "--cache-dir", str(tmp_path / "a"), *kubeconfig,
        *agent_flags("git://127.0.0.1:1/fleet.git", sigstore=mini_sigstore),
    )  # fmt: skip
    assert away.returncode == 1
    assert "git://127.0.0.1:1/fleet.git: cannot list the branches" in away.stderr
    assert "temporary; retrying may help" in away.stderr

    repo = new_repo(git_http, "prereq")
    for env, said in (
        ({}, "none are configured"),
        ({"FLEETLET_GIT_TOKEN": "wrong"}, "refused the token credentials"),
    ):
        done = fleetlet(
            tmp_path, "agent", "sync", "--once", "--cache-dir", str(tmp_path / "b"), *kubeconfig,
            *agent_flags(repo, sigstore=mini_sigstore), env=env,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert said in done.stderr, done.stderr
        assert "FLEETLET_GIT_TOKEN" in done.stderr, done.stderr  # how to give them


# --- no hub, wrong hub token -----------------------------------------------------------------


def test_installations_without_a_hub_or_with_a_wrong_token(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    neither = fleetlet(tmp_path, "installations", "list")
    assert neither.returncode == 1
    assert "--hub URL" in one_line(neither) and "--repo GIT_URL" in one_line(neither)
    down = fleetlet(tmp_path, "installations", "list", "--hub", "http://127.0.0.1:1")
    assert down.returncode == 1
    assert "is `fleetlet hub serve` running there?" in one_line(down)

    repo = new_repo(git_daemon, "prereq-hub")
    tokens = tmp_path / "tokens.yaml"
    write_clear_tokens(tokens, {"reader-token-123456": "read"})
    with serving_hub(repo, tmp_path, ["--tokens", str(tokens)]) as url:
        missing = fleetlet(tmp_path, "installations", "list", "--hub", url)
        assert missing.returncode == 1
        assert "--token-file FILE or $FLEETLET_HUB_TOKEN" in one_line(missing)
        wrong = fleetlet(
            tmp_path, "installations", "list", "--hub", url,
            env={"FLEETLET_HUB_TOKEN": "not-the-token"},
        )  # fmt: skip
        assert wrong.returncode == 1
        assert "the token given was refused" in one_line(wrong)
        right = fleetlet(
            tmp_path, "installations", "list", "--hub", url,
            env={"FLEETLET_HUB_TOKEN": "reader-token-123456"},
        )  # fmt: skip
        assert right.returncode == 0, right.stderr


# --- missing directories, unreachable git for the hub ----------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("render", "no-such-bundle"), "no-such-bundle: no such directory (give the bundle's"),
        (
            ("hub", "render", "no-such-fleet", "--out", "out"),
            "no-such-fleet: expected a fleet repo directory (fleet.yaml, clusters/, bundles/), "
            "got nothing there",
        ),
        (
            ("hub", "diff", str(REPO_ROOT / "fleet-examples"), "--repo", "git://127.0.0.1:1/x.git"),
            "cannot list branches of git://127.0.0.1:1/x.git",
        ),
        (
            ("hub", "publish", str(REPO_ROOT / "fleet-examples"), "--repo", "git://127.0.0.1:1/x"),
            "give --identity-token FILE, set SIGSTORE_ID_TOKEN",
        ),
        (("hub", "serve", "--repo", "git://127.0.0.1:1/x.git"), "needs --tokens FILE"),
    ],
    ids=["render", "hub-render", "hub-diff", "hub-publish", "hub-serve"],
)
def test_missing_directories_servers_and_settings_are_named(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    done = fleetlet(tmp_path, *args)
    assert done.returncode != 0
    assert said in one_line(done), done.stderr
