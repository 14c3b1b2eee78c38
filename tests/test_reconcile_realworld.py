"""What real-world content exposed in the reconcile, each on the real components: a real API
server (kwok runs the pods), registry, git server and signatures from the mini Sigstore.

- a failed first install is remembered: removing the bundle deletes what it wrote, and all of
  its bookkeeping goes with it (group records, runs, revisions);
- an admission webhook that is down fails its group alone, named in the reason; the other
  groups move, removals happen, ``agent sync --once`` prints a summary and exits 1; once the
  webhook is back the target is retried by itself;
- ``kubectl get bd`` says which revision it describes and what is happening now;
- a refusal the cluster caused (a missing namespace) is retried by itself once fixed, and the
  message says how a failed target is tried again;
- the Kubernetes guestbook example (no namespaces in it) deploys with ``createNamespace``
  and namespace labels; objects that cannot get a namespace are all named, with the fix;
- a LoadBalancer Service is healthy without a load balancer, unless the bundle asks to wait;
- an independent group moves while another one waits for its health.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.kube import KubeClient, ObjectRef
from tests.fleetlab import (
    Lab,
    conditions,
    configmap,
    deployment,
    live,
    namespace_manifest,
    service,
)
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

GUESTBOOK = Path(__file__).parent / "assets" / "realworld" / "guestbook"


def bundle(lab: Lab, name: str, files: dict[str, str], **extra: Any) -> dict[str, Any]:
    """A fleet-repo bundle whose plain content (file name -> YAML) is pushed to the registry."""
    digest = lab.push(name, files, tag=f"t{time.monotonic_ns()}")
    return {"name": name, "sources": [lab.source(name, digest)], **extra}


def bookkeeping(kube: KubeClient, namespace: str, name: str) -> list[str]:
    """The agent's own objects about bundle ``name`` (or its own group) in its namespace."""
    left = []
    for kind in ("ConfigMap", "Secret"):
        for obj in kube.list("v1", kind, namespace=namespace):
            found = obj["metadata"]["name"]
            if name in found and found.startswith("fleetlet-"):
                left.append(f"{kind}/{found}")
    return left


