"""kill -9 of the agent in the middle of a group upgrade, then a restart: the group ends wholly
on the new revision or wholly on the previous one, never mixed, and healthy.

The agent runs as ``python -m fleetlet agent sync --once``, a separate process. It is killed
with SIGKILL by its own fault injection (``FLEETLET_FAILPOINT``: the named step, then
``os.kill(getpid(), SIGKILL)``), between every stage of a move and of a rollback, and once by
the test from outside while the stage that writes the group's objects is running. A restarted
agent finds the intent it recorded in the cluster and finishes the move, or returns the group.
The last test restarts it with the git server and the registry stopped and a new, empty cache:
the rollback needs neither.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agent.apply.intent import GroupRecords
from agent.health import Status, assess
from agent.kube import KubeClient
from tests.fleetlab import (
    REPO_ROOT,
    Lab,
    conditions,
    configmap,
    deployment,
    live,
    namespace_manifest,
)
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

HEALTH_TIMEOUT = 8


@dataclass(frozen=True)
class Version:
    number: int
    broken: bool = False

    @property
    def image(self) -> str:
        return (
            f"example/web-{self.number}:broken" if self.broken else f"example/web:{self.number}.0"
        )

    @property
    def value(self) -> str:
        return f"v{self.number}"

    @property
    def extra(self) -> bool:
        # Every other version adds an object, so a rollback must delete it.
        return self.number % 2 == 0


class Upgrades:
    """Publishes versions of a two-bundle group and reads which version the cluster runs."""

    def __init__(self, lab: Lab, kube: KubeClient) -> None:
        self.lab = lab
        self.kube = kube
        self.ns = lab.name("crash")
        self.web = lab.name("web")
        self.conf = lab.name("conf")
        self.base = lab.name("base")

    def publish(self, version: Version) -> None:
        lab = self.lab
        web = lab.push(
            "web",
            {"deployment.yaml": deployment("web", self.ns, version.image)},
            tag=f"v{version.number}",
        )
        files = {"config.yaml": configmap("settings", self.ns, {"value": version.value})}
        if version.extra:
            files["extra.yaml"] = configmap(
                f"extra-{version.number}", self.ns, {"from": version.value}
            )
        conf = lab.push("conf", files, tag=f"v{version.number}")
        base = lab.push("base", {"ns.yaml": namespace_manifest(self.ns)}, tag="v1")
        checks = {"timeoutSeconds": HEALTH_TIMEOUT}
        lab.publish(
            [
                {"name": self.base, "sources": [lab.source("base", base)], "group": "base"},
                {
                    "name": self.web,
                    "sources": [lab.source("web", web)],
                    "group": "app",
                    "dependsOn": ["base"],
                    "healthChecks": checks,
                },
                {
                    "name": self.conf,
                    "sources": [lab.source("conf", conf)],
                    "group": "app",
                    "dependsOn": ["base"],
                    "healthChecks": checks,
                },
            ]
        )

    def assert_wholly_on(self, version: Version, everything: list[Version]) -> None:
        """Every object of the group is the given version's, nothing of another version is
        left, and it is healthy."""
        web = live(self.kube, "apps/v1", "Deployment", "web", self.ns)
        settings = live(self.kube, "v1", "ConfigMap", "settings", self.ns)
        assert web is not None and settings is not None
        image = web["spec"]["template"]["spec"]["containers"][0]["image"]
        assert (image, settings["data"]["value"]) == (version.image, version.value)
        for other in everything:
            present = live(self.kube, "v1", "ConfigMap", f"extra-{other.number}", self.ns)
            expected = other == version and other.extra
            assert (present is not None) == expected, f"extra-{other.number}"
        deadline = time.monotonic() + 60
        while (
            health := assess(live(self.kube, "apps/v1", "Deployment", "web", self.ns))
        ).status is not Status.CURRENT:
            assert time.monotonic() < deadline, (health, self.describe())
            time.sleep(0.5)

    def assert_ready(self, reason: str) -> None:
        """Both bundles' Ready condition has ``reason`` (True for Healthy, else False)."""
        for bundle in (self.web, self.conf):
            ready = conditions(self.kube, bundle)["Ready"]
            status = "True" if reason == "Healthy" else "False"
            assert (ready["status"], ready["reason"]) == (status, reason), ready

    def describe(self) -> str:
        """The Deployment's status and its pods, for a failure message."""
        web = live(self.kube, "apps/v1", "Deployment", "web", self.ns) or {}
        pods = self.kube.list("v1", "Pod", namespace=self.ns)
        shown = [
            (
                p["metadata"]["name"],
                p["spec"]["containers"][0]["image"],
                p.get("spec", {}).get("nodeName"),
                [(c["type"], c["status"]) for c in (p.get("status") or {}).get("conditions") or []],
            )
            for p in pods
        ]
        return f"deployment status {web.get('status')}; pods {shown}"

    def intent_exists(self, agent_namespace: str) -> bool:
        return GroupRecords(self.kube, namespace=agent_namespace).load("app").intent is not None


