"""``fleetlet agent run``: the loop as it runs in a cluster, and what a refused publication
looks like from the cluster.

The agent runs as a separate process with a short interval: it installs what is published,
follows a new publication by itself, answers its probes, and stops cleanly on SIGTERM. A
publication tampered with in the git repository is refused: every BundleDeployment says why
(the reason names the check), nothing in the cluster changes, and the next good publication
is applied.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pygit2
import pytest
import requests

from agent.errors import InclusionProofError
from agent.kube import KubeClient
from tests.fleetlab import REPO_ROOT, Lab, conditions, configmap, live, namespace_manifest
from tests.realenv.binaries import kubectl
from tests.realenv.gitserver import free_port
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed


def _publish(lab: Lab, name: str, ns: str, value: str) -> None:
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"value": value})}
    digest = lab.push("cfg", files, tag=value)
    lab.publish([{"name": name, "sources": [lab.source("cfg", digest)]}])


def _wait(predicate: object, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_agent_run_follows_publications_answers_probes_and_stops_on_sigterm(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("run"), lab.name("cfg")
    _publish(lab, name, ns, "one")
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "fleetlet", "agent", "run",
         *lab.agent_args("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent"),
         "--interval", "1", "--jitter", "0.2", "--probe-address", f"127.0.0.1:{port}"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "agent.log").open("w"),
    )  # fmt: skip
    try:

        def value() -> str | None:
            cm = live(kube, "v1", "ConfigMap", "c", ns)
            return None if cm is None else str(cm["data"]["value"])

        _wait(lambda: value() == "one", "the first publication")
        _wait(lambda: conditions(kube, name).get("Ready", {}).get("status") == "True", "Ready")

        def probe(path: str) -> int:
            return requests.get(f"http://127.0.0.1:{port}{path}", timeout=10).status_code

        assert probe("/healthz") == 200
        _wait(lambda: probe("/readyz") == 200, "ready (a first tick completed)")
        assert probe("/nothing") == 404
        _publish(lab, name, ns, "two")
        _wait(lambda: value() == "two", "the second publication, picked up by the loop")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        print((tmp_path / "agent.log").read_text()[-5000:])  # shown when the test fails


def test_a_tampered_publication_is_refused_on_every_bundledeployment_and_changes_nothing(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("refused"), lab.name("cfg")
    _publish(lab, name, ns, "one")
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    agent.tick()
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name)
    assert bd is not None
    generation = bd["metadata"]["generation"]

    # Someone with write access to the repository edits the set on the cluster's branch.
    repo = pygit2.Repository(str(lab.git.root / lab.repo_name))
    ref = "refs/heads/fleetlet/clusters/edge-1"
    tree = repo.revparse_single(ref).peel(pygit2.Tree)
    builder = repo.TreeBuilder(tree)
    edited = repo[tree["set.yaml"].id].data.replace(ns.encode(), b"evil-namespace")
    edited = edited.replace(b"\nserial: 1\n", b"\nserial: 2\n")  # past the replay check
    assert b"serial: 2" in edited
    builder.insert("set.yaml", repo.create_blob(edited), pygit2.GIT_FILEMODE_BLOB)
    who = pygit2.Signature("intruder", "intruder@example.invalid")
    repo.create_commit(ref, who, who, "tampered", builder.write(), [repo.references[ref].target])

    with pytest.raises(InclusionProofError):
        agent.tick()
    ready = conditions(kube, name)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InclusionProofInvalid"), ready
    assert "refused" in ready["message"] and "still running serial 1" in ready["message"]
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name)
    assert bd is not None and bd["metadata"]["generation"] == generation  # the spec is untouched
    shown = subprocess.run(
        [kubectl(), "--kubeconfig", str(crds.kubeconfig), "get", "bd", name],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "InclusionProofInvalid" in shown.stdout, shown.stdout
    assert live(kube, "v1", "Namespace", "evil-namespace") is None
    cm = live(kube, "v1", "ConfigMap", "c", ns)
    assert cm is not None and cm["data"] == {"value": "one"}
    # The refused commit is not fetched again until the branch moves.
    fetches = agent.pipeline._watcher.fetches
    assert agent.tick().inbound == "refused-before"
    assert agent.pipeline._watcher.fetches == fetches

    _publish(lab, name, ns, "two")
    agent.tick()
    assert conditions(kube, name)["Ready"]["status"] == "True"
    cm = live(kube, "v1", "ConfigMap", "c", ns)
    assert cm is not None and cm["data"] == {"value": "two"}
