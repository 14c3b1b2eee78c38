"""Applying and removing an agent installation: ``fleetlet agent install|uninstall``.

Install is server-side apply of :func:`agent.install.manifests.install_objects`, in order, as
field manager ``fleetlet-install`` (taking over fields another manager set, so a cluster first
set up by hand converges). It is idempotent: applying the same configuration again changes no
object (the API server keeps every ``resourceVersion``), and each object is reported as
``created``, ``configured`` or ``unchanged``; what the configuration leaves out that another
would make (the upgrade candidate with ``--self-upgrade=off``) is deleted last, so a second
install with another setting converges. The CRDs are waited for (``Established``) before
anything else; an optional object whose API is not served (a ServiceMonitor without the
Prometheus Operator) is ``skipped`` and said so.

Uninstall removes the Deployments first (the agent and its upgrade candidate stop), then the
rest of what install made, and the namespace when install created it. The CRDs, and with them every BundleDeployment and
BundleOutputs, stay unless asked (``--crds``): what the agent applied keeps running either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.errors import TemporaryError
from agent.install.crd_removal import remove_crds as remove_crds_one_by_one
from agent.install.manifests import (
    CONFIG_MAP,
    EVENTS_NAMESPACE,
    FIELD_MANAGER,
    GIT_SECRET,
    HUB_KEY_CONFIG_MAP,
    MANAGED_BY,
    NAME,
    REGISTRY_SECRET,
    STATUS_GIT_SECRET,
    TRUST_SECRET,
    Object,
    approval_policies,
    crds,
)
from agent.kube import ApiNotServedError, KubeClient, ObjectRef
from agent.upgrade.deployment import CANDIDATE

OPTIONAL_KINDS = frozenset({"ServiceMonitor"})
"""Kinds installed only where their API is served."""


class CrdsNotEstablishedError(TemporaryError):
    """The API server has not established (or, uninstalling, removed) fleetlet's CRDs within
    the wait."""


@dataclass(frozen=True)
class Change:
    """What happened to one object: ``created``, ``configured``, ``unchanged``, ``skipped``
    (install), ``deleted`` or ``absent`` (uninstall)."""

    ref: ObjectRef
    action: str

    def __str__(self) -> str:
        return f"{self.ref.kind.lower()}/{self.ref.name}" + (
            f" -n {self.ref.namespace}" if self.ref.namespace else ""
        )


def install(
    kube: KubeClient,
    objects: Iterable[Object],
    *,
    crd_timeout: float = 60.0,
    report: Callable[[Change], None] | None = None,
    left_out: Iterable[Object] = (),
) -> list[Change]:
    """Apply ``objects`` in order, then delete those of ``left_out`` that exist (what another
    setting installs and this one does not: ``deleted``, and not reported when already
    absent); returns what happened to each.

    Raises CrdsNotEstablishedError, and what :meth:`KubeClient.apply` raises (ForbiddenError
    when the caller may not create an object: installing needs cluster-admin rights).
    """
    changes: list[Change] = []
    waiting_crds: list[str] = []
    for obj in objects:
        ref = ObjectRef.of(obj)
        if obj["kind"] != "CustomResourceDefinition" and waiting_crds:
            _wait_established(kube, waiting_crds, crd_timeout)
            waiting_crds = []
        try:
            before = kube.get(ref)
        except ApiNotServedError:
            if obj["kind"] in OPTIONAL_KINDS:
                change = Change(ref, "skipped")
                changes.append(change)
                if report is not None:
                    report(change)
                continue
            raise
        after = kube.apply(obj, field_manager=FIELD_MANAGER, force=True)
        if before is None:
            action = "created"
        elif _version(before) == _version(after):
            action = "unchanged"
        else:
            action = "configured"
        if obj["kind"] == "CustomResourceDefinition":
            waiting_crds.append(ref.name)
        change = Change(ref, action)
        changes.append(change)
        if report is not None:
            report(change)
    if waiting_crds:
        _wait_established(kube, waiting_crds, crd_timeout)
    for obj in left_out:
        ref = ObjectRef.of(obj)
        if kube.delete(ref):
            change = Change(ref, "deleted")
            changes.append(change)
            if report is not None:
                report(change)
    return changes


def uninstall(
    kube: KubeClient,
    *,
    namespace: str,
    remove_crds: bool = False,
    crd_timeout: float = 300.0,
    report: Callable[[Change], None] | None = None,
) -> list[Change]:
    """Remove the installation in ``namespace`` (see the module docstring); returns what
    happened to each object. Objects already gone are ``absent``, never an error.

    With ``remove_crds``, removes the CRDs one at a time (:mod:`agent.install.crd_removal`)
    and waits up to ``crd_timeout`` seconds in all for the API server to delete every custom
    object and the CRDs (``kubectl delete`` waits for that without a bound).

    Raises what :meth:`KubeClient.delete` raises (ForbiddenError...), CrdsNotEstablishedError
    (temporary) when the CRDs are still terminating after ``crd_timeout``.
    """
    rbac = "rbac.authorization.k8s.io/v1"
    refs = [
        ObjectRef("apps/v1", "Deployment", NAME, namespace),
        ObjectRef("apps/v1", "Deployment", CANDIDATE, namespace),
        ObjectRef("monitoring.coreos.com/v1", "ServiceMonitor", NAME, namespace),
        ObjectRef("v1", "Service", NAME, namespace),
        *(ObjectRef.of(o) for o in approval_policies(namespace)),
        ObjectRef("v1", "ConfigMap", CONFIG_MAP, namespace),
        ObjectRef("v1", "ConfigMap", HUB_KEY_CONFIG_MAP, namespace),
        ObjectRef("v1", "ConfigMap", "fleetlet-ssh-known-hosts", namespace),
        *(
            ObjectRef("v1", "Secret", name, namespace)
            for name in (TRUST_SECRET, GIT_SECRET, STATUS_GIT_SECRET, REGISTRY_SECRET)
        ),
        ObjectRef(rbac, "RoleBinding", f"{NAME}-events", EVENTS_NAMESPACE),
        ObjectRef(rbac, "Role", f"{NAME}-events", EVENTS_NAMESPACE),
        ObjectRef(rbac, "RoleBinding", NAME, namespace),
        ObjectRef(rbac, "Role", NAME, namespace),
        ObjectRef(rbac, "ClusterRoleBinding", NAME, None),
        ObjectRef(rbac, "ClusterRole", NAME, None),
        ObjectRef("v1", "ServiceAccount", NAME, namespace),
    ]
    changes: list[Change] = []

    def delete(ref: ObjectRef) -> None:
        try:
            gone = kube.delete(ref)
        except ApiNotServedError:
            gone = False
        change = Change(ref, "deleted" if gone else "absent")
        changes.append(change)
        if report is not None:
            report(change)

    for ref in refs:
        delete(ref)
    # The namespace goes only when install made it (a namespace of the user's stays).
    ns_ref = ObjectRef("v1", "Namespace", namespace, None)
    live = kube.get(ns_ref)
    labels = ((live or {}).get("metadata") or {}).get("labels") or {}
    if live is not None and all(labels.get(k) == v for k, v in MANAGED_BY.items()):
        delete(ns_ref)
    if remove_crds:
        # One at a time, each listed first and gone before the next: see
        # agent.install.crd_removal. Waiting means a new install right after does not meet a
        # CRD on its way out.
        deadline = time.monotonic() + crd_timeout
        names = [crd["metadata"]["name"] for crd in crds()]
        if remove_crds_one_by_one(kube, names, deadline=deadline, delete=delete):
            raise CrdsNotEstablishedError(
                f"fleetlet's CRDs still terminating after {crd_timeout:.0f} s", delay=5.0
            )
    return changes


def _version(obj: Object) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version is not None else None


def _wait_established(kube: KubeClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        crd = kube.get(
            ObjectRef("apiextensions.k8s.io/v1", "CustomResourceDefinition", pending[0], None)
        )
        conditions = ((crd or {}).get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise CrdsNotEstablishedError(
                f"CRD {pending[0]} not Established after {timeout:.0f} s", delay=5.0
            )
        time.sleep(0.2)
    kube.forget_discovery()
