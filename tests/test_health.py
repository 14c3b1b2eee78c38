"""Health assessment: kstatus rules per kind (pure), bundle checks, and against a real cluster
(Deployments that become Available through kwok, a `broken` image that stalls, CRDs), plus
``fleetlet health -f FILE``."""

from __future__ import annotations

import copy
import datetime
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api.models import ConditionCheck, FieldExpression, HealthCheck, ObjectReference
from agent.health import Status, assess, assess_live, evaluate, wait_healthy
from agent.health.checks import MISSING, as_text, field_value
from agent.health.command import HealthInputError, run_health
from agent.kube import LIST_FROM, KubeClient
from tests.realenv.kube import Cluster

MANAGER = "fleetlet-test"
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def cond(
    type_: str, status: str, reason: str = "", message: str = "", **extra: Any
) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, **extra}


def deployment(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "generation": 2},
        "spec": {"replicas": 2, "progressDeadlineSeconds": 600},
        "status": {"observedGeneration": 2, **copy.deepcopy(status)},
    }


AVAILABLE_DEPLOYMENT_STATUS: dict[str, Any] = {
    "replicas": 2,
    "updatedReplicas": 2,
    "readyReplicas": 2,
    "availableReplicas": 2,
    "conditions": [
        cond("Available", "True", "MinimumReplicasAvailable"),
        cond("Progressing", "True", "NewReplicaSetAvailable"),
    ],
}


# --- generic rules -----------------------------------------------------------------------------


def test_missing_object_is_not_found() -> None:
    assert assess(None).status is Status.NOT_FOUND


def test_deletion_timestamp_is_terminating_whatever_the_kind() -> None:
    obj = deployment(**AVAILABLE_DEPLOYMENT_STATUS)
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert assess(obj).status is Status.TERMINATING


def test_generation_not_observed_is_in_progress() -> None:
    obj = deployment(**AVAILABLE_DEPLOYMENT_STATUS)
    obj["metadata"]["generation"] = 3
    result = assess(obj)
    assert result.status is Status.IN_PROGRESS
    assert result.reason == "LatestGenerationNotObserved"
    assert "generation is 3, but latest observed generation is 2" in result.message


def test_reconciling_and_stalled_conditions_decide_for_any_kind() -> None:
    widget: dict[str, Any] = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "generation": 1},
        "status": {"conditions": [cond("Reconciling", "True", "Progressing", "rolling out")]},
    }
    assert assess(widget).status is Status.IN_PROGRESS
    assert assess(widget).message == "rolling out"
    widget["status"]["conditions"] = [cond("Stalled", "True", "BadConfig", "bad key")]
    result = assess(widget)
    assert (result.status, result.reason, result.message) == (Status.FAILED, "BadConfig", "bad key")


def test_ready_condition_of_custom_resources() -> None:
    obj: dict[str, Any] = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "generation": 4},
        "status": {"conditions": [cond("Ready", "True", "Reconciled", "all good")]},
    }
    assert assess(obj).status is Status.CURRENT
    obj["status"]["conditions"] = [cond("Ready", "False", "DependencyMissing", "no secret")]
    result = assess(obj)
    assert (result.status, result.reason, result.message) == (
        Status.IN_PROGRESS,
        "DependencyMissing",
        "no secret",
    )
    # A Ready condition written for an older generation says nothing about this one.
    obj["status"]["conditions"] = [cond("Ready", "True", "Reconciled", observedGeneration=3)]
    assert assess(obj).status is Status.IN_PROGRESS
    # No conditions at all: kstatus calls it Current.
    assert (
        assess({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}).status
        is Status.CURRENT
    )


def test_malformed_status_is_unknown_not_an_exception() -> None:
    obj = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "status": {"conditions": "yes"},
    }
    assert assess(obj).status is Status.UNKNOWN
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "status": {"phase": "Exploded"},
    }
    assert assess(pod).status is Status.UNKNOWN


# --- Deployment --------------------------------------------------------------------------------


