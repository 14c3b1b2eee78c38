"""kstatus-compatible health of one Kubernetes object, from the object alone (no API calls).

The statuses and rules follow kstatus (sigs.k8s.io/cli-utils, ``pkg/kstatus/status``): the
generic rules of ``generic.go`` (``checkGenericProperties``: deletionTimestamp → Terminating;
``status.observedGeneration`` behind ``metadata.generation`` → InProgress; ``Reconciling=True``
→ InProgress; ``Stalled=True`` → Failed), then the per-kind rules of ``core.go``
(``legacyTypes``: Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, Pod, PVC, Service,
PodDisruptionBudget, CustomResourceDefinition; ConfigMap, Secret and CronJob always Current),
otherwise Current, as ``Compute`` in ``status.go`` does. Messages and reasons are kstatus's.

Additions, where kstatus has no rule (marked "fleetlet:" below): APIService (``Available``,
or with ``api_service_endpoints`` its backing Service's ready endpoints: see
:func:`_apiservice`), Namespace (``phase``), and any other object
with a standard ``Ready`` condition is judged by it (True → Current, False/Unknown →
InProgress, a ``Ready`` observed for an older generation → InProgress). A LoadBalancer Service
is Current once it has a cluster IP, as in kstatus (most edge clusters have no load-balancer
controller); ``wait_for_load_balancer`` also waits for its ingress address, as Argo CD does.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """kstatus's statuses."""

    CURRENT = "Current"
    IN_PROGRESS = "InProgress"
    FAILED = "Failed"
    TERMINATING = "Terminating"
    NOT_FOUND = "NotFound"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Assessment:
    """The status of one object, a CamelCase ``reason`` and a human ``message`` saying why."""

    status: Status
    reason: str
    message: str

    @property
    def healthy(self) -> bool:
        return self.status is Status.CURRENT

    def to_dict(self) -> dict[str, str]:
        return {"status": str(self.status), "reason": self.reason, "message": self.message}


class _Malformed(Exception):
    """The object does not have the shape its kind promises (→ Unknown)."""


# kstatus core.go: how long a Pending pod may be Unschedulable before it counts as Failed.
SCHEDULE_WINDOW = datetime.timedelta(seconds=15)

NOT_FOUND = Assessment(Status.NOT_FOUND, "NotFound", "Resource not found")


def _current(message: str, reason: str = "Current") -> Assessment:
    return Assessment(Status.CURRENT, reason, message)


def _in_progress(reason: str, message: str) -> Assessment:
    return Assessment(Status.IN_PROGRESS, reason, message)


def _failed(reason: str, message: str) -> Assessment:
    return Assessment(Status.FAILED, reason, message)


# --- field access (kstatus util.go GetIntField / GetStringField semantics) ---------------------


