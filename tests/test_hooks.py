"""Helm hooks, Argo CD hooks and waves as ordered stages of a group's move: the sorting as pure
logic, then on the real components (API server with kwok running Jobs, registry, git server,
mini Sigstore): pre hooks before the objects, waves in order, post hooks after the group is
healthy, delete policies, a failing hook rolling the group back, delete hooks on removal.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent.apply.hooks import (
    FAIL,
    POST,
    POST_DELETE,
    PRE,
    PRE_DELETE,
    SYNC,
    Hook,
    HookError,
    HookFailedError,
    hook_state,
    run_hooks,
    split,
    wave_of,
)
from agent.kube import KubeClient, ObjectRef
from tests.fleetlab import Lab, conditions, configmap, live
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed


def obj(kind: str, name: str, **annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def names(items: list[Any]) -> list[str]:
    """The names of hooks or of plain objects."""
    return [(getattr(i, "manifest", None) or i)["metadata"]["name"] for i in items]


# --- sorting (pure logic) -----------------------------------------------------------------


def test_helm_hooks_are_chosen_by_install_or_upgrade() -> None:
    objects = [
        obj("ConfigMap", "app"),
        obj("Job", "migrate", **{"helm.sh/hook": "pre-install,pre-upgrade", "helm.sh/hook-weight": "-5"}),
        obj("Job", "seed", **{"helm.sh/hook": "post-install"}),
        obj("Job", "notify", **{"helm.sh/hook": "post-upgrade", "helm.sh/hook-delete-policy": "hook-succeeded,hook-failed"}),
        obj("Pod", "smoke", **{"helm.sh/hook": "test"}),
        obj("Job", "backup", **{"helm.sh/hook": "pre-delete"}),
        obj("Job", "undo", **{"helm.sh/hook": "pre-rollback"}),
    ]  # fmt: skip
    install = split("web", objects, install=True)
    assert names(install.main) == ["app"]
    assert names(install.of(PRE)) == ["migrate"] and install.of(PRE)[0].weight == -5
    assert names(install.of(POST)) == ["seed"]
    assert names(install.of(PRE_DELETE)) == ["backup"]
    assert install.not_run == ["Pod smoke (test)", "Job undo (pre-rollback)"]
    upgrade = split("web", objects, install=False)
    assert names(upgrade.of(PRE)) == ["migrate"] and names(upgrade.of(POST)) == ["notify"]
    assert upgrade.of(POST)[0].policies == {"hook-succeeded", "hook-failed"}
    # The default delete policy of both tools: the previous object of the name goes first.
    assert upgrade.of(PRE)[0].policies == {"before-hook-creation"}


def test_argo_hooks_and_waves() -> None:
    objects = [
        obj("ConfigMap", "late", **{"argocd.argoproj.io/sync-wave": "5"}),
        obj("ConfigMap", "early", **{"fleetlet.io/wave": "-1"}),
        obj("Job", "schema", **{"argocd.argoproj.io/hook": "PreSync", "argocd.argoproj.io/sync-wave": "2"}),
        obj("Job", "warm", **{"argocd.argoproj.io/hook": "Sync"}),
        obj("Job", "check", **{"argocd.argoproj.io/hook": "PostSync", "argocd.argoproj.io/hook-delete-policy": "HookSucceeded"}),
        obj("Job", "page", **{"argocd.argoproj.io/hook": "SyncFail"}),
        obj("Job", "clean", **{"argocd.argoproj.io/hook": "PostDelete"}),
        obj("ConfigMap", "never", **{"argocd.argoproj.io/hook": "Skip"}),
    ]  # fmt: skip
    sorted_out = split("app", objects, install=True)
    assert [wave_of(o) for o in sorted_out.main] == [5, -1]
    assert names(sorted_out.of(PRE)) == ["schema"] and sorted_out.of(PRE)[0].weight == 2
    assert names(sorted_out.of(SYNC)) == ["warm"] and names(sorted_out.of(FAIL)) == ["page"]
    assert names(sorted_out.of(POST)) == ["check"]
    assert sorted_out.of(POST)[0].policies == {"hook-succeeded"}
    assert names(sorted_out.of(POST_DELETE)) == ["clean"]
    assert sorted_out.not_run == ["ConfigMap never (Skip)"]


def test_bad_hooks_and_waves_are_refused_naming_the_object() -> None:
    for bad, text in [
        (obj("ConfigMap", "a", **{"fleetlet.io/wave": "soon"}), "ConfigMap a: fleetlet.io/wave 'soon'"),
        (obj("Job", "b", **{"helm.sh/hook": "pre-install", "helm.sh/hook-weight": "x"}), "Job b"),
        (obj("Job", "c", **{"helm.sh/hook": "crd-install"}), "unknown helm hook crd-install"),
        (obj("Job", "d", **{"argocd.argoproj.io/hook": "Whenever"}), "unknown Argo CD hook"),
    ]:  # fmt: skip
        with pytest.raises(HookError, match=text):
            split("x", [bad], install=True)


def test_a_hook_is_done_when_its_job_completes_or_its_pod_succeeds() -> None:
    job = {"kind": "Job", "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert hook_state(job)[0] == "done"
    failed = {"kind": "Job", "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}  # fmt: skip
    assert hook_state(failed) == ("failed", "Job failed: BackoffLimitExceeded")
    assert hook_state({"kind": "Job", "status": {}})[0] == "running"
    assert hook_state({"kind": "Pod", "status": {"phase": "Succeeded"}})[0] == "done"
    assert hook_state({"kind": "Pod", "status": {"phase": "Failed"}})[0] == "failed"
    assert hook_state({"kind": "ConfigMap"})[0] == "done"
    assert hook_state(None)[0] == "failed"


# --- on the real components -----------------------------------------------------------------


def hook_configmap(name: str, namespace: str, hook: str, **more: str) -> str:
    extra = "".join(f"    {k}: {v!r}\n" for k, v in more.items())
    return (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        f"  annotations:\n    helm.sh/hook: {hook}\n{extra}data:\n  hook: {name}\n"
    )


def job(name: str, namespace: str, image: str, hook: str, policy: str = "") -> str:
    annotations = f"    helm.sh/hook: {hook}\n"
    if policy:
        annotations += f"    helm.sh/hook-delete-policy: {policy}\n"
    return f"""apiVersion: batch/v1
