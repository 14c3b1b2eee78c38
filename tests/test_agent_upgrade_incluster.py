"""The agent upgrading itself in a pod: the candidate is a second Deployment (issue #30).

On a control plane of this module's own, ``agent install``'s objects are applied (CRDs, RBAC,
the agent's Deployment, Available through kwok), and the acting agent's upgrade loop
(:class:`agent.upgrade.incluster.InClusterUpgrades`) runs in this process **as the agent's
ServiceAccount** (a client certificate of its user name): so every object call it makes is
authorized by the RBAC ``agent install`` grants, no more. The release is a real agent artifact
pushed to a real registry and pulled by digest; its ``fleetlet-agent.json`` names the container
image and declares the CRDs and rules (``agent.upgrade.artifact.pack(image=...)``).

What kwok cannot show: it runs no container. A candidate pod of a good image becomes Ready
(kwok says so), but no agent runs in it, so nothing checks itself, says so on the Lease, takes
the Lease or syncs. In the good case the test says on the Lease what the candidate's code says
(``Upgrades._prove``: who it is and that it checked itself, then, once it holds the Lease, that
it proved itself); that code itself, the self-check and the one sync, is tested where the agent
runs as a process (tests/test_agent_upgrade.py, the demo's agent-upgrade scenario). The third
test shows the acting agent does not take a Ready pod for proof: nobody speaking on the Lease
is a rollback. An image tagged ``broken`` never becomes Ready (tests/realenv/kwok/stages.yaml):
that failure is kwok's real Deployment behaviour, with nothing said for the candidate. The
candidate Deployment is ``agent install``'s, with no replica: the agent only ever patches it.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.install.manifests import FIELD_MANAGER, InstallConfig, crds, install_objects
from agent.kube import ForbiddenError, KubeClient
from agent.runner.objects import ObjectDoor
from agent.runner.reader import open_reader
from agent.upgrade.artifact import MANIFEST, pack
from agent.upgrade.deployment import (
    CANDIDATE,
    ENV_DEPLOYMENT,
    NAME,
    AgentDeployment,
    Release,
    UpgradeStepError,
    own_image,
)
from agent.upgrade.desired import Desired, Record, UpgradeStore, agent_report
from agent.upgrade.incluster import InClusterUpgrades
from agent.upgrade.lease import IDENTITY, PROVEN, READY, AgentLease
from tests.fleetlab import REPO_ROOT
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry

pytestmark = pytest.mark.slow  # a control plane of its own, and two attempts run to their deadline

NAMESPACE = "fleetlet-system"
INSTALLED = "registry.example.test/fleetlet-agent@sha256:" + "1" * 64
GOOD = "registry.example.test/fleetlet-agent@sha256:" + "2" * 64
BROKEN = "registry.example.test/fleetlet-agent:broken@sha256:" + "3" * 64
NEW_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
REPOSITORY = "fleetlet/agent-release"
CONFIG = InstallConfig(
    image=INSTALLED,
    repo="https://git.example.test/fleet-state.git",
    cluster="edge-1",
    identity="ci@example.test",
    issuer="https://issuer.example.test",
    trusted_root="{}",
)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, kube_binaries: dict[str, Path]
) -> Iterator[Cluster]:
    running = Cluster(
        name="incluster", workdir=tmp_path_factory.mktemp("kube-incluster"), binaries=kube_binaries
    ).start()
    try:
        admin = KubeClient(kubeconfig=str(running.kubeconfig))
        for obj in install_objects(CONFIG):
            admin.apply(obj, field_manager=FIELD_MANAGER, force=True)
            if obj["kind"] == "CustomResourceDefinition":
                _until(lambda o=obj: _established(admin, o), "the CRDs established")
        _until(lambda: _available(admin, NAME), "the installed agent Available")
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def agent_kubeconfig(cluster: Cluster) -> str:
    """The agent's ServiceAccount as a user: RBAC grants it what agent install grants."""
    return cluster.mint_user(
        f"system:serviceaccount:{NAMESPACE}:{NAME}",
        ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
    )


def _until(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _established(kube: KubeClient, crd: dict[str, Any]) -> bool:
    live = kube.get(crd) or {}
    conditions = (live.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _deployment(kube: KubeClient, name: str) -> dict[str, Any] | None:
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}}
    ref["metadata"]["namespace"] = NAMESPACE
    return kube.get(ref)


def _available(kube: KubeClient, name: str) -> bool:
    live = _deployment(kube, name) or {}
    status = live.get("status") or {}
    return (
        status.get("observedGeneration") == (live.get("metadata") or {}).get("generation")
        and status.get("updatedReplicas") == 1
        and status.get("availableReplicas") == 1
    )


