"""Approvals are enforced by kube-apiserver: the ValidatingAdmissionPolicy of
deploy/agent/approvals and the CRD's own rules, against a real API server, with real users
(client certificates minted by the test cluster's CA) and the real ``fleetlet approve|deny``.

Each refusal is checked as a user meets it: the API server's own message (the policy's, or the
CRD rule's), and the request left as it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api import to_dict
from agent.api.approvals import BundleDeploymentRequestSpec, BundlePin, RequestPreview
from agent.approve.decide import DECISION_FIELD_MANAGER
from agent.approve.request import Request, Requests, read, ref
from agent.kube import STATE_FIELD_MANAGER, KubeApiError, KubeClient
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

REPO_ROOT = Path(__file__).resolve().parent.parent
APPROVALS = REPO_ROOT / "deploy" / "agent" / "approvals"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def run_kubectl(cluster: Cluster | Path, *args: str, check: bool = True) -> str:
    config = cluster.kubeconfig if isinstance(cluster, Cluster) else cluster
    done = subprocess.run(
        [kubectl(), "--kubeconfig", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def fleetlet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


@pytest.fixture(scope="module")
def approvals_enforced(crds: Cluster) -> Cluster:
    """deploy/agent/approvals applied as an operator would (kubectl apply -k), and enforcing:
    the API server refuses a request whose requestedBy is not its creator."""
    run_kubectl(crds, "create", "namespace", "fleetlet-system", check=False)
    run_kubectl(
        crds, "apply", "--server-side", "--field-manager=fleetlet-tests", "-k", str(APPROVALS)
    )
    admin = KubeClient(kubeconfig=str(crds.kubeconfig))
    deadline = time.monotonic() + 60
    name = f"probe-{uuid.uuid4().hex[:6]}"
    while True:
        try:
            admin.create(request_object(name, requested_by="somebody-else"), field_manager="t")
        except KubeApiError as exc:
            assert "requestedBy" in str(exc), exc
            return crds
        admin.delete(ref(name))
        assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy never took effect"
        time.sleep(0.5)


def request_object(name: str, *, requested_by: str, group: str = "app") -> dict[str, Any]:
    spec = BundleDeploymentRequestSpec(
        cluster="edge-1",
        group=group,
        serial=7,
        set_digest=DIGEST,
        requested_by=requested_by,
        bundles=(BundlePin(name="web", spec_digest=DIGEST, content_digest=OTHER),),
        reasons=("bundle web asks for an approval (approval: manual)",),
        preview=RequestPreview(changed=1, unchanged=3),
    )
    return {**ref(name), "spec": to_dict(spec)}


@dataclass(frozen=True)
class User:
    name: str
    kubeconfig: Path

    def client(self) -> KubeClient:
        return KubeClient(kubeconfig=str(self.kubeconfig))


@dataclass
class Users:
    cluster: Cluster
    tag: str

    def mint(self, base: str, *, cluster_role: str | None = None) -> User:
        name = f"{base}-{self.tag}"
        path = Path(self.cluster.mint_user(name))
        if cluster_role is not None:
            run_kubectl(
                self.cluster,
                "create",
                "clusterrolebinding",
                f"{name}-{cluster_role}",
                f"--clusterrole={cluster_role}",
                f"--user={name}",
            )
        return User(name, path)

    def role(self, name: str, rules: list[dict[str, Any]]) -> str:
        role = f"{name}-{self.tag}"
        document = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": rules,
        }
        subprocess.run(
            [kubectl(), "--kubeconfig", str(self.cluster.kubeconfig), "apply", "-f", "-"],
            input=yaml.safe_dump(document),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return role


STATUS_EDITOR = [
    {
        "apiGroups": ["fleetlet.io"],
        "resources": ["bundledeploymentrequests"],
        "verbs": ["get", "list"],
    },
    {
        "apiGroups": ["fleetlet.io"],
        "resources": ["bundledeploymentrequests/status"],
        "verbs": ["get", "update", "patch"],
    },
]
AGENT_LIKE = [
    {
        "apiGroups": ["fleetlet.io"],
        "resources": ["bundledeploymentrequests"],
        "verbs": ["get", "list", "create", "delete", "supersede"],
    },
    STATUS_EDITOR[1],
]


@pytest.fixture
def users(approvals_enforced: Cluster) -> Users:
    return Users(approvals_enforced, uuid.uuid4().hex[:6])


@pytest.fixture
def admin(approvals_enforced: Cluster) -> Iterator[KubeClient]:
    with KubeClient(kubeconfig=str(approvals_enforced.kubeconfig)) as client:
        yield client


@pytest.fixture
def pending(admin: KubeClient) -> Iterator[str]:
    """A pending request, created by the admin as itself."""
    name = f"app-s7-{uuid.uuid4().hex[:6]}"
    admin.create(request_object(name, requested_by=admin.whoami()), field_manager="t")
    try:
        yield name
    finally:
        admin.delete(ref(name))


def raw_decision(
    client: KubeClient, name: str, *, decision: str, by: str, reason: str = "r"
) -> None:
    """Write a decision to the status as a hostile client would: no checks of ours."""
    current = read(client, name)
    client.apply(
        {
            **ref(name),
            "metadata": {"name": name, "resourceVersion": current.resource_version},
            "status": {
                "conditions": [
                    {
                        "type": decision,
                        "status": "True",
                        "reason": decision,
                        "message": reason,
                        "lastTransitionTime": "2026-11-22T22:00:00Z",
                    }
                ],
                "decision": decision,
                "decidedBy": by,
                "reason": reason,
            },
        },
        field_manager=DECISION_FIELD_MANAGER,
        force=True,
        subresource="status",
    )


def state(admin: KubeClient, name: str) -> Request:
    return read(admin, name)


# --- the tests ----------------------------------------------------------------------------


def test_user_without_the_verb_is_refused_by_the_api_server_with_the_policys_message(
    users: Users, admin: KubeClient, pending: str
) -> None:
    """RBAC lets mallory write the status subresource, yet the policy refuses her: deciding
    needs the verb approve on the request."""
    mallory = users.mint("mallory", cluster_role=users.role("status-editor", STATUS_EDITOR))
    done = fleetlet("approve", pending, "--kubeconfig", str(mallory.kubeconfig))
    assert done.returncode == 1, done
    assert f"user {mallory.name} may not" in done.stderr, done.stderr
    assert "needs the verb approve" in done.stderr, done.stderr
    assert "fleetlet-approvals" in done.stderr, done.stderr  # the policy names itself
    assert state(admin, pending).state == "Pending"


def test_approver_approves_and_is_recorded_as_the_authenticated_user(
    users: Users, admin: KubeClient, pending: str, approvals_enforced: Cluster
) -> None:
    alice = users.mint("alice", cluster_role="fleetlet-approver")
    done = fleetlet("approve", pending, "--reason", "image bump, reviewed", "--kubeconfig",
                    str(alice.kubeconfig))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"approved by {alice.name}" in done.stdout
    decided = state(admin, pending)
    assert decided.state == "Approved"
    assert decided.status.decided_by == alice.name
    assert decided.status.reason == "image bump, reviewed"
    approved = {c.type: c.status for c in decided.status.conditions}
    assert approved == {"Approved": "True"}
    # kubectl get bdr shows the decision and who made it.
    out = run_kubectl(approvals_enforced, "get", "bdr", pending)
    header, row = out.splitlines()[:2]
    assert header.split()[:10] == [
        "NAME", "GROUP", "SERIAL", "CREATED", "CHANGED", "DELETED", "FINDINGS", "DECISION",
        "BY", "SUPERSEDED",
    ]  # fmt: skip
    assert row.split()[:9] == [pending, "app", "7", "0", "1", "0", "0", "Approved", alice.name]


def test_named_resource_rbac_decides_only_the_named_request(
    users: Users, admin: KubeClient, pending: str
) -> None:
    other = f"app-s7-{uuid.uuid4().hex[:6]}"
    admin.create(request_object(other, requested_by=admin.whoami()), field_manager="t")
    try:
        role = users.role(
            "one-request",
            [
                {
                    "apiGroups": ["fleetlet.io"],
                    "resources": ["bundledeploymentrequests"],
                    "verbs": ["get", "approve"],
                    "resourceNames": [pending],
                },
                {**STATUS_EDITOR[1], "resourceNames": [pending]},
                {
                    "apiGroups": ["fleetlet.io"],
                    "resources": ["bundledeploymentrequests", "bundledeploymentrequests/status"],
                    "verbs": ["get", "update", "patch"],
                    "resourceNames": [other],
                },
            ],
        )
        carol = users.mint("carol", cluster_role=role)
        refused = fleetlet("deny", other, "--reason", "no", "--kubeconfig", str(carol.kubeconfig))
        assert refused.returncode == 1
        assert "needs the verb approve" in refused.stderr, refused.stderr
        assert state(admin, other).state == "Pending"
        done = fleetlet("deny", pending, "--reason", "not on a Friday", "--kubeconfig",
                        str(carol.kubeconfig))  # fmt: skip
        assert done.returncode == 0, done.stderr
        denied = state(admin, pending)
        assert (denied.state, denied.status.decided_by) == ("Denied", carol.name)
        assert denied.status.reason == "not on a Friday"
    finally:
        admin.delete(ref(other))


def test_a_forged_approver_is_refused(users: Users, admin: KubeClient, pending: str) -> None:
    alice = users.mint("alice", cluster_role="fleetlet-approver")
    with alice.client() as client, pytest.raises(KubeApiError) as refused:
        raw_decision(client, pending, decision="Approved", by="the-boss")
    assert f"status.decidedBy must be the user deciding ({alice.name})" in str(refused.value)
    assert state(admin, pending).state == "Pending"


def test_a_second_decision_is_refused(users: Users, admin: KubeClient, pending: str) -> None:
    alice = users.mint("alice", cluster_role="fleetlet-approver")
    bob = users.mint("bob", cluster_role="fleetlet-approver")
    assert fleetlet("approve", pending, "--kubeconfig", str(alice.kubeconfig)).returncode == 0
    # The command says so before asking...
    again = fleetlet("deny", pending, "--reason", "changed my mind", "--kubeconfig",
                     str(bob.kubeconfig))  # fmt: skip
    assert again.returncode == 1
    assert f"already Approved by {alice.name}" in again.stderr
    # ... and the API server refuses it when asked anyway (a denial, another approval).
    with bob.client() as client:
        for decision in ("Denied", "Approved"):
            with pytest.raises(KubeApiError) as refused:
                raw_decision(client, pending, decision=decision, by=bob.name)
            assert "a decision to stay as it is (it is final)" in str(refused.value)
    decided = state(admin, pending)
    assert (decided.state, decided.status.decided_by) == ("Approved", alice.name)


def test_the_agents_identity_creates_and_supersedes_but_never_approves(
    users: Users, admin: KubeClient
) -> None:
    """A user with the agent's rights (create, supersede, status) cannot decide, cannot claim
    to be someone else as requester, and a superseded request cannot be approved."""
    agent = users.mint("agent", cluster_role=users.role("agent-like", AGENT_LIKE))
    alice = users.mint("alice", cluster_role="fleetlet-approver")
    name = f"app-s7-{uuid.uuid4().hex[:6]}"
    with agent.client() as client:
        with pytest.raises(KubeApiError) as forged:
            client.create(request_object(name, requested_by=alice.name), field_manager="t")
        assert f"spec.requestedBy must name the user creating the request ({agent.name})" in str(
            forged.value
        )
        client.create(request_object(name, requested_by=agent.name), field_manager="t")
        try:
            with pytest.raises(KubeApiError) as refused:
                raw_decision(client, name, decision="Approved", by=agent.name)
            assert "needs the verb approve" in str(refused.value)
            requests = Requests(kube=client, owner="unused")
            requests.supersede(read(client, name), serial=8)
            assert state(admin, name).state == "Superseded"
            done = fleetlet("approve", name, "--kubeconfig", str(alice.kubeconfig))
            assert done.returncode == 1 and "superseded" in done.stderr, done.stderr
            with alice.client() as approver, pytest.raises(KubeApiError) as late:
                raw_decision(approver, name, decision="Approved", by=alice.name)
            assert "no decision on a superseded request" in str(late.value)
            assert state(admin, name).state == "Superseded"
        finally:
            admin.delete(ref(name))


def test_a_denial_needs_a_reason_and_the_spec_never_changes(
    users: Users, admin: KubeClient, pending: str
) -> None:
    alice = users.mint("alice", cluster_role="fleetlet-approver")
    with alice.client() as client:
        with pytest.raises(KubeApiError) as refused:
            raw_decision(client, pending, decision="Denied", by=alice.name, reason="")
        assert "a reason with a denial" in str(refused.value)
    changed_spec = request_object(pending, requested_by=admin.whoami())
    changed_spec["spec"]["setDigest"] = OTHER
    with pytest.raises(KubeApiError) as changed:
        admin.apply(changed_spec, field_manager=STATE_FIELD_MANAGER, force=True)
    assert "an unchanged spec" in str(changed.value)


def test_preview_prints_the_request_and_its_whole_diffs(
    approvals_enforced: Cluster, admin: KubeClient, namespace: str
) -> None:
    """``fleetlet preview``: the table, ``-o json``, and ``--full`` with the diffs the request
    cut, read back from the ConfigMap in the agent's namespace."""
    from agent.approve.preview import build_preview, rendered_changes
    from agent.approve.request import Requests

    big = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "big", "namespace": "shop"},
        "data": {f"key{i}": "v" * 100 for i in range(100)},
    }
    built = build_preview(rendered_changes({}, {"web": [big]}))
    assert built.full_diffs  # the diff was cut in the request
    pins = {"web": BundlePin(name="web", spec_digest=DIGEST, content_digest=OTHER)}
    request = Requests(kube=admin, owner=namespace).create(
        cluster="edge-1", group="app", serial=3, set_digest=DIGEST, pins=pins,
        reasons=["bundle web asks for an approval (approval: manual)"], preview=built,
    )  # fmt: skip
    try:
        config = str(approvals_enforced.kubeconfig)
        table = fleetlet("preview", request.name, "--kubeconfig", config)
        assert table.returncode == 0, table.stderr
        assert "Objects (server-side dry run): 1 created, 0 changed" in table.stdout
        assert f"fleetlet preview {request.name} --full` shows them whole" in table.stdout
        assert table.stdout.count("vvvv\n") < 100
        full = fleetlet("preview", request.name, "--kubeconfig", config, "--full",
                        "--namespace", namespace, "-o", "json")  # fmt: skip
        assert full.returncode == 0, full.stderr
        data = json.loads(full.stdout)
        assert data["state"] == "Pending"
        assert data["spec"]["preview"]["fullDiff"] == f"fleetlet-preview-{request.name}"
        whole = data["fullDiffs"]["web: ConfigMap shop/big"]
        assert whole.count("v" * 100) == 100
        shown = fleetlet("preview", request.name, "--kubeconfig", config, "--full",
                         "--namespace", namespace)  # fmt: skip
        assert shown.stdout.count("v" * 100) == 100
    finally:
        admin.delete(ref(request.name))
