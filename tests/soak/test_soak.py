"""A compressed soak: a fleet of two clusters under publications every few seconds, broken
versions, drift by another field manager, agents killed and API servers, the git server and
the registry restarted (or frozen) at random; then a last good publication, and the checks a
user would make after a long week:

- every group is wholly on one revision (the last one), nothing is orphaned (no object of an
  older version, no move left half-done);
- every run is recorded (each bundle's run ids have no gap, none is left Running, the newest
  is the last version's success);
- the hub's view equals each cluster's (applied serial, readiness, the runs);
- the agent that ran throughout did not grow: its resident memory and open files at the end
  are those of its first minutes.

``FLEETLET_SOAK_SECONDS`` sets how long the faults go on (60 s by default: the short version
CI runs; a long run by hand: ``FLEETLET_SOAK_SECONDS=1800 pytest -m soak``);
``FLEETLET_SOAK_REPORT`` names a JSON file for the figures (events, samples).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.apply.intent import GroupRecords
from agent.kube import KubeClient
from agent.report.runs import RunLog
from hub.status.aggregate import FleetStatus
from tests.fleetlab import REPO_ROOT, Lab, configmap, deployment, live, namespace_manifest
from tests.outage import install_crds
from tests.realenv.gitserver import GitDaemon
from tests.realenv.kube import Cluster, start_clusters
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore

pytestmark = pytest.mark.soak

SECONDS = float(os.environ.get("FLEETLET_SOAK_SECONDS", "60"))
REPORT = os.environ.get("FLEETLET_SOAK_REPORT")
AGENT_NAMESPACE = "fleetlet-soak"
CLUSTERS = ("edge-1", "edge-2")
STEADY = "edge-1"  # its agent is never killed: its memory and files are watched
AGENT_FLAGS = [
    "--interval", "1", "--jitter", "0.5", "--drift-interval", "4", "--max-backoff", "4",
    "--connect-timeout", "1", "--read-timeout", "3", "--fetch-attempts", "2",
    "--retry-backoff", "2", "--heartbeat", "2",
]  # fmt: skip


@dataclass
class Soak:
    lab: Lab
    clusters: dict[str, Cluster]
    workdir: Path
    rng: random.Random = field(default_factory=lambda: random.Random(21))
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    version: int = 0
    good: list[int] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ns = self.lab.name("shop")
        self.names = {b: self.lab.name(b) for b in ("base", "backend", "frontend")}
        self.kube = {c: KubeClient(kubeconfig=str(k.kubeconfig)) for c, k in self.clusters.items()}
        self._base = self.lab.push("base", {"ns.yaml": namespace_manifest(self.ns)}, tag="v1")

    def count(self, event: str) -> None:
        self.events[event] = self.events.get(event, 0) + 1

    # -- publications -------------------------------------------------------------------

    def publish(self, *, broken: bool) -> bool:
        """The next version (``broken``: its backend never becomes ready); False when the
        git server or the registry was away."""
        number = self.version + 1
        lab = self.lab
        image = f"example/backend-{number}:broken" if broken else f"example/backend:{number}.0"
        frontend = {
            "deploy.yaml": deployment("frontend", self.ns, f"example/frontend:{number}.0"),
            "config.yaml": configmap("frontend-config", self.ns, {"value": f"v{number}"}),
        }
        if number % 2 == 0:
            frontend["extra.yaml"] = configmap(f"extra-{number}", self.ns, {"n": str(number)})
        try:
            backend = lab.push(
                "backend",
                {
                    "deploy.yaml": deployment("backend", self.ns, image),
                    "config.yaml": configmap("backend-config", self.ns, {"value": f"v{number}"}),
                },
                tag=f"v{number}",
            )
            front = lab.push("frontend", frontend, tag=f"v{number}")
            # A broken version is told apart in 10 s; a good one gets the time a cluster
            # whose API server was just restarted needs (its controllers catch up slowly).
            health = {"timeoutSeconds": 10 if broken else 120}
            shop = {"group": "shop", "dependsOn": ["base"], "healthChecks": health}
            lab.publish(
                [
                    {"name": self.names["base"], "sources": [lab.source("base", self._base)],
                     "group": "base"},
                    {"name": self.names["backend"], "sources": [lab.source("backend", backend)],
                     **shop},
                    {"name": self.names["frontend"], "sources": [lab.source("frontend", front)],
                     **shop},
                ]
            )  # fmt: skip
        except Exception:  # the server we just took away: tried again later
            self.count("publication failed (server away)")
            return False
        self.version = number
        if not broken:
            self.good.append(number)
        self.count("broken publication" if broken else "publication")
        return True

    # -- agents -------------------------------------------------------------------------

    def start_agent(self, cluster: str) -> None:
        log = (self.workdir / f"agent-{cluster}.log").open("ab")
        self.agents[cluster] = subprocess.Popen(
            [sys.executable, "-m", "fleetlet", "agent", "run",
             *self.lab.agent_args(cluster, self.clusters[cluster], namespace=AGENT_NAMESPACE,
                                  workdir=self.workdir / f"agent-{cluster}", extra=AGENT_FLAGS)],
            cwd=REPO_ROOT, stdout=log, stderr=log,
        )  # fmt: skip

    def sample(self) -> None:
        """Resident memory (KiB) and open files of the steady agent."""
        pid = self.agents[STEADY].pid
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rss = int(
                next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]
            )
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, StopIteration):
            return
        self.samples.append((time.monotonic(), rss, fds))

    def open_files(self) -> dict[str, int]:
        """What the steady agent's open files are, by kind (for a failure message)."""
        kinds: dict[str, int] = {}
        fd_dir = Path(f"/proc/{self.agents[STEADY].pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            kind = target.split(":")[0] if ":" in target else str(Path(target).parent)
            kinds[kind] = kinds.get(kind, 0) + 1
        return kinds

    # -- faults -------------------------------------------------------------------------

    def fault(self) -> None:
        """One fault, chosen at random."""
        kind = self.rng.choices(
            ["drift", "kill agent", "restart apiserver", "freeze apiserver", "restart git",
             "restart registry"],
            weights=[4, 2, 2, 1, 1, 1],
        )[0]  # fmt: skip
        cluster = self.rng.choice(CLUSTERS)
        if kind == "drift":
            with_drift = "backend-config" if self.rng.random() < 0.5 else "frontend-config"
            try:
                self.kube[cluster].apply(
                    {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": with_drift, "namespace": self.ns},
                     "data": {"value": "drifted"}},
                    field_manager="someone-else", force=True,
                )  # fmt: skip
            except Exception:
                self.count("drift not injected (API server away)")
                return
        elif kind == "kill agent":
            victim = "edge-2"
            self.agents[victim].send_signal(self.rng.choice([signal.SIGKILL, signal.SIGTERM]))
            self.agents[victim].wait(timeout=60)
            time.sleep(self.rng.uniform(0.2, 2.0))
            self.start_agent(victim)
        elif kind == "restart apiserver":
            self.clusters[cluster].stop_apiserver()
            time.sleep(self.rng.uniform(0.0, 2.0))
            self.clusters[cluster].start_apiserver()
        elif kind == "freeze apiserver":
            self.clusters[cluster].freeze_apiserver()
            time.sleep(self.rng.uniform(1.0, 4.0))
            self.clusters[cluster].thaw_apiserver()
        elif kind == "restart git":
            assert isinstance(self.lab.git, GitDaemon)
            self.lab.git.kill()
            time.sleep(self.rng.uniform(0.0, 2.0))
            self.lab.git.start()
        else:
            self.lab.registry.kill()
            time.sleep(self.rng.uniform(0.0, 2.0))
            self.lab.registry.start()
        self.count(kind)

    # -- what a user checks -------------------------------------------------------------

    def settled_on(self, serial: int) -> bool:
        """Every bundle of every cluster Ready, its group on ``serial``."""
        try:
            for kube in self.kube.values():
                for name in self.names.values():
                    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name) or {}
                    status = bd.get("status") or {}
                    ready = {c["type"]: c["status"] for c in status.get("conditions") or []}
                    applied = (status.get("appliedRevision") or {}).get("serial")
                    if ready.get("Ready") != "True" or applied is None:
                        return False
                    if name != self.names["base"] and applied != serial:
                        return False
        except Exception:
            return False
        return True


