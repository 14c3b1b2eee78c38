"""README's "Put your first cluster into a fleet", run as written.

The lines between the ``first-cluster`` markers of README.md are run one by one with bash,
unchanged, in a directory holding ``fleet/`` (no cluster in it yet) and ``enroll/`` (the
``config.yaml`` the README asks for) beside a running ``hub serve --enroll enroll/``; only the
environment points them at the test's parts: ``$REGISTRY`` (the test registry, plain HTTP:
declared insecure in a registries.conf, as an operator would), ``$HUB``, ``$FLEET_REPO`` (a
git daemon), the signing token of the local Sigstore (``SIGSTORE_ID_TOKEN``,
``FLEETLET_TRUST_CONFIG``), ``KUBECONFIG`` (a fresh cluster of this module's own, without any
fleetlet object).

The test clusters fake pods (kwok), so after ``agent install`` the test does the kubelet's
part for the agent's pod: it runs the image the Deployment pins, with podman, as the pod spec
says (its command, environment from the ConfigMap and Secrets, mounted Secrets, UID 65532, a
read-only root filesystem) and with the pod's in-cluster identity: a token of the agent's
ServiceAccount, so only the RBAC that install created applies. Two settings differ from a real
pod, both for the test environment: the probe port (the pod would have a network namespace of
its own) and plain HTTP to the test registry. Then the README's last line shows the bundle
Ready.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from hub.api.tokens import write_clear_tokens
from tests.fleetlab import REPO_ROOT, Lab, configmap, namespace_manifest
from tests.realenv.binaries import kubectl as kubectl_path
from tests.realenv.gitserver import free_port
from tests.realenv.hubserver import serving_hub
from tests.realenv.kube import Cluster
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_agent_install import fresh_cluster as fresh_cluster  # the fixture
from tests.test_hub_fleet import write_fleet
from tests.test_image import CONTAINERS_CONF, container_logs

pytestmark = pytest.mark.image

NAMESPACE = "fleetlet-system"


def readme_commands() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    match = re.search(r"<!-- first-cluster:begin.*?```sh\n(.*?)```\n<!-- first-cluster:end -->", text, re.S)  # fmt: skip
    assert match, "README.md has no first-cluster block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_readme_is_six_commands_or_fewer() -> None:
    # Build and push the image, a token, the one-command enrollment, a publish, a look.
    assert 1 <= len(readme_commands()) <= 6


def kubectl(cluster: Cluster, *args: str) -> str:
    done = subprocess.run(
        [kubectl_path(), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _get(cluster: Cluster, kind: str, name: str) -> dict[str, Any] | None:
    done = subprocess.run(
        [kubectl_path(), "--kubeconfig", str(cluster.kubeconfig), "get", kind, name,
         "-n", NAMESPACE, "-o", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return json.loads(done.stdout) if done.returncode == 0 else None


def run_pod(cluster: Cluster, workdir: Path, env: dict[str, str]) -> str:
    """Start the agent Deployment's pod with podman, as a kubelet would; its container name."""
    deployment = _get(cluster, "deployment", "fleetlet-agent")
    assert deployment is not None
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    args = ["podman", "run", "--detach", "--name", f"fleetlet-pod-{uuid.uuid4().hex[:6]}",
            "--network", "host", "--pull", "missing"]  # fmt: skip
    security = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    args += ["--user", f"{security['runAsUser']}:{security['runAsGroup']}"]
    if security.get("readOnlyRootFilesystem"):
        args.append("--read-only")

    def data_of(kind: str, name: str) -> dict[str, str] | None:
        obj = _get(cluster, kind, name)
        if obj is None:
            return None
        if kind == "secret":
            return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            args += ["--tmpfs", f"{mount['mountPath']}:rw,U"]
            continue
        source = volume.get("secret") or volume.get("configMap")
        kind = "secret" if "secret" in volume else "configmap"
        data = data_of(kind, source.get("secretName") or source.get("name"))
        assert data is not None or source.get("optional"), f"required {kind} missing"
        directory = workdir / "volumes" / mount["name"]
        directory.mkdir(parents=True)
        items = source.get("items") or [{"key": k, "path": k} for k in (data or {})]
        for item in items:
            (directory / item["path"]).write_text((data or {})[item["key"]])
            (directory / item["path"]).chmod(0o644)
        args += ["--volume", f"{directory}:{mount['mountPath']}:ro"]

    variables: dict[str, str] = {}
    for var in container["env"]:
        if "value" in var:
            variables[var["name"]] = var["value"]
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.namespace"
            variables[var["name"]] = NAMESPACE
            continue
        ref = source.get("configMapKeyRef") or source["secretKeyRef"]
        data = data_of("configmap" if "configMapKeyRef" in source else "secret", ref["name"])
        if data is None or ref["key"] not in data:
            assert ref.get("optional"), f"{var['name']}: {ref} missing"
            continue
        variables[var["name"]] = data[ref["key"]]
    # The pod has a network namespace of its own; on the host network, a free port instead.
    variables["FLEETLET_PROBE_ADDRESS"] = f"127.0.0.1:{free_port()}"
    # The test registry speaks plain HTTP (a real one, HTTPS, needs nothing).
    variables["FLEETLET_PLAIN_HTTP_REGISTRIES"] = "true"

    # The pod's in-cluster identity: the agent's ServiceAccount token, the cluster's CA.
    token = kubectl(cluster, "create", "token", spec["serviceAccountName"], "-n", NAMESPACE).strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    server = urlparse(config["clusters"][0]["cluster"]["server"])
    account = workdir / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token)
    (account / "namespace").write_text(NAMESPACE)
    (account / "ca.crt").write_bytes(
        base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
    )
    for path in account.iterdir():
        path.chmod(0o644)
    args += ["--volume", f"{account}:/var/run/secrets/kubernetes.io/serviceaccount:ro"]
    variables["KUBERNETES_SERVICE_HOST"] = str(server.hostname)
    variables["KUBERNETES_SERVICE_PORT"] = str(server.port)
    for name, text in variables.items():
        args += ["--env", f"{name}={text}"]
    command = container["command"]
    args += ["--entrypoint", command[0], container["image"], *command[1:]]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return args[args.index("--name") + 1]