def test_deployment_available_is_current() -> None:
    result = assess(deployment(**AVAILABLE_DEPLOYMENT_STATUS))
    assert result.status is Status.CURRENT
    assert result.message == "Deployment is available. Replicas: 2"


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ({"replicas": 1}, "LessReplicas"),
        ({"replicas": 2, "updatedReplicas": 1}, "LessUpdated"),
        ({"replicas": 3, "updatedReplicas": 2}, "ExtraPods"),
        ({"replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}, "LessAvailable"),
        (
            {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 2, "readyReplicas": 1},
            "LessReady",
        ),
        (
            {
                "replicas": 2,
                "updatedReplicas": 2,
                "availableReplicas": 2,
                "readyReplicas": 2,
                "conditions": [cond("Progressing", "True", "ReplicaSetUpdated")],
            },
            "ReplicaSetNotAvailable",
        ),
        (
            {
                "replicas": 2,
                "updatedReplicas": 2,
                "availableReplicas": 2,
                "readyReplicas": 2,
                "conditions": [
                    cond("Progressing", "True", "NewReplicaSetAvailable"),
                    cond("Available", "False", "MinimumReplicasUnavailable"),
                ],
            },
            "DeploymentNotAvailable",
        ),
    ],
)
def test_deployment_in_progress_reasons(status: dict[str, Any], reason: str) -> None:
    result = assess(deployment(**status))
    assert (result.status, result.reason) == (Status.IN_PROGRESS, reason)


def test_deployment_past_progress_deadline_is_failed() -> None:
    result = assess(
        deployment(
            replicas=3,
            updatedReplicas=1,
            readyReplicas=2,
            availableReplicas=2,
            conditions=[
                cond("Available", "True", "MinimumReplicasAvailable"),
                cond(
                    "Progressing",
                    "False",
                    "ProgressDeadlineExceeded",
                    'ReplicaSet "web-7d4b" has timed out progressing.',
                ),
            ],
        )
    )
    assert result.status is Status.FAILED
    assert result.reason == "ProgressDeadlineExceeded"
    assert "timed out progressing" in result.message


def test_deployment_without_progress_deadline_needs_no_progressing_condition() -> None:
    obj = deployment(
        replicas=2,
        updatedReplicas=2,
        readyReplicas=2,
        availableReplicas=2,
        conditions=[cond("Available", "True")],
    )
    del obj["spec"]["progressDeadlineSeconds"]
    assert assess(obj).status is Status.CURRENT


# --- other workloads ---------------------------------------------------------------------------


def statefulset(spec: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "shop", "generation": 1},
        "spec": {"replicas": 3, **spec},
        "status": {"observedGeneration": 1, **status},
    }


def test_statefulset_rules() -> None:
    done = {
        "replicas": 3,
        "readyReplicas": 3,
        "currentReplicas": 3,
        "updatedReplicas": 3,
        "currentRevision": "db-1",
        "updateRevision": "db-1",
    }
    assert assess(statefulset({}, **done)).status is Status.CURRENT
    assert assess(statefulset({}, **{**done, "readyReplicas": 2})).reason == "LessReady"
    assert (
        assess(statefulset({}, **{**done, "updateRevision": "db-2"})).reason == "RevisionMismatch"
    )
    partitioned = {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}}
    assert (
        assess(statefulset(partitioned, **{**done, "updatedReplicas": 1})).reason
        == "PartitionRollout"
    )
    assert (
        assess(statefulset(partitioned, **{**done, "updatedReplicas": 2})).status is Status.CURRENT
    )
    on_delete = {"updateStrategy": {"type": "OnDelete"}}
    assert assess(statefulset(on_delete)).status is Status.CURRENT


def test_daemonset_rules() -> None:
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "kube-system", "generation": 1},
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": 3,
            "currentNumberScheduled": 3,
            "updatedNumberScheduled": 3,
            "numberAvailable": 3,
            "numberReady": 3,
        },
    }
    assert assess(obj).status is Status.CURRENT
    obj["status"]["numberAvailable"] = 2
    assert assess(obj).reason == "LessAvailable"
    del obj["status"]["observedGeneration"]
    assert assess(obj).reason == "NoObservedGeneration"


def test_replicaset_rules() -> None:
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": "shop"},
        "spec": {"replicas": 2},
        "status": {
            "replicas": 2,
            "fullyLabeledReplicas": 2,
            "readyReplicas": 2,
            "availableReplicas": 2,
        },
    }
    assert assess(obj).status is Status.CURRENT
    obj["status"]["conditions"] = [cond("ReplicaFailure", "True", "FailedCreate", "quota")]
    assert assess(obj).reason == "ReplicaFailure"


def job(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "migrate", "namespace": "shop"},
        "spec": {"completions": 1},
        "status": status,
    }