@pytest.fixture
def soak(
    tmp_path: Path,
    kube_binaries: dict[str, Path],
    mini_sigstore: MiniSigstore,
) -> Iterator[Soak]:
    clusters = {
        name: Cluster(name=f"soak-{i}", workdir=tmp_path / f"kube-{i}", binaries=kube_binaries,
                      stop_grace=0.5)
        for i, name in enumerate(CLUSTERS)
    }  # fmt: skip
    start_clusters(list(clusters.values()))
    (tmp_path / "registry").mkdir()
    registry = Registry(workdir=tmp_path / "registry")
    git = GitDaemon(workdir=tmp_path / "git")
    registry.start()
    git.start()
    try:
        for cluster in clusters.values():
            install_crds(cluster)
            KubeClient(kubeconfig=str(cluster.kubeconfig)).apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENT_NAMESPACE}},
                field_manager="fleetlet-tests",
            )
        lab = Lab(
            registry=registry,
            git=git,
            sigstore=mini_sigstore,
            tmp=tmp_path / "lab",
            clusters=[{"name": c, "labels": {"tier": "edge"}} for c in CLUSTERS],
        )
        created = Soak(lab=lab, clusters=clusters, workdir=tmp_path)
        try:
            yield created
        finally:
            for agent in created.agents.values():
                agent.kill()
                agent.wait(timeout=60)
    finally:
        for cluster in clusters.values():
            cluster.stop()
        git.kill()
        registry.kill()


