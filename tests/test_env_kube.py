"""Acceptance tests of the Kubernetes test environment, each against real control planes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ConflictError

from tests.realenv.binaries import ALL_BINARIES, KUBERNETES_VERSION, ensure_binaries
from tests.realenv.kube import Cluster, ClusterError, start_clusters

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    """Poll ``probe`` until it returns a truthy value; fail the test naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except ApiException as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


def conditions(obj: Any) -> dict[str, Any]:
    return {c.type: c for c in (obj.status.conditions or [])}


def crd_manifest(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def established(ext: k8s_client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    condition = conditions(crd).get("Established")
    return condition is not None and condition.status == "True"


def test_three_clusters_serve_crds_and_server_side_apply(
    kube_fleet: list[Cluster], tmp_path: Path
) -> None:
    assert len(kube_fleet) == 3
    assert len({c.server for c in kube_fleet}) == 3
    group = f"t{uuid.uuid4().hex[:8]}.fleetlet.io"
    for index, cluster in enumerate(kube_fleet):
        with cluster.api_client() as api:
            dyn = DynamicClient(api, cache_file=str(tmp_path / f"discovery-{index}.json"))
            ext = k8s_client.ApiextensionsV1Api(api)
            ext.create_custom_resource_definition(crd_manifest(group))
            wait_for(
                f"CRD Established on {cluster.name}",
                lambda ext=ext: established(ext, f"widgets.{group}"),
            )
            ns = f"ssa-{uuid.uuid4().hex[:6]}"
            k8s_client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})

            # The new API is served: a Widget can be applied.
            dyn.resources.invalidate_cache()
            widgets = dyn.resources.get(api_version=f"{group}/v1", kind="Widget")
            widget = {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": "w", "namespace": ns},
                "spec": {"size": index},
            }
            applied = widgets.server_side_apply(body=widget, field_manager="fleetlet")
            assert applied.spec.size == index

            configmaps = dyn.resources.get(api_version="v1", kind="ConfigMap")
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "settings", "namespace": ns},
                "data": {"cluster": cluster.name},
            }
            result = configmaps.server_side_apply(body=body, field_manager="fleetlet")
            assert result.data.cluster == cluster.name
            managers = [m.manager for m in result.metadata.managedFields]
            assert managers == ["fleetlet"]

            # Another manager changing a field it does not own is refused...
            rival = {**body, "data": {"cluster": "someone-else"}}
            with pytest.raises(ConflictError) as refused:
                configmaps.server_side_apply(body=rival, field_manager="intruder")
            assert refused.value.status == 409
            assert configmaps.get(name="settings", namespace=ns).data.cluster == cluster.name

            # ...unless it forces, which moves the field's ownership to it.
            forced = configmaps.server_side_apply(
                body=rival, field_manager="intruder", force_conflicts=True
            )
            assert forced.data.cluster == "someone-else"
            assert [m.manager for m in forced.metadata.managedFields] == ["intruder"]

            k8s_client.CoreV1Api(api).delete_namespace(ns)
            ext.delete_custom_resource_definition(f"widgets.{group}")


def deployment(name: str, image: str, replicas: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            # Short, so that a stalled rollout is reported as failed within the test.
            "progressDeadlineSeconds": 10,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image}]},
            },
        },
    }


def image_patch(image: str) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}}


def rolled_out(apps: k8s_client.AppsV1Api, name: str, ns: str) -> Any:
    """The Deployment if its latest generation is fully rolled out and Available, else None."""
    dep = apps.read_namespaced_deployment_status(name, ns)
    status = dep.status
    want = dep.spec.replicas
    done = (
        status.observed_generation == dep.metadata.generation
        and status.updated_replicas == want
        and status.ready_replicas == want
        and status.available_replicas == want
        and (status.replicas or 0) == want
    )
    available = conditions(dep).get("Available")
    return dep if done and available is not None and available.status == "True" else None


