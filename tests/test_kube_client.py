"""KubeClient against a real API server: server-side apply, dry run, conflicts, RBAC refusals,
impersonation, discovery, and an unreachable server."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import PermanentError, TemporaryError
from agent.health import Status, assess
from agent.kube import (
    ApiNotServedError,
    ApiUnavailableError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    KubeClient,
    KubeconfigError,
    NotFoundError,
)
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster

MANAGER = "fleetlet-agent"


@pytest.fixture(scope="module")
def discovery_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("discovery")


@pytest.fixture(scope="module")
def kube(kube_cluster: Cluster, discovery_dir: Path) -> Iterator[KubeClient]:
    with KubeClient(
        kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=discovery_dir
    ) as client:
        yield client


def configmap(namespace: str, name: str = "settings", **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def eventually(action: Callable[[], Any], *, timeout: float = 30.0) -> Any:
    """Retry ``action`` while it raises ForbiddenError (RBAC caches take a moment to see a
    new binding); re-raise after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except ForbiddenError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# --- server-side apply ---------------------------------------------------------------------------


def test_apply_creates_and_dry_run_changes_nothing(kube: KubeClient, namespace: str) -> None:
    planned = kube.apply(configmap(namespace, mode="blue"), field_manager=MANAGER, dry_run=True)
    assert planned["data"] == {"mode": "blue"}
    assert kube.get(configmap(namespace)) is None

    created = kube.apply(configmap(namespace, mode="blue"), field_manager=MANAGER)
    assert created["metadata"]["uid"]
    managers = {m["manager"] for m in created["metadata"]["managedFields"]}
    assert managers == {MANAGER}

    preview = kube.apply(configmap(namespace, mode="green"), field_manager=MANAGER, dry_run=True)
    assert preview["data"] == {"mode": "green"}
    live = kube.get(configmap(namespace))
    assert live is not None and live["data"] == {"mode": "blue"}
    assert live["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_conflict_names_the_other_manager_and_force_takes_over(
    kube: KubeClient, namespace: str
) -> None:
    kube.apply(configmap(namespace, mode="blue"), field_manager="kubectl-edit")
    with pytest.raises(ConflictError) as caught:
        kube.apply(configmap(namespace, mode="green"), field_manager=MANAGER)
    error = caught.value
    assert isinstance(error, PermanentError)
    assert error.reason == "Conflict" and error.status == 409
    assert error.managers == ["kubectl-edit"]
    assert [c.field for c in error.causes] == [".data.mode"]
    assert 'conflict with "kubectl-edit"' in str(error)
    assert f"ConfigMap v1 {namespace}/settings" in str(error)

    taken = kube.apply(configmap(namespace, mode="green"), field_manager=MANAGER, force=True)
    assert taken["data"] == {"mode": "green"}
    owners = {
        m["manager"]
        for m in taken["metadata"]["managedFields"]
        if "f:data" in m.get("fieldsV1", {})
    }
    assert owners == {MANAGER}


def test_invalid_object_keeps_the_server_causes(kube: KubeClient, namespace: str) -> None:
    with pytest.raises(InvalidError) as caught:
        kube.apply(configmap(namespace, name="Not_Valid"), field_manager=MANAGER)
    assert caught.value.reason == "Invalid"
    assert [c.field for c in caught.value.causes] == ["metadata.name"]
    assert "RFC 1123" in str(caught.value)


def test_missing_namespace_is_not_found(kube: KubeClient) -> None:
    missing = f"absent-{uuid.uuid4().hex[:6]}"
    with pytest.raises(NotFoundError, match=f'namespaces "{missing}" not found'):
        kube.apply(configmap(missing), field_manager=MANAGER)


def test_get_list_delete(kube: KubeClient, namespace: str) -> None:
    for index in range(3):
        obj = configmap(namespace, name=f"item-{index}", n=str(index))
        obj["metadata"]["labels"] = {"fleetlet.io/test-set": "a" if index < 2 else "b"}
        kube.apply(obj, field_manager=MANAGER)
    listed = kube.list(
        "v1", "ConfigMap", namespace=namespace, label_selector="fleetlet.io/test-set=a"
    )
    assert sorted(o["metadata"]["name"] for o in listed) == ["item-0", "item-1"]
    assert {(o["apiVersion"], o["kind"]) for o in listed} == {("v1", "ConfigMap")}

    live = kube.get(configmap(namespace, name="item-0"))
    assert live is not None
    with pytest.raises(ConflictError):
        kube.delete(live, uid=str(uuid.uuid4()))
    assert kube.delete(live, dry_run=True) is True
    assert kube.get(live) is not None
    assert kube.delete(live, uid=live["metadata"]["uid"]) is True
    assert kube.get(live) is None
    assert kube.delete(live) is False


