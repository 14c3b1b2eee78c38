"""Status, runs and outputs from real agents to git, the hub and the cluster.

The lockstep scenario (install, an upgrade rolled back, a fixed upgrade) run by a real agent,
whose status goes to a status repository on a real git server: ``fleetlet installations``
shows the three runs and the latest outputs, ``kubectl get bundleoutputs`` the same values, the
hub API opens the sensitive one for an admin token only, and the sensitive value is in no blob
of any branch. Then two agents: one goes quiet and the hub shows it Stale; the other's status,
made while the git server is down, arrives once it is back.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pygit2
import pytest
import requests
import yaml

from agent.kube import KubeClient
from agent.report.seal import write_keypair
from hub.api.tokens import write_clear_tokens
from tests.fleetlab import (
    REPO_ROOT,
    Lab,
    conditions,
    configmap,
    deployment,
    live,
    namespace_manifest,
)
from tests.realenv.binaries import kubectl
from tests.realenv.hubserver import serving_hub
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

ADMIN = "admin-token-e2e-0123456789"
READER = "read-token-e2e-0123456789"


def _secret(name: str, namespace: str, data: dict[str, str]) -> str:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "data": encoded,
        }
    )


def _cli(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", "installations", *args, "-o", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _blobs(repo_path: Path) -> Iterator[bytes]:
    """Every blob reachable from every branch of a bare repository."""
    repo = pygit2.Repository(str(repo_path))
    seen: set[str] = set()
    for ref in repo.references:
        for commit in repo.walk(repo.references[ref].target):
            stack = [commit.tree]
            while stack:
                tree = stack.pop()
                for item in tree:
                    if str(item.id) in seen:
                        continue
                    seen.add(str(item.id))
                    obj = repo[item.id]
                    if isinstance(obj, pygit2.Tree):
                        stack.append(obj)
                    elif isinstance(obj, pygit2.Blob):
                        yield obj.data


@pytest.fixture
def second_namespace(crds: Cluster, namespace: str) -> Iterator[str]:
    """Another agent namespace on the same cluster."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    name = f"{namespace[:50]}-b"
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, field_manager="test"
    )
    yield name
    kube.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def test_runs_and_outputs_of_the_lockstep_scenario_reach_the_cli_the_cluster_and_the_hub(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    secret_value = f"pw-{lab.suffix}-never-in-git"
    ns, web, conf = lab.name("shop"), lab.name("web"), lab.name("conf")
    private_key, public_key = tmp_path / "hub.key", tmp_path / "hub.pub"
    write_keypair(private_key, public_key)
    # The agent's sealing key, issued by the hub (fleetlet hub agent-key).
    sealing_key = tmp_path / "edge-1.sealing.key"
    issued = subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", "agent-key", "--hub-key", str(private_key),
         "--cluster", "edge-1", "--out", str(sealing_key)],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    assert sealing_key.stat().st_mode & 0o077 == 0

    def publish(web_image: str, value: str) -> None:
        web_digest = lab.push("web", {"d.yaml": deployment("web", ns, web_image)}, tag=value)
        conf_digest = lab.push(
            "conf",
            {
                "01_ns.yaml": namespace_manifest(ns),
                "02_cm.yaml": configmap("settings", ns, {"endpoint": f"db-{value}.example"}),
                "03_secret.yaml": _secret("creds", ns, {"password": secret_value}),
            },
            tag=value,
        )
        outputs = [
            {"name": "endpoint", "object": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": "settings"},
             "fieldPath": ".data.endpoint"},
            {"name": "password", "object": {"apiVersion": "v1", "kind": "Secret", "namespace": ns, "name": "creds"},
             "fieldPath": ".data.password", "sensitive": True},
        ]  # fmt: skip
        lab.publish(
            [
                {
                    "name": conf,
                    "sources": [lab.source("conf", conf_digest)],
                    "group": "shop",
                    "outputs": outputs,
                    "healthChecks": {"timeoutSeconds": 10},
                },
                {
                    "name": web,
                    "sources": [lab.source("web", web_digest)],
                    "group": "shop",
                    "healthChecks": {"timeoutSeconds": 10},
                },
            ]
        )

    agent = lab.agent(
        "edge-1",
        crds,
        namespace=namespace,
        workdir=tmp_path / "agent",
        hub_public_key=public_key,
        sealing_key=sealing_key,
    )
    publish("example/web:1", "one")
    agent.tick()
    publish("example/web-2:broken", "two")
    agent.tick()
    publish("example/web:3", "three")
    agent.tick()
    assert conditions(kube, conf)["Ready"]["status"] == "True"

    # The CLI, straight from the status branches in git.
    status = ["--repo", lab.status_url, "--cache-dir", str(tmp_path / "cli-cache")]
    for bundle in (conf, web):
        runs = _cli("runs", "list", f"edge-1/{bundle}", *status)["items"]
        assert [r["result"] for r in runs] == ["Succeeded", "RolledBack", "Succeeded"], runs
        assert [r["serial"] for r in runs] == [3, 2, 1]
    latest = _cli("outputs", "list", f"edge-1/{conf}", "--run", "latest", *status)
    assert latest["result"] == "Succeeded"
    outputs = {o["name"]: o for o in latest["items"]}
    assert outputs["endpoint"]["value"] == "db-three.example"
    assert outputs["password"]["value"] == "<sensitive>"
    opened = _cli(
        "outputs",
        "list",
        f"edge-1/{conf}",
        "--run",
        "latest",
        *status,
        "--hub-key",
        str(private_key),
    )
    assert {o["name"]: o["value"] for o in opened["items"]}["password"] == secret_value
    # Sealed with this cluster's own key, for this place: the hub knows the agent made it.
    assert {o["name"]: o.get("sealedBy") for o in opened["items"]}["password"] == "agent"

    # The cluster: kubectl shows the same values; the sensitive one is in a Secret.
    shown = subprocess.run(
        [kubectl(), "--kubeconfig", str(crds.kubeconfig), "get", "bundleoutputs", conf, "-o", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    in_cluster = {o["name"]: o for o in json.loads(shown.stdout)["spec"]["outputs"]}
    assert in_cluster["endpoint"]["value"] == "db-three.example"
    ref = in_cluster["password"]["secretRef"]
    held = live(kube, "v1", "Secret", ref["name"], namespace)
    assert held is not None and base64.b64decode(held["data"][ref["key"]]).decode() == secret_value

    # Nowhere in git in clear: not in any blob of any branch of either repository.
    for bare in (
        lab.git.workdir / "repos" / lab.status_name,
        lab.git.workdir / "repos" / lab.repo_name,
    ):
        assert bare.exists(), bare
        assert not any(secret_value.encode() in blob for blob in _blobs(bare)), bare

    # The hub: the value for admins, <sensitive> for readers, nothing without a token.
    tokens = tmp_path / "tokens.yaml"
    write_clear_tokens(tokens, {ADMIN: "admin", READER: "read"})
    workdir = tmp_path / "hub"
    workdir.mkdir()
    with serving_hub(
        lab.status_url, workdir, ["--tokens", str(tokens), "--hub-key", str(private_key)]
    ) as url:
        path = f"{url}/api/v1/installations/edge-1/{conf}/runs/latest/outputs"

        def get(token: str | None) -> requests.Response:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return requests.get(path, headers=headers, timeout=30)

        admin = {o["name"]: o["value"] for o in get(ADMIN).json()["items"]}
        reader = {o["name"]: o["value"] for o in get(READER).json()["items"]}
        assert admin == {"endpoint": "db-three.example", "password": secret_value}
        assert reader == {"endpoint": "db-three.example", "password": "<sensitive>"}
        assert get(None).status_code == 401


def test_a_quiet_agent_goes_stale_and_status_made_during_a_git_outage_arrives_later(
    lab: Lab, crds: Cluster, namespace: str, second_namespace: str, tmp_path: Path
) -> None:
    ns = lab.name("quiet")
    one, two = lab.name("one"), lab.name("two")
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"k": "v"})}
    digest = lab.push("cfg", files, tag="v1")
    other = lab.push("cfg", {"c.yaml": configmap("d", ns, {"k": "v"})}, tag="v2")
    lab.publish(
        [
            {
                "name": one,
                "sources": [lab.source("cfg", digest)],
                "targets": [{"clusters": ["edge-1"]}],
            },
            {
                "name": two,
                "sources": [lab.source("cfg", other)],
                "targets": [{"clusters": ["edge-2"]}],
                "dependsOn": [],
            },
        ]
    )
    first = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "one")
    second = lab.agent("edge-2", crds, namespace=second_namespace, workdir=tmp_path / "two")
    first.tick()
    second.tick()
    workdir = tmp_path / "hub"
    workdir.mkdir()
    tokens = tmp_path / "tokens.yaml"
    write_clear_tokens(tokens, {ADMIN: "admin"})
    with serving_hub(lab.status_url, workdir, ["--tokens", str(tokens)], stale_after="4s") as url:

        def states() -> dict[str, str]:
            answer = requests.get(
                f"{url}/api/v1/installations",
                headers={"Authorization": f"Bearer {ADMIN}"},
                timeout=30,
            ).json()
            return {i["cluster"]: i["state"] for i in answer["items"]}

        deadline = time.monotonic() + 60
        while states() != {"edge-1": "Ready", "edge-2": "Ready"}:
            assert time.monotonic() < deadline, states()
            time.sleep(0.5)
        # edge-2's agent stops; edge-1's keeps its heartbeat (1 s).
        deadline = time.monotonic() + 60
        while states() != {"edge-1": "Ready", "edge-2": "Stale"}:
            assert time.monotonic() < deadline, states()
            first.tick()
            time.sleep(1)

        # The git server goes down during edge-1's run; its newer status waits and arrives.
        lab.git.kill()
        kube = KubeClient(kubeconfig=str(crds.kubeconfig))
        kube.apply(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}, "data": {"k": "edited"}},
            field_manager="someone", force=True,
        )  # fmt: skip
        with pytest.raises(Exception, match=r"(?i)git|unreachable|connect"):
            first.tick()  # the poll fails; the drift is corrected anyway, its status kept
        assert first.pusher is not None and first.pusher.pending
        pending = first.pusher.latest
        assert pending is not None
        assert pending.bundle(one) is not None and pending.bundle(one).drift_count == 1  # type: ignore[union-attr]
        lab.git.start()
        first.tick()
        # A failed push is retried after a backoff (at most the 1 s heartbeat here, jittered).
        deadline = time.monotonic() + 30
        while first.pusher.pending:
            assert time.monotonic() < deadline, first.pusher.last_error
            time.sleep(0.2)
            first.tick()
        deadline = time.monotonic() + 60
        while True:
            answer = requests.get(
                f"{url}/api/v1/installations/edge-1/{one}",
                headers={"Authorization": f"Bearer {ADMIN}"},
                timeout=30,
            ).json()
            if answer.get("driftCount") == 1:
                break
            assert time.monotonic() < deadline, answer
            time.sleep(0.5)
