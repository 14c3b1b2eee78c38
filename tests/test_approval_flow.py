"""Approvals end to end: the agent asks (a BundleDeploymentRequest with a live preview), a person
or the cluster's ApprovalPolicy decides, the API server enforces who may, and the agent applies
exactly what was approved, the whole lockstep group at once, or nothing.

Real API server (kwok runs the pods), registry, git server and mini Sigstore; the agent is built
as ``fleetlet agent run`` builds it (in-process, or as ``python -m fleetlet agent sync --once``
for the kill -9 test); people decide with ``python -m fleetlet approve|deny`` and kubeconfigs of
their own (client certificates of the test cluster's CA), bound to deploy/'s
``fleetlet-approver`` ClusterRole.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.apply.intent import GroupRecords
from agent.approve.request import Request, Requests
from agent.kube import KubeClient
from tests.fleetlab import Lab, conditions, configmap, deployment, live, namespace_manifest
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster
from tests.test_approvals import AGENT_LIKE, User, Users, request_object
from tests.test_approvals import approvals_enforced as approvals_enforced  # the fixture
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

REPO_ROOT = Path(__file__).resolve().parent.parent
HEALTH = {"timeoutSeconds": 20}


def fleetlet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


class Shop:
    """A base group (its namespace) and the ``app`` group: ``web`` (a Deployment, approval:
    manual unless told otherwise) and ``conf`` (a ConfigMap, and in some versions a
    ClusterRoleBinding), in versions."""

    def __init__(self, lab: Lab, kube: KubeClient, *, manual: bool = True) -> None:
        self.lab = lab
        self.kube = kube
        self.manual = manual
        self.ns = lab.name("shop")
        self.base = lab.name("base")
        self.web = lab.name("web")
        self.conf = lab.name("conf")
        self.binding = lab.name("shop-view")

    def publish(self, version: int, *, binding: bool = False) -> None:
        self.lab.publish(self.bundles(version, binding=binding))

    def bundles(self, version: int, *, binding: bool = False) -> list[dict[str, Any]]:
        """The fleet-repo bundle documents of ``version`` (content pushed to the registry)."""
        lab = self.lab
        web = lab.push(
            "web",
            {"d.yaml": deployment("web", self.ns, f"example/web:{version}.0")},
            tag=f"v{version}",
        )
        files = {"c.yaml": configmap("settings", self.ns, {"value": f"v{version}"})}
        if binding:
            files["crb.yaml"] = yaml.safe_dump(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": self.binding},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "view",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": "web", "namespace": self.ns}],
                }
            )
        conf = lab.push("conf", files, tag=f"v{version}")
        base = lab.push("base", {"ns.yaml": namespace_manifest(self.ns)}, tag="v1")
        web_bundle: dict[str, Any] = {
            "name": self.web,
            "sources": [lab.source("web", web)],
            "group": "app",
            "dependsOn": ["base"],
            "healthChecks": HEALTH,
        }
        if self.manual:
            web_bundle["approval"] = "manual"
        return [
            {"name": self.base, "sources": [lab.source("base", base)], "group": "base"},
            web_bundle,
            {
                "name": self.conf,
                "sources": [lab.source("conf", conf)],
                "group": "app",
                "dependsOn": ["base"],
                "healthChecks": HEALTH,
            },
        ]

    def running(self) -> tuple[str | None, str | None]:
        """(web's image, conf's value) in the cluster; None where absent."""
        web = live(self.kube, "apps/v1", "Deployment", "web", self.ns)
        conf = live(self.kube, "v1", "ConfigMap", "settings", self.ns)
        image = web["spec"]["template"]["spec"]["containers"][0]["image"] if web else None
        return image, (conf["data"]["value"] if conf else None)

    def on(self, version: int) -> bool:
        return self.running() == (f"example/web:{version}.0", f"v{version}")

    def ready(self, bundle: str) -> dict[str, Any]:
        return conditions(self.kube, bundle)["Ready"]

    def phase(self, bundle: str) -> str:
        bd = live(self.kube, "fleetlet.io/v1alpha1", "BundleDeployment", bundle)
        assert bd is not None
        return str(bd["status"]["phase"])


def requests(kube: KubeClient, namespace: str) -> list[Request]:
    """The agent's requests for group ``app``, newest first."""
    return Requests(kube=kube, owner=namespace).of_group("app")


def pending(kube: KubeClient, namespace: str) -> Request:
    found = [r for r in requests(kube, namespace) if r.state == "Pending"]
    assert len(found) == 1, [(r.name, r.state) for r in requests(kube, namespace)]
    return found[0]


@pytest.fixture
def users(approvals_enforced: Cluster) -> Users:
    return Users(approvals_enforced, uuid.uuid4().hex[:6])