def test_concurrent_applies_share_one_client(kube: KubeClient, namespace: str) -> None:
    objects = [configmap(namespace, name=f"many-{i:02d}", i=str(i)) for i in range(40)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        applied = list(pool.map(lambda o: kube.apply(o, field_manager=MANAGER), objects))
    assert [a["data"] for a in applied] == [o["data"] for o in objects]
    names = {o["metadata"]["name"] for o in kube.list("v1", "ConfigMap", namespace=namespace)}
    assert {o["metadata"]["name"] for o in objects} <= names


# --- RBAC and impersonation ------------------------------------------------------------------------


def test_user_without_rbac_is_forbidden(
    kube_cluster: Cluster, namespace: str, discovery_dir: Path
) -> None:
    user = f"nobody-{uuid.uuid4().hex[:6]}"
    with KubeClient(
        kubeconfig=kube_cluster.mint_user(user), discovery_cache_dir=discovery_dir
    ) as client:
        with pytest.raises(ForbiddenError) as caught:
            client.apply(configmap(namespace), field_manager=MANAGER)
        assert caught.value.reason == "Forbidden" and caught.value.status == 403
        assert f'User "{user}" cannot patch resource "configmaps"' in str(caught.value)
        with pytest.raises(ForbiddenError):
            client.get(configmap(namespace))


def test_impersonated_service_account_is_refused_then_allowed_after_a_rolebinding(
    kube_cluster: Cluster, kube: KubeClient, namespace: str, discovery_dir: Path
) -> None:
    # The agent's user may impersonate the `deployer` ServiceAccount, nothing else.
    agent_user = f"agent-{uuid.uuid4().hex[:6]}"
    rbac = "rbac.authorization.k8s.io/v1"
    for obj in (
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "deployer", "namespace": namespace},
        },
        {
            "apiVersion": rbac,
            "kind": "Role",
            "metadata": {"name": "impersonate-deployer", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["serviceaccounts"],
                    "verbs": ["impersonate"],
                    "resourceNames": ["deployer"],
                }
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": "agent-impersonates", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "impersonate-deployer",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": agent_user}
            ],
        },
    ):
        kube.apply(obj, field_manager=MANAGER)

    with KubeClient(
        kubeconfig=kube_cluster.mint_user(agent_user), discovery_cache_dir=discovery_dir
    ) as agent:
        as_deployer = agent.impersonating("deployer", namespace)
        assert as_deployer.impersonate == f"system:serviceaccount:{namespace}:deployer"
        # Impersonation is allowed (once RBAC caches see the binding), but the ServiceAccount
        # itself may not write ConfigMaps yet: the refusal names the ServiceAccount.
        sa_user = f"system:serviceaccount:{namespace}:deployer"
        deadline = time.monotonic() + 30
        while True:
            with pytest.raises(ForbiddenError) as caught:
                as_deployer.apply(configmap(namespace), field_manager=MANAGER)
            if f'User "{sa_user}" cannot patch resource "configmaps"' in str(caught.value):
                break
            assert time.monotonic() < deadline, str(caught.value)
            time.sleep(0.2)
        # Another ServiceAccount may not be impersonated at all.
        with pytest.raises(ForbiddenError, match="impersonate"):
            agent.impersonating("default", namespace).get(configmap(namespace))

        kube.apply(
            {
                "apiVersion": rbac,
                "kind": "Role",
                "metadata": {"name": "configmap-writer", "namespace": namespace},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["configmaps"],
                        "verbs": ["get", "create", "patch"],
                    }
                ],
            },
            field_manager=MANAGER,
        )
        kube.apply(
            {
                "apiVersion": rbac,
                "kind": "RoleBinding",
                "metadata": {"name": "deployer-writes", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "configmap-writer",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}
                ],
            },
            field_manager=MANAGER,
        )
        applied = eventually(
            lambda: as_deployer.apply(configmap(namespace, mode="x"), field_manager=MANAGER)
        )
        assert applied["data"] == {"mode": "x"}
        live = kube.get(configmap(namespace))
        assert live is not None and live["data"] == {"mode": "x"}


# --- discovery ---------------------------------------------------------------------------------