def test_deployment_becomes_available_and_a_broken_image_stalls_the_rollout(
    kube_cluster: Cluster, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        apps = k8s_client.AppsV1Api(api)
        core = k8s_client.CoreV1Api(api)
        apps.create_namespaced_deployment(namespace, deployment("web", "example.test/web:1.0"))
        dep = wait_for("web Available", lambda: rolled_out(apps, "web", namespace))
        assert conditions(dep)["Progressing"].reason == "NewReplicaSetAvailable"
        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        assert len(pods) == 3
        assert all(p.status.phase == "Running" and p.spec.node_name for p in pods)

        apps.patch_namespaced_deployment(
            "web",
            namespace,
            image_patch("example.test/web:broken"),
        )

        def stalled() -> Any:
            dep = apps.read_namespaced_deployment_status("web", namespace)
            progressing = conditions(dep).get("Progressing")
            if (
                dep.status.observed_generation == dep.metadata.generation
                and progressing is not None
                and progressing.status == "False"
            ):
                return dep
            return None

        dep = wait_for("the broken rollout to exceed its progress deadline", stalled)
        assert conditions(dep)["Progressing"].reason == "ProgressDeadlineExceeded"
        # The new pods run but never become ready, so the rollout cannot complete: the old
        # replicas keep serving (maxUnavailable rounds down to 0).
        assert dep.status.updated_replicas >= 1
        assert (dep.status.unavailable_replicas or 0) >= 1
        assert rolled_out(apps, "web", namespace) is None
        broken = [
            p
            for p in core.list_namespaced_pod(namespace, label_selector="app=web").items
            if p.spec.containers[0].image.endswith(":broken")
        ]
        assert broken
        for pod in broken:
            ready = {c.type: c.status for c in pod.status.conditions or []}
            assert pod.status.phase == "Running"
            assert ready["Ready"] == "False"

        # Rolling back to the good image completes: the broken pods are deleted for real.
        apps.patch_namespaced_deployment(
            "web",
            namespace,
            image_patch("example.test/web:1.0"),
        )
        wait_for("web rolled back", lambda: rolled_out(apps, "web", namespace))
        wait_for(
            "broken pods gone",
            lambda: len(core.list_namespaced_pod(namespace, label_selector="app=web").items) == 3,
        )


def test_rbac_refuses_a_user_until_a_role_binding_allows_it(
    kube_cluster: Cluster, namespace: str
) -> None:
    user = f"alice-{uuid.uuid4().hex[:6]}"
    with (
        kube_cluster.api_client() as admin,
        Cluster.client_for(kube_cluster.mint_user(user, groups=["fleet-readers"])) as alice_api,
    ):
        alice = k8s_client.CoreV1Api(alice_api)
        with pytest.raises(ApiException) as refused:
            alice.list_namespaced_config_map(namespace)
        assert refused.value.status == 403
        assert user in refused.value.body

        rbac = k8s_client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "cm-reader"},
                "rules": [
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "cm-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "cm-reader",
                },
                # Bound to the group: the certificate's O is honoured as a group.
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Group",
                        "name": "fleet-readers",
                    }
                ],
            },
        )
        listed = wait_for(
            "alice allowed to list configmaps",
            lambda: alice.list_namespaced_config_map(namespace),
        )
        assert any(cm.metadata.name == "kube-root-ca.crt" for cm in listed.items)
        # Only what the Role grants: writing is still refused.
        with pytest.raises(ApiException) as still_refused:
            alice.create_namespaced_config_map(namespace, {"metadata": {"name": "x"}})
        assert still_refused.value.status == 403
        # And she cannot impersonate anyone.
        alice_api.set_default_header("Impersonate-User", "admin")
        with pytest.raises(ApiException) as no_impersonation:
            alice.list_namespaced_config_map(namespace)
        assert no_impersonation.value.status == 403


def test_admin_impersonating_a_service_account_gets_its_permissions(
    kube_cluster: Cluster, namespace: str
) -> None:
    with kube_cluster.api_client() as admin, kube_cluster.api_client() as as_sa:
        core = k8s_client.CoreV1Api(admin)
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "deployer"}})
        as_sa.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:deployer")
        sa_core = k8s_client.CoreV1Api(as_sa)
        secret = {"metadata": {"name": "s"}, "stringData": {"k": "v"}}
        with pytest.raises(ApiException) as refused:
            sa_core.create_namespaced_secret(namespace, secret)
        assert refused.value.status == 403
        assert f"system:serviceaccount:{namespace}:deployer" in refused.value.body

        k8s_client.RbacAuthorizationV1Api(admin).create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "deployer-edit"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "edit",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}
                ],
            },
        )
        created = wait_for(
            "the impersonated ServiceAccount allowed to create a Secret",
            lambda: sa_core.create_namespaced_secret(namespace, secret),
        )
        assert created.metadata.name == "s"
        # The binding is namespaced: elsewhere the ServiceAccount is still refused.
        with pytest.raises(ApiException) as elsewhere:
            sa_core.list_namespaced_secret("default")
        assert elsewhere.value.status == 403


