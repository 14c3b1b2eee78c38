"""A kustomize bundle end to end: pushed to a real registry, published by the hub (signed) with
a bundle patch and a per-cluster override (another overlay, another patch), synced by an agent
onto a real API server with the real kustomize; rendering again runs no tool, even after the
agent restarts."""

from __future__ import annotations

import textwrap
from pathlib import Path

from agent.kube import KubeClient
from tests.fleetlab import Lab, conditions, live
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_bundle
from tests.realenv.tool_fixtures import ToolCounter
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

TREE = {
    "base/kustomization.yaml": "resources: [deployment.yaml, settings.yaml]\n",
    "base/deployment.yaml": """
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: web
          labels: {app: web}
          annotations: {argocd.argoproj.io/sync-wave: "1"}
        spec:
          replicas: 1
          selector: {matchLabels: {app: web}}
          template:
            metadata: {labels: {app: web}}
            spec:
              containers: [{name: main, image: "example/web:1.0"}]
    """,
    "base/settings.yaml": """
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: settings}
        data: {mode: base}
    """,
    "overlays/default/kustomization.yaml": """
        resources: [../../base]
        patches:
          - patch: |
              apiVersion: v1
              kind: ConfigMap
              metadata: {name: settings}
              data: {mode: default}
    """,
    "overlays/canary/kustomization.yaml": """
        resources: [../../base]
        images: [{name: example/web, newTag: "2.0"}]
        patches:
          - patch: |
              apiVersion: v1
              kind: ConfigMap
              metadata: {name: settings}
              data: {mode: canary}
    """,
}


def _push_tree(lab: Lab, repository: str) -> str:
    directory = lab.tmp / "content" / repository
    for name, text in TREE.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(textwrap.dedent(text).lstrip())
    pushed = push_bundle(OciClient(host=lab.registry.host), repository, directory, tag="v1")
    return pushed.digest


def test_a_kustomize_bundle_is_published_patched_per_cluster_and_synced(
    lab: Lab,
    crds: Cluster,
    namespace: str,
    app_namespace: str,
    tmp_path: Path,
    counted_kustomize: ToolCounter,
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    web = lab.name("web")
    digest = _push_tree(lab, "kustomized")
    lab.publish(
        [
            {
                "name": web,
                "sources": [lab.source("kustomized", digest)],
                "format": "kustomize",
                "formatOptions": {"path": "overlays/default", "targetNamespace": app_namespace},
                "patches": [
                    {"patch": "spec: {replicas: 2}\n", "target": {"kind": "Deployment"}},
                ],
                "healthChecks": {"timeoutSeconds": 120},
                "overrides": [
                    {
                        "clusters": ["edge-1"],
                        "path": "overlays/canary",
                        "patches": [
                            {
                                "patch": '[{"op": "add", "path": "/metadata/labels/canary", '
                                '"value": "yes"}]',
                                "target": {"kind": "Deployment", "name": "web"},
                            }
                        ],
                    }
                ],
            }
        ]
    )
    workdir = tmp_path / "agent"
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=workdir)

    first = agent.tick()

    assert first.outbound is not None and first.outbound.moved == (web,), first
    assert conditions(kube, web)["Ready"]["status"] == "True"
    deployment = live(kube, "apps/v1", "Deployment", "web", app_namespace)
    assert deployment is not None
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "example/web:2.0"
    assert deployment["spec"]["replicas"] == 2  # the bundle's patch
    assert deployment["metadata"]["labels"]["canary"] == "yes"  # edge-1's override patch
    assert deployment["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] == "1"
    settings = live(kube, "v1", "ConfigMap", "settings", app_namespace)
    assert settings is not None and settings["data"] == {"mode": "canary"}  # edge-1's overlay
    runs = counted_kustomize.runs
    assert runs == 1  # one build carries the patches

    # An idle reconcile renders nothing; rendering the accepted set again runs no tool.
    assert agent.tick().inbound == "unchanged"
    accepted = agent.accepted
    assert accepted is not None
    (again,) = agent.pipeline.render(accepted)
    assert counted_kustomize.runs == runs
    assert {o["kind"] for o in again.objects} == {"Deployment", "ConfigMap"}

    # Nor after a restart: the renders are kept under the agent's cache directory.
    restarted = lab.agent("edge-1", crds, namespace=namespace, workdir=workdir)
    (after_restart,) = restarted.pipeline.render(accepted)
    assert after_restart.objects == again.objects
    assert counted_kustomize.runs == runs