def test_put_your_first_cluster_into_a_fleet(
    lab: Lab, fresh_cluster: Cluster, tmp_path: Path
) -> None:
    workdir = tmp_path / "here"
    workdir.mkdir()
    (workdir / "scripts").symlink_to(REPO_ROOT / "scripts")  # "from this repository"
    # The hub's enrollment directory, as the README's "You need" and operations.md say.
    enroll = workdir / "enroll"
    enroll.mkdir()
    shutil.copy(lab.sigstore.trusted_root_path, enroll / "trusted_root.json")
    (enroll / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "repo": lab.url,
                "statusRepo": lab.status_url,
                "identity": DEFAULT_IDENTITY,
                "issuer": lab.sigstore.issuer,
                "trustedRoot": "trusted_root.json",
                "inventory": "../fleet/clusters/enrolled.yaml",
            }
        )
    )
    ns, bundle = f"shop-{lab.suffix}", "web-config"
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("settings", ns, {"v": "1"})}
    digest = lab.push("shop/web-config", files, tag="v1")
    write_fleet(
        workdir / "fleet",
        clusters=[],
        bundles=[
            {
                "name": bundle,
                "sources": [lab.source("shop/web-config", digest)],
                "serviceAccountName": "deployer",
                "targets": [{"clusterSelector": {}}],
            }
        ],
        settings={
            "name": "first",
            "repo": "https://fleet.example.invalid/first.git",
            "signing": {"identity": DEFAULT_IDENTITY, "issuer": lab.sigstore.issuer},
        },
    )
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    registries = tmp_path / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{lab.registry.host}"\ninsecure = true\n')
    api_tokens = tmp_path / "api-tokens.yaml"
    write_clear_tokens(api_tokens, {"admin-token-" + "a" * 20: "admin"})
    serve = tmp_path / "serve"
    serve.mkdir()
    with serving_hub(
        lab.status_url, serve, ["--tokens", str(api_tokens), "--enroll", str(enroll)]
    ) as hub:
        _run_readme(lab, fresh_cluster, tmp_path, workdir, hub, bundle, ns)


def _run_readme(
    lab: Lab, fresh_cluster: Cluster, tmp_path: Path, workdir: Path, hub: str, bundle: str, ns: str
) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(kubectl_path()).parent}:{os.environ['PATH']}",
        "REGISTRY": lab.registry.host,
        "HUB": hub,
        "FLEET_REPO": lab.url,
        "KUBECONFIG": str(fresh_cluster.kubeconfig),
        "SIGSTORE_ID_TOKEN": lab.sigstore.mint_token(),
        "FLEETLET_TRUST_CONFIG": str(lab.sigstore.trust_config_path),
        "CONTAINERS_CONF": str(tmp_path / "containers.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(tmp_path / "registries.conf"),
    }
    commands = readme_commands()
    *setup, last = commands
    for line in setup:
        done = subprocess.run(
            ["bash", "-c", line], cwd=workdir, env=env, capture_output=True, text=True,
            timeout=1800,
        )  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"

    # The cluster admin grants the bundle's ServiceAccount what the bundle deploys.
    kubectl(fresh_cluster, "create", "serviceaccount", "deployer", "-n", NAMESPACE)
    kubectl(fresh_cluster, "create", "clusterrolebinding", "deployer-first",
            "--clusterrole=cluster-admin", f"--serviceaccount={NAMESPACE}:deployer")  # fmt: skip
    # The kubelet's part: the agent's pod, from what install created.
    container = run_pod(fresh_cluster, tmp_path, env)
    try:
        deadline = time.monotonic() + 180
        while True:
            shown = subprocess.run(
                ["bash", "-c", last], cwd=workdir, env=env, capture_output=True, text=True,
                timeout=60,
            )  # fmt: skip
            rows = [line.split() for line in shown.stdout.splitlines()[1:]]
            if any(row[0] == bundle and "True" in row for row in rows):
                break
            assert time.monotonic() < deadline, (shown.stdout, container_logs(env, container))
            time.sleep(1)
        assert shown.returncode == 0
        settings = json.loads(kubectl(fresh_cluster, "get", "configmap", "settings", "-n", ns, "-o", "json"))  # fmt: skip
        assert settings["data"] == {"v": "1"}
    finally:
        subprocess.run(["podman", "rm", "--force", container], capture_output=True, env=env)