def test_apiserver_reports_the_pinned_kubernetes_version(kube_cluster: Cluster) -> None:
    with kube_cluster.api_client() as api:
        info = k8s_client.VersionApi(api).get_code()
    assert info.git_version == KUBERNETES_VERSION
    assert kube_cluster.version()["gitVersion"] == KUBERNETES_VERSION


def processes_using(path: Path) -> list[int]:
    """PIDs whose command line mentions ``path`` (every component's flags name its workdir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if str(path).encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def test_failed_start_reports_the_component_log_and_leaves_nothing_running(
    tmp_path_factory: pytest.TempPathFactory, kube_binaries: dict[str, Path]
) -> None:
    good_dir = tmp_path_factory.mktemp("kube-good")
    broken_dir = tmp_path_factory.mktemp("kube-broken")
    # etcd refuses a data dir whose member directory is a file: a real start-up failure.
    (broken_dir / "etcd").mkdir(mode=0o700)
    (broken_dir / "etcd" / "member").write_text("not a directory")
    good = Cluster(name="good", workdir=good_dir, binaries=kube_binaries, start_timeout=60)
    broken = Cluster(name="broken", workdir=broken_dir, binaries=kube_binaries, start_timeout=60)
    with pytest.raises(ClusterError) as failed:
        start_clusters([good, broken])
    message = str(failed.value)
    assert "cluster broken: etcd exited" in message
    assert str(broken_dir / "logs" / "etcd.log") in message
    assert "not a directory" in message  # etcd's own words, from the tail of its log
    # Started together, stopped together: nothing of either cluster is left running.
    assert processes_using(broken_dir) == []
    assert processes_using(good_dir) == []


def test_apiserver_outage_then_recovery_and_stop_leaves_nothing_running(
    tmp_path_factory: pytest.TempPathFactory, kube_binaries: dict[str, Path]
) -> None:
    workdir = tmp_path_factory.mktemp("kube-outage")
    with Cluster(name="outage", workdir=workdir, binaries=kube_binaries) as cluster:
        assert len(processes_using(workdir)) == 5
        with cluster.api_client() as api:
            apps = k8s_client.AppsV1Api(api)
            cluster.stop_apiserver()
            with pytest.raises(urllib3.exceptions.MaxRetryError):
                k8s_client.VersionApi(api).get_code(_request_timeout=5)
            cluster.start_apiserver()
            # The controllers, scheduler and kwok came back on their own: workloads run again.
            apps.create_namespaced_deployment("default", deployment("after", "example.test/a:1"))
            wait_for(
                "Deployment Available after the outage",
                lambda: rolled_out(apps, "after", "default"),
            )
    assert processes_using(workdir) == []


def test_binaries_are_resolved_from_the_cache() -> None:
    paths = ensure_binaries()
    assert set(paths) == set(ALL_BINARIES)
    assert all(p.is_file() and os.access(p, os.X_OK) for p in paths.values())


def test_kubebuilder_assets_take_precedence_per_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = ensure_binaries()
    # envtest's assets hold kube-apiserver, etcd and kubectl only: the others come from the cache.
    for name in ("kube-apiserver", "etcd"):
        (tmp_path / name).symlink_to(cached[name])
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    paths = ensure_binaries()
    assert paths["kube-apiserver"] == tmp_path / "kube-apiserver"
    assert paths["etcd"] == tmp_path / "etcd"
    assert paths["kwok"] == cached["kwok"]
    assert paths["kube-scheduler"] == cached["kube-scheduler"]


def test_the_binaries_are_built_without_any_installed_package() -> None:
    """scripts/install.sh starts `python3 -m tests.realenv.binaries` before pip has installed
    anything (the Go builds run beside apt and pip): it must need the standard library only.
    ``-S`` leaves site-packages off the path, so any other import fails here."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-S", "-m", "tests.realenv.binaries", "kubectl"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["kubectl", str(ensure_binaries(["kubectl"])["kubectl"])]
