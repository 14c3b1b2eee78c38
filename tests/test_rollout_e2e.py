"""A progressive rollout on three real clusters (kube-apiserver, controller-manager, scheduler
and kwok each), with real agents (built as ``fleetlet agent run`` builds them), the registry,
the git server and the mini Sigstore.

``edge-1`` is the canary. A good version reaches the canary first, then, once its agent reports
it Ready, the other two. A broken version (its image never gets ready) reaches the canary only:
its agent rolls its group back, the hub halts the rollout and publishes the previous version back
to it, and the other clusters never receive the broken one: neither on their branches nor in
their live objects nor in their run history.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.api import load_set
from agent.kube import KubeClient
from agent.verify.publication import SET_FILE
from hub.fleet.load import load_fleet
from hub.publish.flow import prepare
from hub.publish.git import BranchStore
from hub.publish.shards import ShardedStore
from hub.publish.sign import PublicationSigner
from hub.rollout.controller import Controller
from hub.rollout.state import Rollout
from hub.status.aggregate import FleetStatus
from tests.fleetlab import Lab, deployment, live, namespace_manifest
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster
from tests.test_crds import REPO_ROOT
from tests.test_crds import crds as crds  # the fixture: the CRDs on the first cluster

CLUSTERS = ("edge-1", "edge-2", "edge-3")
STRATEGY = {
    "waves": [{"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}}],
    "maxFailures": 0,
    "onFailure": "revert",
}


@pytest.fixture
def stores(kube_fleet: list[Cluster], crds: Cluster) -> Iterator[dict[str, Cluster]]:
    """The three clusters (the CRDs applied on each), one per store of the lab."""
    for cluster in kube_fleet[1:]:
        args = [kubectl(), "--kubeconfig", str(cluster.kubeconfig), "apply", "--server-side"]
        args += [
            "--field-manager=fleetlet-tests",
            "--force-conflicts",
            "-f",
            str(REPO_ROOT / "crds"),
        ]
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        subprocess.run(
            [kubectl(), "--kubeconfig", str(cluster.kubeconfig), "wait", "--for=condition=Established",
             "crd", "--all", "--timeout=60s"],
            capture_output=True, text=True, timeout=90, check=True,
        )  # fmt: skip
    yield dict(zip(CLUSTERS, kube_fleet, strict=True))


def test_a_good_version_goes_canary_first_a_broken_one_halts_and_reverts_the_canary_only(
    lab: Lab, stores: dict[str, Cluster], tmp_path: Path
) -> None:
    lab.clusters = [
        {"name": "edge-1", "labels": {"tier": "canary"}},
        {"name": "edge-2", "labels": {"tier": "production"}},
        {"name": "edge-3", "labels": {"tier": "production"}},
    ]
    ns = lab.name("shop")
    web = lab.name("web")
    agent_ns = f"fleetlet-{uuid.uuid4().hex[:6]}"
    kubes = {n: KubeClient(kubeconfig=str(c.kubeconfig)) for n, c in stores.items()}
    for kube in kubes.values():
        kube.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_ns}},
            field_manager="fleetlet-tests",
        )
    agents = {
        n: lab.agent(n, stores[n], namespace=agent_ns, workdir=tmp_path / n) for n in CLUSTERS
    }

    def version(tag: str) -> dict[str, Any]:
        files = {
            "01_ns.yaml": namespace_manifest(ns),
            "02_web.yaml": deployment("web", ns, f"example/web:{tag}"),
        }
        digest = lab.push("web", files, tag=tag.replace(".", "-"))
        return {
            "name": web,
            "sources": [lab.source("web", digest)],
            "healthChecks": {"timeoutSeconds": 20},
        }

    store = BranchStore(url=lab.url, cache_dir=tmp_path / "hub-branches")
    status = FleetStatus(repo_url=lab.status_url, cache_dir=tmp_path / "hub-status")
    controller = Controller(sharded=ShardedStore.of(store), status=status)

    def signer() -> PublicationSigner:
        return PublicationSigner.from_trust_config(
            trust_config=lab.sigstore.trust_config_path, token=lab.sigstore.mint_token()
        )

    fleets: list[Path] = []

    def publish(bundle: dict[str, Any]) -> set[str]:
        fleets.append(lab.fleet_dir([bundle]))
        report = controller.publish(prepare(fleets[-1]), signer=signer(), actor="ci")
        return set(report.publication.pushed) if report.publication else set()

    def step() -> set[str]:
        report = controller.step(load_fleet(fleets[-1]), signer=signer())
        return set(report.publication.pushed) if report.publication else set()

    def sync(*names: str) -> None:
        for name in names or CLUSTERS:
            agents[name].tick()

    def image(name: str) -> str:
        found = live(kubes[name], "apps/v1", "Deployment", "web", ns)
        assert found is not None, name
        return str(found["spec"]["template"]["spec"]["containers"][0]["image"])

    def rollout() -> Rollout:
        found = [r for r in controller.read().active() if r.group == web]
        assert len(found) == 1
        return found[0]

    # Every store runs 1.0 (published before the group had a strategy).
    assert publish(version("1.0")) == set(CLUSTERS)
    sync()
    assert {n: image(n) for n in CLUSTERS} == dict.fromkeys(CLUSTERS, "example/web:1.0")

    # 2.0 with a strategy: the canary first.
    assert publish({**version("2.0"), "rollout": STRATEGY}) == {"edge-1"}
    sync()
    assert {n: image(n) for n in CLUSTERS} == {
        "edge-1": "example/web:2.0",
        "edge-2": "example/web:1.0",
        "edge-3": "example/web:1.0",
    }
    # The canary reports 2.0 Ready: the rest of the fleet gets it.
    assert step() == {"edge-2", "edge-3"}
    sync()
    assert {n: image(n) for n in CLUSTERS} == dict.fromkeys(CLUSTERS, "example/web:2.0")
    assert step() == set()
    assert rollout().status == "Completed"
    serials = {n: agents[n].state.load().last_serial for n in CLUSTERS}

    # 3.0 is broken: the canary gets it, fails, rolls its group back by itself...
    broken = version("broken")
    broken_pin = broken["sources"][0]["digest"]
    assert publish({**broken, "rollout": STRATEGY}) == {"edge-1"}
    sync()
    assert image("edge-1") == "example/web:2.0"  # the agent's own roll back
    # ... the hub halts the rollout and publishes 2.0 back to the canary.
    assert step() == {"edge-1"}
    halted = rollout()
    assert halted.status == "Reverted" and halted.halt is not None
    assert list(halted.halt.failures) == ["edge-1"]
    assert "RolledBack" in halted.halt.failures["edge-1"]
    sync()
    assert step() == set()
    assert all(m.phase == "reverted" for m in halted.members.values() if m.wave == 0)

    # The other stores never received the broken version: branch, live objects, history.
    store.fetch()
    for name in CLUSTERS:
        data = store.read_file(name, SET_FILE) if name in store.tips else None
        assert data is not None
        entry = load_set(data, origin=name).entry(web)
        assert entry is not None and entry.spec.sources[0].pin != broken_pin, name
        assert image(name) == "example/web:2.0", name
    for name in ("edge-2", "edge-3"):
        assert agents[name].state.load().last_serial == serials[name], name
        document = agents[name].status_document()
        bundle = document.bundle(web)
        assert bundle is not None and bundle.applied_revision is not None
        assert all(broken_pin not in run.source_digests for run in bundle.runs), name
    # The canary accepted the revert and runs 2.0, Ready (its own roll back had put 2.0 back
    # already, so the revert moved nothing there): should its agent lose its state, its
    # branch would not give it the broken version again.
    canary = agents["edge-1"].status_document()
    assert canary.last_accepted_serial > serials["edge-1"] + 1
    report = canary.bundle(web)
    assert report is not None and report.applied_revision is not None
    assert report.applied_revision.serial == serials["edge-1"]
    assert broken_pin not in report.applied_revision.sources
    ready = {c.type: c.status for c in report.conditions}
    assert ready["Ready"] == "True"
