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
    # The rolled-back run of the failing bundle names the object; the other bundle's does not.
    rolled = {b: agent.reconciler.views[b].runs[0] for b in (shop.web, shop.conf)}
    assert [r.result for r in rolled.values()] == ["RolledBack", "RolledBack"]
    assert rolled[shop.web].failed_object is not None
    assert "Deployment" in rolled[shop.web].failed_object, rolled[shop.web]
    assert rolled[shop.conf].failed_object is None

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
    assert results == ["Succeeded", "RolledBack", "Succeeded"]


def _bundle(lab: Lab, name: str, files: dict[str, str], **extra: Any) -> dict[str, Any]:
    repo = name.rsplit("-", 1)[0]
    digest = lab.push(repo, files, tag=lab.suffix)
    return {"name": name, "sources": [lab.source(repo, digest)], **extra}


def test_drift_is_corrected_and_counted_unless_the_bundle_is_paused_by_annotation(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("drift"), lab.name("cfg")
    files = {
        "01_ns.yaml": namespace_manifest(ns),
        "02_cm.yaml": configmap("settings", ns, {"mode": "strict"}),
    }
    lab.publish([_bundle(lab, name, files)])
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    agent.tick()
    assert conditions(kube, name)["Ready"]["status"] == "True"

    # Someone edits the ConfigMap and deletes nothing else: the next poll puts it back.
    kube.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": ns},
         "data": {"mode": "lax"}},
        field_manager="kubectl-edit", force=True,
    )  # fmt: skip
    result = agent.tick()
    assert result.outbound is not None and result.outbound.drift_corrected == 1
    cm = live(kube, "v1", "ConfigMap", "settings", ns)
    assert cm is not None and cm["data"] == {"mode": "strict"}
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name)
    assert bd is not None and bd["status"]["driftCount"] == 1
    runs = agent.reconciler.views[name].runs
    assert runs[0].operation == "driftCorrection" and runs[0].counts.configured == 1

    # A cluster admin pauses the bundle: drift is reported, not corrected.
    kube.apply(
        {"apiVersion": "fleetlet.io/v1alpha1", "kind": "BundleDeployment",
         "metadata": {"name": name, "annotations": {"fleetlet.io/paused": "true"}}},
        field_manager="cluster-admin",
    )  # fmt: skip
    kube.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": ns},
         "data": {"mode": "lax"}},
        field_manager="kubectl-edit", force=True,
    )  # fmt: skip
    result = agent.tick()
    assert result.outbound is not None and result.outbound.drift_corrected == 0
    cm = live(kube, "v1", "ConfigMap", "settings", ns)
    assert cm is not None and cm["data"] == {"mode": "lax"}
    paused = conditions(kube, name)["Paused"]
    assert paused["status"] == "True"
    assert "drift not corrected: 1 object(s) differ" in paused["message"]
    assert "ConfigMap" in paused["message"]
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name)
    assert bd is not None and bd["status"]["driftCount"] == 1


