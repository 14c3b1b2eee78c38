"""An OLM bundle end to end: the argocd operator's registry+v1 bundle pushed to a real registry
as a container image (the bundle image layout: ``manifests/`` and ``metadata/`` at the root,
OLM's labels on the image config), published by the hub (signed), pulled and converted by an
agent, applied to a real API server: the operator's Deployment becomes Available (kwok runs
its pods), with its ServiceAccount, the Roles of OwnNamespace mode and its ClusterRoles."""

from __future__ import annotations

import shutil
from pathlib import Path

from agent.kube import KubeClient
from tests.fleetlab import Lab, conditions, live
from tests.realenv.kube import Cluster
from tests.realenv.oci import OciClient, push_image
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

BUNDLE = Path(__file__).parent / "assets" / "olm-bundles" / "bundles" / "argocd-operator.v0.6.0"
LABELS = {
    "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
    "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
    "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
    "operators.operatorframework.io.bundle.package.v1": "argocd-operator",
}


def test_an_olm_bundle_image_is_published_synced_and_its_operator_runs(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    image = tmp_path / "bundle-image"
    shutil.copytree(BUNDLE, image)
    digest = push_image(
        OciClient(host=lab.registry.host), "olm/argocd-operator-bundle", image,
        tag="v0.6.0", labels=LABELS,
    )  # fmt: skip
    operator_ns = lab.name("argocd")
    name = lab.name("argocd-operator")
    lab.publish(
        [
            {
                "name": name,
                "sources": [lab.source("olm/argocd-operator-bundle", digest)],
                "format": "registry+v1",
                "createNamespace": True,
                "formatOptions": {
                    "targetNamespace": operator_ns,
                    "watchNamespace": operator_ns,  # OwnNamespace mode
                },
                "healthChecks": {"timeoutSeconds": 120},
            }
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")

    first = agent.tick()

    assert first.outbound is not None and first.outbound.moved == (name,), first
    assert conditions(kube, name)["Ready"]["status"] == "True", conditions(kube, name)
    deployment = live(kube, "apps/v1", "Deployment", "argocd-operator-controller-manager",
                      operator_ns)  # fmt: skip
    assert deployment is not None
    available = {c["type"]: c["status"] for c in deployment["status"]["conditions"]}
    assert available["Available"] == "True"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["olm.targetNamespaces"] == operator_ns
    assert annotations["olm.operatorNamespace"] == operator_ns
    assert deployment["spec"]["revisionHistoryLimit"] == 1
    account = "argocd-operator-controller-manager"
    assert live(kube, "v1", "ServiceAccount", account, operator_ns) is not None
    role = "argocd-operator.v0-22gmilmgp91wu25is5i2ec598hni8owq3l71bbkl7iz3"  # its generated name
    binding = live(kube, "rbac.authorization.k8s.io/v1", "RoleBinding", role, operator_ns)
    assert binding is not None
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": operator_ns}
    ]
    crd = live(kube, "apiextensions.k8s.io/v1", "CustomResourceDefinition",
               "argocdexports.argoproj.io")  # fmt: skip
    assert crd is not None
    service = live(kube, "v1", "Service", "argocd-operator-controller-manager-metrics-service",
                   operator_ns)  # fmt: skip
    assert service is not None