def wait_until(condition: Callable[[], bool], *, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def get_bd(cluster: Cluster, name: str) -> dict[str, str]:
    """``kubectl get bd NAME`` as a column -> value mapping."""
    out = subprocess.run(
        [kubectl(), "--kubeconfig", str(cluster.kubeconfig), "get", "bd", name],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    header, row = out.splitlines()[:2]
    return dict(zip(header.split(), row.split(), strict=False))


def test_removing_a_bundle_whose_first_install_failed_deletes_what_it_wrote(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, other_ns = lab.name("first"), lab.name("keeps")
    bad, good = lab.name("bad"), lab.name("good")
    broken = {
        "01_ns.yaml": namespace_manifest(ns),
        "02_cm.yaml": configmap("settings", ns, {"mode": "one"}),
        "03_web.yaml": deployment("web", ns, "example/web:broken"),
    }
    healthy = {
        "01_ns.yaml": namespace_manifest(other_ns),
        "02_cm.yaml": configmap("stays", other_ns, {"a": "1"}),
    }
    lab.publish(
        [
            bundle(lab, bad, broken, healthChecks={"timeoutSeconds": 6}),
            bundle(lab, good, healthy),
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    first = agent.tick()
    assert first.outbound is not None and first.outbound.failed == (bad,), first
    ready = conditions(kube, bad)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "HealthCheckFailed", ready
    assert "removing the bundle deletes it" in ready["message"]
    assert live(kube, "v1", "ConfigMap", "settings", ns) is not None  # left for inspection

    # The failed bundle leaves the set: everything it wrote goes, and its bookkeeping too.
    lab.publish([bundle(lab, good, healthy)])
    second = agent.tick()
    assert second.outbound is not None and second.outbound.removed == (bad,), second
    assert live(kube, "v1", "ConfigMap", "settings", ns) is None
    assert live(kube, "apps/v1", "Deployment", "web", ns) is None
    assert live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", bad) is None
    assert bookkeeping(kube, namespace, bad) == []
    assert live(kube, "v1", "ConfigMap", "stays", other_ns) is not None

    # A healthy bundle removed: its objects and all of its bookkeeping go.
    lab.publish([bundle(lab, bad, {"cm.yaml": configmap("later", other_ns, {"b": "2"})})])
    agent.tick()
    assert live(kube, "v1", "ConfigMap", "stays", other_ns) is None
    assert live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", good) is None
    assert bookkeeping(kube, namespace, good) == []


@pytest.fixture
def failing_webhook(kube_cluster: Cluster, lab: Lab) -> Iterator[tuple[str, str]]:
    """A validating webhook for ConfigMaps in namespaces labelled for this test, whose service
    does not exist (the API server answers 500 "failed calling webhook"). Yields (webhook name,
    namespace label value); the configuration is deleted at the end."""
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    name = f"deny-{lab.suffix}.fleetlet.test"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"fleetlet-test-{lab.suffix}"},
        "webhooks": [
            {
                "name": name,
                "clientConfig": {
                    "service": {"name": "no-such-service", "namespace": "default", "port": 443}
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["configmaps"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"fleetlet-test-webhook": lab.suffix}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    kube.apply(config, field_manager="test")
    try:
        yield name, lab.suffix
    finally:
        kube.delete(config)


def test_a_failing_webhook_stops_only_its_group_and_is_retried_once_it_is_back(
    lab: Lab,
    crds: Cluster,
    namespace: str,
    tmp_path: Path,
    failing_webhook: tuple[str, str],
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    webhook, label = failing_webhook
    hooked_ns, free_ns = lab.name("hooked"), lab.name("free")
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": hooked_ns, "labels": {"fleetlet-test-webhook": label}}},
        field_manager="test",
    )  # fmt: skip
    hooked, other, old = lab.name("hooked"), lab.name("other"), lab.name("old")
    free = {"01_ns.yaml": namespace_manifest(free_ns)}
    lab.publish([bundle(lab, old, {**free, "cm.yaml": configmap("old", free_ns, {"v": "1"})})])
    workdir = tmp_path / "agent"
    extra = ["--retry-backoff", "1"]
    installed = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir, extra=extra)
    assert installed.returncode == 0, installed.stderr

    # A new set: the hooked group (refused by the webhook), an independent group, and the old
    # bundle removed. Only the hooked group fails; the rest of the pass goes on.
    lab.publish(
        [
            bundle(lab, hooked, {"cm.yaml": configmap("hooked", hooked_ns, {"v": "1"})}),
            bundle(lab, other, {**free, "cm.yaml": configmap("other", free_ns, {"v": "1"})}),
        ]
    )
    result = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir, extra=extra)
    assert result.returncode == 1, (result.stdout, result.stderr)
    summary = result.stdout.strip()
    assert summary.startswith("edge-1: rendered, serial 2"), summary
    assert f"moved: {other}" in summary and f"failed: {hooked}" in summary
    assert f"removed: {old}" in summary
    assert webhook in result.stderr and len(result.stderr.strip().splitlines()) == 1
    ready = conditions(kube, hooked)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ApplyFailed", ready
    assert webhook in ready["message"] and "nothing was written" in ready["message"]
    assert "retried by itself" in ready["message"]
    assert live(kube, "v1", "ConfigMap", "hooked", hooked_ns) is None
    assert live(kube, "v1", "ConfigMap", "other", free_ns) is not None
    assert live(kube, "v1", "ConfigMap", "old", free_ns) is None
    assert conditions(kube, other)["Ready"]["status"] == "True"

    # The webhook is gone (its service came back, say): the same target is retried by itself.
    kube.delete(
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": f"fleetlet-test-{lab.suffix}"}}
    )  # fmt: skip
    time.sleep(1.5)
    retried = lab.sync_once("edge-1", crds, namespace=namespace, workdir=workdir, extra=extra)
    assert retried.returncode == 0, (retried.stdout, retried.stderr)
    assert f"moved: {hooked}" in retried.stdout
    assert live(kube, "v1", "ConfigMap", "hooked", hooked_ns) is not None


def test_kubectl_get_bd_says_which_revision_and_what_is_happening(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, web, conf = lab.name("cols"), lab.name("web"), lab.name("conf")

    def publish(image: str, value: str) -> None:
        checks = {"timeoutSeconds": 20}
        lab.publish(
            [
                bundle(
                    lab,
                    web,
                    {
                        "01_ns.yaml": namespace_manifest(ns),
                        "02_web.yaml": deployment("web", ns, image),
                    },
                    group="shop",
                    healthChecks=checks,
                ),
                bundle(
                    lab,
                    conf,
                    {"cm.yaml": configmap("conf", ns, {"v": value})},
                    group="shop",
                    healthChecks=checks,
                ),
            ]
        )

    publish("example/web:1.0", "one")
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    agent.tick()
    shown = get_bd(crds, web)
    assert (shown["TARGET"], shown["APPLIED"], shown["READY"], shown["PHASE"]) == (
        "1", "1", "True", "Ready"
    )  # fmt: skip

    publish("example/web:broken", "two")
    moving = threading.Thread(target=agent.tick)
    moving.start()
    try:
        wait_until(lambda: get_bd(crds, web)["PHASE"] == "HealthChecking", what="the health wait")
        during = get_bd(crds, web)
        # Ready says nothing of the new revision yet: Unknown, not the old serial's True.
        assert (during["TARGET"], during["APPLIED"], during["READY"]) == ("2", "2", "Unknown")
        assert during["REASON"] == "Progressing"
        message = conditions(kube, web)["Ready"]["message"]
        assert "health-checking serial 2 (group shop, 1 of 1)" in message, message
    finally:
        moving.join(timeout=120)
    after = get_bd(crds, web)
    assert (after["TARGET"], after["APPLIED"], after["READY"], after["PHASE"]) == (
        "2", "1", "False", "RolledBack"
    )  # fmt: skip
    ready = conditions(kube, web)["Ready"]
    assert "tried again only with a new serial or a changed fleetlet.io/retry" in ready["message"]
    # Each bundle counts its own objects, not the group's (the demo once showed
    # "ready: 6, total: 3" on one bundle of a rolled-back group).
    for name, objects in ((web, 2), (conf, 1)):
        bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name)
        assert bd is not None, name
        resources = bd["status"]["resources"]
        assert (resources["total"], resources["ready"], resources["notReady"]) == (
            objects, objects, 0
        ), (name, resources)  # fmt: skip


def test_a_refusal_the_cluster_caused_is_retried_by_itself_once_fixed(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("later"), lab.name("needs-ns")
    lab.publish([bundle(lab, name, {"cm.yaml": configmap("app", ns, {"v": "1"})})])
    agent = lab.agent(
        "edge-1", crds, namespace=namespace, workdir=tmp_path / "agent",
        extra=["--retry-backoff", "1"],
    )  # fmt: skip
    first = agent.tick()
    assert first.outbound is not None and first.outbound.failed_now == (name,)
    ready = conditions(kube, name)["Ready"]
    assert ready["reason"] == "ApplyFailed", ready
    assert f"namespace {ns} does not exist" in ready["message"]
    assert "createNamespace" in ready["message"] and "retried by itself" in ready["message"]

    kube.apply(namespace_manifest_dict(ns), field_manager="cluster-admin")
    time.sleep(1.5)
    second = agent.tick()
    assert second.outbound is not None and second.outbound.moved == (name,), second
    assert conditions(kube, name)["Ready"]["status"] == "True"


def namespace_manifest_dict(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def test_the_guestbook_deploys_with_create_namespace_and_every_bad_object_is_named(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, guestbook, loose = lab.name("guestbook"), lab.name("guestbook"), lab.name("loose")
    files = {p.name: p.read_text() for p in sorted(GUESTBOOK.glob("*.yaml"))}
    no_namespace = {
        "cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata: {}\n",
        "svc.yaml": service("web", "PLACEHOLDER").replace("  namespace: PLACEHOLDER\n", ""),
    }
    lab.publish(
        [
            bundle(
                lab,
                guestbook,
                files,
                formatOptions={"targetNamespace": ns},
                createNamespace=True,
                namespaceLabels={"pod-security.kubernetes.io/enforce": "baseline"},
                namespaceAnnotations={"owner": "shop-team"},
            ),
            bundle(lab, loose, no_namespace),
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    result = agent.tick()
    assert result.outbound is not None
    assert result.outbound.moved == (guestbook,) and result.outbound.failed == (loose,)
    created = live(kube, "v1", "Namespace", ns)
    assert created is not None
    assert created["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    assert created["metadata"]["annotations"]["owner"] == "shop-team"
    frontend = live(kube, "apps/v1", "Deployment", "frontend", ns)
    assert frontend is not None and frontend["status"].get("availableReplicas") == 3
    assert conditions(kube, guestbook)["Ready"]["status"] == "True"
    # Both objects without a namespace are named, once each, with the ways to give one.
    message = conditions(kube, loose)["Ready"]["message"]
    assert "2 objects refused" in message, message
    assert message.count("ConfigMap settings") == 1 and message.count("Service web") == 1
    assert "formatOptions.targetNamespace" in message

    # Removed: the guestbook's objects go, the namespace it created stays (as in Fleet/Argo).
    lab.publish([bundle(lab, loose, {"cm.yaml": configmap("settings", ns, {})})])
    agent.tick()
    assert live(kube, "apps/v1", "Deployment", "frontend", ns) is None
    assert live(kube, "v1", "Service", "frontend", ns) is None
    assert live(kube, "v1", "Namespace", ns) is not None


def test_a_load_balancer_service_is_healthy_without_a_load_balancer_unless_asked(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, plain, waits = lab.name("lb"), lab.name("lb"), lab.name("lb-waits")
    lb = service("front", ns).replace("spec:\n", "spec:\n  type: LoadBalancer\n")
    lab.publish(
        [
            bundle(lab, plain, {"01_ns.yaml": namespace_manifest(ns), "02_svc.yaml": lb}),
            bundle(
                lab,
                waits,
                {"svc.yaml": lb.replace("name: front", "name: back")},
                dependsOn=[plain],
                healthChecks={"timeoutSeconds": 4, "waitForLoadBalancer": True},
            ),
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    result = agent.tick()
    assert result.outbound is not None and result.outbound.moved == (plain,), result
    assert conditions(kube, plain)["Ready"]["status"] == "True"
    ready = conditions(kube, waits)["Ready"]
    assert ready["reason"] == "HealthCheckFailed"
    assert "load balancer's ingress address" in ready["message"], ready


def test_an_independent_group_moves_while_another_waits_for_its_health(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, slow, quick = lab.name("par"), lab.name("slow"), lab.name("quick")
    kube.apply(namespace_manifest_dict(ns), field_manager="test")
    lab.publish(
        [
            bundle(
                lab,
                slow,
                {"web.yaml": deployment("web", ns, "example/web:broken")},
                healthChecks={"timeoutSeconds": 30},
            ),
            bundle(lab, quick, {"cm.yaml": configmap("quick", ns, {"v": "1"})}),
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    moving = threading.Thread(target=agent.tick)
    moving.start()
    try:
        wait_until(
            lambda: (
                kube.get(ObjectRef("v1", "ConfigMap", "quick", ns)) is not None
                and conditions(kube, quick).get("Ready", {}).get("status") == "True"
            ),
            what="the independent group to be Ready",
        )
        # ... while the other group is still waiting for its health.
        assert get_bd(crds, slow)["PHASE"] == "HealthChecking"
    finally:
        moving.join(timeout=120)
    assert conditions(kube, slow)["Ready"]["reason"] == "HealthCheckFailed"
