"""``fleetlet agent install`` / ``uninstall`` on a real control plane of its own.

The cluster is a fresh one (a user's new cluster: uninstalling the CRDs must not disturb the
other tests' shared one). Everything goes through the command line as a user types it:
install, a second install that must change nothing (every ``resourceVersion`` kept), an
upgrade to another image digest, the agent's rights checked with ``kubectl auth can-i``,
uninstall keeping the CRDs, then removing them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api.crds import CRDS
from agent.install.crd_removal import crd_ref, remove_crds
from agent.install.installer import install
from agent.install.manifests import RELEASE_IMAGE
from agent.kube import ApiNotServedError, KubeClient, NotFoundError, ObjectRef
from tests.fleetlab import REPO_ROOT
from tests.realenv.binaries import kubectl as kubectl_path
from tests.realenv.kube import Cluster
from tests.realenv.sigstore import MiniSigstore

IMAGE_1 = "registry.example.test/fleetlet-agent@sha256:" + "1" * 64
IMAGE_2 = "registry.example.test/fleetlet-agent@sha256:" + "2" * 64
NAMESPACE = "fleetlet-system"
GIT_PASSWORD = "install-test-git-password"


def fleetlet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
    )


def kubectl(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [kubectl_path(), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done


@pytest.fixture(scope="module")
def fresh_cluster(
    tmp_path_factory: pytest.TempPathFactory, kube_binaries: dict[str, Path]
) -> Iterator[Cluster]:
    """A control plane of this module's own, stopped at its end."""
    cluster = Cluster(
        name="install", workdir=tmp_path_factory.mktemp("kube-install"), binaries=kube_binaries
    ).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def install_args(mini_sigstore: MiniSigstore, tmp_path: Path) -> list[str]:
    password = tmp_path / "git-password"
    password.write_text(GIT_PASSWORD + "\n")
    return [
        "--repo", "https://git.example.test/fleet-state.git",
        "--status-repo", "https://git.example.test/fleet-status.git",
        "--cluster", "edge-7",
        "--identity", "https://ci.example.test/publish",
        "--issuer", mini_sigstore.issuer,
        "--trusted-root", str(mini_sigstore.trusted_root_path),
        "--git-username", "edge-7",
        "--git-password-file", str(password),
    ]  # fmt: skip


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_dry_run_prints_the_manifests_and_deploy_matches_them(install_args: list[str]) -> None:
    done = fleetlet("agent", "install", "--image", IMAGE_1, *install_args, "--dry-run")
    assert done.returncode == 0, done.stderr
    objects = _objects(done.stdout)
    kinds = [o["kind"] for o in objects]
    assert kinds[: len(CRDS)] == ["CustomResourceDefinition"] * len(CRDS)  # CRDs first
    assert kinds[-2:] == ["Deployment"] * 2  # the agent last, once everything it needs exists
    assert {"Namespace", "ServiceAccount", "ClusterRole", "Role", "Secret", "ConfigMap"} <= set(
        kinds
    )
    deployment, candidate = [o for o in objects if o["kind"] == "Deployment"]
    assert candidate["metadata"]["name"] == "fleetlet-agent-candidate"
    assert candidate["spec"]["replicas"] == 0  # run only by an in-cluster upgrade
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE_1
    # Approvals enforced by the API server come with the agent (docs/approvals.md).
    named = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {
        ("ValidatingAdmissionPolicy", "fleetlet-approvals"),
        ("ValidatingAdmissionPolicyBinding", "fleetlet-approvals"),
        ("ClusterRole", "fleetlet-approver"),
    } <= named
    assert ("ServiceAccount", "fleetlet-auto-approver") not in named  # opt-in only
    events = [o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] == "default"]
    assert [r["verbs"] for r in events[0]["rules"]] == [["create", "patch"]]
    # Secrets hold base64, and the password is nowhere in clear.
    assert GIT_PASSWORD not in done.stdout
    # deploy/agent/ is these objects (the kustomize base never drifts from the command).
    check = subprocess.run(
        [sys.executable, "-m", "agent.install.manifests", "--check"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert check.returncode == 0, check.stderr


def test_an_image_without_a_digest_is_refused(install_args: list[str]) -> None:
    done = fleetlet(
        "agent", "install", "--image", "fleetlet-agent:0.1.0", *install_args, "--dry-run"
    )
    assert done.returncode == 1
    assert "pin the agent by digest" in done.stderr and len(done.stderr.splitlines()) == 1
    done = fleetlet("agent", "install", "--image", RELEASE_IMAGE, *install_args, "--dry-run")
    assert done.returncode == 1 and "no agent image is published yet" in done.stderr


def test_status_goes_to_a_repository_of_its_own_unless_shared_knowingly(
    install_args: list[str],
) -> None:
    """Issue 28: with one repository a cluster's status credential can push the hub's refs;
    install asks for a status repository of its own, and shares --repo only when told."""
    at = install_args.index("--status-repo")
    without = install_args[:at] + install_args[at + 2 :]
    for args in (without, [*without, "--status-repo", "https://git.example.test/fleet-state.git"]):
        done = fleetlet("agent", "install", "--image", IMAGE_1, *args, "--dry-run")
        assert done.returncode == 1
        assert "--status-repo GIT_URL is required, a repository other than --repo" in done.stderr
        assert len(done.stderr.splitlines()) == 1
    done = fleetlet("agent", "install", "--image", IMAGE_1, *without, "--shared-status-repo",
                    "--dry-run")  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = fleetlet("agent", "install", "--image", IMAGE_1, *install_args, "--dry-run")
    (config,) = [o for o in _objects(done.stdout) if o["kind"] == "ConfigMap"
                 and o["metadata"]["name"] == "fleetlet-agent"]  # fmt: skip
    assert config["data"]["status-repo"] == "https://git.example.test/fleet-status.git"


def _versions(cluster: Cluster) -> dict[str, str]:
    """resourceVersion of every object install made, by kind/namespace/name."""
    found: dict[str, str] = {}
    queries = [
        ("customresourcedefinitions", None, "fleetlet.io"),
        ("namespaces", None, NAMESPACE),
        ("clusterroles,clusterrolebindings", None, "fleetlet-agent"),
        ("roles,rolebindings", "default", "fleetlet-agent-events"),
        (
            "serviceaccounts,roles,rolebindings,configmaps,secrets,services,deployments",
            NAMESPACE,
            "",
        ),
    ]
    for kinds, namespace, contains in queries:
        args = ["get", kinds, "-o", "json"] + (["-n", namespace] if namespace else [])
        for item in json.loads(kubectl(cluster, *args).stdout)["items"]:
            meta = item["metadata"]
            if contains in meta["name"] and not meta["name"].startswith("kube-root-ca"):
                found[f"{item['kind']}/{meta.get('namespace', '')}/{meta['name']}"] = meta[
                    "resourceVersion"
                ]
    return found


def can_i(cluster: Cluster, *args: str) -> bool:
    user = f"system:serviceaccount:{NAMESPACE}:fleetlet-agent"
    done = kubectl(cluster, "auth", "can-i", *args, f"--as={user}", check=False)
    assert done.stdout.strip() in ("yes", "no"), done.stderr
    return done.stdout.strip() == "yes"


def test_install_reinstall_upgrade_uninstall(
    fresh_cluster: Cluster, install_args: list[str]
) -> None:
    cluster = fresh_cluster
    config = ["--kubeconfig", str(cluster.kubeconfig)]

    # Install: everything is created, and the agent is pinned to the digest.
    done = fleetlet("agent", "install", "--image", IMAGE_1, *install_args, *config)
    assert done.returncode == 0, done.stderr
    assert "cluster edge-7 is in the fleet" in done.stdout
    assert GIT_PASSWORD not in done.stdout + done.stderr
    deployment = json.loads(
        kubectl(
            cluster, "get", "deployment", "fleetlet-agent", "-n", NAMESPACE, "-o", "json"
        ).stdout
    )
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE_1
    for crd in CRDS:
        kubectl(cluster, "wait", "--for=condition=Established", f"crd/{crd.name}", "--timeout=5s")
    trust = json.loads(
        kubectl(cluster, "get", "secret", "fleetlet-trust", "-n", NAMESPACE, "-o", "json").stdout
    )
    assert set(trust["data"]) == {"trusted_root.json", "identity", "issuer"}
    assert (
        kubectl(cluster, "get", "secret", "fleetlet-git-credentials", "-n", NAMESPACE).returncode
        == 0
    )
    before = _versions(cluster)
    assert len(before) >= 15, before

    # Reinstall: nothing changes, not even a resourceVersion.
    done = fleetlet("agent", "install", "--image", IMAGE_1, *install_args, *config, "-o", "json")
    assert done.returncode == 0, done.stderr
    actions = {item["action"] for item in json.loads(done.stdout)["items"]}
    assert actions == {"unchanged"}, done.stdout
    assert _versions(cluster) == before

    # Upgrade: only the Deployment moves, to the new digest (and the pod template of its
    # upgrade candidate, which has no replica: agent.upgrade.deployment).
    done = fleetlet("agent", "install", "--image", IMAGE_2, *install_args, *config, "-o", "json")
    assert done.returncode == 0, done.stderr
    changed = [i for i in json.loads(done.stdout)["items"] if i["action"] != "unchanged"]
    assert [(i["kind"], i["name"], i["action"]) for i in changed] == [
        ("Deployment", "fleetlet-agent", "configured"),
        ("Deployment", "fleetlet-agent-candidate", "configured"),
    ]
    image = kubectl(
        cluster, "get", "deployment", "fleetlet-agent", "-n", NAMESPACE,
        "-o", "jsonpath={.spec.template.spec.containers[0].image}",
    ).stdout  # fmt: skip
    assert image == IMAGE_2
    after = _versions(cluster)
    assert {k for k in after if after[k] != before[k]} == {
        f"Deployment/{NAMESPACE}/fleetlet-agent",
        f"Deployment/{NAMESPACE}/fleetlet-agent-candidate",
    }
    candidate = kubectl(
        cluster, "get", "deployment", "fleetlet-agent-candidate", "-n", NAMESPACE,
        "-o", "jsonpath={.spec.replicas}",
    ).stdout  # fmt: skip
    assert candidate == "0"

    # Least privilege as installed: Events in `default` may be created and patched, nothing
    # else there; its own namespace as before; no cluster-admin.
    assert can_i(cluster, "create", "events", "-n", "default")
    assert can_i(cluster, "patch", "events", "-n", "default")
    assert can_i(cluster, "create", "events.events.k8s.io", "-n", "default")
    for verb in ("get", "list", "update", "delete"):
        assert not can_i(cluster, verb, "events", "-n", "default"), verb
    assert not can_i(cluster, "create", "configmaps", "-n", "default")
    assert not can_i(cluster, "create", "events", "-n", "kube-system")
    assert can_i(cluster, "create", "secrets", "-n", NAMESPACE)
    assert not can_i(cluster, "*", "*")
    # Upgrading itself: its own Deployments, ClusterRole and Role by name, nothing else.
    for own in ("deployments.apps/fleetlet-agent", "deployments.apps/fleetlet-agent-candidate"):
        assert can_i(cluster, "patch", own, "-n", NAMESPACE)
    assert not can_i(cluster, "create", "deployments.apps", "-n", NAMESPACE)
    assert not can_i(cluster, "patch", "deployments.apps/other", "-n", NAMESPACE)
    rbac = "rbac.authorization.k8s.io"
    assert can_i(cluster, "escalate", f"clusterroles.{rbac}/fleetlet-agent")
    assert can_i(cluster, "escalate", f"roles.{rbac}/fleetlet-agent", "-n", NAMESPACE)
    assert not can_i(cluster, "escalate", f"clusterroles.{rbac}/fleetlet-approver")
    assert not can_i(cluster, "bind", f"clusterroles.{rbac}/fleetlet-agent")
    assert not can_i(cluster, "patch", f"clusterrolebindings.{rbac}/fleetlet-agent")
    assert can_i(
        cluster,
        "patch",
        "customresourcedefinitions.apiextensions.k8s.io/bundledeployments.fleetlet.io",
    )
    assert not can_i(cluster, "create", "customresourcedefinitions.apiextensions.k8s.io")
    # It asks for approvals; it never gives one, and the policy that says so is installed.
    assert can_i(cluster, "create", "bundledeploymentrequests.fleetlet.io")
    assert not can_i(cluster, "approve", "bundledeploymentrequests.fleetlet.io")
    kubectl(cluster, "get", "validatingadmissionpolicy,validatingadmissionpolicybinding",
            "fleetlet-approvals")  # fmt: skip

    # Uninstall: the agent and its namespace go; the CRDs (and BundleDeployments) stay.
    done = fleetlet("agent", "uninstall", *config)
    assert done.returncode == 0, done.stderr
    assert "CRDs and BundleDeployments kept" in done.stdout
    gone = kubectl(cluster, "get", "deployment", "fleetlet-agent", "-n", NAMESPACE, check=False)
    assert gone.returncode != 0
    assert kubectl(cluster, "get", "clusterrole", "fleetlet-agent", check=False).returncode != 0
    assert (
        kubectl(
            cluster, "get", "validatingadmissionpolicy", "fleetlet-approvals", check=False
        ).returncode
        != 0
    )
    assert kubectl(cluster, "get", "role", "fleetlet-agent-events", "-n", "default", check=False).returncode != 0  # fmt: skip
    phase = kubectl(
        cluster, "get", "namespace", NAMESPACE, "-o", "jsonpath={.status.phase}", check=False
    )
    assert phase.returncode != 0 or phase.stdout == "Terminating"
    for crd in CRDS:
        assert kubectl(cluster, "get", "crd", crd.name).returncode == 0
    # Again: nothing left to remove is not an error. Then the CRDs, when asked.
    done = fleetlet("agent", "uninstall", *config, "--crds")
    assert done.returncode == 0, done.stderr
    for crd in CRDS:
        assert kubectl(cluster, "get", "crd", crd.name, check=False).returncode != 0


def test_remove_crds_removes_a_groups_crds_and_their_objects(kube_cluster: Cluster) -> None:
    """agent.install.crd_removal on CRDs of one new group, with objects of each kind in a
    namespace: every CRD goes, with its objects, and nothing is reported left."""
    group = f"r{uuid.uuid4().hex[:8]}.example.test"
    kinds = ["Alpha", "Beta", "Gamma"]
    namespace = f"crds-{uuid.uuid4().hex[:6]}"
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig)) as kube:
        crds = [
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{kind.lower()}s.{group}"},
                "spec": {
                    "group": group,
                    "scope": "Namespaced",
                    "names": {"kind": kind, "plural": f"{kind.lower()}s",
                              "singular": kind.lower(), "listKind": f"{kind}List"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                        "openAPIV3Schema": {"type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True}}}],
                },
            }
            for kind in kinds
        ]  # fmt: skip
        install(kube, [{"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": namespace}}, *crds])  # fmt: skip
        for kind in kinds:
            kube.apply(
                {"apiVersion": f"{group}/v1", "kind": kind,
                 "metadata": {"name": "one", "namespace": namespace}, "spec": {"n": 1}},
                field_manager="test",
            )  # fmt: skip
        names = [c["metadata"]["name"] for c in crds]
        assert remove_crds(kube, names, deadline=time.monotonic() + 300) == []
        for name in names:
            assert kube.get(crd_ref(name)) is None
        for kind in kinds:  # no longer served (discovery may still list it a moment: 404)
            with pytest.raises((ApiNotServedError, NotFoundError)):
                kube.list(f"{group}/v1", kind, namespace=namespace)
        kube.delete(ObjectRef("v1", "Namespace", namespace, None))