@pytest.fixture
def alice(users: Users) -> User:
    return users.mint("alice", cluster_role="fleetlet-approver")


@pytest.fixture
def kube(approvals_enforced: Cluster) -> Iterator[KubeClient]:
    with KubeClient(kubeconfig=str(approvals_enforced.kubeconfig)) as client:
        yield client


def approve(user: User, name: str, *more: str) -> None:
    done = fleetlet("approve", name, "--kubeconfig", str(user.kubeconfig), *more)
    assert done.returncode == 0, done.stderr


def test_a_lockstep_group_is_approved_once_and_moves_together(
    lab: Lab, approvals_enforced: Cluster, kube: KubeClient, alice: User, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    shop = Shop(lab, kube)
    shop.publish(1)
    agent = lab.agent("edge-1", approvals_enforced, namespace=namespace, workdir=tmp_path / "a")
    first = agent.tick()
    assert first.outbound is not None
    assert first.outbound.moved == ("base",), first
    assert first.outbound.awaiting_approval == ("app",), first
    assert shop.running() == (None, None)  # nothing of the group applied
    for bundle in (shop.web, shop.conf):
        ready = shop.ready(bundle)
        assert (ready["status"], ready["reason"]) == ("False", "AwaitingApproval"), ready
        assert shop.phase(bundle) == "AwaitingApproval"
    request = pending(kube, namespace)
    assert ready["message"].startswith(
        f"serial 1 waits for an approval of BundleDeploymentRequest {request.name}"
    )
    # One request for the whole group, pinned to both bundles, with the live preview.
    assert {p.name for p in request.spec.bundles} == {shop.web, shop.conf}
    assert request.spec.set_digest.startswith("sha256:") and request.spec.serial == 1
    assert request.spec.reasons == (f"bundle {shop.web} asks for an approval (approval: manual)",)
    preview = request.spec.preview
    assert (preview.source, preview.created, preview.changed, preview.deleted) == ("live", 2, 0, 0)
    assert {(o.kind, o.name, o.action) for o in preview.objects} == {
        ("Deployment", "web", "created"),
        ("ConfigMap", "settings", "created"),
    }
    assert all("+kind: " in o.diff for o in preview.objects)
    shown = fleetlet("preview", request.name, "--kubeconfig", str(alice.kubeconfig))
    assert shown.returncode == 0, shown.stderr
    assert "Objects (server-side dry run): 2 created, 0 changed" in shown.stdout
    assert f"created  {shop.web}" in shown.stdout
    # Asking again makes no second request.
    again = agent.tick()
    assert again.outbound is not None and again.outbound.awaiting_approval == ("app",)
    assert [r.name for r in requests(kube, namespace)] == [request.name]
    # The hub sees it through the status branch: the state, and the request with its preview.
    hub = ("--repo", lab.status_url, "--cache-dir", str(tmp_path / "hub"), "-o", "json")
    listed = fleetlet("installations", "list", "--state", "AwaitingApproval", *hub)
    assert listed.returncode == 0, listed.stderr
    assert {i["bundle"] for i in json.loads(listed.stdout)["items"]} == {shop.web, shop.conf}
    detail = json.loads(fleetlet("installations", "show", f"edge-1/{shop.web}", *hub).stdout)
    (reported,) = detail["requests"]
    assert (reported["name"], reported["state"], reported["serial"]) == (request.name, "Pending", 1)
    assert reported["preview"]["created"] == 2 and "diff" not in reported["preview"]["objects"][0]

    approve(alice, request.name, "--reason", "first install")
    # The poll job (what `agent run` schedules) looks again while a decision is awaited,
    # though the branch did not move.
    moved = agent.poll()
    assert moved.inbound == "unchanged"
    assert moved.outbound is not None and moved.outbound.moved == ("app",), moved
    assert shop.on(1)
    assert shop.ready(shop.web)["status"] == "True" and shop.ready(shop.conf)["status"] == "True"

    # An upgrade: a new request, the preview says what changes, field by field.
    shop.publish(2)
    agent.tick()
    assert shop.on(1)
    v2 = pending(kube, namespace)
    assert v2.spec.serial == 2 and v2.name != request.name
    changed = {o.kind: o for o in v2.spec.preview.objects}
    assert v2.spec.preview.changed == 2 and v2.spec.preview.created == 0
    assert changed["Deployment"].paths == ("spec.template.spec.containers[0].image",)
    assert changed["ConfigMap"].paths == ("data.value",)
    assert "-      - image: example/web:1.0" in changed["Deployment"].diff
    assert "+      - image: example/web:2.0" in changed["Deployment"].diff
    # A newer publication before anyone decided: v2's request is superseded, v3 asks anew.
    shop.publish(3)
    agent.tick()
    states = {r.spec.serial: r.state for r in requests(kube, namespace)}
    assert states == {1: "Approved", 2: "Superseded", 3: "Pending"}, states
    late = fleetlet("approve", v2.name, "--kubeconfig", str(alice.kubeconfig))
    assert late.returncode == 1 and "superseded" in late.stderr, late.stderr
    approve(alice, pending(kube, namespace).name)
    final = agent.tick()
    assert final.outbound is not None and final.outbound.moved == ("app",)
    assert shop.on(3)
    out = subprocess.run(
        [kubectl(), "--kubeconfig", str(approvals_enforced.kubeconfig), "get", "bdr",
         "-l", f"fleetlet.io/managed-by={namespace}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert out.count(alice.name) == 2 and "Approved" in out, out


def test_deny_leaves_the_group_wholly_as_it_was_and_says_who_and_why(
    lab: Lab, approvals_enforced: Cluster, kube: KubeClient, alice: User, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    shop = Shop(lab, kube)
    shop.publish(1)
    agent = lab.agent("edge-1", approvals_enforced, namespace=namespace, workdir=tmp_path / "a")
    agent.tick()
    approve(alice, pending(kube, namespace).name)
    agent.tick()
    assert shop.on(1)
    shop.publish(2)
    agent.tick()
    request = pending(kube, namespace)
    denied = fleetlet("deny", request.name, "--reason", "not during the sale",
                      "--kubeconfig", str(alice.kubeconfig))  # fmt: skip
    assert denied.returncode == 0, denied.stderr
    after = agent.tick()
    assert after.outbound is not None and after.outbound.held == ("app",)
    assert not after.outbound.converged
    assert shop.on(1)  # both bundles, exactly as they were
    for bundle in (shop.web, shop.conf):
        ready = shop.ready(bundle)
        assert (ready["status"], ready["reason"]) == ("False", "Denied"), ready
        assert f"serial 2 denied by {alice.name}" in ready["message"]
        assert "not during the sale" in ready["message"]
        assert "still running serial 1" in ready["message"]
        assert conditions(kube, bundle)["Degraded"]["status"] == "False"
        assert shop.phase(bundle) == "Denied"
    hub = ("--repo", lab.status_url, "--cache-dir", str(tmp_path / "hub"), "-o", "json")
    detail = json.loads(fleetlet("installations", "show", f"edge-1/{shop.conf}", *hub).stdout)
    assert detail["state"] == "Denied"
    latest = detail["requests"][0]
    assert (latest["state"], latest["decidedBy"], latest["reason"]) == (
        "Denied",
        alice.name,
        "not during the sale",
    )
    # It stays denied: the next pass neither asks again nor moves.
    agent.tick()
    assert [r.state for r in requests(kube, namespace)] == ["Denied", "Approved"]
    assert shop.on(1)
    assert GroupRecords(kube, namespace=namespace).load("app").intent is None


def test_a_request_approved_for_other_digests_moves_nothing(
    lab: Lab, approvals_enforced: Cluster, kube: KubeClient, users: Users, alice: User,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    shop = Shop(lab, kube)
    shop.publish(1)
    agent = lab.agent("edge-1", approvals_enforced, namespace=namespace, workdir=tmp_path / "a")
    agent.tick()
    approve(alice, pending(kube, namespace).name)
    agent.tick()
    assert shop.on(1)
    shop.publish(2)
    agent.tick()
    v2 = pending(kube, namespace)
    # Approved, but for serial 2's digests: serial 3 is published before the agent looks.
    approve(alice, v2.name)
    shop.publish(3)
    agent.tick()
    assert shop.on(1)
    v3 = pending(kube, namespace)
    assert v3.spec.serial == 3
    # Someone else (allowed to create requests) makes one that claims to be for exactly
    # serial 3's pins, labelled as the agent's, and it is approved: the agent does not take it.
    eve = users.mint("eve", cluster_role=users.role("agent-like", AGENT_LIKE))
    forged = request_object(f"app-s3-{uuid.uuid4().hex[:6]}", requested_by=eve.name)
    forged["metadata"]["labels"] = {
        "fleetlet.io/managed-by": namespace,
        "fleetlet.io/group": "app",
    }
    forged["spec"] = {**forged["spec"], **{
        k: v for k, v in _spec_dict(v3).items() if k not in ("requestedBy",)
    }}  # fmt: skip
    with eve.client() as client:
        client.create(forged, field_manager="t")
    approve(alice, forged["metadata"]["name"])
    agent.tick()
    assert shop.on(1)
    assert pending(kube, namespace).name == v3.name
    for bundle in (shop.web, shop.conf):
        assert shop.ready(bundle)["reason"] == "AwaitingApproval"


def _spec_dict(request: Request) -> dict[str, Any]:
    from agent.api import to_dict

    return dict(to_dict(request.spec))


def test_kill_9_between_approval_and_apply_ends_on_one_revision(
    lab: Lab, approvals_enforced: Cluster, kube: KubeClient, alice: User, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    shop = Shop(lab, kube)
    workdir = tmp_path / "agent"

    def sync(**env: str) -> subprocess.CompletedProcess[str]:
        return lab.sync_once("edge-1", approvals_enforced, namespace=namespace,
                             workdir=workdir, env=env)  # fmt: skip

    shop.publish(1)
    assert sync().returncode == 4  # waiting for an approval: not everything is Ready
    approve(alice, pending(kube, namespace).name)
    assert sync().returncode == 0
    assert shop.on(1)
    for version, point in enumerate(("approved", "intent", "apply:applying", "healthy"), start=2):
        shop.publish(version)
        waiting = sync()
        assert waiting.returncode == 4, waiting.stderr
        approve(alice, pending(kube, namespace).name)
        killed = sync(FLEETLET_FAILPOINT=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr)
        again = sync()
        assert again.returncode == 0, (point, again.stdout, again.stderr)
        assert shop.on(version), (point, shop.running())
        assert shop.ready(shop.web)["status"] == "True"
        assert GroupRecords(kube, namespace=namespace).load("app").intent is None


def test_auto_approval_approves_the_harmless_change_and_holds_the_one_adding_a_clusterrolebinding(
    lab: Lab, approvals_enforced: Cluster, kube: KubeClient, alice: User, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """The cluster admin's ApprovalPolicy requires an approval of every move (no bundle says
    manual) and lets through what touches no RBAC, CRD or webhook, as the approver
    ServiceAccount it names."""
    shop = Shop(lab, kube, manual=False)
    approver = f"approver-{lab.suffix}"
    policy = lab.name("policy")
    cluster = approvals_enforced

    def run(*args: str, stdin: str | None = None) -> None:
        subprocess.run([kubectl(), "--kubeconfig", str(cluster.kubeconfig), *args],
                       input=stdin, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip

    run("create", "serviceaccount", approver, "-n", namespace)
    run("create", "clusterrolebinding", approver, "--clusterrole=fleetlet-approver",
        f"--serviceaccount={namespace}:{approver}")  # fmt: skip
    document = {
        "apiVersion": "fleetlet.io/v1alpha1",
        "kind": "ApprovalPolicy",
        "metadata": {"name": policy},
        "spec": {
            "requireApproval": True,
            "approver": approver,
            "rules": [
                {"name": "broken", "expression": "preview.nosuchfield == 1"},
                {
                    "name": "no-rbac-crds-webhooks",
                    "expression": "preview.security.rbac.size() == 0 && "
                    "preview.security.crds.size() == 0 && preview.security.webhooks.size() == 0",
                },
            ],
        },
    }
    run("apply", "-f", "-", stdin=yaml.safe_dump(document))
    try:
        shop.publish(1)
        agent = lab.agent("edge-1", cluster, namespace=namespace, workdir=tmp_path / "a")
        first = agent.tick()
        assert first.outbound is not None and first.outbound.moved == ("base", "app"), first
        assert shop.on(1)
        v1 = requests(kube, namespace)[0]
        assert v1.state == "Approved"
        assert v1.status.decided_by == f"system:serviceaccount:{namespace}:{approver}"
        assert (v1.status.policy, v1.status.rule) == (policy, "no-rbac-crds-webhooks")
        assert v1.spec.reasons == (
            f"ApprovalPolicy {policy} requires an approval of every move (requireApproval)",
        )

        shop.publish(2, binding=True)
        held = agent.tick()
        assert held.outbound is not None and held.outbound.awaiting_approval == ("app",), held
        assert shop.on(1)
        assert (
            live(kube, "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", shop.binding) is None
        )
        v2 = pending(kube, namespace)
        (finding,) = v2.spec.preview.security.rbac
        assert (
            finding.object == f"ClusterRoleBinding {shop.binding}" and finding.action == "created"
        )
        assert "cluster-wide" in finding.details and "roleRef: ClusterRole view" in finding.details
        assert f"subject: ServiceAccount {shop.ns}/web" in finding.details
        message = shop.ready(shop.conf)["message"]
        assert "rule broken failed" in message, message  # a bad rule is said, not fatal

        approve(alice, v2.name, "--reason", "read-only binding, reviewed")
        moved = agent.tick()
        assert moved.outbound is not None and moved.outbound.moved == ("app",)
        assert shop.on(2)
        assert live(kube, "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", shop.binding)
    finally:
        run("delete", "approvalpolicy", policy, "--ignore-not-found")
        run("delete", "clusterrolebinding", approver, shop.binding, "--ignore-not-found")