def _field(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.strip(".").split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _int(obj: Mapping[str, Any], path: str, default: int) -> int:
    value = _field(obj, path)
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return default


def _str(obj: Mapping[str, Any], path: str, default: str) -> str:
    value = _field(obj, path)
    return value if isinstance(value, str) else default


@dataclass(frozen=True, slots=True)
class _Condition:
    type: str
    status: str
    reason: str
    message: str
    observed_generation: int | None


def _conditions(obj: Mapping[str, Any]) -> list[_Condition]:
    raw = _field(obj, "status.conditions")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _Malformed("status.conditions is not a list")
    out = []
    for item in raw:
        if not isinstance(item, Mapping):
            raise _Malformed("a status condition is not an object")
        generation = item.get("observedGeneration")
        out.append(
            _Condition(
                type=str(item.get("type") or ""),
                status=str(item.get("status") or ""),
                reason=str(item.get("reason") or ""),
                message=str(item.get("message") or ""),
                observed_generation=generation if isinstance(generation, int) else None,
            )
        )
    return out


def _condition(conditions: Sequence[_Condition], type_: str) -> _Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def _group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


# --- generic rules (kstatus generic.go) --------------------------------------------------------


def _generic(obj: Mapping[str, Any], kind: str) -> Assessment | None:
    if _str(obj, "metadata.deletionTimestamp", ""):
        return Assessment(Status.TERMINATING, "Terminating", "Resource scheduled for deletion")
    generation = _field(obj, "metadata.generation")
    observed = _field(obj, "status.observedGeneration")
    # kstatus checkGeneration: only when both are present.
    if isinstance(generation, int) and isinstance(observed, int) and observed != generation:
        return _in_progress(
            "LatestGenerationNotObserved",
            f"{kind} generation is {generation}, but latest observed generation is {observed}",
        )
    for cond in _conditions(obj):
        if cond.type == "Reconciling" and cond.status == "True":
            return _in_progress(cond.reason or "Reconciling", cond.message)
        if cond.type == "Stalled" and cond.status == "True":
            return _failed(cond.reason or "Stalled", cond.message)
    return None


# --- per-kind rules (kstatus core.go) ----------------------------------------------------------


def _always_ready(obj: Mapping[str, Any]) -> Assessment:
    return _current("Resource is always ready")


def _deployment(obj: Mapping[str, Any]) -> Assessment:
    # No progressDeadlineSeconds: the controller never sets Progressing; treat as progressing.
    progressing = _field(obj, "spec.progressDeadlineSeconds") is None
    available = False
    for cond in _conditions(obj):
        if cond.type == "Progressing":
            if cond.reason == "ProgressDeadlineExceeded":
                return _failed(
                    "ProgressDeadlineExceeded",
                    f"Progress deadline exceeded: {cond.message}"
                    if cond.message
                    else "Progress deadline exceeded",
                )
            if cond.status == "True" and cond.reason == "NewReplicaSetAvailable":
                progressing = True
        elif cond.type == "Available" and cond.status == "True":
            available = True
    spec = _int(obj, "spec.replicas", 1)
    replicas = _int(obj, "status.replicas", 0)
    updated = _int(obj, "status.updatedReplicas", 0)
    ready = _int(obj, "status.readyReplicas", 0)
    avail = _int(obj, "status.availableReplicas", 0)
    if spec > replicas:
        return _in_progress("LessReplicas", f"Replicas: {replicas}/{spec}")
    if spec > updated:
        return _in_progress("LessUpdated", f"Updated: {updated}/{spec}")
    if replicas > spec:
        return _in_progress("ExtraPods", f"Pending termination: {replicas - spec}")
    if updated > avail:
        return _in_progress("LessAvailable", f"Available: {avail}/{updated}")
    if spec > ready:
        return _in_progress("LessReady", f"Ready: {ready}/{spec}")
    if not progressing:
        return _in_progress("ReplicaSetNotAvailable", "ReplicaSet not Available")
    if not available:
        return _in_progress("DeploymentNotAvailable", "Deployment not Available")
    return _current(f"Deployment is available. Replicas: {replicas}")


def _statefulset(obj: Mapping[str, Any]) -> Assessment:
    if _str(obj, "spec.updateStrategy.type", "") == "OnDelete":
        return _current("StatefulSet is using the ondelete update strategy")
    spec = _int(obj, "spec.replicas", 1)
    ready = _int(obj, "status.readyReplicas", 0)
    current = _int(obj, "status.currentReplicas", 0)
    updated = _int(obj, "status.updatedReplicas", 0)
    replicas = _int(obj, "status.replicas", 0)
    partition = _int(obj, "spec.updateStrategy.rollingUpdate.partition", -1)
    if spec > replicas:
        return _in_progress("LessReplicas", f"Replicas: {replicas}/{spec}")
    if spec > ready:
        return _in_progress("LessReady", f"Ready: {ready}/{spec}")
    if replicas > spec:
        return _in_progress("ExtraPods", f"Pending termination: {replicas - spec}")
    if partition != -1:
        if updated < spec - partition:
            return _in_progress("PartitionRollout", f"updated: {updated}/{spec - partition}")
        return _current(f"Partition rollout complete. updated: {updated}")
    if spec > current:
        return _in_progress("LessCurrent", f"current: {current}/{spec}")
    if _str(obj, "status.currentRevision", "") != _str(obj, "status.updateRevision", ""):
        return _in_progress("RevisionMismatch", "Waiting for updated revision to match current")
    return _current(f"All replicas scheduled as expected. Replicas: {replicas}")


def _daemonset(obj: Mapping[str, Any]) -> Assessment:
    # kstatus checkGenerationSet: a DaemonSet the controller has acted on has both fields.
    if not isinstance(_field(obj, "metadata.generation"), int):
        return _in_progress("NoGeneration", "DaemonSet metadata.generation not found")
    if not isinstance(_field(obj, "status.observedGeneration"), int):
        return _in_progress("NoObservedGeneration", "DaemonSet status.observedGeneration not found")
    desired = _int(obj, "status.desiredNumberScheduled", -1)
    current = _int(obj, "status.currentNumberScheduled", 0)
    updated = _int(obj, "status.updatedNumberScheduled", 0)
    available = _int(obj, "status.numberAvailable", 0)
    ready = _int(obj, "status.numberReady", 0)
    if desired == -1:
        return _in_progress("NoDesiredNumber", "Missing .status.desiredNumberScheduled")
    if desired > current:
        return _in_progress("LessCurrent", f"Current: {current}/{desired}")
    if desired > updated:
        return _in_progress("LessUpdated", f"Updated: {updated}/{desired}")
    if desired > available:
        return _in_progress("LessAvailable", f"Available: {available}/{desired}")
    if desired > ready:
        return _in_progress("LessReady", f"Ready: {ready}/{desired}")
    return _current(f"All replicas scheduled as expected. Replicas: {desired}")


def _replicaset(obj: Mapping[str, Any]) -> Assessment:
    for cond in _conditions(obj):
        if cond.type == "ReplicaFailure" and cond.status == "True":
            return _in_progress("ReplicaFailure", "Replica Failure condition. Check Pods")
    spec = _int(obj, "spec.replicas", 1)
    replicas = _int(obj, "status.replicas", 0)
    ready = _int(obj, "status.readyReplicas", 0)
    available = _int(obj, "status.availableReplicas", 0)
    labelled = _int(obj, "status.fullyLabeledReplicas", 0)
    if spec > labelled:
        return _in_progress("LessLabelled", f"Labelled: {labelled}/{spec}")
    if spec > available:
        return _in_progress("LessAvailable", f"Available: {available}/{spec}")
    if spec > ready:
        return _in_progress("LessReady", f"Ready: {ready}/{spec}")
    if replicas > spec:
        return _in_progress("ExtraPods", f"Pending termination: {replicas - spec}")
    return _current(f"ReplicaSet is available. Replicas: {replicas}")


def _pvc(obj: Mapping[str, Any]) -> Assessment:
    phase = _str(obj, "status.phase", "unknown")
    if phase != "Bound":
        return _in_progress("NotBound", f"PVC is not Bound. phase: {phase}")
    return _current("PVC is Bound")


def _parse_time(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _pod(obj: Mapping[str, Any], now: datetime.datetime) -> Assessment:
    conditions = _conditions(obj)
    phase = _str(obj, "status.phase", "")
    if phase == "Succeeded":
        return _current("Pod has completed successfully")
    if phase == "Failed":
        return _current("Pod has completed, but not successfully")
    if phase == "Running":
        ready = _condition(conditions, "Ready")
        if ready is not None and ready.status == "True":
            return _current("Pod is Ready")
        looping = []
        statuses = _field(obj, "status.containerStatuses")
        for item in statuses if isinstance(statuses, list) else []:
            if not isinstance(item, Mapping):
                continue
            reason = _field(item, "state.waiting.reason")
            if reason == "CrashLoopBackOff" and isinstance(item.get("name"), str):
                looping.append(item["name"])
        if looping:
            return _failed(
                "ContainerCrashLooping", f"Containers in CrashLoop state: {','.join(looping)}"
            )
        return _in_progress("PodRunningNotReady", "Pod is running but is not Ready")
    if phase == "Pending":
        scheduled = _condition(conditions, "PodScheduled")
        if (
            scheduled is not None
            and scheduled.status == "False"
            and scheduled.reason == "Unschedulable"
        ):
            # kstatus gives a pod ScheduleWindow to be scheduled before calling it Failed.
            created = _parse_time(_str(obj, "metadata.creationTimestamp", ""))
            if created is not None and now - created < SCHEDULE_WINDOW:
                return _in_progress("PodNotScheduled", "Pod has not been scheduled")
            return _failed("PodUnschedulable", "Pod could not be scheduled")
        return _in_progress("PodPending", "Pod is in the Pending phase")
    if phase == "":
        return _in_progress("PodNotObserved", "Pod phase not available")
    raise _Malformed(f"unknown phase {phase}")


def _pdb(obj: Mapping[str, Any]) -> Assessment:
    return _current("AllowedDisruptions has been computed.")


def _job(obj: Mapping[str, Any]) -> Assessment:
    parallelism = _int(obj, "spec.parallelism", 1)
    completions = _int(obj, "spec.completions", parallelism)
    succeeded = _int(obj, "status.succeeded", 0)
    active = _int(obj, "status.active", 0)
    failed = _int(obj, "status.failed", 0)
    for cond in _conditions(obj):
        if cond.status != "True":
            continue
        if cond.type == "Complete":
            return _current(f"Job Completed. succeeded: {succeeded}/{completions}")
        if cond.type == "Failed":
            message = f"Job Failed. failed: {failed}/{completions}"
            return _failed("JobFailed", f"{message}: {cond.message}" if cond.message else message)
        if cond.type == "Suspended":
            return _current("Job is suspended")
    if not _str(obj, "status.startTime", ""):
        return _in_progress("JobNotStarted", "Job not started")
    return _current(f"Job in progress. success:{succeeded}, active: {active}, failed: {failed}")


def _service(obj: Mapping[str, Any], *, wait_for_load_balancer: bool = False) -> Assessment:
    if _str(obj, "spec.type", "ClusterIP") == "LoadBalancer":
        if not _str(obj, "spec.clusterIP", ""):
            return _in_progress("NoIPAssigned", "ClusterIP not set. Service type: LoadBalancer")
        # fleetlet (opt-in): also wait for the load balancer itself, as Argo CD does.
        ingress = _field(obj, "status.loadBalancer.ingress")
        if wait_for_load_balancer and not (isinstance(ingress, list) and ingress):
            return _in_progress(
                "NoLoadBalancerIngress", "Waiting for the load balancer's ingress address"
            )
    return _current("Service is ready")


def _crd(obj: Mapping[str, Any]) -> Assessment:
    conditions = _conditions(obj)
    names = _condition(conditions, "NamesAccepted")
    if names is not None and names.status == "False":
        return _failed(names.reason or "NamesNotAccepted", names.message)
    established = _condition(conditions, "Established")
    if established is not None:
        if established.status == "False" and established.reason != "Installing":
            return _failed(established.reason or "NotEstablished", established.message)
        if established.status == "True":
            return _current("CRD is established")
    return _in_progress("Installing", "Install in progress")


# kube-aggregator's availability controller checks, in order: the backing Service exists
# (ServiceNotFound), its port (ServicePortError), ready endpoints behind it (EndpointsNotFound,
# MissingEndpoints), then a discovery request through them (FailedDiscoveryCheck): that reason
# says the Service has ready endpoints.
_ENDPOINTS_READY = "FailedDiscoveryCheck"


def _apiservice(obj: Mapping[str, Any], *, api_service_endpoints: bool = False) -> Assessment:
    # fleetlet: kstatus has no rule (so helm --wait and Flux take any APIService as ready);
    # an aggregated API is usable when Available, as Argo CD judges it.
    # ``api_service_endpoints``: also once its Service has ready endpoints, without the API
    # server's discovery request through them (a control plane outside the pod network);
    # never while the Service is missing or none of its pods is ready.
    available = _condition(_conditions(obj), "Available")
    if available is not None and available.status == "True":
        return _current("APIService is available")
    if available is None:
        return _in_progress("NotAvailable", "APIService has no Available condition yet")
    if api_service_endpoints and available.reason == _ENDPOINTS_READY:
        return _current(
            "APIService's Service has ready endpoints; the API server's discovery request "
            f"through them is not required ({available.reason}: {available.message})",
            "EndpointsReady",
        )
    return _in_progress(available.reason or "NotAvailable", available.message)


def _namespace(obj: Mapping[str, Any]) -> Assessment:
    # fleetlet: kstatus has no rule (deletionTimestamp already says Terminating).
    phase = _str(obj, "status.phase", "Active")
    if phase == "Terminating":
        return Assessment(Status.TERMINATING, "Terminating", "Namespace is terminating")
    return _current(f"Namespace is {phase}")


def _ready_condition(obj: Mapping[str, Any]) -> Assessment | None:
    # fleetlet: the standard `Ready` condition of custom resources (Flux, cert-manager, CAPI...).
    ready = _condition(_conditions(obj), "Ready")
    if ready is None:
        return None
    generation = _field(obj, "metadata.generation")
    if (
        ready.observed_generation is not None
        and isinstance(generation, int)
        and ready.observed_generation != generation
    ):
        return _in_progress(
            "ReadyNotObserved",
            f"Ready condition is for generation {ready.observed_generation}, "
            f"latest is {generation}",
        )
    if ready.status == "True":
        return _current(ready.message or "Resource is Ready", ready.reason or "Ready")
    return _in_progress(ready.reason or "NotReady", ready.message or f"Ready is {ready.status}")


_RULES = {
    "Secret": _always_ready,
    "ConfigMap": _always_ready,
    "PersistentVolumeClaim": _pvc,
    "Namespace": _namespace,
    "apps/StatefulSet": _statefulset,
    "apps/DaemonSet": _daemonset,
    "extensions/DaemonSet": _daemonset,
    "apps/Deployment": _deployment,
    "extensions/Deployment": _deployment,
    "apps/ReplicaSet": _replicaset,
    "extensions/ReplicaSet": _replicaset,
    "policy/PodDisruptionBudget": _pdb,
    "batch/CronJob": _always_ready,
    "batch/Job": _job,
    "apiextensions.k8s.io/CustomResourceDefinition": _crd,
}


def assess(
    obj: Mapping[str, Any] | None,
    *,
    now: datetime.datetime | None = None,
    wait_for_load_balancer: bool = False,
    api_service_endpoints: bool = False,
) -> Assessment:
    """The kstatus status of ``obj`` as it is (None: the object does not exist → NotFound).
    ``wait_for_load_balancer``: a LoadBalancer Service is InProgress until it has an ingress.
    ``api_service_endpoints``: an APIService is Current once its Service has ready endpoints,
    even when the API server cannot reach them (``healthChecks.apiServices: Endpoints``).

    Never raises: an object whose status has an unexpected shape is Unknown, with why.
    """
    if obj is None:
        return NOT_FOUND
    kind = str(obj.get("kind") or "")
    group = _group(str(obj.get("apiVersion") or ""))
    try:
        generic = _generic(obj, kind)
        if generic is not None:
            return generic
        if kind == "Pod" and not group:
            clock = now or datetime.datetime.now(datetime.UTC)
            return _pod(obj, clock if clock.tzinfo else clock.replace(tzinfo=datetime.UTC))
        if kind == "Service" and not group:
            return _service(obj, wait_for_load_balancer=wait_for_load_balancer)
        if kind == "APIService" and group == "apiregistration.k8s.io":
            return _apiservice(obj, api_service_endpoints=api_service_endpoints)
        rule = _RULES.get(f"{group}/{kind}" if group else kind)
        if rule is not None:
            return rule(obj)
        return _ready_condition(obj) or _current("Resource is current")
    except _Malformed as exc:
        return Assessment(Status.UNKNOWN, "Unknown", f"cannot assess {kind}: {exc}")