def test_job_rules() -> None:
    assert assess(job()).reason == "JobNotStarted"
    assert assess(job(startTime="2026-01-01T00:00:00Z", active=1)).status is Status.CURRENT
    complete = job(succeeded=1, conditions=[cond("Complete", "True")])
    assert assess(complete).status is Status.CURRENT
    failed = job(
        failed=6,
        conditions=[
            cond(
                "Failed",
                "True",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
        ],
    )
    result = assess(failed)
    assert (result.status, result.reason) == (Status.FAILED, "JobFailed")
    assert "backoff limit" in result.message


def pod(
    phase: str,
    *,
    conditions: Sequence[dict[str, Any]] = (),
    created: datetime.datetime = NOW,
    **status: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-abc",
            "namespace": "shop",
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "status": {"phase": phase, "conditions": list(conditions), **status},
    }


def test_pod_rules() -> None:
    assert (
        assess(pod("Running", conditions=[cond("Ready", "True")]), now=NOW).status is Status.CURRENT
    )
    assert assess(pod("Succeeded"), now=NOW).status is Status.CURRENT
    assert (
        assess(pod("Running", conditions=[cond("Ready", "False")]), now=NOW).reason
        == "PodRunningNotReady"
    )
    crash = pod(
        "Running",
        conditions=[cond("Ready", "False", "ContainersNotReady")],
        containerStatuses=[
            {
                "name": "app",
                "ready": False,
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            },
            {"name": "sidecar", "ready": True, "restartCount": 0, "state": {"running": {}}},
        ],
    )
    result = assess(crash, now=NOW)
    assert (result.status, result.reason) == (Status.FAILED, "ContainerCrashLooping")
    assert result.message == "Containers in CrashLoop state: app"
    # kstatus: an image that cannot be pulled keeps the pod Pending (InProgress), not Failed.
    pulling = pod(
        "Pending",
        containerStatuses=[{"name": "app", "state": {"waiting": {"reason": "ImagePullBackOff"}}}],
    )
    assert assess(pulling, now=NOW).status is Status.IN_PROGRESS


def test_unschedulable_pod_fails_after_the_schedule_window() -> None:
    unschedulable = [cond("PodScheduled", "False", "Unschedulable", "0/1 nodes are available")]
    fresh = pod("Pending", conditions=unschedulable, created=NOW - datetime.timedelta(seconds=5))
    assert assess(fresh, now=NOW).reason == "PodNotScheduled"
    old = pod("Pending", conditions=unschedulable, created=NOW - datetime.timedelta(minutes=1))
    assert assess(old, now=NOW).status is Status.FAILED


# --- other kinds -------------------------------------------------------------------------------


def test_pvc_service_configmap() -> None:
    pvc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "status": {"phase": "Pending"},
    }
    assert assess(pvc).reason == "NotBound"
    pvc["status"]["phase"] = "Bound"
    assert assess(pvc).status is Status.CURRENT
    svc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10"},
    }
    assert assess(svc).status is Status.CURRENT
    svc["spec"]["type"] = "LoadBalancer"
    # As kstatus: Current once it has a cluster IP (edge clusters rarely have an LB controller),
    # unless the bundle asks to wait for the load balancer's address.
    assert assess(svc).status is Status.CURRENT
    assert assess(svc, wait_for_load_balancer=True).reason == "NoLoadBalancerIngress"
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}
    assert assess(svc, wait_for_load_balancer=True).status is Status.CURRENT
    svc["spec"]["clusterIP"] = ""
    assert assess(svc).reason == "NoIPAssigned"
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    assert assess(cm).status is Status.CURRENT


def crd(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "status": {"conditions": list(conditions)},
    }


def test_crd_rules() -> None:
    assert assess(crd()).reason == "Installing"
    assert (
        assess(crd(cond("NamesAccepted", "True"), cond("Established", "True"))).status
        is Status.CURRENT
    )
    taken = assess(
        crd(
            cond("NamesAccepted", "False", "MultipleNamesNotAllowed", '"widget" is already in use'),
            cond("Established", "False", "NotAccepted"),
        )
    )
    assert (taken.status, taken.reason) == (Status.FAILED, "MultipleNamesNotAllowed")
    assert assess(crd(cond("Established", "False", "Installing"))).status is Status.IN_PROGRESS


