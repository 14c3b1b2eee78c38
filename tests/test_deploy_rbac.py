"""deploy/agent/ against a real kube-apiserver: accepted as written, and least privilege.

The manifests are applied the way an operator would (``kubectl apply --server-side -k``), through
a throwaway kustomize overlay that only moves them to a unique namespace and name prefix, because
the API server is shared with other tests. Permissions are checked twice: ``kubectl auth can-i``
as the agent's ServiceAccount (what a cluster admin would ask), and real requests made with a
token of that ServiceAccount, including impersonation of a bundle's ServiceAccount.
The Deployment is only checked to be accepted: kwok fakes pods and there is no image, so nothing
here claims that the agent runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api.crds import CRDS, REPO_ROOT
from tests.realenv.binaries import kubectl as kubectl_path
from tests.realenv.kube import Cluster

DEPLOY = REPO_ROOT / "deploy" / "agent"


@dataclass(frozen=True, kw_only=True)
class Install:
    """One installation of deploy/agent under a unique namespace and name prefix."""

    cluster: Cluster
    namespace: str
    prefix: str
    overlay: Path

    @property
    def service_account(self) -> str:
        return f"{self.prefix}fleetlet-agent"

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def kubectl(
    cluster: Cluster | Path, *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run kubectl with a kubeconfig (a cluster's admin one, or a file); fail with its stderr."""
    config = cluster.kubeconfig if isinstance(cluster, Cluster) else cluster
    result = subprocess.run(
        [kubectl_path(), "--kubeconfig", str(config), *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result


def _overlay(directory: Path, *, namespace: str, prefix: str, bases: list[Path]) -> Path:
    """A kustomization moving ``bases`` to ``namespace`` with ``prefix`` on every name."""
    directory.mkdir(parents=True, exist_ok=True)
    # kustomize refuses absolute resource paths.
    resources = [os.path.relpath(base, directory) for base in bases]
    text = yaml.safe_dump({"resources": resources, "namespace": namespace, "namePrefix": prefix})
    (directory / "kustomization.yaml").write_text(text)
    return directory


def _install(cluster: Cluster, overlay: Path) -> None:
    kubectl(cluster, "apply", "--server-side", "--field-manager=fleetlet-tests", "-k", str(overlay))


def _uninstall(cluster: Cluster, overlay: Path) -> None:
    kubectl(cluster, "delete", "-k", str(overlay), "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="module")
def crds_installed(kube_cluster: Cluster) -> None:
    """The CRDs from crds/, installed by the operator (the agent's role does not cover CRDs)."""
    files = [arg for crd in CRDS for arg in ("-f", str(REPO_ROOT / crd.file))]
    kubectl(
        kube_cluster,
        "apply",
        "--server-side",
        "--field-manager=fleetlet-tests",
        "--force-conflicts",
        *files,
    )
    kubectl(kube_cluster, "wait", "--for=condition=Established", "--timeout=60s", *files)


@pytest.fixture(scope="module")
def install(
    kube_cluster: Cluster, crds_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Install]:
    """deploy/agent applied with server-side apply under a unique namespace; removed after."""
    tag = uuid.uuid4().hex[:6]
    namespace, prefix = f"fleetlet-rbac-{tag}", f"t{tag}-"
    overlay = _overlay(
        tmp_path_factory.mktemp("deploy-agent"), namespace=namespace, prefix=prefix, bases=[DEPLOY]
    )
    try:
        _install(kube_cluster, overlay)
        yield Install(cluster=kube_cluster, namespace=namespace, prefix=prefix, overlay=overlay)
    finally:
        _uninstall(kube_cluster, overlay)


@pytest.fixture(scope="module")
def agent_kubeconfig(install: Install, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig holding a real token of the agent's ServiceAccount (TokenRequest API)."""
    token = kubectl(
        install.cluster,
        "create",
        "token",
        install.service_account,
        "-n",
        install.namespace,
        "--duration=1h",
    ).stdout.strip()
    config = yaml.safe_load(install.cluster.kubeconfig.read_text())
    config["users"] = [{"name": "agent", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "agent"
    path = tmp_path_factory.mktemp("agent-token") / "agent.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def can_i(install: Install, *args: str) -> bool:
    """``kubectl auth can-i ARGS`` as the agent's ServiceAccount (exit code 0 yes, 1 no)."""
    result = kubectl(
        install.cluster, "auth", "can-i", *args, f"--as={install.username}", check=False
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {args}: {answer!r} {result.stderr.strip()}"
    return answer == "yes"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


# --- the manifests as written ------------------------------------------------------------------


def test_no_cluster_admin_or_wildcards_by_default() -> None:
    """The default install binds no built-in admin role and grants no wildcard."""
    docs = [doc for path in sorted(DEPLOY.glob("*.yaml")) for doc in _documents(path)]
    kinds = {doc["kind"] for doc in docs}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "Role", "Deployment"} <= kinds
    for doc in docs:
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert doc["roleRef"]["name"] in ("fleetlet-agent", "fleetlet-agent-events")
            assert doc["roleRef"]["name"] == doc["metadata"]["name"]
        for rule in doc.get("rules", []):
            for key in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
                assert "*" not in rule.get(key, []), f"wildcard in {doc['metadata']['name']}"
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert not any("cluster-admin" in entry for entry in kustomization["resources"])


def test_objects_accepted_by_the_api_server(install: Install) -> None:
    """Every object of deploy/agent exists after server-side apply, as written."""
    ns, sa = install.namespace, install.service_account

    def get(*args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(
            kubectl(install.cluster, "get", *args, "-o", "json").stdout
        )
        return result

    labels = get("namespace", ns)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    get("serviceaccount", sa, "-n", ns)
    get("clusterrole", sa)
    get("clusterrolebinding", sa)
    get("role", sa, "-n", ns)
    get("rolebinding", sa, "-n", ns)
    spec = get("deployment", sa, "-n", ns)["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == sa
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    # Pinned by digest (the base's placeholder; an overlay or `agent install` sets the real one).
    assert "@sha256:" in container["image"]
    assert container["command"] == ["fleetlet", "agent", "run"]
    env = {e["name"] for e in container["env"]}
    assert {"FLEETLET_REPO", "FLEETLET_CLUSTER", "FLEETLET_TRUSTED_ROOT"} <= env
    assert {"FLEETLET_IDENTITY", "FLEETLET_ISSUER"} <= env
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["limits"]["memory"]
    assert container["resources"]["requests"]["memory"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/var/cache/fleetlet"]]
    # The trusted root comes from the deployment (a ConfigMap of the namespace), and is required.
    trust = volumes[mounts["/etc/fleetlet/trust"]]["secret"]
    assert not trust.get("optional", False)


def test_pod_passes_restricted_pod_security(install: Install) -> None:
    """The pod template is admitted in a namespace enforcing Pod Security 'restricted'."""
    deployment = kubectl(
        install.cluster,
        "get",
        "deployment",
        install.service_account,
        "-n",
        install.namespace,
        "-o",
        "json",
    ).stdout
    template = yaml.safe_load(deployment)["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pss-check", "namespace": install.namespace},
        "spec": template["spec"],
    }
    # A server-side dry run goes through admission (PodSecurity) without creating the pod.
    result = kubectl(
        install.cluster, "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod)
    )
    assert "created (server dry run)" in result.stdout
    # And the same namespace does refuse a pod that breaks 'restricted': the check is real.
    template["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    refused = kubectl(
        install.cluster,
        "create",
        "--dry-run=server",
        "-f",
        "-",
        stdin=yaml.safe_dump(pod),
        check=False,
    )
    assert refused.returncode != 0 and "PodSecurity" in refused.stderr


# --- what the agent may do -------------------------------------------------------------------

ALLOWED_CLUSTER = [
    *[(verb, "bundledeployments.fleetlet.io") for verb in ("get", "list", "watch", "create")],
    *[(verb, "bundledeployments.fleetlet.io") for verb in ("update", "patch", "delete")],
    *[(verb, "bundleoutputs.fleetlet.io") for verb in ("get", "list", "create", "patch", "delete")],
    *[
        (verb, "bundledeploymentrequests.fleetlet.io")
        for verb in ("get", "watch", "create", "delete", "supersede")
    ],
    *[(verb, "approvalpolicies.fleetlet.io") for verb in ("get", "list", "watch")],
]


@pytest.mark.parametrize(("verb", "resource"), ALLOWED_CLUSTER)
def test_agent_may_manage_its_own_objects(install: Install, verb: str, resource: str) -> None:
    assert can_i(install, verb, resource)


def test_agent_may_update_bundledeployment_status(install: Install) -> None:
    assert can_i(install, "patch", "bundledeployments.fleetlet.io", "--subresource=status")
    assert can_i(install, "update", "bundledeployments.fleetlet.io", "--subresource=status")


@pytest.mark.parametrize(
    ("verb", "resource"),
    [
        ("get", "secrets"),
        ("list", "secrets"),
        ("create", "secrets"),
        ("delete", "secrets"),
        ("create", "configmaps"),
        ("patch", "configmaps"),
        ("create", "events"),
        ("impersonate", "serviceaccounts"),
        ("create", "leases.coordination.k8s.io"),  # which agent acts: agent.upgrade
        ("patch", "leases.coordination.k8s.io"),
    ],
)
def test_agent_may_use_its_own_namespace(install: Install, verb: str, resource: str) -> None:
    assert can_i(install, verb, resource, "-n", install.namespace)


def test_agent_may_discover_apis(install: Install) -> None:
    assert can_i(install, "get", "/apis")
    assert can_i(install, "get", "/api")


REFUSED = [
    # Secrets anywhere but its own namespace.
    ("get", "secrets", "-n", "kube-system"),
    ("create", "secrets", "-n", "default"),
    ("list", "secrets", "--all-namespaces"),
    ("get", "configmaps", "-n", "kube-system"),
    # RBAC: no way to grant itself more.
    ("create", "clusterroles"),
    ("create", "clusterrolebindings"),
    ("escalate", "clusterroles"),
    ("bind", "clusterroles"),
    # Cluster-admin-ish.
    ("*", "*"),
    ("delete", "namespaces"),
    ("create", "namespaces"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "nodes"),
    ("create", "validatingadmissionpolicies.admissionregistration.k8s.io"),
    # No cluster-wide read of arbitrary objects: health and outputs go through the bundle's SA.
    ("list", "deployments.apps", "--all-namespaces"),
    ("list", "pods", "--all-namespaces"),
    # Impersonation only of ServiceAccounts of its own namespace, never users or groups.
    ("impersonate", "serviceaccounts", "-n", "kube-system"),
    ("impersonate", "users"),
    ("impersonate", "groups"),
    ("impersonate", "userextras.authentication.k8s.io"),
    # The agent asks for approval; it may not give it (the status subresource it may write, to
    # mark a request Superseded; the ValidatingAdmissionPolicy requires `approve` to decide).
    ("approve", "bundledeploymentrequests.fleetlet.io"),
    ("update", "bundledeploymentrequests.fleetlet.io"),
    ("update", "approvalpolicies.fleetlet.io"),
    ("create", "approvalpolicies.fleetlet.io"),
]
REFUSED_IN_OWN_NAMESPACE = [
    # Even in its own namespace: nothing that runs code or mints identities.
    ("create", "pods"),
    ("create", "deployments.apps"),
    ("create", "serviceaccounts"),
    ("create", "serviceaccounts/token"),
    ("create", "roles"),
    ("create", "rolebindings"),
    ("delete", "namespaces"),
]


@pytest.mark.parametrize("args", REFUSED, ids=lambda args: " ".join(args))
def test_agent_may_not(install: Install, args: tuple[str, ...]) -> None:
    assert not can_i(install, *args)


@pytest.mark.parametrize("args", REFUSED_IN_OWN_NAMESPACE, ids=lambda args: " ".join(args))
def test_agent_may_not_in_its_own_namespace(install: Install, args: tuple[str, ...]) -> None:
    assert not can_i(install, *args, "-n", install.namespace)


# --- real requests with the agent's own token --------------------------------------------------


def test_agent_token_reaches_own_namespace_only(install: Install, agent_kubeconfig: Path) -> None:
    """With its real token the agent stores a Secret at home and is refused one elsewhere."""
    whoami = kubectl(
        agent_kubeconfig, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"
    )
    assert whoami.stdout == install.username
    name = f"state-{uuid.uuid4().hex[:6]}"
    kubectl(
        agent_kubeconfig,
        "create",
        "secret",
        "generic",
        name,
        "-n",
        install.namespace,
        "--from-literal=serial=1",
    )
    kubectl(agent_kubeconfig, "delete", "secret", name, "-n", install.namespace)
    refused = kubectl(
        agent_kubeconfig,
        "create",
        "secret",
        "generic",
        name,
        "-n",
        "default",
        "--from-literal=serial=1",
        check=False,
    )
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    assert install.username in refused.stderr


def test_agent_applies_as_the_bundle_service_account(
    install: Install, agent_kubeconfig: Path, namespace: str
) -> None:
    """A bundle's ServiceAccount, granted by the cluster admin, is what bounds the bundle.

    The admin creates ServiceAccount ``bundle-a`` in the agent's namespace and lets it manage
    ConfigMaps in one target namespace. The agent, impersonating it, creates a ConfigMap there,
    is refused a ClusterRole with the API server's message, and may not impersonate anything
    outside its namespace.
    """
    cluster, home = install.cluster, install.namespace
    kubectl(cluster, "create", "serviceaccount", "bundle-a", "-n", home)
    kubectl(
        cluster,
        "create",
        "role",
        "bundle-a",
        "-n",
        namespace,
        "--verb=get,list,watch,create,patch,update,delete",
        "--resource=configmaps",
    )
    kubectl(
        cluster,
        "create",
        "rolebinding",
        "bundle-a",
        "-n",
        namespace,
        "--role=bundle-a",
        f"--serviceaccount={home}:bundle-a",
    )
    as_bundle = f"--as=system:serviceaccount:{home}:bundle-a"
    manifest = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "from-bundle", "namespace": namespace},
            "data": {"k": "v"},
        }
    )
    applied = kubectl(
        agent_kubeconfig,
        "apply",
        "--server-side",
        "--field-manager=fleetlet",
        as_bundle,
        "-f",
        "-",
        stdin=manifest,
    )
    assert "serverside-applied" in applied.stdout
    # Impersonating a ServiceAccount also brings its groups: whatever is bound to
    # system:serviceaccounts:<agent namespace> is given to every bundle (docs/operations.md).
    whoami = json.loads(kubectl(agent_kubeconfig, "auth", "whoami", as_bundle, "-o", "json").stdout)
    user = whoami["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{home}:bundle-a"
    assert f"system:serviceaccounts:{home}" in user["groups"]
    # The bundle does not inherit the agent's rights: no revision store, no other outputs.
    secrets = kubectl(agent_kubeconfig, "get", "secrets", "-n", home, as_bundle, check=False)
    assert secrets.returncode != 0 and "forbidden" in secrets.stderr.lower()
    # Health and outputs are read the same way, through the bundle's ServiceAccount.
    read = kubectl(
        agent_kubeconfig,
        "get",
        "configmap",
        "from-bundle",
        "-n",
        namespace,
        as_bundle,
        "-o",
        "jsonpath={.data.k}",
    )
    assert read.stdout == "v"
    # The agent itself cannot read it: it has no rights outside its namespace.
    assert (
        kubectl(
            agent_kubeconfig, "get", "configmap", "from-bundle", "-n", namespace, check=False
        ).returncode
        != 0
    )

    cluster_role = yaml.safe_dump(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"bundle-a-{uuid.uuid4().hex[:6]}"},
            "rules": [],
        }
    )
    refused = kubectl(
        agent_kubeconfig,
        "apply",
        "--server-side",
        "--field-manager=fleetlet",
        as_bundle,
        "-f",
        "-",
        stdin=cluster_role,
        check=False,
    )
    assert refused.returncode != 0
    assert "forbidden" in refused.stderr.lower()
    assert f"system:serviceaccount:{home}:bundle-a" in refused.stderr

    for identity in (
        ["--as=system:serviceaccount:kube-system:default"],
        ["--as=admin", "--as-group=system:masters"],
        [f"--as=system:serviceaccount:{home}:bundle-a", "--as-group=system:masters"],
    ):
        denied = kubectl(agent_kubeconfig, "get", "namespaces", *identity, check=False)
        assert denied.returncode != 0, identity
        assert "cannot impersonate" in denied.stderr, denied.stderr


def test_agent_token_creates_requests_but_never_approves_them(
    install: Install, agent_kubeconfig: Path
) -> None:
    """With its real token, the agent makes a BundleDeploymentRequest (as itself) and marks
    it Superseded, and the ValidatingAdmissionPolicy of deploy/agent/approvals refuses it a
    decision, whatever RBAC allows on the status."""
    from agent.approve.request import Requests, read, ref
    from agent.kube import KubeApiError, KubeClient
    from tests.test_approvals import raw_decision, request_object

    name = f"app-s7-{uuid.uuid4().hex[:6]}"
    with KubeClient(kubeconfig=str(agent_kubeconfig)) as agent:
        assert agent.whoami() == install.username
        deadline = time.monotonic() + 60
        while True:  # until the policy of this install takes effect
            try:
                agent.create(request_object(name, requested_by="someone-else"), field_manager="t")
            except KubeApiError as exc:
                assert "requestedBy" in str(exc), exc
                break
            agent.delete(ref(name))
            assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy never took effect"
            time.sleep(0.5)
        agent.create(request_object(name, requested_by=install.username), field_manager="t")
        try:
            with pytest.raises(KubeApiError) as refused:
                raw_decision(agent, name, decision="Approved", by=install.username)
            assert "needs the verb approve" in str(refused.value), refused.value
            assert read(agent, name).state == "Pending"
            Requests(kube=agent, owner=install.namespace).supersede(read(agent, name), serial=9)
            assert read(agent, name).state == "Superseded"
        finally:
            agent.delete(ref(name))


# --- the opt-in overlay -----------------------------------------------------------------------


def test_cluster_admin_overlay_is_an_explicit_opt_in(
    kube_cluster: Cluster, crds_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """deploy/agent/cluster-admin, applied on top, makes the agent cluster-admin; not before."""
    tag = uuid.uuid4().hex[:6]
    namespace, prefix = f"fleetlet-admin-{tag}", f"a{tag}-"
    overlay = _overlay(
        tmp_path_factory.mktemp("deploy-agent-admin"),
        namespace=namespace,
        prefix=prefix,
        bases=[DEPLOY, DEPLOY / "cluster-admin"],
    )
    install = Install(cluster=kube_cluster, namespace=namespace, prefix=prefix, overlay=overlay)
    try:
        _install(kube_cluster, overlay)
        assert can_i(install, "*", "*")
        assert can_i(install, "get", "secrets", "-n", "kube-system")
    finally:
        _uninstall(kube_cluster, overlay)