def _stopped(kube: KubeClient) -> bool:
    """The candidate has no replica and no pod left."""
    live = _deployment(kube, CANDIDATE) or {}
    pods = kube.list(
        "v1", "Pod", namespace=NAMESPACE, label_selector=f"app.kubernetes.io/name={CANDIDATE}"
    )
    return (live.get("spec") or {}).get("replicas") == 0 and not pods


def _rules(kube: KubeClient, kind: str) -> list[dict[str, Any]]:
    ref: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": NAME},
    }
    if kind == "Role":
        ref["metadata"]["namespace"] = NAMESPACE
    return list((kube.get(ref) or {}).get("rules") or [])


def _release(tmp: Path, registry: Registry, image: str, version: str) -> Desired:
    """An agent release of this checkout as ``image``, one more ClusterRole rule and a short
    name more on a CRD (both additions), pushed; what a set pinning it asks for."""
    tree = pack(REPO_ROOT, tmp / version, version=version, image=image)
    manifest = json.loads((tree / MANIFEST).read_text())
    manifest["rbac"]["clusterRole"].append(NEW_RULE)
    crd = next(c for c in manifest["crds"] if c["metadata"]["name"].startswith("bundleoutputs"))
    crd["spec"]["names"]["shortNames"] = [*crd["spec"]["names"].get("shortNames", []), "fbo"]
    (tree / MANIFEST).write_text(json.dumps(manifest))
    pushed = push_bundle(OciClient(host=registry.host), REPOSITORY, tree)
    return Desired(uri=f"{registry.host}/{REPOSITORY}", digest=pushed.digest, serial=7, since=7)


def _upgrades(
    kubeconfig: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, deadline: int
) -> InClusterUpgrades:
    """The acting agent's upgrade loop, as ``agent run`` in the agent's pod builds it."""
    monkeypatch.setenv(ENV_DEPLOYMENT, NAME)
    monkeypatch.setenv("FLEETLET_AGENT_UPGRADE_DEADLINE", str(deadline))
    monkeypatch.delenv("FLEETLET_AGENT_IMAGE", raising=False)
    monkeypatch.delenv("FLEETLET_AGENT_CANDIDATE", raising=False)
    settings = SimpleNamespace(
        kubeconfig=kubeconfig,
        namespace=NAMESPACE,
        network=SimpleNamespace(connect_timeout=5.0, read_timeout=30.0, attempts=3),
        poll=SimpleNamespace(interval=1.0, drift_interval=1.0),
        repo=SimpleNamespace(cache_dir=tmp / "cache"),
        plain_http_registries=True,
    )
    # The supervisor's small door (agent.runner.objects), as agent run has it; no status push,
    # no set accepted.
    supervisor = SimpleNamespace(pusher=None, last=None, reader=open_reader(kubeconfig))
    upgrades = InClusterUpgrades(settings=settings, supervisor=supervisor)
    assert isinstance(upgrades.kube, ObjectDoor)
    return upgrades


def _attempt_ends(store: UpgradeStore, desired: Desired) -> Record:
    def ended() -> Record | None:
        _desired, record = store.read()
        done = record.attempt == desired.digest and record.state in ("Failed", "Succeeded")
        return record if done else None

    found: Record = _until(ended, "the attempt's end", timeout=120)
    return found