def test_apiservice_namespace_pdb() -> None:
    api: dict[str, Any] = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "status": {
            "conditions": [
                cond(
                    "Available",
                    "False",
                    "MissingEndpoints",
                    "endpoints for service/metrics-server in kube-system have no addresses",
                )
            ]
        },
    }
    result = assess(api)
    assert (result.status, result.reason) == (Status.IN_PROGRESS, "MissingEndpoints")
    api["status"]["conditions"] = [cond("Available", "True", "Passed")]
    assert assess(api).status is Status.CURRENT
    ns: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "shop"},
        "status": {"phase": "Active"},
    }
    assert assess(ns).status is Status.CURRENT
    ns["status"]["phase"] = "Terminating"
    assert assess(ns).status is Status.TERMINATING
    pdb: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "p", "generation": 2},
        "status": {"observedGeneration": 1},
    }
    assert assess(pdb).status is Status.IN_PROGRESS
    pdb["status"]["observedGeneration"] = 2
    assert assess(pdb).status is Status.CURRENT


def test_apiservice_with_endpoints_judgement() -> None:
    """``healthChecks.apiServices: Endpoints``: an APIService whose Service has ready
    endpoints is healthy without the API server's discovery request through them; one with
    no Service or no ready endpoint is not (helm --wait and kstatus take both as ready)."""
    url = "https://10.0.0.7:443/apis/metrics.k8s.io/v1beta1"

    def api(reason: str, message: str) -> dict[str, Any]:
        return {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io"},
            "status": {"conditions": [cond("Available", "False", reason, message)]},
        }

    for failure in (
        f'Get "{url}": dial tcp 10.0.0.7:443: i/o timeout',
        f"bad status from {url}: 404",
    ):
        unreached = api(
            "FailedDiscoveryCheck", f"failing or missing response from {url}: {failure}"
        )
        by_endpoints = assess(unreached, api_service_endpoints=True)
        assert (by_endpoints.status, by_endpoints.reason) == (Status.CURRENT, "EndpointsReady")
        assert failure in by_endpoints.message
        by_default = assess(unreached)  # Available
        assert (by_default.status, by_default.reason) == (
            Status.IN_PROGRESS,
            "FailedDiscoveryCheck",
        )
    for reason, message in [
        ("MissingEndpoints", "endpoints for service/ns/metrics-server have no addresses"),
        ("EndpointsNotFound", "cannot find endpoints for service/ns/metrics-server"),
        ("ServiceNotFound", 'service/metrics-server in "ns" is not present'),
        ("ServicePortError", 'service/metrics-server in "ns" is not listening on port 443'),
    ]:
        judged = assess(api(reason, message), api_service_endpoints=True)
        assert (judged.status, judged.reason) == (Status.IN_PROGRESS, reason), message
    no_status = api("x", "y")
    del no_status["status"]
    assert assess(no_status, api_service_endpoints=True).status is Status.IN_PROGRESS


# --- the bundle's own checks -------------------------------------------------------------------


def ref(kind: str = "Deployment", api_version: str = "apps/v1") -> ObjectReference:
    return ObjectReference(api_version=api_version, kind=kind, name="web", namespace="shop")


def test_condition_check() -> None:
    check = HealthCheck(object=ref(), condition=ConditionCheck(type="Available"))
    obj = deployment(**AVAILABLE_DEPLOYMENT_STATUS)
    assert evaluate(check, obj).status is Status.CURRENT
    obj["status"]["conditions"][0] = cond(
        "Available", "False", "MinimumReplicasUnavailable", "1 of 2"
    )
    result = evaluate(check, obj)
    assert result.status is Status.IN_PROGRESS
    assert "Available is False, want True" in result.message and "1 of 2" in result.message
    assert evaluate(check, None).status is Status.NOT_FOUND


def test_field_expression_check() -> None:
    check = HealthCheck(
        object=ref(), expression=FieldExpression(field_path=".status.readyReplicas", equals="2")
    )
    assert evaluate(check, deployment(**AVAILABLE_DEPLOYMENT_STATUS)).status is Status.CURRENT
    missing = evaluate(check, deployment())
    assert missing.status is Status.IN_PROGRESS and "missing" in missing.message
    obj = {"data": {"a.b": "x", "flag": True}, "items": [{"n": 1.0}]}
    assert field_value(obj, ".data['a.b']") == "x"
    assert as_text(field_value(obj, ".data.flag")) == "true"
    assert as_text(field_value(obj, ".items[0].n")) == "1"
    assert field_value(obj, ".items[3]") is MISSING
    with pytest.raises(ValueError):
        field_value(obj, "data")


