"""Lockstep groups end to end: a set with two groups installs; an upgrade that breaks one
bundle of a group takes the whole group back to its previous healthy revision, leaving the
other group alone; a fixed upgrade then goes through. Real API server (kwok runs the pods),
real registry, real git server, signatures from the mini Sigstore.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from agent.kube import KubeClient
from tests.fleetlab import (
    Lab,
    conditions,
    configmap,
    crd_manifest,
    deployment,
    live,
    namespace_manifest,
    service,
)
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed


class Shop:
    """The two groups of the acceptance scenario, in versions."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.group = f"{lab.suffix}.fleetlet.test"
        self.ns = lab.name("shop")
        self.platform_ns = lab.name("platform")
        self.platform = lab.name("platform")
        self.web = lab.name("web")
        self.conf = lab.name("conf")

    def platform_files(self) -> dict[str, str]:
        return {
            "01_crd.yaml": crd_manifest(self.group, "widgets", "Widget"),
            "02_namespace.yaml": namespace_manifest(self.platform_ns)
            + "---\n"
            + namespace_manifest(self.ns),
            "03_operator.yaml": deployment("operator", self.platform_ns, "example/operator:1.0"),
        }

    def web_files(self, image: str) -> dict[str, str]:
        return {
            "deployment.yaml": deployment("web", self.ns, image),
            "service.yaml": service("web", self.ns),
        }

    def conf_files(self, value: str, *, extra: bool = False) -> dict[str, str]:
        files = {
            "config.yaml": configmap("settings", self.ns, {"value": value}),
            "widget.yaml": f"apiVersion: {self.group}/v1\nkind: Widget\nmetadata:\n"
            f"  name: main\n  namespace: {self.ns}\nspec:\n  size: {value}\n",
        }
        if extra:
            files["extra.yaml"] = configmap("extra", self.ns, {"added": "by-v2"})
        return files

    def bundles(self, *, web: str, conf: str, timeout: int = 20) -> list[dict[str, Any]]:
        lab = self.lab
        checks = {"timeoutSeconds": timeout}
        return [
            {
                "name": self.platform,
                "sources": [
                    lab.source("platform", lab.push("platform", self.platform_files(), tag="v1"))
                ],
                "group": "platform",
                "healthChecks": {"timeoutSeconds": 60},
            },
            {
                "name": self.web,
                "sources": [lab.source("web", web)],
                "group": "apps",
                "dependsOn": ["platform"],
                "healthChecks": checks,
            },
            {
                "name": self.conf,
                "sources": [lab.source("conf", conf)],
                "group": "apps",
                "dependsOn": ["platform"],
                "healthChecks": checks,
            },
        ]


def _image(kube: KubeClient, shop: Shop) -> str:
    web = live(kube, "apps/v1", "Deployment", "web", shop.ns)
    assert web is not None
    return str(web["spec"]["template"]["spec"]["containers"][0]["image"])


def test_two_groups_install_a_broken_upgrade_rolls_the_group_back_and_a_fix_goes_through(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    shop = Shop(lab)
    web_v1 = lab.push("web", shop.web_files("example/web:1.0"), tag="v1")
    conf_v1 = lab.push("conf", shop.conf_files("one"), tag="v1")
    lab.publish(shop.bundles(web=web_v1, conf=conf_v1))
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")

    first = agent.tick()
    assert first.outbound is not None
    assert first.outbound.moved == ("platform", "apps"), first
    for bundle in (shop.platform, shop.web, shop.conf):
        ready = conditions(kube, bundle)["Ready"]
        assert ready["status"] == "True", (bundle, ready)
    shown = subprocess.run(
        [kubectl(), "--kubeconfig", str(crds.kubeconfig), "get", "bd",
         shop.web, shop.conf, shop.platform],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "apps" in shown.stdout and "platform" in shown.stdout and "Healthy" in shown.stdout
    operator = live(kube, "apps/v1", "Deployment", "operator", shop.platform_ns)
    assert operator is not None
    platform_version = operator["metadata"]["resourceVersion"]

    # v2: web's image is broken, conf changes its value and adds an object.
    web_v2 = lab.push("web", shop.web_files("example/web:broken"), tag="v2")
    conf_v2 = lab.push("conf", shop.conf_files("two", extra=True), tag="v2")
    lab.publish(shop.bundles(web=web_v2, conf=conf_v2))
    second = agent.tick()
    assert second.outbound is not None and second.outbound.rolled_back == ("apps",), second
    assert _image(kube, shop) == "example/web:1.0"
    settings = live(kube, "v1", "ConfigMap", "settings", shop.ns)
    assert settings is not None and settings["data"] == {"value": "one"}
    assert live(kube, "v1", "ConfigMap", "extra", shop.ns) is None
    widget = live(kube, f"{shop.group}/v1", "Widget", "main", shop.ns)
    assert widget is not None and widget["spec"]["size"] == "one"
    operator = live(kube, "apps/v1", "Deployment", "operator", shop.platform_ns)
    assert operator is not None and operator["metadata"]["resourceVersion"] == platform_version
    for bundle in (shop.web, shop.conf):
        ready = conditions(kube, bundle)["Ready"]
        assert ready["status"] == "False" and ready["reason"] == "RolledBack", ready
        assert "Deployment" in ready["message"] and "web" in ready["message"], ready
    assert conditions(kube, shop.platform)["Ready"]["status"] == "True"

    # The failed serial is not retried in a loop.
    third = agent.tick()
    assert third.outbound is not None and third.outbound.moved == ()
    assert _image(kube, shop) == "example/web:1.0"

    # v3 fixes it: the group moves, the added object comes with it.
    web_v3 = lab.push("web", shop.web_files("example/web:3.0"), tag="v3")
    lab.publish(shop.bundles(web=web_v3, conf=conf_v2))
    fourth = agent.tick()
    assert fourth.outbound is not None and fourth.outbound.moved == ("apps",), fourth
    assert _image(kube, shop) == "example/web:3.0"
    assert live(kube, "v1", "ConfigMap", "extra", shop.ns) is not None
    for bundle in (shop.web, shop.conf):
        assert conditions(kube, bundle)["Ready"]["status"] == "True"
    results = [r.result for r in agent.reconciler.views[shop.web].runs]
    assert results == ["succeeded", "rolledBack", "succeeded"]
