"""The agent image, built and run as a cluster would run it.

``scripts/build-images.sh agent`` builds deploy/images/agent.Containerfile on a base made from
Debian packages (cached by content: a second run with the same sources builds nothing). The
image is pushed to the test registry, pulled back **by digest**, and started with podman as the
Deployment starts it: its own entrypoint, UID 65532, a read-only root filesystem with the cache
and /tmp as the only writable places. That agent reconciles a published, signed set on a real
API server, answers its probes, and stops cleanly on SIGTERM.

Podman needs two workarounds on these machines (see docs/operations.md, "Building the
images"): a containers.conf without default ulimits and with the cgroupfs manager, and the runc
runtime. They are test-harness settings; the Containerfile stays an ordinary one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agent.kube import KubeClient
from tests.fleetlab import REPO_ROOT, Lab, conditions, configmap, live, namespace_manifest
from tests.realenv.gitserver import free_port
from tests.realenv.kube import Cluster
from tests.realenv.registry import Registry
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

# Needs podman, buildah and mmdebstrap (scripts/install.sh installs them); never skipped.
pytestmark = pytest.mark.image

CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def container_logs(env: dict[str, str], container: str) -> str:
    done = subprocess.run(
        ["podman", "logs", container], capture_output=True, text=True, timeout=60, env=env
    )
    return (done.stdout + done.stderr)[-4000:]


def podman(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def agent_image(podman_env: dict[str, str]) -> str:
    """The agent image, built by scripts/build-images.sh (its local reference)."""
    done = subprocess.run(
        ["bash", "scripts/build-images.sh", "agent"],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO_ROOT,
        env=podman_env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    name, reference = done.stdout.strip().splitlines()[-1].split()
    assert name == "agent"
    return reference


@pytest.fixture
def pushed_image(
    agent_image: str, registry: Registry, podman_env: dict[str, str], tmp_path: Path
) -> Iterator[str]:
    """The image pushed to the test registry and pulled back by digest: ``REPO@sha256:...``."""
    repository = f"{registry.host}/fleetlet-agent"
    digest_file = tmp_path / "digest"
    podman(
        podman_env, "push", "--tls-verify=false", "--digestfile", str(digest_file),
        agent_image, f"{repository}:test",
    )  # fmt: skip
    reference = f"{repository}@{digest_file.read_text().strip()}"
    podman(podman_env, "pull", "--tls-verify=false", "--quiet", reference)
    yield reference
    subprocess.run(["podman", "rmi", "--force", reference], capture_output=True, env=podman_env)


def test_the_image_is_non_root_and_has_no_compiler(
    agent_image: str, podman_env: dict[str, str]
) -> None:
    user = podman(podman_env, "image", "inspect", "--format", "{{.Config.User}}", agent_image)
    assert user == "65532:65532"
    found = subprocess.run(
        ["podman", "run", "--rm", "--entrypoint", "sh", agent_image, "-c",
         "id -u; for c in gcc cc clang make pip; do command -v $c; done; fleetlet --version"],
        capture_output=True, text=True, timeout=120, env=podman_env,
    )  # fmt: skip
    lines = found.stdout.split()
    assert lines[0] == "65532"
    assert lines[1:] == ["fleetlet", "0.1.0"], found.stdout  # no compiler, no pip


def test_the_image_from_the_registry_reconciles_a_published_set(
    pushed_image: str,
    lab: Lab,
    crds: Cluster,
    namespace: str,
    tmp_path: Path,
    podman_env: dict[str, str],
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("image"), lab.name("cfg")
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"v": "one"})}
    lab.publish([{"name": name, "sources": [lab.source("cfg", lab.push("cfg", files, tag="one"))]}])

    # What the Deployment mounts: the kubeconfig stands in for the in-cluster ServiceAccount.
    config = tmp_path / "etc"
    config.mkdir()
    shutil.copy(crds.kubeconfig, config / "kubeconfig")
    shutil.copy(lab.sigstore.trusted_root_path, config / "trusted_root.json")
    for path in (config, *config.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    port = free_port()
    container = f"fleetlet-agent-test-{uuid.uuid4().hex[:6]}"
    podman(
        podman_env, "run", "--detach", "--name", container, "--network", "host",
        "--read-only", "--tmpfs", "/tmp:rw,mode=1777", "--tmpfs", "/var/cache/fleetlet:rw,U",
        "--volume", f"{config}:/etc/fleetlet:ro",
        "--env", f"FLEETLET_NAMESPACE={namespace}",
        "--env", "FLEETLET_LOG_FORMAT=json",
        pushed_image,
        "agent", "run",
        "--repo", lab.url, "--cluster", "edge-1", "--no-status",
        "--kubeconfig", "/etc/fleetlet/kubeconfig",
        "--trusted-root", "/etc/fleetlet/trusted_root.json",
        "--identity", DEFAULT_IDENTITY, "--issuer", lab.sigstore.issuer,
        "--plain-http-registries", "--interval", "1", "--jitter", "0.2",
        "--probe-address", f"127.0.0.1:{port}",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            cm = live(kube, "v1", "ConfigMap", "c", ns)
            ready = conditions(kube, name).get("Ready", {}) if cm is not None else {}
            if ready.get("status") == "True":
                break
            state = podman(podman_env, "inspect", "--format", "{{.State.Status}}", container)
            assert state == "running", container_logs(podman_env, container)
            assert time.monotonic() < deadline, container_logs(podman_env, container)
            time.sleep(0.5)
        assert cm is not None and cm["data"] == {"v": "one"}
        # Ready once the first tick has returned (the objects above are written during it).
        while requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, container_logs(podman_env, container)
            time.sleep(0.3)
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        podman(podman_env, "stop", "--time", "30", container)
        exit_code = podman(podman_env, "inspect", "--format", "{{.State.ExitCode}}", container)
        assert exit_code == "0", container_logs(podman_env, container)
        logs = subprocess.run(
            ["podman", "logs", container], capture_output=True, text=True, env=podman_env
        )
        # The agent logged JSON lines naming its cluster.
        lines = [line for line in logs.stderr.splitlines() if line.strip()]
        assert lines and all(line.startswith("{") for line in lines), logs.stderr[-2000:]
        assert all('"cluster": "edge-1"' in line for line in lines)
    finally:
        subprocess.run(["podman", "rm", "--force", container], capture_output=True, env=podman_env)
