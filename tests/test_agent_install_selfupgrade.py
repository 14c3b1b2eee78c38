"""``agent install --self-upgrade=on|no-new-rules|off`` on the session's control plane.

Each test installs the agent into a namespace of its own (``--namespace``); the cluster-scoped
objects (fleetlet's CRDs, the ClusterRole ``fleetlet-agent``) are the same for every
installation, and this file's tests run one after the other. What the agent's ServiceAccount
may do is asked twice, as a cluster admin would: ``kubectl auth can-i --as`` (a
SubjectAccessReview) and real requests with a client certificate of the ServiceAccount's user
name, which the API server refuses or accepts by the RBAC ``agent install`` wrote.

The agent's side runs its upgrade loop (:class:`agent.upgrade.incluster.InClusterUpgrades`, as
``agent run`` in the pod builds it) in this process as that ServiceAccount, on a real release
pushed to the session's registry: with ``off`` it starts nothing, and its entry reports
``UpgradeDisabled``, which the hub's rollout judges a failure of that cluster, unless its pod
runs the image the release names (then Ready, passed); installed again with ``on``, the same
declared release is tried. With ``no-new-rules`` a release with the
installed rules gets as far as its candidate, one with a rule more is refused and rolled back.
kwok runs no container: no candidate ever speaks on the Lease here, so every attempt that gets
that far ends at its deadline (tests/test_agent_upgrade_incluster.py shows the rest).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agent.api import to_dict
from agent.install.installer import install
from agent.install.manifests import (
    RELEASE_IMAGE,
    InstallConfig,
    approval_policies,
    deployment,
    install_objects,
    left_out_objects,
    rbac_objects,
)
from agent.kube import ForbiddenError, KubeClient, ObjectRef
from agent.runner.reader import open_reader
from agent.upgrade import AGENT_ENTRY
from agent.upgrade.artifact import MANIFEST, pack
from agent.upgrade.deployment import (
    CANDIDATE,
    ENV_DEPLOYMENT,
    NAME,
    AgentDeployment,
    Release,
    candidate_of,
    read_release,
    release_manifest,
)
from agent.upgrade.desired import Desired, Record, UpgradeStore, agent_report
from agent.upgrade.incluster import InClusterUpgrades
from agent.upgrade.rights import SelfUpgrade, disabled_message, fit_rules
from hub.rollout.evaluate import Installation, Observation, judge
from hub.rollout.state import Member
from hub.status.document import installation_state
from tests.fleetlab import REPO_ROOT
from tests.realenv.binaries import kubectl as kubectl_path
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.registry import Registry

IMAGE = "registry.example.test/fleetlet-agent@sha256:" + "1" * 64
RELEASE = "registry.example.test/fleetlet-agent@sha256:" + "2" * 64
RBAC = "rbac.authorization.k8s.io"
NEW_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}


def fleetlet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


@pytest.fixture
def install_args(tmp_path: Path) -> list[str]:
    root = tmp_path / "trusted_root.json"
    root.write_text("{}")
    return [
        "--image", IMAGE,
        "--repo", "https://git.example.test/fleet-state.git",
        "--status-repo", "https://git.example.test/fleet-status.git",
        "--cluster", "edge-9",
        "--identity", "https://ci.example.test/publish",
        "--issuer", "https://issuer.example.test",
        "--trusted-root", str(root),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def shared_cluster(kube_cluster: Cluster) -> Iterator[Cluster]:
    """The session's control plane, left as found: the cluster-wide objects ``agent install``
    makes besides the CRDs (the agent's ClusterRole and binding, its Events Role in
    ``default``, the approval policy and approver role) are deleted after this file, so that
    no later file's ``kubectl apply --server-side`` of them meets ``fleetlet-install`` as their
    owner (``deploy/agent/approvals`` in tests/test_approvals.py)."""
    yield kube_cluster
    rbac = f"{RBAC}/v1"
    refs = [
        ObjectRef(rbac, "ClusterRoleBinding", NAME, None),
        ObjectRef(rbac, "ClusterRole", NAME, None),
        ObjectRef(rbac, "RoleBinding", f"{NAME}-events", "default"),
        ObjectRef(rbac, "Role", f"{NAME}-events", "default"),
        *(ObjectRef.of(o) for o in approval_policies("unused") if not o["metadata"].get("namespace")),
    ]  # fmt: skip
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig)) as kube:
        for ref in refs:
            kube.delete(ref)


@pytest.fixture
def namespace(shared_cluster: Cluster) -> Iterator[str]:
    """A fresh namespace with a short name: the ServiceAccount's user name, with it, is a
    client certificate's common name (64 characters at most)."""
    kube_cluster = shared_cluster
    name = f"su-{uuid.uuid4().hex[:8]}"
    ref = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig)) as kube:
        kube.create(ref)
        try:
            yield name
        finally:
            kube.delete(ref)


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _upgrade_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules of the agent's ClusterRole and Role that concern its own upgrade."""
    own = [
        o for o in objects if o["kind"] in ("ClusterRole", "Role") and o["metadata"]["name"] == NAME
    ]
    upgrade = {"clusterroles", "roles", "deployments", "customresourcedefinitions"}
    return [r for o in own for r in o["rules"] if upgrade & set(r["resources"])]  # fmt: skip


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_help_and_dry_run_say_what_each_setting_grants(install_args: list[str]) -> None:
    done = fleetlet("agent", "install", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--self-upgrade {on,no-new-rules,off}" in text
    assert "escalate on its own ClusterRole and Role" in text
    assert "no-new-rules: the same without escalate" in text
    assert "off: no candidate Deployment and none of these rights" in text

    printed = {}
    for mode in SelfUpgrade:
        done = fleetlet("agent", "install", *install_args, "--self-upgrade", mode, "--dry-run")
        assert done.returncode == 0, done.stderr
        printed[mode] = (_objects(done.stdout), done.stderr)
    on, _ = printed[SelfUpgrade.ON]
    default = _objects(fleetlet("agent", "install", *install_args, "--dry-run").stdout)
    assert default == on  # on is the default, and today's installation
    assert any("escalate" in r["verbs"] for r in _upgrade_rules(on))

    off, said = printed[SelfUpgrade.OFF]
    assert _upgrade_rules(off) == []
    deployments = [o for o in off if o["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == [NAME]
    assert _env(deployments[0])["FLEETLET_SELF_UPGRADE"] == "off"
    # The difference from a default install, on stderr: what install would delete.
    assert said.strip() == (
        f"# --self-upgrade=off: Deployment fleetlet-system/{CANDIDATE} is left out; "
        "`agent install` deletes it (prune it in GitOps)"
    )
    # Nothing else differs from on: the same objects, less the upgrade rules and candidate.
    assert len(off) == len(on) - 1

    narrow, said = printed[SelfUpgrade.NO_NEW_RULES]
    assert said == ""
    rules = _upgrade_rules(narrow)
    assert rules and not any("escalate" in r["verbs"] for r in rules)
    assert rules == [
        {**r, "verbs": [v for v in r["verbs"] if v != "escalate"]} for r in _upgrade_rules(on)
    ]
    assert CANDIDATE in {o["metadata"]["name"] for o in narrow if o["kind"] == "Deployment"}

    done = fleetlet("agent", "install", *install_args, "--self-upgrade", "none", "--dry-run")
    assert done.returncode == 2
    assert "argument --self-upgrade: invalid choice: 'none'" in done.stderr
    # The agent reads it from its pod's environment; a value it does not know stops it at once.
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", "agent", "run", "--repo", "https://git.example.test/r.git",
         "--cluster", "edge-9"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "FLEETLET_SELF_UPGRADE": "maybe"},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "fleetlet: --self-upgrade ($FLEETLET_SELF_UPGRADE) 'maybe': expected one of on, "
        "no-new-rules, off"
    )


def _kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_path(), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _can_i(cluster: Cluster, namespace: str, *args: str) -> bool:
    """``kubectl auth can-i`` as the agent's ServiceAccount (a SubjectAccessReview)."""
    user = f"system:serviceaccount:{namespace}:{NAME}"
    done = _kubectl(cluster, "auth", "can-i", *args, f"--as={user}")
    assert done.stdout.strip() in ("yes", "no"), done.stderr
    return done.stdout.strip() == "yes"


def _agent(cluster: Cluster, namespace: str) -> str:
    """A kubeconfig of the agent's ServiceAccount (a client certificate of its user name)."""
    return cluster.mint_user(
        f"system:serviceaccount:{namespace}:{NAME}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
    )


def _ref(kind: str, namespace: str | None, name: str = NAME) -> dict[str, Any]:
    api = "apps/v1" if kind == "Deployment" else f"{RBAC}/v1"
    meta = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": api, "kind": kind, "metadata": meta}


def _rights(cluster: Cluster, ns: str) -> dict[str, bool]:
    """What self-upgrade needs, as can-i answers it for the agent's ServiceAccount."""
    crd = "customresourcedefinitions.apiextensions.k8s.io/bundledeployments.fleetlet.io"
    return {
        "patch deployment": _can_i(cluster, ns, "patch", f"deployments.apps/{NAME}", "-n", ns),
        "patch candidate": _can_i(cluster, ns, "patch", f"deployments.apps/{CANDIDATE}", "-n", ns),
        "patch clusterrole": _can_i(cluster, ns, "patch", f"clusterroles.{RBAC}/{NAME}"),
        "escalate clusterrole": _can_i(cluster, ns, "escalate", f"clusterroles.{RBAC}/{NAME}"),
        "escalate role": _can_i(cluster, ns, "escalate", f"roles.{RBAC}/{NAME}", "-n", ns),
        "patch crd": _can_i(cluster, ns, "patch", crd),
    }


def _install(cluster: Cluster, args: list[str], ns: str, mode: str) -> list[tuple[str, str, str]]:
    """``agent install`` as a user types it; the (kind, name, action) of what changed."""
    done = fleetlet("agent", "install", *args, "--namespace", ns, "--self-upgrade", mode,
                    "--kubeconfig", str(cluster.kubeconfig), "-o", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    return [(i["kind"], i["name"], i["action"]) for i in items if i["action"] != "unchanged"]


def test_installing_again_with_another_setting_converges(
    kube_cluster: Cluster, namespace: str, install_args: list[str]
) -> None:
    cluster, ns = kube_cluster, namespace
    admin = KubeClient(kubeconfig=str(cluster.kubeconfig))
    agent = KubeClient(kubeconfig=_agent(cluster, ns))
    rules = lambda: list((admin.get(_ref("ClusterRole", None)) or {}).get("rules") or [])  # noqa: E731

    # off: none of self-upgrade's rights, no candidate; the agent's other rights as ever.
    _install(cluster, install_args, ns, "off")
    assert not any(_rights(cluster, ns).values()), _rights(cluster, ns)
    assert admin.get(_ref("Deployment", ns, CANDIDATE)) is None
    assert _env(admin.get(_ref("Deployment", ns)) or {})["FLEETLET_SELF_UPGRADE"] == "off"
    assert _can_i(cluster, ns, "create", "bundledeployments.fleetlet.io")
    # Refused by the API server, not only by can-i: its own ClusterRole, its Deployment.
    with pytest.raises(ForbiddenError):
        agent.patch(_ref("ClusterRole", None), {"rules": [*rules(), NEW_RULE]})
    with pytest.raises(ForbiddenError):
        agent.patch(_ref("Deployment", ns), {"spec": {"replicas": 1}})
    with pytest.raises(ForbiddenError):
        agent.get(_ref("Role", ns))
    # Again, the same: nothing changes, nothing is deleted.
    assert _install(cluster, install_args, ns, "off") == []
    items = json.loads(
        fleetlet("agent", "install", *install_args, "--namespace", ns, "--self-upgrade", "off",
                 "--kubeconfig", str(cluster.kubeconfig), "-o", "json").stdout
    )["items"]  # fmt: skip
    assert len({(i["kind"], i["name"]) for i in items}) == len(items)  # each object once

    # no-new-rules: the upgrade's rights and the candidate, without escalate; both exist
    # before the agent's Deployment says it may use them.
    changed = _install(cluster, install_args, ns, "no-new-rules")
    assert changed == [
        ("ClusterRole", NAME, "configured"),
        ("Role", NAME, "configured"),
        ("Deployment", CANDIDATE, "created"),
        ("Deployment", NAME, "configured"),
    ]
    assert _rights(cluster, ns) == {
        "patch deployment": True,
        "patch candidate": True,
        "patch clusterrole": True,
        "escalate clusterrole": False,
        "escalate role": False,
        "patch crd": True,
    }
    agent.patch(_ref("Deployment", ns, CANDIDATE), {"metadata": {"labels": {"touched": "yes"}}})
    agent.patch(_ref("ClusterRole", None), {"rules": rules()})  # the rules it holds: allowed
    with pytest.raises(ForbiddenError) as caught:
        agent.patch(_ref("ClusterRole", None), {"rules": [*rules(), NEW_RULE]})
    assert "attempting to grant RBAC permissions not currently held" in str(caught.value)
    assert NEW_RULE not in rules()

    # on: escalate back; a new rule goes through.
    _install(cluster, install_args, ns, "on")
    assert all(_rights(cluster, ns).values()), _rights(cluster, ns)
    before = rules()
    agent.patch(_ref("ClusterRole", None), {"rules": [*before, NEW_RULE]})
    assert NEW_RULE in rules()

    # off again: the rule the agent gave itself, the upgrade's rights and the candidate go,
    # taken away only once the agent's pod runs with the new setting (table output: each
    # object as it is done).
    done = fleetlet("agent", "install", *install_args, "--namespace", ns, "--self-upgrade",
                    "off", "--kubeconfig", str(cluster.kubeconfig))  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # Applied twice: with on's rules (the agent's own new rule goes) before its Deployment,
    # with off's after it; then the candidate deleted.
    first, second = [n for n, line in enumerate(lines) if line.startswith(f"clusterrole/{NAME} ")]
    assert first < lines.index(f"deployment/{NAME} -n {ns} configured") < second, lines
    assert lines[second] == f"clusterrole/{NAME} configured"
    assert second < lines.index(f"deployment/{CANDIDATE} -n {ns} deleted"), lines
    # The roles were narrowed once the agent's Deployment ran its new pod (the old one gone).
    agent_deployment = admin.get(_ref("Deployment", ns)) or {}
    status = agent_deployment["status"]
    assert status["observedGeneration"] == agent_deployment["metadata"]["generation"]
    assert status["updatedReplicas"] == status["replicas"] == 1
    assert lines[-1].startswith(f"cluster edge-9 is in the fleet: agent {IMAGE} in namespace "
                                f"{ns}, self-upgrade off (")  # fmt: skip
    assert "1 deleted)" in lines[-1]
    assert NEW_RULE not in rules()
    assert not any(_rights(cluster, ns).values())
    assert admin.get(_ref("Deployment", ns, CANDIDATE)) is None


def _until(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _config(namespace: str, mode: SelfUpgrade) -> InstallConfig:
    return InstallConfig(
        image=IMAGE,
        repo="https://git.example.test/fleet-state.git",
        cluster="edge-9",
        identity="ci@example.test",
        issuer="https://issuer.example.test",
        trusted_root="{}",
        namespace=namespace,
        self_upgrade=mode,
    )


def _install_objects(kube: KubeClient, namespace: str, mode: SelfUpgrade) -> None:
    config = _config(namespace, mode)
    install(kube, install_objects(config), left_out=left_out_objects(config))


def _upgrades(
    kubeconfig: str,
    namespace: str,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    rights: SelfUpgrade,
    image: str = "",
) -> InClusterUpgrades:
    """The acting agent's upgrade loop, as ``agent run`` in the agent's pod builds it (running
    the container ``image``: "", started from elsewhere)."""
    monkeypatch.setenv(ENV_DEPLOYMENT, NAME)
    monkeypatch.setenv("FLEETLET_AGENT_UPGRADE_DEADLINE", "4")
    monkeypatch.setenv("FLEETLET_AGENT_IMAGE", image.rpartition("@")[2])
    monkeypatch.delenv("FLEETLET_AGENT_CANDIDATE", raising=False)
    settings = SimpleNamespace(
        kubeconfig=kubeconfig,
        namespace=namespace,
        network=SimpleNamespace(connect_timeout=5.0, read_timeout=30.0, attempts=3),
        poll=SimpleNamespace(interval=1.0, drift_interval=1.0),
        repo=SimpleNamespace(cache_dir=tmp / "cache"),
        plain_http_registries=True,
    )
    supervisor = SimpleNamespace(pusher=None, last=None, reader=open_reader(kubeconfig))
    return InClusterUpgrades(settings=settings, supervisor=supervisor, rights=rights)


def _verdict(desired: Desired, record: Record) -> str:
    """The hub's rollout verdict on a cluster whose agent reports ``record``."""
    now = datetime.now(UTC).replace(microsecond=0)
    member = Member(wave=0, previous="p", target="t", phase="released", serial=desired.serial,
                    since=int(now.timestamp()) - 10)  # fmt: skip
    report = agent_report(desired, record, now)
    assert report is not None
    item = to_dict(report)
    applied = (item.get("appliedRevision") or {}).get("serial", 0)
    run = (item.get("runs") or [{}])[0].get("serial", 0)
    state = installation_state(item, stale=False)
    seen = Observation(heartbeat=now, stale=False, accepted=desired.serial,
                       installations={AGENT_ENTRY: Installation(state, applied, run)})  # fmt: skip
    found = judge(member, seen, (AGENT_ENTRY,), now, timedelta(minutes=10))
    return f"{found.verdict}: {found.reason}"


def test_an_agent_installed_off_reports_a_declared_release_disabled_until_installed_on(
    kube_cluster: Cluster,
    namespace: str,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    _install_objects(admin, namespace, SelfUpgrade.OFF)
    kubeconfig = _agent(kube_cluster, namespace)
    # A real release of this checkout, pushed; the set declares it (what the inbound
    # pipeline keeps of the set's agent entry).
    tree = pack(REPO_ROOT, tmp_path / "release", version="2.0.0-test", image=RELEASE)
    pushed = push_bundle(OciClient(host=registry.host), "fleetlet/optout-release", tree)
    desired = Desired(uri=f"{registry.host}/fleetlet/optout-release", digest=pushed.digest,
                      serial=7, since=7)  # fmt: skip
    store = UpgradeStore(admin, namespace)
    store.save_desired(desired)

    upgrades = _upgrades(kubeconfig, namespace, tmp_path, monkeypatch, SelfUpgrade.OFF, IMAGE)
    upgrades.start()
    try:
        record = _until(lambda: (r := store.read()[1]).state == "Failed" and r, "the refusal")
        time.sleep(2.5)  # two more checks: not tried again, nothing started
        assert store.read()[1] == record
    finally:
        upgrades.stop()
        upgrades.finish()
    assert (record.reason, record.attempt, record.attempt_serial) == (
        "UpgradeDisabled", desired.digest, 7)  # fmt: skip
    assert record.message == disabled_message(desired.digest)
    assert "--self-upgrade=off on this cluster" in record.message
    assert "run `fleetlet agent install --self-upgrade=on`" in record.message
    # Pulled by digest only to read which image it names (not the one this pod runs);
    # nothing started.
    assert (tmp_path / "cache" / "agent-images").is_dir()
    assert admin.get(_ref("Deployment", namespace, CANDIDATE)) is None
    report = agent_report(desired, record)
    assert report is not None
    conditions = {c.type: c for c in report.conditions}
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", "UpgradeDisabled")
    assert conditions["Ready"].message == record.message and "\n" not in record.message
    assert (conditions["Degraded"].status, conditions["Degraded"].reason) == (
        "True",
        "UpgradeDisabled",
    )
    # The hub's rollout: a failure of this cluster on that serial, not a wait.
    assert _verdict(desired, record) == f"failed: {AGENT_ENTRY}: Degraded on serial 7"
    # An attempt left in progress (the install switched it off in the middle): refused too,
    # rather than reported as progressing until the rollout's deadline.
    store.save_record(dataclasses.replace(record, state="Progressing", reason="", message="x"))
    upgrades = _upgrades(kubeconfig, namespace, tmp_path, monkeypatch, SelfUpgrade.OFF, IMAGE)
    upgrades.start()
    try:
        again = _until(lambda: (r := store.read()[1]).state == "Failed" and r, "the refusal")
    finally:
        upgrades.stop()
        upgrades.finish()
    assert (again.reason, again.message) == ("UpgradeDisabled", record.message)

    # An operator installs the release's image by hand (agent install --image): the agent
    # reads the release (pulled, nothing started), finds it runs it, and says so: passed.
    upgrades = _upgrades(kubeconfig, namespace, tmp_path, monkeypatch, SelfUpgrade.OFF, RELEASE)
    upgrades.start()
    try:
        runs = _until(lambda: (r := store.read()[1]).running == desired.digest and r, "Ready")
    finally:
        upgrades.stop()
        upgrades.finish()
    assert (runs.version, runs.state, runs.attempt) == ("2.0.0-test", "", "")
    assert admin.get(_ref("Deployment", namespace, CANDIDATE)) is None
    ready = agent_report(desired, runs)
    assert ready is not None and ready.conditions[0].status == "True"
    assert _verdict(desired, runs) == "passed: Ready on serial 7 or later"
    store.save_record(Record())  # the pod's image again: the test's agent runs from elsewhere

    # Installed again with on: the same declared release is tried (the candidate started);
    # nobody speaks for it here (no container runs), so it ends at the deadline, rolled back.
    _install_objects(admin, namespace, SelfUpgrade.ON)
    upgrades = _upgrades(kubeconfig, namespace, tmp_path, monkeypatch, SelfUpgrade.ON)
    upgrades.start()
    try:
        _until(
            lambda: ((admin.get(_ref("Deployment", namespace, CANDIDATE)) or {}).get("spec") or {}).get("replicas"),
            "the candidate started",
        )  # fmt: skip
        tried = _until(
            lambda: (r := store.read()[1]).reason not in ("", "UpgradeDisabled") and r,
            "the attempt's end",
        )
    finally:
        upgrades.stop()
        upgrades.finish()
    assert (tried.state, tried.reason) == ("Failed", "DeadlineExceeded")


def test_no_new_rules_declares_a_release_with_the_installed_rules_and_refuses_one_more(
    kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A release carries the rules of ``on`` (escalate included); an agent installed with
    ``no-new-rules`` declares them without escalate, so the same rules go through and a rule
    more is refused by the API server (the step the in-cluster upgrade rolls back)."""
    admin = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    _install_objects(admin, namespace, SelfUpgrade.NO_NEW_RULES)
    agent = AgentDeployment(KubeClient(kubeconfig=_agent(kube_cluster, namespace)), namespace)
    (tmp_path / "fleetlet-agent.json").write_text(
        json.dumps(release_manifest(RELEASE, version="2"))
    )
    release = read_release(tmp_path, "test")
    assert any("escalate" in r["verbs"] for r in release.cluster_rules or ())
    before = (admin.get(_ref("ClusterRole", None)) or {})["rules"]

    fitted = SelfUpgrade.NO_NEW_RULES
    same = Release(
        version="2", image=RELEASE, crds=release.crds,
        cluster_rules=fit_rules(release.cluster_rules, fitted),
        role_rules=fit_rules(release.role_rules, fitted),
    )  # fmt: skip
    assert agent.declare(same).rules == {}  # nothing to change
    with pytest.raises(ForbiddenError):  # as built: escalate is a right it does not hold
        agent.declare(release)
    more = Release(
        version="3", image=RELEASE,
        cluster_rules=fit_rules([*(release.cluster_rules or ()), NEW_RULE], fitted),
    )  # fmt: skip
    with pytest.raises(ForbiddenError) as caught:
        agent.declare(more)
    assert "attempting to grant RBAC permissions not currently held" in str(caught.value)
    assert (admin.get(_ref("ClusterRole", None)) or {})["rules"] == before


def _pushed(registry: Registry, tmp: Path, version: str, *rules: dict[str, Any]) -> Desired:
    """A release of this checkout with ``rules`` more in its ClusterRole, pushed; what a set
    declaring it asks for (serial and since: its version's major)."""
    tree = pack(REPO_ROOT, tmp / version, version=version, image=RELEASE)
    manifest = json.loads((tree / MANIFEST).read_text())
    manifest["rbac"]["clusterRole"] += list(rules)
    (tree / MANIFEST).write_text(json.dumps(manifest))
    pushed = push_bundle(OciClient(host=registry.host), "fleetlet/optout-release", tree)
    serial = int(version.split(".")[0])
    return Desired(uri=f"{registry.host}/fleetlet/optout-release", digest=pushed.digest,
                   serial=serial, since=serial)  # fmt: skip


def test_an_agent_installed_no_new_rules_upgrades_without_escalate(
    kube_cluster: Cluster,
    namespace: str,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upgrade loop as the ServiceAccount of an agent installed ``no-new-rules``: a release
    with the installed rules gets as far as its candidate (nobody speaks for it here, so it
    ends at the deadline); one with a rule more is refused at the declare step, rolled back."""
    admin = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    _install_objects(admin, namespace, SelfUpgrade.NO_NEW_RULES)
    kubeconfig = _agent(kube_cluster, namespace)
    store = UpgradeStore(admin, namespace)
    before = (admin.get(_ref("ClusterRole", None)) or {})["rules"]

    def attempt(desired: Desired) -> Record:
        store.save_desired(desired)
        upgrades = _upgrades(kubeconfig, namespace, tmp_path, monkeypatch, SelfUpgrade.NO_NEW_RULES)
        upgrades.start()
        try:
            return _until(
                lambda: (r := store.read()[1]).attempt == desired.digest
                and r.state == "Failed" and r,
                "the attempt's end",
            )  # fmt: skip
        finally:
            upgrades.stop()
            upgrades.finish()

    same = attempt(_pushed(registry, tmp_path, "7.0.0-test"))
    assert (same.state, same.reason) == ("Failed", "DeadlineExceeded")
    assert "did not pass its self-check" in same.message  # the candidate was started
    more = attempt(_pushed(registry, tmp_path, "8.0.0-test", NEW_RULE))
    assert (more.state, more.reason) == ("Failed", "Forbidden")
    assert "attempting to grant RBAC permissions not currently held" in more.message
    assert (admin.get(_ref("ClusterRole", None)) or {})["rules"] == before
    candidate = admin.get(_ref("Deployment", namespace, CANDIDATE)) or {}
    assert candidate["spec"]["replicas"] == 0


@pytest.mark.parametrize("mode", [SelfUpgrade.NO_NEW_RULES, SelfUpgrade.OFF])
def test_the_kustomize_components_build_what_install_applies(
    mode: SelfUpgrade, kustomize_binary: Path, tmp_path: Path
) -> None:
    """``deploy/agent`` with the component ``self-upgrade-<mode>``, built by the real kustomize:
    the agent's roles and Deployments are those ``agent install --self-upgrade=<mode>`` makes."""
    shutil.copytree(REPO_ROOT / "deploy" / "agent", tmp_path / "agent")  # as a user vendors it
    overlay = tmp_path / "cluster"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../agent"], "components": [f"../agent/self-upgrade-{mode}"]})
    )
    done = subprocess.run(
        [str(kustomize_binary), "build", str(overlay)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    built = {(o["kind"], o["metadata"]["name"]): o for o in _objects(done.stdout)}
    ns = "fleetlet-system"
    for role in rbac_objects(ns, mode):
        assert built[(role["kind"], role["metadata"]["name"])] == role
    agent = deployment(namespace=ns, image=RELEASE_IMAGE, self_upgrade=mode)
    wanted = [agent] if mode is SelfUpgrade.OFF else [agent, candidate_of(agent)]
    # The same objects; a strategic-merge patch puts the variable it sets first.
    assert [_by_name(o) for o in built.values() if o["kind"] == "Deployment"] == [
        _by_name(o) for o in wanted
    ]


def _by_name(deployment: dict[str, Any]) -> dict[str, Any]:
    """``deployment`` with its container's variables in name order."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["env"] = sorted(container["env"], key=lambda e: e["name"])
    return deployment