def test_a_proved_candidate_moves_the_agents_deployment_to_its_image(
    cluster: Cluster,
    agent_kubeconfig: str,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = KubeClient(kubeconfig=str(cluster.kubeconfig))
    desired = _release(tmp_path, registry, GOOD, "2.0.0-test")
    store = UpgradeStore(admin, NAMESPACE)
    store.save_desired(desired)
    upgrades = _upgrades(agent_kubeconfig, tmp_path, monkeypatch, deadline=60)
    seen: dict[str, Any] = {}

    def candidate_speaks() -> None:
        """What the candidate agent's code says on the Lease (kwok runs no container)."""
        live = _until(lambda: _available(admin, CANDIDATE) and _deployment(admin, CANDIDATE), "")
        seen["candidate"] = live
        seen["rules during"] = _rules(admin, "ClusterRole")
        container = live["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        attempt = env["FLEETLET_AGENT_CANDIDATE"]
        lease = AgentLease(admin, NAMESPACE, "fleetlet-agent-candidate-pod-1")
        lease.say(IDENTITY, lease.identity)
        lease.say(READY, attempt)
        view = _until(lambda: lease.read() or None, "the Lease")
        _until(lambda: (lease.read() or view).holder == lease.identity, "the hand-over")
        seen["handed over"] = True
        lease.say(PROVEN, attempt)
        # Stopped (no replica), the candidate's agent releases the Lease as it exits.
        _until(lambda: _stopped(admin), "the candidate stopped")
        lease.hand_to("")

    speaker = threading.Thread(target=candidate_speaks, daemon=True)
    speaker.start()
    upgrades.start()
    try:
        promoted = _until(
            lambda: own_image(_deployment(admin, NAME) or {}) == GOOD and _stopped(admin),
            "the agent's Deployment on the new image and the candidate stopped",
        )
        assert promoted
    finally:
        upgrades.stop()
        upgrades.finish()
    speaker.join(timeout=5)
    candidate = seen["candidate"]
    container = candidate["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The candidate: the agent's own pod spec, the new image by digest, marked as a candidate.
    assert container["image"] == GOOD
    assert env["FLEETLET_AGENT_CANDIDATE"] == f"{desired.digest}/{desired.since}"
    assert env[ENV_DEPLOYMENT] == NAME
    assert candidate["spec"]["template"]["spec"]["serviceAccountName"] == NAME
    assert (
        candidate["spec"]["template"]["spec"]["volumes"]
        == ((_deployment(admin, NAME) or {})["spec"]["template"]["spec"]["volumes"])
    )
    assert NEW_RULE in seen["rules during"] and seen["handed over"]
    # After: the agent's Deployment runs the new image (kwok makes its new pod Available), it
    # knows which release that is, and the release's rule and CRD change stay.
    own = _deployment(admin, NAME) or {}
    own_env = {
        e["name"]: e.get("value") for e in own["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert own_env["FLEETLET_AGENT_IMAGE"] == desired.digest
    assert own_env["FLEETLET_AGENT_VERSION"] == "2.0.0-test"
    assert "FLEETLET_AGENT_CANDIDATE" not in own_env
    _until(lambda: _available(admin, NAME), "the agent's Deployment Available on the new image")
    assert NEW_RULE in _rules(admin, "ClusterRole")
    crd = admin.get(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "bundleoutputs.fleetlet.io"},
        }
    )
    assert "fbo" in (crd or {})["spec"]["names"]["shortNames"]
    # `agent install` again is the operator's reset: the installed image, and the agent knows it
    # runs that one (so the release the set pins is an upgrade again).
    for obj in install_objects(CONFIG):
        if obj["kind"] == "Deployment":
            admin.apply(obj, field_manager=FIELD_MANAGER, force=True)
    own = _deployment(admin, NAME) or {}
    own_env = {
        e["name"]: e.get("value") for e in own["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert own_image(own) == INSTALLED
    assert own_env["FLEETLET_AGENT_IMAGE"] == INSTALLED.rpartition("@")[2]
    _until(lambda: _available(admin, NAME), "the reinstalled agent Available")


def _rolled_back(
    cluster: Cluster,
    agent_kubeconfig: str,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    image: str,
) -> tuple[Record, Desired, str, list[dict[str, Any]], list[dict[str, Any]]]:
    """An attempt to ``image`` nobody speaks for, run to its end: (the record, what was asked,
    the agent's image before, the rules before, the candidate's state while it ran)."""
    admin = KubeClient(kubeconfig=str(cluster.kubeconfig))
    before = own_image(_deployment(admin, NAME) or {})
    rules = _rules(admin, "ClusterRole")
    desired = _release(tmp_path, registry, image, "3.0.0-test")
    store = UpgradeStore(admin, NAMESPACE)
    store.save_desired(desired)
    upgrades = _upgrades(agent_kubeconfig, tmp_path, monkeypatch, deadline=8)
    upgrades.start()
    states: list[dict[str, Any]] = []
    try:
        _until(
            lambda: ((_deployment(admin, CANDIDATE) or {}).get("spec") or {}).get("replicas"),
            "the candidate started",
        )
        states.append(_deployment(admin, CANDIDATE) or {})
        record = _attempt_ends(store, desired)
    finally:
        upgrades.stop()
        upgrades.finish()
    _until(lambda: _stopped(admin), "the candidate stopped, its pod gone")
    assert own_image(_deployment(admin, NAME) or {}) == before
    assert _rules(admin, "ClusterRole") == rules
    return record, desired, before, rules, states


def test_a_broken_image_never_available_is_stopped_and_reported_rolled_back(
    cluster: Cluster,
    agent_kubeconfig: str,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record, desired, _before, _rules_before, _states = _rolled_back(
        cluster, agent_kubeconfig, registry, tmp_path, monkeypatch, BROKEN
    )
    assert (record.state, record.reason) == ("Failed", "DeadlineExceeded")
    assert "not Available" in record.message and "MinimumReplicasUnavailable" in record.message
    report = agent_report(desired, record)
    assert report is not None
    ready = next(c for c in report.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "RolledBack")
    assert [(r.result, r.serial) for r in report.runs] == [("RolledBack", 7)]


def test_a_ready_pod_is_no_proof_without_the_candidates_word_on_the_lease(
    cluster: Cluster,
    agent_kubeconfig: str,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = GOOD.replace("2" * 64, "4" * 64)
    record, _desired, _before, _rules_before, _states = _rolled_back(
        cluster, agent_kubeconfig, registry, tmp_path, monkeypatch, good
    )
    assert (record.state, record.reason) == ("Failed", "DeadlineExceeded")
    assert "did not pass its self-check" in record.message
    assert f"Deployment {CANDIDATE} Available" in record.message


def test_the_agent_may_change_only_its_own_roles_and_deployments(
    cluster: Cluster, agent_kubeconfig: str
) -> None:
    agent = KubeClient(kubeconfig=agent_kubeconfig)
    rbac = "rbac.authorization.k8s.io/v1"
    for ref in (
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "fleetlet-approver"}},
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "cluster-admin"}},
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
        },
    ):
        with pytest.raises(ForbiddenError):
            agent.patch(ref, {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ForbiddenError):
        agent.delete(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": NAME, "namespace": NAMESPACE},
            }
        )


def test_a_release_that_stops_serving_a_crd_version_is_refused_before_any_change(
    cluster: Cluster, agent_kubeconfig: str
) -> None:
    admin = KubeClient(kubeconfig=str(cluster.kubeconfig))
    crd = next(c for c in crds() if c["metadata"]["name"] == "bundledeployments.fleetlet.io")
    narrowed = copy.deepcopy(crd)
    for version in narrowed["spec"]["versions"]:
        version["served"] = False
    rules = _rules(admin, "ClusterRole")
    release = Release(
        version="5.0.0-test",
        image=GOOD,
        crds=(narrowed,),
        cluster_rules=(*rules, {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}),
    )
    with pytest.raises(UpgradeStepError) as caught:
        AgentDeployment(KubeClient(kubeconfig=agent_kubeconfig), NAMESPACE).declare(release)
    assert caught.value.reason == "CrdNarrowed"
    assert "stops serving v1alpha1" in str(caught.value)
    assert _rules(admin, "ClusterRole") == rules
    live = admin.get(crd) or {}
    assert all(v["served"] for v in live["spec"]["versions"])


def _until_authorizer_says(admin: KubeClient, *, escalate: bool) -> None:
    """Wait until the API server's RBAC authorizer, which reads roles from its own cache, says
    the agent may (or may not) ``escalate`` its ClusterRole: a patch of that role is seen there
    a moment after it is written, and the escalation check asks the same cache."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:{NAME}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            "resourceAttributes": {"group": "rbac.authorization.k8s.io", "resource": "clusterroles",
                                   "verb": "escalate", "name": NAME},
        },
    }  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        answer = admin.create(review).get("status") or {}
        if bool(answer.get("allowed")) == escalate:
            return
        assert time.monotonic() < deadline, f"the authorizer never saw escalate={escalate}"
        time.sleep(0.05)


def test_without_escalate_the_agent_cannot_give_its_role_a_new_rule(
    cluster: Cluster, agent_kubeconfig: str
) -> None:
    """Why ``escalate`` (docs/operations.md): the API server refuses a role edit that grants
    what the editor does not hold, though ``patch`` on that role is allowed."""
    admin = KubeClient(kubeconfig=str(cluster.kubeconfig))
    agent = KubeClient(kubeconfig=agent_kubeconfig)
    ref = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME},
    }
    rules = _rules(admin, "ClusterRole")
    granted = [*rules, {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    without = [
        {**r, "verbs": [v for v in r["verbs"] if v != "escalate"]}
        if r.get("resources") == ["clusterroles"]
        else r
        for r in rules
    ]
    admin.patch(ref, {"rules": without})
    try:
        _until_authorizer_says(admin, escalate=False)
        with pytest.raises(ForbiddenError) as caught:
            agent.patch(ref, {"rules": [*without, granted[-1]]})
        assert "attempting to grant RBAC permissions not currently held" in str(caught.value)
    finally:
        admin.patch(ref, {"rules": rules})
    _until_authorizer_says(admin, escalate=True)
    agent.patch(ref, {"rules": granted})  # with it, as installed
    assert granted[-1] in _rules(admin, "ClusterRole")
    agent.patch(ref, {"rules": rules})
