"""Helm bundles end to end: a chart from a Helm repository (served over http on loopback,
indexed by the real ``helm repo index``), resolved and pinned by ``hub publish``, signed, pulled
by the agent, rendered with the real helm for the live cluster, applied, upgraded (new values, a
new chart version in the range), and rolled back when the chart's pods never get ready (kwok
keeps an image tagged ``broken`` unready).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.kube import KubeClient
from tests.fleetlab import Lab, conditions, live
from tests.realenv.helm import HelmCli, StaticFiles, copy_chart
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def charts(tmp_path: Path) -> Iterator[StaticFiles]:
    server = StaticFiles(tmp_path / "helm-repo")
    yield server
    server.close()


def add_version(helm: HelmCli, charts: StaticFiles, tmp_path: Path, version: str) -> None:
    chart = copy_chart("greeter", tmp_path / f"greeter-{version}", version=version)
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("replicas: 1", "replicas: 1\nflavour: " + version))
    template = chart / "templates" / "configmap.yaml"
    template.write_text(template.read_text() + '  chartVersion: "{{ .Chart.Version }}"\n')
    helm.package(chart, charts.root)
    helm.index(charts.root, charts.url())


def helm_bundle(lab: Lab, charts: StaticFiles, name: str, ns: str, **values: Any) -> dict[str, Any]:
    return {
        "name": name,
        "sources": [
            {"kind": "helm", "uri": charts.url().rstrip("/"), "chart": "greeter", "version": "^1.0"}
        ],
        "format": "helm",
        "formatOptions": {
            "targetNamespace": ns,
            "values": {
                "namespace": {"create": True},
                "hooks": {"enabled": False},
                "greeting": "hi from ${cluster.name}",
                "audience": "the ${cluster.labels.tier} tier",
                **values,
            },
        },
        "healthChecks": {"timeoutSeconds": 20},
    }


def test_helm_chart_installs_upgrades_and_rolls_back_through_hub_and_agent(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path, charts: StaticFiles
) -> None:
    helm = HelmCli(tmp_path / "helm-home")
    add_version(helm, charts, tmp_path, "1.0.0")
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    web, ns = lab.name("greeter"), lab.name("greet")
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")

    report = lab.publish([helm_bundle(lab, charts, web, ns)])
    assert report is not None
    first = agent.tick()
    assert first.outbound is not None and first.outbound.moved == (web,), first
    assert conditions(kube, web)["Ready"]["status"] == "True"
    settings = live(kube, "v1", "ConfigMap", f"{web}-settings", ns)
    assert settings is not None
    # Values templated per cluster by the hub; capabilities from this very cluster.
    assert settings["data"]["message"] == "hi from edge-1, the canary tier!"
    assert settings["data"]["chartVersion"] == "1.0.0"
    assert settings["data"]["kubeVersion"] == kube.server_version()
    assert settings["data"]["release"] == web  # the release name is the bundle's
    widget = live(kube, "greeter.fleetlet.test/v1", "Widget", web, ns)
    assert widget is not None  # the chart's CRD (crds/) went first, then its resource
    # Only `helm template` ran: no Helm release Secret anywhere in the namespace.
    secrets = kube.list("v1", "Secret", namespace=ns)
    assert not [s for s in secrets if s.get("type") == "helm.sh/release.v1"]

    # Upgrade: new values, and a new chart version inside the range (the hub picks it).
    add_version(helm, charts, tmp_path, "1.1.0")
    lab.publish([helm_bundle(lab, charts, web, ns, greeting="hello again", replicas=2)])
    second = agent.tick()
    assert second.outbound is not None and second.outbound.moved == (web,), second
    settings = live(kube, "v1", "ConfigMap", f"{web}-settings", ns)
    assert settings is not None
    assert settings["data"]["message"] == "hello again, the canary tier!"
    assert settings["data"]["chartVersion"] == "1.1.0"
    deployment = live(kube, "apps/v1", "Deployment", web, ns)
    assert deployment is not None and deployment["spec"]["replicas"] == 2

    # A release whose pods never get ready: the bundle goes back to the last healthy one.
    lab.publish(
        [helm_bundle(lab, charts, web, ns, greeting="broken", image="example/greeter:broken")]
    )
    third = agent.tick()
    assert third.outbound is not None and third.outbound.rolled_back == (web,), third
    deployment = live(kube, "apps/v1", "Deployment", web, ns)
    assert deployment is not None
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "example/greeter:1.0"
    settings = live(kube, "v1", "ConfigMap", f"{web}-settings", ns)
    assert settings is not None and settings["data"]["message"] == "hello again, the canary tier!"
    ready = conditions(kube, web)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "RolledBack", ready


def test_an_http_chart_whose_dependency_is_not_vendored_is_pinned_signed_and_applied(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path, charts: StaticFiles
) -> None:
    """An umbrella chart .tgz over http lists greeter (^1.0, from the Helm repository) without
    vendoring it: `hub publish` pins the archive and the dependency into the signed set, the
    agent fetches both by pin and helm renders the subchart for the live cluster."""
    helm = HelmCli(tmp_path / "helm-home")
    add_version(helm, charts, tmp_path, "1.0.0")
    add_version(helm, charts, tmp_path, "1.1.0")
    shop = tmp_path / "shop-src" / "shop"
    (shop / "templates").mkdir(parents=True)
    (shop / "Chart.yaml").write_text(
        "apiVersion: v2\nname: shop\nversion: 0.1.0\ndependencies:\n  - name: greeter\n"
        f"    version: ^1.0\n    repository: {charts.url().rstrip('/')}\n"
    )
    (shop / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-shop\n"
        "data: {chart: shop}\n"
    )
    # Made without `helm package`, which would insist on vendoring greeter.
    archives = tmp_path / "archives"
    archives.mkdir()
    with tarfile.open(archives / "shop-0.1.0.tgz", "w:gz") as archive:
        archive.add(shop, arcname="shop")
    served = StaticFiles(archives)
    try:
        kube = KubeClient(kubeconfig=str(crds.kubeconfig))
        web, ns = lab.name("shop"), lab.name("shop")
        agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
        bundle = {
            "name": web,
            "sources": [{"kind": "http", "uri": served.url("shop-0.1.0.tgz")}],
            "format": "helm",
            "formatOptions": {
                "targetNamespace": ns,
                "values": {
                    "greeter": {
                        "namespace": {"create": True},
                        "hooks": {"enabled": False},
                        "audience": "${cluster.name}",
                    }
                },
            },
            "healthChecks": {"timeoutSeconds": 20},
        }
        assert lab.publish([bundle]) is not None
        first = agent.tick()
        assert first.outbound is not None and first.outbound.moved == (web,), first
        assert conditions(kube, web)["Ready"]["status"] == "True"
        assert live(kube, "v1", "ConfigMap", f"{web}-shop", ns) is not None
        settings = live(kube, "v1", "ConfigMap", f"{web}-settings", ns)
        assert settings is not None
        assert settings["data"]["message"] == "hello, edge-1!"
        assert settings["data"]["chartVersion"] == "1.1.0"  # the newest in ^1.0, pinned
        # The agent read neither the index nor anything but the two pinned archives.
        assert served.gets.count("/shop-0.1.0.tgz") == 2  # the hub's read, the agent's fetch
        assert charts.gets.count("/index.yaml") == 1  # the hub's, once
    finally:
        served.close()


def hub_diff(lab: Lab, fleet: Path, tmp_path: Path, *more: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", "diff", str(fleet), "--repo", lab.url,
         "--cache-dir", str(tmp_path / "diff-cache"), "-q", "-o", "json", *more],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {c["cluster"]: c for c in json.loads(done.stdout)["clusters"]}


def context(diff: str) -> dict[str, Any]:
    """The unchanged lines of a unified diff of a YAML object, as keys and values."""
    out: dict[str, Any] = {}
    for line in diff.splitlines():
        if line.startswith(" "):
            out.update(yaml.safe_load(line.strip()))
    return out


def configmap_change(preview: dict[str, Any]) -> dict[str, Any]:
    (group,) = preview["groups"].values()
    (change,) = [o for o in group["objects"] if o["kind"] == "ConfigMap"]
    assert isinstance(change, dict)
    return change


def test_hub_diff_renders_helm_as_the_agent_did_with_the_facts_and_history_it_reported(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path, charts: StaticFiles
) -> None:
    """A chart whose output depends on `.Capabilities.KubeVersion`, `.APIVersions.Has` and
    `.Release.IsUpgrade`: the agent reports the facts its render used (cluster.json beside its
    status), and `hub diff --cluster` renders the published set exactly as the cluster runs it
    (an upgrade, this cluster's version and APIs); without reported facts it says it used the
    defaults, as an install."""
    helm = HelmCli(tmp_path / "helm-home")
    helm.package(copy_chart("capable", tmp_path / "capable"), charts.root)
    helm.index(charts.root, charts.url())
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    name, ns = lab.name("capable"), lab.name("cap")

    def bundle(greeting: str) -> dict[str, Any]:
        return {
            "name": name,
            "sources": [
                {
                    "kind": "helm",
                    "uri": charts.url().rstrip("/"),
                    "chart": "capable",
                    "version": "1.0.0",
                }
            ],
            "format": "helm",
            "createNamespace": True,
            "formatOptions": {"targetNamespace": ns, "values": {"greeting": greeting}},
        }

    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    for greeting in ("first", "second"):  # an install, then an upgrade
        assert lab.publish([bundle(greeting)]) is not None
        moved = agent.tick()
        assert moved.outbound is not None and moved.outbound.moved == (name,), moved
    cm = live(kube, "v1", "ConfigMap", f"{name}-facts", ns)
    assert cm is not None
    on_cluster = cm["data"]
    assert on_cluster["isUpgrade"] == "true" and on_cluster["message"] == "second"
    assert on_cluster["hasBundleDeployments"] == "true"
    assert on_cluster["kubeVersion"] == kube.server_version()

    fleet = lab.fleet_dir([bundle("third")])
    with_facts = hub_diff(lab, fleet, tmp_path, "--cluster", "edge-1",
                          "--status-repo", lab.status_url)  # fmt: skip
    preview = with_facts["edge-1"]["preview"]
    assert not any("cluster facts" in note for note in preview.get("notes", [])), preview
    change = configmap_change(preview)
    assert change["paths"] == ["data.message"]
    # The published set rendered on the hub is what the agent rendered: the ConfigMap's other
    # lines are unchanged context in the diff, with this cluster's own values.
    unchanged = context(change["diff"])
    for key in ("hasBundleDeployments", "isUpgrade", "kubeVersion"):
        assert unchanged[key] == on_cluster[key], (key, change["diff"])

    # Where the hub finds no facts (the agents' status repository not given, an older agent):
    # Helm's defaults, as an install, and the output says so for that cluster.
    without = hub_diff(lab, fleet, tmp_path, "--cluster", "edge-1")
    notes = without["edge-1"]["preview"]["notes"]
    assert any(
        n.startswith("cluster edge-1: its agent reported no cluster facts")
        and "default capabilities" in n
        and "as an install" in n
        for n in notes
    ), notes
    change = configmap_change(without["edge-1"]["preview"])
    defaults = context(change["diff"])
    assert defaults["isUpgrade"] == "false" and defaults["hasBundleDeployments"] == "false"