def wait(what: str, predicate: Any, soak: Soak, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        soak.sample()
        if time.monotonic() > deadline:
            logs = {c: (soak.workdir / f"agent-{c}.log").read_text()[-3000:] for c in CLUSTERS}
            raise AssertionError(f"timed out waiting for {what}; agent logs: {logs}")
        time.sleep(1)


def test_a_fleet_under_faults_ends_consistent_and_the_agent_does_not_grow(soak: Soak) -> None:
    assert soak.publish(broken=False)
    for cluster in CLUSTERS:
        soak.start_agent(cluster)
    wait("the first version everywhere", lambda: soak.settled_on(soak.version), soak)
    began = time.monotonic()
    next_publication = began
    while time.monotonic() - began < SECONDS:
        soak.sample()
        if time.monotonic() >= next_publication:
            soak.publish(broken=soak.rng.random() < 0.25)
            next_publication = time.monotonic() + soak.rng.uniform(2.0, 5.0)
        else:
            soak.fault()
        time.sleep(soak.rng.uniform(0.5, 2.0))
    faults_seconds = time.monotonic() - began

    # Every fault is undone as it ends; then a last good version.
    for cluster in soak.clusters.values():
        cluster.start_apiserver()
    soak.lab.git.start()
    soak.lab.registry.start()
    if soak.agents["edge-2"].poll() is not None:
        soak.start_agent("edge-2")
    while not soak.publish(broken=False):
        time.sleep(1)
    final = soak.version
    wait(f"version {final} everywhere", lambda: soak.settled_on(final), soak)
    settle_end = time.monotonic() + 10  # a few more idle polls, drift checks and heartbeats
    while time.monotonic() < settle_end:
        soak.sample()
        time.sleep(1)

    assert soak.agents[STEADY].poll() is None, "the steady agent died"
    for cluster, kube in soak.kube.items():
        _assert_wholly_on(soak, cluster, kube, final)
        _assert_runs_recorded(soak, cluster, kube, final)
    _assert_hub_view_equals_clusters(soak)
    growth = _assert_did_not_grow(soak)
    if REPORT:
        Path(REPORT).write_text(
            json.dumps(
                {
                    "fault_seconds": round(faults_seconds, 1),
                    "events": soak.events,
                    "final_version": final,
                    "good_versions": len(soak.good),
                    "steady_agent": growth,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )
    print(f"soak: {faults_seconds:.0f} s of faults, events {soak.events}, agent {growth}")


def _assert_wholly_on(soak: Soak, cluster: str, kube: KubeClient, final: int) -> None:
    """Every object of the shop group is the final version's; nothing of another version is
    left, no move is left half-done."""
    ns = soak.ns
    images = {
        name: (live(kube, "apps/v1", "Deployment", name, ns) or {})["spec"]["template"]["spec"][
            "containers"
        ][0]["image"]
        for name in ("backend", "frontend")
    }
    assert images == {
        "backend": f"example/backend:{final}.0",
        "frontend": f"example/frontend:{final}.0",
    }, (cluster, images)
    owned = {
        (o["kind"], o["metadata"]["name"]): o
        for api_version, kind in (("v1", "ConfigMap"), ("apps/v1", "Deployment"))
        for o in kube.list(api_version, kind, namespace=ns)
        if "fleetlet.io/bundle" in (o["metadata"].get("labels") or {})
    }
    expected = {("Deployment", "backend"), ("Deployment", "frontend"),
                ("ConfigMap", "backend-config"), ("ConfigMap", "frontend-config")}  # fmt: skip
    if final % 2 == 0:
        expected.add(("ConfigMap", f"extra-{final}"))
    assert set(owned) == expected, (cluster, sorted(owned))
    for (_kind, name), obj in owned.items():
        if name.endswith("-config"):
            assert obj["data"]["value"] == f"v{final}", (cluster, name, obj["data"])
    assert GroupRecords(kube, namespace=AGENT_NAMESPACE).load("shop").intent is None, cluster


def _assert_runs_recorded(soak: Soak, cluster: str, kube: KubeClient, final: int) -> None:
    runs = RunLog(kube, namespace=AGENT_NAMESPACE)
    for bundle in ("backend", "frontend"):
        name = soak.names[bundle]
        history = runs.runs(name)
        assert history, (cluster, bundle)
        numbers = [int(r.id.rpartition(".")[2]) for r in history]
        # Newest first, one after the other: no run lost, none recorded twice.
        assert numbers == list(range(numbers[0], numbers[0] - len(numbers), -1)), (
            cluster, bundle, numbers,
        )  # fmt: skip
        assert all(r.result != "Running" for r in history), (cluster, bundle)
        newest = next(r for r in history if r.operation != "driftCorrection")
        assert (newest.result, newest.serial) == ("Succeeded", _serial_of(soak, cluster)), (
            cluster, bundle, newest,
        )  # fmt: skip


def _serial_of(soak: Soak, cluster: str) -> int:
    bd = live(soak.kube[cluster], "fleetlet.io/v1alpha1", "BundleDeployment",
              soak.names["backend"]) or {}  # fmt: skip
    return int(bd["status"]["appliedRevision"]["serial"])


def _assert_hub_view_equals_clusters(soak: Soak) -> None:
    status = FleetStatus(repo_url=soak.lab.status_url, cache_dir=soak.workdir / "hub")
    status.refresh()
    for cluster, kube in soak.kube.items():
        runs = RunLog(kube, namespace=AGENT_NAMESPACE)
        for name in soak.names.values():
            bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name) or {}
            detail = status.installation(cluster, name)
            assert detail is not None, (cluster, name)
            summary = next(i for i in status.installations(cluster=cluster) if i["bundle"] == name)
            assert summary["appliedSerial"] == bd["status"]["appliedRevision"]["serial"]
            assert summary["state"] == "Ready", (cluster, name, summary)
            in_cluster = [r.id for r in runs.runs(name)]
            at_hub = [r["id"] for r in detail["runs"]]
            assert at_hub == in_cluster[: len(at_hub)] and at_hub, (cluster, name, at_hub)


def _assert_did_not_grow(soak: Soak) -> dict[str, Any]:
    """The steady agent's memory and open files in the last quarter of the run against the
    second quarter (the first one warms up: imports, caches, connections)."""
    samples = soak.samples
    assert len(samples) >= 8, samples
    quarter = len(samples) // 4
    early = samples[quarter : 2 * quarter]
    late = samples[-quarter:]
    early_rss, late_rss = max(s[1] for s in early), max(s[1] for s in late)
    early_fds, late_fds = max(s[2] for s in early), max(s[2] for s in late)
    figures = {
        "samples": len(samples),
        "rss_kib_early": early_rss,
        "rss_kib_late": late_rss,
        "fds_early": early_fds,
        "fds_late": late_fds,
    }
    assert late_rss <= early_rss * 1.10 + 4096, figures
    assert late_fds <= early_fds + 4, (figures, soak.open_files())
    return figures
