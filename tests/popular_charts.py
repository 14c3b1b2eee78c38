"""Popular public charts install through hub and agent as ``helm install --create-namespace
--wait`` installs them: the differential install tier (``-m charts``; run by the default test
command like every other test). The tests are ``tests/test_popular_charts*.py``, the charts
split among them (``PARTS``) so that ``--dist loadfile`` spreads the tier over the workers.

Each vendored chart (tests/assets/popular-charts, licenses beside them) is installed with its
default values (storage aside where the control plane has no provisioner: ``VALUES``) twice
on the same control plane (kube-apiserver, controller-manager, scheduler,
kwok running the pods), into a new namespace of the same name and as the same release name:
once with the real pinned helm (``helm install --create-namespace --wait``), then, after
``helm uninstall`` and the namespace are gone, published by the hub to an agent. Compared:
what each install made (kind, namespace, name of every object that appeared and that no
controller owns; Helm's release Secret aside, fleetlet keeps no release Secrets), which
includes the hook objects left behind; and both are Ready (helm's wait passed, the
BundleDeployment is Ready) on the first try.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api.yamlio import SAFE_LOADER
from agent.health import assess
from agent.install.crd_removal import remove_crds
from agent.kube import ApiNotServedError, KubeClient, NotFoundError, ObjectRef
from tests.fleetlab import Lab, conditions
from tests.realenv.helm import HelmCli, StaticFiles
from tests.realenv.kube import Cluster

ASSETS = Path(__file__).resolve().parent / "assets" / "popular-charts"

CHARTS = {
    "ingress-nginx": "ingress-nginx-4.15.1.tgz",
    "cert-manager": "cert-manager-v1.21.1.tgz",
    "grafana": "grafana-10.5.15.tgz",
    "external-dns": "external-dns-1.21.1.tgz",
    "traefik": "traefik-41.3.0.tgz",
    "argo-cd": "argo-cd-10.1.1.tgz",
    "postgresql": "postgresql-17.1.0.tgz",
    "metrics-server": "metrics-server-3.13.1.tgz",
    "kube-prometheus-stack": "kube-prometheus-stack-88.5.3.tgz",
    "kyverno": "kyverno-3.6.4.tgz",
}
"""The charts of the tier, by name (the archive's chart name), as vendored."""

PARTS = {
    "test_popular_charts": [
        "ingress-nginx", "cert-manager", "grafana", "external-dns", "traefik", "postgresql",
        "metrics-server",
    ],
    # Each of these makes many large CRDs (helm and the agent each install, then remove them):
    # a file each, so that the tier's longest file stays short.
    "test_popular_charts_argo_cd": ["argo-cd"],
    "test_popular_charts_kube_prometheus_stack": ["kube-prometheus-stack"],
    "test_popular_charts_kyverno": ["kyverno"],
}  # fmt: skip
"""The tier's test files (tests/NAME.py) and the charts each installs: every chart once."""
assert sorted(c for part in PARTS.values() for c in part) == sorted(CHARTS)

VALUES: dict[str, dict[str, Any]] = {
    # The test control plane has no storage provisioner (kind has local-path): a claim would
    # stay Pending for helm as for fleetlet. Storage aside, the defaults.
    "postgresql": {"primary": {"persistence": {"enabled": False}}},
}
"""Values other than the defaults, the same for both installs."""

HEALTH: dict[str, dict[str, Any]] = {
    # kwok's pods serve nothing, and this control plane is outside any pod network: an
    # APIService is never Available here. `Endpoints` still waits until its Service has ready
    # endpoints (helm's --wait does not look at APIServices at all); a real cluster keeps the
    # default, `Available` (asserted below for the APIService the chart makes).
    "metrics-server": {"apiServices": "Endpoints"},
}
"""The bundle's health options other than the defaults, and why."""

Made = set[tuple[str, str | None, str]]
"""What an install made: (kind, namespace or None, name)."""

# Made by the control plane in every new namespace, not by an install.
_NAMESPACE_DEFAULTS = {("ServiceAccount", "default"), ("ConfigMap", "kube-root-ca.crt")}


@pytest.fixture
def chart_repo(tmp_path: Path) -> Iterator[StaticFiles]:
    """A Helm repository on loopback serving the vendored charts (indexed by real helm)."""
    server = StaticFiles(tmp_path / "popular")
    for archive in CHARTS.values():
        shutil.copy(ASSETS / archive, server.root / archive)
    HelmCli(tmp_path / "helm-index").index(server.root, server.url())
    yield server
    server.close()


def chart_version(name: str) -> str:
    return CHARTS[name].removeprefix(f"{name}-").removesuffix(".tgz")


def helm(
    tmp_path: Path, cluster: Cluster, *args: str, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """The real pinned helm against ``cluster`` (its own HOME)."""
    cli = HelmCli(tmp_path / "helm-home")
    done = subprocess.run(
        [str(cli.binary), "--kubeconfig", str(cluster.kubeconfig), *args],
        env={"PATH": "/usr/bin:/bin", "HOME": str(cli.home)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0 or not check, f"helm {' '.join(args)}: {done.stderr.strip()}"
    return done


HELM_MISSED_A_JOB = re.compile(
    r"failed (pre|post)-install: resource Job/\S+ not ready\. status: NotFound"
)
"""Helm's own flake: its hook wait polls, and misses a hook Job that completes and is deleted
at once (``ttlSecondsAfterFinished: 0``, kubernetes/ingress-nginx#13474), more often on a
loaded machine. The baseline is then installed again; fleetlet's install (watched) must pass
on its first try."""

HELM_TRIES = 3


def helm_install(tmp_path: Path, cluster: Cluster, name: str, release: str) -> None:
    """``helm install --create-namespace --wait`` of chart ``name``, tried again (after
    ``helm uninstall``) only when helm missed a hook Job that completed (``HELM_MISSED_A_JOB``)."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUES.get(name, {})))
    for attempt in range(1, HELM_TRIES + 1):
        done = helm(
            tmp_path, cluster, "install", release, str(ASSETS / CHARTS[name]),
            "--values", str(values), "--namespace", release, "--create-namespace",
            "--wait", "--timeout", "4m", check=False,
        )  # fmt: skip
        if done.returncode == 0:
            return
        assert HELM_MISSED_A_JOB.search(done.stderr) and attempt < HELM_TRIES, done.stderr
        helm(tmp_path, cluster, "uninstall", release, "--namespace", release, "--wait")


def kinds_of(tmp_path: Path, cluster: Cluster, name: str, release: str) -> set[tuple[str, str]]:
    """The (apiVersion, kind) of every object the chart renders, hooks and CRDs included."""
    values = tmp_path / "template-values.yaml"
    values.write_text(yaml.safe_dump(VALUES.get(name, {})))
    out = helm(
        tmp_path, cluster, "template", release, str(ASSETS / CHARTS[name]),
        "--namespace", release, "--include-crds", "--values", str(values),
    )  # fmt: skip
    # libyaml's loader, as the agent reads renders: the pure-Python one takes 8 s for
    # kyverno's 1.6 MB of CRDs on the loaded machine, 0.4 s this way.
    return {
        (doc["apiVersion"], doc["kind"])
        for doc in yaml.load_all(out.stdout, Loader=SAFE_LOADER)
        if isinstance(doc, dict) and doc.get("kind")
    }


def snapshot(kube: KubeClient, kinds: set[tuple[str, str]], *, agent: str = "") -> Made:
    """Every object of these kinds, but those a controller made (owner references), those a
    new namespace gets by itself and those in the agent's namespace (its own records)."""
    found: Made = set()
    kube.forget_discovery()
    for api_version, kind in sorted(kinds):
        try:
            items = kube.list(api_version, kind)
        except (ApiNotServedError, NotFoundError):
            continue  # a CRD's kind not installed (now), or its CRD just deleted
        for obj in items:
            meta = obj.get("metadata") or {}
            if meta.get("ownerReferences") or (kind, meta.get("name")) in _NAMESPACE_DEFAULTS:
                continue
            if agent and agent in (meta.get("namespace"), meta.get("name")):
                continue
            if kind == "Secret" and obj.get("type") == "helm.sh/release.v1":
                continue  # Helm's bookkeeping; fleetlet keeps its revisions itself
            found.add((kind, meta.get("namespace"), str(meta.get("name"))))
    return found


def delete_all(kube: KubeClient, made: Made, kinds: set[tuple[str, str]]) -> None:
    """Delete what an install left (the namespace last) and wait until it is gone."""
    api_of = {kind: api for api, kind in kinds}
    refs = [
        ObjectRef(api_of.get(kind, "v1"), kind, name, namespace)
        for kind, namespace, name in sorted(made, key=lambda m: m[0] == "Namespace")
    ]
    crds = [r.name for r in refs if r.kind == "CustomResourceDefinition"]
    refs = [r for r in refs if r.kind != "CustomResourceDefinition"]
    for ref in refs:
        kube.delete(ref, propagation="Background")
    deadline = time.monotonic() + 300
    # One at a time, each kind's cache warm first (agent.install.crd_removal): deleted all at
    # once, kyverno's waited once 256 s here for the API server's CRD finalizer.
    left = remove_crds(kube, crds, deadline=deadline)
    assert not left, f"CRDs {left} were not deleted"
    for ref in refs:
        while kube.get(ref) is not None:
            assert time.monotonic() < deadline, f"{ref} was not deleted"
            time.sleep(0.5)


def bundle(repo: StaticFiles, name: str, release: str) -> dict[str, Any]:
    return {
        "name": release,
        "sources": [
            {
                "kind": "helm",
                "uri": repo.url().rstrip("/"),
                "chart": name,
                "version": chart_version(name),
            }
        ],
        "format": "helm",
        "createNamespace": True,
        "formatOptions": {"targetNamespace": release, "values": VALUES.get(name, {})},
        "healthChecks": {"timeoutSeconds": 240, **HEALTH.get(name, {})},
    }


def install_both(
    name: str,
    lab: Lab,
    crds: Cluster,
    namespace: str,
    tmp_path: Path,
    chart_repo: StaticFiles,
) -> None:
    """Install chart ``name`` with helm, remove it, install it through hub and agent, and
    compare (the module's docstring)."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    release = lab.name(name)
    kinds = kinds_of(tmp_path, crds, name, release) | {("v1", "Namespace")}
    before = snapshot(kube, kinds, agent=namespace)

    # 1. Real helm, into a new namespace, waiting until everything is ready.
    helm_install(tmp_path, crds, name, release)
    by_helm = snapshot(kube, kinds, agent=namespace) - before
    assert ("Namespace", None, release) in by_helm and len(by_helm) > 3, by_helm
    helm(tmp_path, crds, "uninstall", release, "--namespace", release, "--wait")
    delete_all(kube, snapshot(kube, kinds, agent=namespace) - before, kinds)  # hooks, the namespace
    left = snapshot(kube, kinds, agent=namespace) - before
    assert left == set(), f"left after helm uninstall and the deletions: {sorted(left)}"

    # 2. Published by the hub, installed by the agent, on the first try.
    try:
        assert lab.publish([bundle(chart_repo, name, release)]) is not None
        agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
        first = agent.tick()
        ready = conditions(kube, release)["Ready"]
        assert ready["status"] == "True", ready
        assert first.outbound is not None and first.outbound.moved == (release,), first
        by_fleetlet = snapshot(kube, kinds, agent=namespace) - before
        only_fleetlet, only_helm = sorted(by_fleetlet - by_helm), sorted(by_helm - by_fleetlet)
        assert (only_fleetlet, only_helm) == ([], []), (
            f"fleetlet only: {only_fleetlet}, helm only: {only_helm}"
        )
        for kind, _, api_name in sorted(by_fleetlet):
            if kind == "APIService":
                # Healthy by its ready endpoints; by default fleetlet would still wait, as the
                # API server does not reach the pods (helm's --wait never looks).
                api = kube.get(ObjectRef("apiregistration.k8s.io/v1", kind, api_name))
                judged = assess(api, api_service_endpoints=True), assess(api)
                assert [j.reason for j in judged] == ["EndpointsReady", "FailedDiscoveryCheck"], api
    finally:
        kube.delete(ObjectRef("fleetlet.io/v1alpha1", "BundleDeployment", release))
        delete_all(kube, snapshot(kube, kinds, agent=namespace) - before, kinds)
