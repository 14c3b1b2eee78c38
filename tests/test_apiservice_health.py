"""An APIService's health through hub and agent, on a real control plane (whose aggregator
judges the APIService): with ``healthChecks.apiServices: Endpoints`` a bundle is Ready once
the APIService's Service has ready endpoints, and not before (helm's ``--wait`` and kstatus
take any APIService as ready, even one with no pod behind it).

The default, ``Available``, is the judgement of the differential tier
(tests/test_popular_charts.py, metrics-server) and of tests/test_health.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.kube import KubeClient, ObjectRef
from tests.fleetlab import Lab, conditions, deployment, namespace_manifest
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed


def _service(name: str, namespace: str) -> str:
    return f"""apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {namespace}
spec:
  selector: {{app: {name}}}
  ports:
    - port: 443
      targetPort: 8443
"""


def _apiservice(group: str, service: str, namespace: str) -> str:
    return f"""apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1alpha1.{group}
spec:
  group: {group}
  version: v1alpha1
  service: {{name: {service}, namespace: {namespace}, port: 443}}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
"""


def test_apiservice_by_endpoints_not_ready_without_pods_ready_with_them_and_only_its_own(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    name, ns, group = lab.name("aggregated"), lab.name("metrics"), f"{lab.name('m')}.example.com"
    other_group = f"{lab.name('other')}.example.com"
    files = {
        "01_namespace.yaml": namespace_manifest(ns),
        "02_service.yaml": _service("server", ns),
        "03_apiservice.yaml": _apiservice(group, "server", ns),
    }

    def publish(files: dict[str, str], tag: str, timeout: int, *also: dict[str, Any]) -> None:
        digest = lab.push("aggregated", files, tag=tag)
        health = {"apiServices": "Endpoints", "timeoutSeconds": timeout}
        source = lab.source("aggregated", digest)
        lockstep = {"group": lab.name("lockstep")}
        first = {"name": name, "sources": [source], "healthChecks": health, **lockstep}
        assert lab.publish([first, *({**b, **lockstep} for b in also)])

    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    try:
        # 1. No pod behind the Service: never healthy, whatever the wait (helm: ready).
        publish(files, "no-pods", timeout=5)
        agent.tick()
        ready = conditions(kube, name)["Ready"]
        assert ready["status"] == "False", ready
        assert f"APIService/v1alpha1.{group}" in ready["message"], ready
        assert ready["reason"] == "HealthCheckFailed", ready
        assert "have no addresses" in ready["message"], ready  # the aggregator's MissingEndpoints

        # 2. A ready pod behind it (kwok): Ready, though no server answers discovery there.
        files["04_deployment.yaml"] = deployment("server", ns, "registry.example/server:1")
        publish(files, "with-pods", timeout=120)
        agent.tick()
        ready = conditions(kube, name)["Ready"]
        assert ready["status"] == "True", ready
        api = kube.get(ObjectRef("apiregistration.k8s.io/v1", "APIService", f"v1alpha1.{group}"))
        assert api is not None
        available = {c["type"]: c for c in api["status"]["conditions"]}["Available"]
        assert (available["status"], available["reason"]) == ("False", "FailedDiscoveryCheck")

        # 3. Beside it in one lockstep group, a bundle with the default judgement and its own
        # APIService on the same ready pods: that one is judged by Available, so the group
        # fails on it alone (one bundle's option never relaxes another's APIServices).
        other = {"03_apiservice.yaml": _apiservice(other_group, "server", ns)}
        source = lab.source("aggregated", lab.push("aggregated", other, tag="other"))
        bundle = {
            "name": lab.name("other"),
            "sources": [source],
            "healthChecks": {"timeoutSeconds": 5},
        }
        publish(files, "with-pods", 5, bundle)
        agent.tick()
        ready = conditions(kube, bundle["name"])["Ready"]
        assert ready["status"] == "False", ready
        assert f"APIService/v1alpha1.{other_group}: InProgress" in ready["message"], ready
        assert f"APIService/v1alpha1.{group}:" not in ready["message"], ready
    finally:
        for bundle_name in (name, lab.name("other")):
            kube.delete(ObjectRef("fleetlet.io/v1alpha1", "BundleDeployment", bundle_name))
        for api_group in (group, other_group):
            kube.delete(
                ObjectRef("apiregistration.k8s.io/v1", "APIService", f"v1alpha1.{api_group}")
            )
        kube.delete(ObjectRef("v1", "Namespace", ns), propagation="Background")
