"""deploy/hub/ against a real kube-apiserver: accepted as written, and its pod passes Pod
Security ``restricted``. Applied through a throwaway overlay that moves it to a unique
namespace (the API server is shared); the pod is only admitted (server-side dry run): kwok
fakes pods, and the image's own run is tests/test_image.py's business."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import yaml

from agent.api.crds import REPO_ROOT
from tests.realenv.kube import Cluster
from tests.test_deploy_rbac import _overlay, kubectl

DEPLOY = REPO_ROOT / "deploy" / "hub"


def test_hub_manifests_are_accepted_and_the_pod_is_restricted(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    namespace = f"fleetlet-hub-{uuid.uuid4().hex[:6]}"
    overlay = _overlay(tmp_path / "overlay", namespace=namespace, prefix="", bases=[DEPLOY])
    kubectl(
        kube_cluster, "apply", "--server-side", "--field-manager=fleetlet-tests", "-k", str(overlay)
    )
    try:
        deployment = json.loads(
            kubectl(
                kube_cluster, "get", "deployment", "fleetlet-hub", "-n", namespace, "-o", "json"
            ).stdout
        )
        pod_spec = deployment["spec"]["template"]["spec"]
        (container,) = pod_spec["containers"]
        assert "@sha256:" in container["image"]
        assert container["command"][:3] == ["fleetlet", "hub", "serve"]
        flags = {arg.split("=", 1)[0] for arg in container["command"][3:]}
        assert {"--tls-cert", "--tls-key", "--tokens", "--repo"} <= flags
        assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        assert pod_spec["automountServiceAccountToken"] is False
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hub-pss-check", "namespace": namespace},
            "spec": pod_spec,
        }
        admitted = kubectl(
            kube_cluster, "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod)
        )
        assert "created (server dry run)" in admitted.stdout
        labels = json.loads(
            kubectl(kube_cluster, "get", "namespace", namespace, "-o", "json").stdout
        )
        assert labels["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    finally:
        kubectl(kube_cluster, "delete", "-k", str(overlay), "--ignore-not-found", "--wait=false")
