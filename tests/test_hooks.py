"""Helm hooks, Argo CD hooks and waves as ordered stages of a group's move: the sorting as pure
logic, then on the real components (API server with kwok running Jobs, registry, git server,
mini Sigstore): pre hooks before the objects, waves in order, post hooks after the group is
healthy, delete policies, a failing hook rolling the group back, delete hooks on removal.
"""

from __future__ import annotations

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
    HookError,
    hook_state,
    split,
    wave_of,
)
from agent.kube import KubeClient
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