# --- against a real cluster --------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeClient]:
    with KubeClient(
        kubeconfig=str(kube_cluster.kubeconfig),
        discovery_cache_dir=tmp_path_factory.mktemp("discovery"),
    ) as client:
        yield client


def web_deployment(
    namespace: str, *, image: str = "registry.example/web:1.0", deadline: int = 600
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "progressDeadlineSeconds": deadline,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]},
            },
        },
    }


def until(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def test_deployment_becomes_current_then_a_broken_image_is_in_progress_then_failed(
    kube: KubeClient, namespace: str
) -> None:
    good = web_deployment(namespace)
    kube.apply(good, field_manager=MANAGER)
    report = wait_healthy(kube, [good], timeout=120, interval=0.5)
    assert report.healthy, report.summary()
    assert report.results[0].assessment.message == "Deployment is available. Replicas: 2"

    broken = web_deployment(namespace, image="registry.example/web:broken", deadline=8)
    kube.apply(broken, field_manager=MANAGER)
    seen_in_progress = until(
        lambda: assess(kube.get(broken)).status is Status.IN_PROGRESS,
        timeout=60,
        what="the broken rollout to be InProgress",
    )
    assert seen_in_progress
    # Past progressDeadlineSeconds the controller marks it; kstatus then says Failed.
    report = wait_healthy(kube, [broken], timeout=120, interval=0.5)
    assert not report.healthy and not report.timed_out
    [failed] = report.failed
    assert failed.assessment.reason == "ProgressDeadlineExceeded"
    assert "health check failed: Deployment/" in report.summary()


def test_wait_healthy_times_out_while_in_progress_with_the_reason(
    kube: KubeClient, namespace: str
) -> None:
    broken = web_deployment(namespace, image="registry.example/web:broken")
    kube.apply(broken, field_manager=MANAGER)
    report = wait_healthy(kube, [broken], timeout=3, interval=0.5)
    assert report.timed_out and not report.healthy
    assert report.results[0].status is Status.IN_PROGRESS
    assert "timed out" in report.summary()


def test_crd_is_current_once_established(kube: KubeClient) -> None:
    group = f"h{uuid.uuid4().hex[:8]}.example.com"
    crd_obj = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "plural": "gadgets",
                "singular": "gadget",
                "kind": "Gadget",
                "listKind": "GadgetList",
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
    kube.apply(crd_obj, field_manager=MANAGER)
    try:
        report = wait_healthy(kube, [crd_obj], timeout=60, interval=0.2)
        assert report.healthy, report.summary()
        assert report.results[0].assessment.message == "CRD is established"
    finally:
        kube.delete(crd_obj)


def test_bundle_checks_against_live_objects(kube: KubeClient, namespace: str) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": namespace},
        "data": {"mode": "blue"},
    }
    kube.apply(cm, field_manager=MANAGER)
    target = ObjectReference(api_version="v1", kind="ConfigMap", name="settings")
    passing = HealthCheck(
        object=target, expression=FieldExpression(field_path=".data.mode", equals="blue")
    )
    failing = HealthCheck(
        object=target, expression=FieldExpression(field_path=".data.mode", equals="green")
    )
    absent = HealthCheck(
        object=ObjectReference(api_version="v1", kind="ConfigMap", name="nope"),
        condition=ConditionCheck(type="Ready"),
    )
    unserved = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "web", "namespace": namespace},
    }
    results = assess_live(
        kube, [cm, unserved], checks=[passing, failing, absent], default_namespace=namespace
    )
    assert [r.status for r in results] == [
        Status.CURRENT,
        Status.NOT_FOUND,
        Status.CURRENT,
        Status.IN_PROGRESS,
        Status.NOT_FOUND,
    ]
    assert results[1].assessment.reason == "ApiNotServed"
    assert "'blue', want 'green'" in results[3].assessment.message