# (failpoint, whether the target is broken): between every stage of a move and of a rollback.
POINTS = [
    ("intent", False),
    ("apply:dry run", False),
    ("apply:applying", False),
    ("applied", False),
    ("health", True),
    ("healthy", False),
    ("pruned", False),
    ("stored#1", False),
    ("finished", False),
    ("rollback", True),
    ("rollback:applied", True),
    ("rollback:pruned", True),
]


def test_kill_9_at_every_step_of_an_upgrade_and_a_rollback_never_leaves_the_group_mixed(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    upgrades = Upgrades(lab, kube)
    workdir = tmp_path / "agent"
    current = Version(1)
    published = [current]
    upgrades.publish(current)
    first = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir)
    assert first.returncode == 0, first.stderr
    upgrades.assert_wholly_on(current, published)

    for number, (point, broken) in enumerate(POINTS, start=2):
        target = Version(number, broken=broken)
        published.append(target)
        upgrades.publish(target)
        killed = lab.sync_once(
            "edge-1", crds, namespace=namespace, workdir=workdir, env={"FLEETLET_FAILPOINT": point}
        )
        assert killed.returncode == -signal.SIGKILL, (point, killed.returncode, killed.stderr)
        assert upgrades.intent_exists(namespace), f"{point}: no intent left by the crash"
        again = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir)
        assert again.returncode == (1 if broken else 0), (point, again.stdout, again.stderr)
        if not broken:
            current = target
        upgrades.assert_wholly_on(current, published)
        upgrades.assert_ready("RolledBack" if broken else "Healthy")
        assert not upgrades.intent_exists(namespace), f"{point}: the intent is still there"

    # Once more, killed from outside while the objects of the group are being written.
    target = Version(len(POINTS) + 2)
    published.append(target)
    upgrades.publish(target)
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetlet", "agent", "sync", "--once",
         *lab.agent_args("edge-1", crds, namespace=namespace, workdir=workdir)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            settings = live(kube, "v1", "ConfigMap", "settings", upgrades.ns)
            if settings is not None and settings["data"]["value"] == target.value:
                break
            assert process.poll() is None, "the agent finished before it was killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    again = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir)
    assert again.returncode == 0, again.stderr
    upgrades.assert_wholly_on(target, published)
    upgrades.assert_ready("Healthy")


def test_a_rollback_after_a_crash_needs_neither_the_git_server_nor_the_registry(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    upgrades = Upgrades(lab, kube)
    good, broken = Version(1), Version(2, broken=True)
    upgrades.publish(good)
    first = lab.sync_once("edge-1", crds, namespace=namespace, workdir=tmp_path / "a")
    assert first.returncode == 0, first.stderr
    upgrades.publish(broken)
    killed = lab.sync_once(
        "edge-1",
        crds,
        namespace=namespace,
        workdir=tmp_path / "a",
        env={"FLEETLET_FAILPOINT": "applied"},
    )
    assert killed.returncode == -signal.SIGKILL
    web = live(kube, "apps/v1", "Deployment", "web", upgrades.ns)
    assert (
        web is not None
        and web["spec"]["template"]["spec"]["containers"][0]["image"] == broken.image
    )

    lab.git.kill()
    lab.registry.kill()
    # A new pod: nothing cached; the set and the previous revision are only in the cluster.
    again = lab.sync_once("edge-1", crds, namespace=namespace, workdir=tmp_path / "new-pod")
    assert again.returncode == 1  # the git server is down: a temporary failure is reported
    assert "temporary" in again.stderr, again.stderr
    upgrades.assert_wholly_on(good, [good, broken])
    assert not upgrades.intent_exists(namespace)
    # Interrupted, not failed: the target is tried again once it can be fetched.
    for bundle in (upgrades.web, upgrades.conf):
        ready = conditions(kube, bundle)["Ready"]
        assert ready["reason"] == "FetchFailed" and "registry unreachable" in ready["message"]

    lab.git.start()
    lab.registry.start()
    last = lab.sync_once("edge-1", crds, namespace=namespace, workdir=tmp_path / "new-pod")
    assert last.returncode == 1, last.stdout  # the broken target failed again, for real
    upgrades.assert_wholly_on(good, [good, broken])
    upgrades.assert_ready("RolledBack")
    message = conditions(kube, upgrades.web)["Ready"]["message"]
    assert "Deployment" in message and "web" in message, message