def test_prune_keeps_crds_and_an_object_moved_to_another_bundle_keeps_its_uid(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns = lab.name("prune")
    group = f"{lab.suffix}.prune.test"
    a, b = lab.name("a"), lab.name("b")
    base = {
        "01_ns.yaml": namespace_manifest(ns),
        "02_crd.yaml": crd_manifest(group, "gadgets", "Gadget"),
        "03_keep.yaml": configmap("keep", ns, {"x": "1"}),
        "04_gone.yaml": configmap("gone", ns, {"x": "1"}),
        "05_moving.yaml": configmap("moving", ns, {"x": "1"}),
    }
    lab.publish(
        [_bundle(lab, a, base), _bundle(lab, b, {"cm.yaml": configmap("b-own", ns, {"y": "1"})})]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    agent.tick()
    moving = live(kube, "v1", "ConfigMap", "moving", ns)
    assert moving is not None
    uid = moving["metadata"]["uid"]

    # a drops "gone", the CRD and "moving"; b takes "moving" over.
    a_files = {k: v for k, v in base.items() if k in ("01_ns.yaml", "03_keep.yaml")}
    b_files = {
        "cm.yaml": configmap("b-own", ns, {"y": "1"}),
        "moving.yaml": configmap("moving", ns, {"x": "2"}),
    }
    lab.publish([_bundle(lab, a, a_files), _bundle(lab, b, b_files)])
    agent.tick()
    assert live(kube, "v1", "ConfigMap", "gone", ns) is None
    assert live(kube, "v1", "ConfigMap", "keep", ns) is not None
    assert (
        live(kube, "apiextensions.k8s.io/v1", "CustomResourceDefinition", f"gadgets.{group}")
        is not None
    )
    moved = live(kube, "v1", "ConfigMap", "moving", ns)
    assert moved is not None
    assert moved["metadata"]["uid"] == uid
    assert moved["metadata"]["labels"]["fleetlet.io/bundle"] == b
    assert moved["data"] == {"x": "2"}
    for name in (a, b):
        assert conditions(kube, name)["Ready"]["status"] == "True"


def test_a_bundle_applied_as_a_service_account_that_may_not_create_cluster_roles(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns = lab.name("sa")
    role = lab.name("reader")
    # The ServiceAccount may manage ConfigMaps in its app namespace, nothing cluster-wide.
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, field_manager="test"
    )
    kube.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "deployer", "namespace": namespace}},
        field_manager="test",
    )  # fmt: skip
    kube.apply(
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "deployer", "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]},
        field_manager="test",
    )  # fmt: skip
    kube.apply(
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "deployer", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
         "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": namespace}]},
        field_manager="test",
    )  # fmt: skip
    cluster_role = (
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n"
        f"metadata:\n  name: {role}\nrules: []\n"
    )
    name = lab.name("app")
    files = {"cm.yaml": configmap("app", ns, {"a": "1"}), "role.yaml": cluster_role}
    other = lab.name("other")
    lab.publish(
        [
            _bundle(lab, name, files, serviceAccountName="deployer", group="g"),
            _bundle(lab, other, {"cm.yaml": configmap("other", ns, {"b": "1"})}, group="g"),
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    result = agent.tick()
    assert result.outbound is not None and result.outbound.failed == ("g",)
    ready = conditions(kube, name)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ApplyFailed", ready
    assert "ClusterRole" in ready["message"] and "forbidden" in ready["message"], ready
    assert "nothing was written" in ready["message"]
    # Nothing of the group was applied: not the ServiceAccount's ConfigMap, not the other bundle's.
    assert live(kube, "v1", "ConfigMap", "app", ns) is None
    assert live(kube, "v1", "ConfigMap", "other", ns) is None
    assert live(kube, "rbac.authorization.k8s.io/v1", "ClusterRole", role) is None


def test_an_optional_service_monitor_is_skipped_and_listed_and_a_required_one_fails_clearly(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns = lab.name("mon")
    monitor = (
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\n"
        f"metadata:\n  name: web\n  namespace: {ns}\nspec:\n  endpoints: [{{port: http}}]\n"
    )
    files = {
        "01_ns.yaml": namespace_manifest(ns),
        "02_svc.yaml": service("web", ns),
        "03_mon.yaml": monitor,
    }
    optional, required = lab.name("optional"), lab.name("required")
    lab.publish(
        [
            _bundle(
                lab,
                optional,
                files,
                optional=[{"apiGroup": "monitoring.coreos.com", "kind": "ServiceMonitor"}],
            ),
            _bundle(
                lab,
                required,
                {"mon.yaml": monitor.replace("name: web", "name: other")},
                dependsOn=[optional],
            ),
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    result = agent.tick()
    assert result.outbound is not None
    assert result.outbound.moved == (optional,)
    assert result.outbound.failed == (required,)
    assert live(kube, "v1", "Service", "web", ns) is not None
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", optional)
    assert bd is not None and bd["status"]["resources"]["skipped"] == 1
    assert "skipped" in conditions(kube, optional)["Ready"]["message"]
    assert "ServiceMonitor" in conditions(kube, optional)["Ready"]["message"]
    failed = conditions(kube, required)["Ready"]
    assert failed["reason"] == "ApiNotServed", failed
    assert (
        "ServiceMonitor" in failed["message"] and "mark the manifest optional" in failed["message"]
    )


def test_a_custom_resource_of_an_earlier_groups_crd_gets_the_target_namespace(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    # When the set is rendered the CRD (of the platform group) is not served yet; the scope of
    # its kind comes from the CRD in the set, so a Promotion written without a namespace lands
    # in the bundle's target namespace instead of being refused.
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns = lab.name("promo")
    group = f"{lab.suffix}.promo.test"
    defs, user = lab.name("defs"), lab.name("user")
    promotion = f"apiVersion: {group}/v1\nkind: Promotion\nmetadata:\n  name: sale\nspec: {{}}\n"
    lab.publish(
        [
            _bundle(
                lab,
                defs,
                {
                    "01_ns.yaml": namespace_manifest(ns),
                    "02_crd.yaml": crd_manifest(group, "promotions", "Promotion"),
                },
                group="platform",
            ),
            _bundle(
                lab,
                user,
                {"promotion.yaml": promotion},
                group="shop",
                dependsOn=["platform"],
                formatOptions={"targetNamespace": ns},
            ),
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    agent.tick()
    agent.tick()
    assert conditions(kube, user)["Ready"]["status"] == "True", conditions(kube, user)["Ready"]
    assert live(kube, f"{group}/v1", "Promotion", "sale", ns) is not None