def test_many_objects_of_a_kind_are_read_by_one_list_or_by_gets_when_listing_is_refused(
    kube: KubeClient, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    maps = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i}", "namespace": namespace},
            "data": {"i": str(i)},
        }
        for i in range(LIST_FROM + 2)
    ]
    for cm in maps[:-1]:
        kube.apply(cm, field_manager=MANAGER)
    expected = [Status.CURRENT] * (len(maps) - 1) + [Status.NOT_FOUND]

    def count_gets(client: KubeClient) -> list[Any]:
        gets: list[Any] = []
        real = client.get

        def get(obj: Any) -> Any:
            gets.append(obj)
            return real(obj)

        monkeypatch.setattr(client, "get", get)
        return gets

    gets = count_gets(kube)
    assert [r.status for r in assess_live(kube, maps)] == expected
    assert gets == []  # one LIST; the last one is absent from it

    # A ServiceAccount that may get ConfigMaps but not list them: a GET each.
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "getter", "namespace": namespace},
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "get-configmaps", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "getter", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "get-configmaps",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "getter", "namespace": namespace}],
    }
    for obj in (account, role, binding):
        kube.apply(obj, field_manager=MANAGER)
    getter = kube.impersonating("getter", namespace)
    getter_gets = count_gets(getter)
    assert [r.status for r in assess_live(getter, maps)] == expected
    assert len(getter_gets) == len(maps)


# --- fleetlet health -f FILE -------------------------------------------------------------------


def write_objects(path: Path, objects: list[dict[str, Any]]) -> str:
    path.write_text(yaml.safe_dump_all(objects))
    return str(path)


def test_health_command_offline_table_and_json(tmp_path: Path) -> None:
    good = deployment(**AVAILABLE_DEPLOYMENT_STATUS)
    stuck = crd(cond("Established", "False", "Installing"))
    filename = write_objects(tmp_path / "objects.yaml", [good, stuck])
    text, code = run_health(filename=filename, output="table", offline=True)
    lines = text.splitlines()
    assert code == 1
    assert lines[0].split() == ["OBJECT", "STATUS", "MESSAGE"]
    assert lines[1].split()[:2] == ["Deployment/shop/web", "Current"]
    assert lines[2].split()[:3] == [
        "CustomResourceDefinition/widgets.example.com",
        "InProgress",
        "Install",
    ]
    text, code = run_health(filename=filename, output="json", offline=True)
    parsed = json.loads(text)
    assert [(o["kind"], o["status"]) for o in parsed] == [
        ("Deployment", "Current"),
        ("CustomResourceDefinition", "InProgress"),
    ]
    # A `kubectl get -o yaml` List is read item by item.
    listed = tmp_path / "list.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [good]}))
    text, code = run_health(filename=str(listed), output="json", offline=True)
    assert code == 0 and len(json.loads(text)) == 1


def test_health_command_refuses_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(HealthInputError, match="document 1 is not an object"):
        run_health(filename=str(bad), output="table", offline=True)
    with pytest.raises(HealthInputError, match="cannot read"):
        run_health(filename=str(tmp_path / "absent.yaml"), output="table", offline=True)


def test_health_command_reads_the_live_cluster(
    kube_cluster: Cluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    ready = web_deployment(namespace)
    kube.apply(ready, field_manager=MANAGER)
    wait_healthy(kube, [ready], timeout=120, interval=0.5)
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "absent", "namespace": namespace},
    }
    filename = write_objects(tmp_path / "objects.yaml", [ready, cm])
    text, code = run_health(
        filename=filename,
        output="table",
        kubeconfig=str(kube_cluster.kubeconfig),
        discovery_cache_dir=tmp_path,
    )
    lines = text.splitlines()
    assert code == 1 and len(lines) == 3
    assert lines[1].split()[:2] == [f"Deployment/{namespace}/web", "Current"]
    assert lines[2].split()[:2] == [f"ConfigMap/{namespace}/absent", "NotFound"]
    text, _ = run_health(
        filename=filename,
        output="json",
        kubeconfig=str(kube_cluster.kubeconfig),
        discovery_cache_dir=tmp_path,
    )
    assert [o["status"] for o in json.loads(text)] == ["Current", "NotFound"]


def test_fleetlet_health_console_command(
    kube_cluster: Cluster, kube: KubeClient, namespace: str, tmp_path: Path
) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "present", "namespace": namespace},
    }
    kube.apply(cm, field_manager=MANAGER)
    filename = write_objects(tmp_path / "objects.yaml", [cm])
    result = subprocess.run(
        [sys.executable, "-m", "fleetlet", "health", "-f", filename, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "KUBECONFIG": str(kube_cluster.kubeconfig),
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
        },
        cwd=Path(__file__).resolve().parent.parent,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert [o["status"] for o in json.loads(result.stdout)] == ["Current"]
