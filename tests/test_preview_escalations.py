"""Issue 28 item 8 against the real API server: the live preview (a server-side dry run, as the
agent makes it before asking for an approval) of a move that adds an APIService, a
ServiceAccount token Secret and a hostPath PersistentVolume, and relabels a Namespace to Pod
Security ``privileged``, flags each of them, and the "no RBAC, CRDs or webhooks" rule does not
approve it. Nothing is written (a dry run)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.apply.group import FIELD_MANAGER, dry_run_group
from agent.apply.plan import BundleInput
from agent.approve.policy import activation, evaluate
from agent.approve.preview import build_preview, live_changes
from agent.kube import KubeClient
from tests.realenv.kube import Cluster
from tests.test_preview import NO_RISK, _request

ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.fixture
def kube(kube_cluster: Cluster, tmp_path: Path) -> Iterator[KubeClient]:
    with KubeClient(
        kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=tmp_path / "discovery"
    ) as client:
        yield client


def test_the_live_preview_flags_escalations_that_grant_without_rbac(
    kube: KubeClient, namespace: str
) -> None:
    nonce = uuid.uuid4().hex[:8]
    # The bundle applied its Namespace at Pod Security restricted before.
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": {ENFORCE: "restricted"}}},
        field_manager=FIELD_MANAGER,
    )  # fmt: skip
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": namespace, "labels": {ENFORCE: "privileged"}}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": f"v1.x{nonce}.example.com"},
         "spec": {"group": f"x{nonce}.example.com", "version": "v1",
                  "service": {"namespace": namespace, "name": "api"},
                  "groupPriorityMinimum": 1000, "versionPriority": 15,
                  "insecureSkipTLSVerify": True}},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
         "metadata": {"name": "token", "namespace": namespace,
                      "annotations": {"kubernetes.io/service-account.name": "default"}}},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"root-{nonce}"},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                  "hostPath": {"path": "/"}}},
    ]  # fmt: skip
    results, _ = dry_run_group(
        kube, [BundleInput(name="b", objects=objects)], agent_namespace="fleetlet-system"
    )
    preview = build_preview(live_changes(results)).preview
    assert preview.refused == 0, [
        (o.kind, o.diff[:300]) for o in preview.objects if o.action == "refused"
    ]
    security = preview.security
    webhooks = {f.object: f.details for f in security.webhooks}
    rbac = {f.object: f.details for f in security.rbac}
    assert (
        "Pod Security enforce relaxed: restricted -> privileged"
        in webhooks[f"Namespace {namespace}"]
    )
    assert (
        f"v1.x{nonce}.example.com served by Service {namespace}/api"
        in webhooks[f"APIService v1.x{nonce}.example.com"]
    )
    assert "token of ServiceAccount default" in rbac[f"Secret {namespace}/token"]
    assert "hostPath /" in rbac[f"PersistentVolume root-{nonce}"]
    assert evaluate(NO_RISK, activation(_request(preview))) is False
    # A dry run: nothing was written.
    assert kube.get({"apiVersion": "v1", "kind": "PersistentVolume",
                     "metadata": {"name": f"root-{nonce}"}}) is None  # fmt: skip