def test_server_version_and_api_versions_are_what_kubectl_reports(
    kube: KubeClient, kube_cluster: Cluster
) -> None:
    shown = subprocess.run(
        [kubectl(), "--kubeconfig", str(kube_cluster.kubeconfig), "version", "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert kube.server_version() == json.loads(shown.stdout)["serverVersion"]["gitVersion"]
    listed = subprocess.run(
        [kubectl(), "--kubeconfig", str(kube_cluster.kubeconfig), "api-versions"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    versions = kube.api_versions()
    assert versions == sorted(versions)
    # Every group/version kubectl lists, and each served kind as group/version/Kind (helm's
    # .Capabilities.APIVersions.Has "apps/v1/Deployment").
    group_versions = {v for v in versions if re.match(r"^v\d", v.rsplit("/", 1)[-1])}
    assert set(listed.stdout.split()) == group_versions
    assert {"v1", "v1/ConfigMap", "apps/v1/Deployment", "batch/v1/Job"} <= set(versions)
    assert "v1/pods/status" not in versions and not any(v.endswith("/") for v in versions)


def test_scope_of_builtin_and_custom_kinds_and_unknown_kinds(
    kube: KubeClient, discovery_dir: Path
) -> None:
    assert kube.is_namespaced("v1", "ConfigMap") is True
    assert kube.is_namespaced("v1", "Namespace") is False
    assert kube.is_namespaced("apps/v1", "Deployment") is True

    group = f"k{uuid.uuid4().hex[:8]}.example.com"
    with pytest.raises(ApiNotServedError) as caught:
        kube.is_namespaced(f"{group}/v1", "Sprocket")
    assert caught.value.reason == "ApiNotServed"
    assert kube.scope(f"{group}/v1", "Sprocket") is None
    sprocket = {"apiVersion": f"{group}/v1", "kind": "Sprocket", "metadata": {"name": "s1"}}
    with pytest.raises(ApiNotServedError, match="does not serve kind Sprocket"):
        kube.apply(sprocket, field_manager=MANAGER)

    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"sprockets.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {
                "plural": "sprockets",
                "singular": "sprocket",
                "kind": "Sprocket",
                "listKind": "SprocketList",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    kube.apply(crd, field_manager=MANAGER)
    try:
        deadline = time.monotonic() + 60
        while True:
            if assess(kube.get(crd)).status is Status.CURRENT:  # Established
                break
            assert time.monotonic() < deadline, "CRD never Established"
            time.sleep(0.2)
        # A kind served since the last discovery is found by re-discovering, once.
        assert kube.is_namespaced(f"{group}/v1", "Sprocket") is False
        created = kube.apply(sprocket, field_manager=MANAGER)
        assert created["metadata"]["name"] == "s1" and "namespace" not in created["metadata"]
        # A second kind in a group version already discovered: found too, by this client and
        # by a new one reading the discovery cache the first one wrote.
        gear = json.loads(json.dumps(crd).replace("prockets", "gears").replace("Sprocket", "Gear"))
        gear["spec"]["scope"] = "Namespaced"
        gear["spec"]["names"]["singular"] = "gear"
        with pytest.raises(ApiNotServedError):
            kube.is_namespaced(f"{group}/v1", "Gear")
        kube.apply(gear, field_manager=MANAGER)
        try:
            deadline = time.monotonic() + 60
            while assess(kube.get(gear)).status is not Status.CURRENT:
                assert time.monotonic() < deadline, "CRD never Established"
                time.sleep(0.2)
            assert kube.is_namespaced(f"{group}/v1", "Gear") is True
            with KubeClient(kubeconfig=kube.kubeconfig, discovery_cache_dir=discovery_dir) as fresh:
                assert fresh.is_namespaced(f"{group}/v1", "Gear") is True
                assert fresh.is_namespaced(f"{group}/v1", "Sprocket") is False
                assert fresh.is_namespaced("v1", "Secret") is True
                with pytest.raises(ApiNotServedError):
                    fresh.is_namespaced(f"{group}/v2", "Gear")
        finally:
            kube.delete(gear)
    finally:
        kube.delete(crd)


# --- failures below HTTP -----------------------------------------------------------------------


def kubeconfig_for(source: Path, server: str, target: Path) -> str:
    document = yaml.safe_load(source.read_text())
    document["clusters"][0]["cluster"]["server"] = server
    target.write_text(yaml.safe_dump(document))
    return str(target)


@pytest.mark.timeout(60)
def test_unreachable_api_server_is_a_temporary_error(kube_cluster: Cluster, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    # Nothing listens on closed_port now: connections are refused.
    config = kubeconfig_for(
        kube_cluster.kubeconfig, f"https://127.0.0.1:{closed_port}", tmp_path / "closed"
    )
    with KubeClient(kubeconfig=config, discovery_cache_dir=tmp_path) as client:
        with pytest.raises(ApiUnavailableError) as caught:
            client.get(configmap("default"))
        assert isinstance(caught.value, TemporaryError)
        assert caught.value.reason == "ApiUnavailable"
        assert "unreachable" in str(caught.value)


@pytest.mark.timeout(60)
def test_silent_api_server_times_out_instead_of_hanging(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    # A socket that accepts connections (backlog) but never says a word, like a hung server.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        server = f"https://127.0.0.1:{silent.getsockname()[1]}"
        config = kubeconfig_for(kube_cluster.kubeconfig, server, tmp_path / "silent")
        with (
            KubeClient(
                kubeconfig=config, discovery_cache_dir=tmp_path, connect_timeout=1, read_timeout=1
            ) as client,
            pytest.raises(ApiUnavailableError),
        ):
            client.is_namespaced("v1", "ConfigMap")


def test_unusable_kubeconfig_is_a_clear_permanent_error(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=r"kubeconfig .*missing: no such file") as caught:
        KubeClient(kubeconfig=str(tmp_path / "missing"))
    assert isinstance(caught.value, PermanentError)
    assert caught.value.reason == "KubeconfigInvalid"
    (tmp_path / "garbage").write_text("clusters: 3\n")
    with pytest.raises(KubeconfigError, match=r"cannot load kubeconfig .*garbage"):
        KubeClient(kubeconfig=str(tmp_path / "garbage"))