kind: Job
metadata:
  generateName: {name}-
  namespace: {namespace}
  annotations:
{annotations}spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: main
          image: {image}
"""


def waved(name: str, namespace: str, wave: int, value: str) -> str:
    return configmap(name, namespace, {"v": value}).replace(
        "metadata:\n", f"metadata:\n  annotations:\n    fleetlet.io/wave: '{wave}'\n", 1
    )


def version(rv: dict[str, Any] | None) -> int:
    assert rv is not None
    return int(rv["metadata"]["resourceVersion"])


def jobs(kube: KubeClient, namespace: str, prefix: str) -> list[dict[str, Any]]:
    return [
        j
        for j in kube.list("batch/v1", "Job", namespace=namespace)
        if j["metadata"]["name"].startswith(prefix)
    ]


def test_hooks_and_waves_run_in_order_and_a_failing_hook_rolls_the_group_back(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("hooks"), lab.name("app")
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, field_manager="test"
    )

    def files(value: str, *, post_image: str = "example/smoke:1") -> dict[str, str]:
        return {
            "pre.yaml": hook_configmap("pre-marker", ns, "pre-install,pre-upgrade"),
            "migrate.yaml": job(
                "migrate", ns, "example/migrate:1", "pre-upgrade", "hook-succeeded"
            ),
            "w0.yaml": waved("first", ns, 0, value),
            "w1.yaml": waved("second", ns, 1, value),
            "post.yaml": hook_configmap("post-marker", ns, "post-install,post-upgrade"),
            "smoke.yaml": job("smoke", ns, post_image, "post-upgrade", "hook-succeeded"),
            "test.yaml": hook_configmap("test-marker", ns, "test"),
            "bye.yaml": hook_configmap("bye", ns, "pre-delete"),
        }

    def publish(**kw: Any) -> None:
        digest = lab.push("hooked", files(**kw), tag=f"t{time.monotonic_ns()}")
        lab.publish(
            [{"name": name, "sources": [lab.source("hooked", digest)], "healthChecks": {"timeoutSeconds": 20}}]
        )  # fmt: skip

    publish(value="one")
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    first = agent.tick()
    assert first.outbound is not None and first.outbound.moved == (name,), first
    pre, w0, w1, post = (
        live(kube, "v1", "ConfigMap", n, ns)
        for n in ("pre-marker", "first", "second", "post-marker")
    )
    # Created in order: the pre hook, wave 0, wave 1 (after wave 0 was healthy), the post hook.
    assert version(pre) < version(w0) < version(w1) < version(post)
    assert live(kube, "v1", "ConfigMap", "test-marker", ns) is None  # test hooks: not run
    assert live(kube, "v1", "ConfigMap", "bye", ns) is None  # pre-delete: not yet
    run = agent.reconciler.views[name].runs[0]
    assert "hooks run:" in run.message and "ConfigMap" in run.message
    assert (
        "hooks not run (tests, rollback hooks, Skip): ConfigMap test-marker (test)" in run.message
    )

    # An upgrade: the pre-upgrade migration Job runs (and is deleted once it succeeded), the
    # hook objects of the same name are made anew (before-hook-creation).
    publish(value="two")
    second = agent.tick()
    assert second.outbound is not None and second.outbound.moved == (name,), second
    assert jobs(kube, ns, "migrate-") == [] and jobs(kube, ns, "smoke-") == []
    assert version(live(kube, "v1", "ConfigMap", "pre-marker", ns)) > version(post)
    assert "Job" in agent.reconciler.views[name].runs[0].message

    # A post-upgrade hook that fails fails the move: the group goes back to "two".
    publish(value="three", post_image="example/smoke:fail")
    third = agent.tick()
    assert third.outbound is not None and third.outbound.rolled_back == (name,), third
    ready = conditions(kube, name)["Ready"]
    assert ready["reason"] == "RolledBack" and "HookFailed" in ready["message"], ready
    assert "Job" in ready["message"] and "smoke-" in ready["message"]
    cm = live(kube, "v1", "ConfigMap", "second", ns)
    assert cm is not None and cm["data"] == {"v": "two"}
    assert [j for j in jobs(kube, ns, "smoke-")], "the failed hook is kept (no hook-failed policy)"

    # Removed: the pre-delete hook runs before the objects go.
    other = lab.push("other", {"cm.yaml": configmap("other", ns, {"a": "1"})}, tag="v1")
    lab.publish([{"name": lab.name("other"), "sources": [lab.source("other", other)]}])
    agent.tick()
    assert live(kube, "v1", "ConfigMap", "first", ns) is None
    assert live(kube, "v1", "ConfigMap", "bye", ns) is not None


# --- the hook runtime against a real API server (as Helm's pkg/action/hooks.go runs hooks) ---


def helm_hook(kind: str, name: str, ns: str, hook: str, weight: int, policy: str, **spec: Any) -> Hook:  # fmt: skip
    api = {"Job": "batch/v1", "Role": "rbac.authorization.k8s.io/v1"}.get(kind, "v1")
    api = "rbac.authorization.k8s.io/v1" if kind == "RoleBinding" else api
    manifest: dict[str, Any] = {
        "apiVersion": api,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {
                "helm.sh/hook": hook,
                "helm.sh/hook-weight": str(weight),
                "helm.sh/hook-delete-policy": policy,
            },
        },
        **spec,
    }
    return split("b", [manifest], install=True).of(PRE if hook.startswith("pre") else POST)[0]


def job_spec(image: str, *, account: str | None = None, **more: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": image}],
    }
    if account:
        pod["serviceAccountName"] = account
    return {"spec": {"backoffLimit": 0, "template": {"spec": pod}, **more}}


def hook_objects(kube: KubeClient, ns: str) -> set[str]:
    found = set()
    for api, kind in (
        ("v1", "ServiceAccount"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("batch/v1", "Job"),
    ):
        found |= {
            f"{kind} {o['metadata']['name']}"
            for o in kube.list(api, kind, namespace=ns)
            if o["metadata"]["name"] != "default"
        }
    return found


def test_hook_succeeded_applies_after_every_hook_of_the_moment_as_in_cert_manager(
    kube_cluster: Cluster, namespace: str
) -> None:
    """cert-manager's startupapicheck: a post-install Job (weight 1) runs as a ServiceAccount
    with a Role and RoleBinding that are hooks themselves (weight -5, before-hook-creation and
    hook-succeeded). They stay until the Job completed, then all go."""
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    ns, policy = namespace, "before-hook-creation,hook-succeeded"
    role = {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    binding = {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "check"},
        "subjects": [{"kind": "ServiceAccount", "name": "check", "namespace": ns}],
    }
    check = job_spec("example/check:1", account="check")
    hooks = [
        helm_hook("Job", "check", ns, "post-install", 1, policy, **check),
        helm_hook("RoleBinding", "check", ns, "post-install", -5, policy, **binding),
        helm_hook("Role", "check", ns, "post-install", -5, policy, **role),
        helm_hook("ServiceAccount", "check", ns, "post-install", -5, policy),
    ]
    ran = run_hooks(hooks, client_for=lambda _b: kube, timeout_for=lambda _b: 60)
    # Helm's order: weight, then name, then kind (ServiceAccount before Role before binding).
    assert ran == [
        f"ServiceAccount {ns}/check",
        f"Role {ns}/check",
        f"RoleBinding {ns}/check",
        f"Job {ns}/check",
    ]
    assert hook_objects(kube, ns) == set()  # every hook-succeeded hook deleted, at the end


def test_a_hook_job_removed_as_soon_as_it_completes_is_seen_completing(
    kube_cluster: Cluster, namespace: str
) -> None:
    """ingress-nginx's admission-create Job: ``ttlSecondsAfterFinished: 0``, so the cluster
    deletes it the moment it completes; the watch sees it complete."""
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    hook = helm_hook("Job", "create", namespace, "pre-install", 0, "before-hook-creation",
                     **job_spec("example/certgen:1", ttlSecondsAfterFinished=0))  # fmt: skip
    assert run_hooks([hook], client_for=lambda _b: kube, timeout_for=lambda _b: 60) == [
        f"Job {namespace}/create"
    ]
    deadline = time.monotonic() + 30
    while live(kube, "batch/v1", "Job", "create", namespace) is not None:
        assert time.monotonic() < deadline, "the TTL controller did not delete the Job"
        time.sleep(0.2)


def test_a_hook_job_deleted_before_it_completed_fails_clearly(
    kube_cluster: Cluster, namespace: str
) -> None:
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    hook = helm_hook("Job", "stuck", namespace, "pre-install", 0, "before-hook-creation",
                     **job_spec("example/stuck:1", suspend=True))  # fmt: skip

    def delete_when_made() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if kube.delete(ObjectRef("batch/v1", "Job", "stuck", namespace)):
                return
            time.sleep(0.1)

    deleter = threading.Thread(target=delete_when_made)
    deleter.start()
    try:
        with pytest.raises(HookFailedError) as failed:
            run_hooks([hook], client_for=lambda _b: kube, timeout_for=lambda _b: 60)
    finally:
        deleter.join()
    assert str(failed.value) == (
        f"hook Job {namespace}/stuck failed: it was deleted before it completed (Job not complete)"
    )


def test_a_failed_hook_goes_by_hook_failed_and_those_before_it_by_hook_succeeded(
    kube_cluster: Cluster, namespace: str
) -> None:
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    ns, broken = namespace, job_spec("example/x:fail")
    hooks = [
        helm_hook("ServiceAccount", "first", ns, "pre-install", -1, "hook-succeeded"),
        helm_hook("ServiceAccount", "kept", ns, "pre-install", -1, "before-hook-creation"),
        helm_hook("Job", "broken", ns, "pre-install", 0, "hook-failed", **broken),
        helm_hook("ServiceAccount", "never", ns, "pre-install", 5, "hook-succeeded"),
    ]
    with pytest.raises(HookFailedError, match=rf"hook Job {ns}/broken failed: Job failed: "):
        run_hooks(hooks, client_for=lambda _b: kube, timeout_for=lambda _b: 60)
    assert hook_objects(kube, ns) == {"ServiceAccount kept"}


def test_a_hook_not_done_in_its_bundles_time_limit_fails(
    kube_cluster: Cluster, namespace: str
) -> None:
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    hook = helm_hook("Job", "slow", namespace, "pre-install", 0, "before-hook-creation",
                     **job_spec("example/slow:1", suspend=True))  # fmt: skip
    with pytest.raises(HookFailedError, match=r"hook Job .*/slow failed: not done after 2s$"):
        run_hooks([hook], client_for=lambda _b: kube, timeout_for=lambda _b: 2)


# --- through hub and agent: namespaces first, and a failed first install retried cleanly ---


def named_job(name: str, namespace: str, image: str, hook: str, policy: str) -> str:
    return job(name, namespace, image, hook, policy).replace(
        f"generateName: {name}-", f"name: {name}"
    )


def test_namespaces_come_before_hooks_and_a_failed_first_install_is_retried_cleanly(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """``createNamespace`` and the bundle's own Namespace exist before its pre-install hooks,
    which live in them. The first install fails (a hook Job that fails, kept by its
    ``hook-succeeded``-only policy), and the next publication installs cleanly over what it
    left: nothing to trip over."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, side, name = lab.name("new"), lab.name("side"), lab.name("first")

    def files(image: str) -> dict[str, str]:
        return {
            "ns.yaml": f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {side}\n",
            "sa.yaml": hook_configmap("setup", side, "pre-install"),
            "migrate.yaml": named_job("migrate", ns, image, "pre-install", "hook-succeeded"),
            "app.yaml": configmap("app", ns, {"v": "1"}),
        }

    def publish(image: str) -> None:
        digest = lab.push("first", files(image), tag=f"t{time.monotonic_ns()}")
        lab.publish(
            [
                {
                    "name": name,
                    "sources": [lab.source("first", digest)],
                    "createNamespace": True,
                    "formatOptions": {"targetNamespace": ns},
                    "healthChecks": {"timeoutSeconds": 20},
                }
            ]
        )

    publish("example/migrate:fail")
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    first = agent.tick()
    assert first.outbound is not None and first.outbound.moved == (), first
    ready = conditions(kube, name)["Ready"]
    assert ready["status"] == "False" and "HookFailed" in ready["reason"] + ready["message"]
    assert f"hook Job {ns}/migrate failed: Job failed" in ready["message"], ready
    assert "not found" not in ready["message"]  # the namespaces were there before the hooks
    assert live(kube, "batch/v1", "Job", "migrate", ns) is not None  # kept by its policy

    publish("example/migrate:2")
    second = agent.tick()
    assert second.outbound is not None and second.outbound.moved == (name,), second
    assert conditions(kube, name)["Ready"]["status"] == "True"
    assert live(kube, "v1", "ConfigMap", "app", ns) is not None
    assert live(kube, "v1", "ConfigMap", "setup", side) is not None
    assert live(kube, "batch/v1", "Job", "migrate", ns) is None  # succeeded, then deleted
