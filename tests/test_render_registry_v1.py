"""The ``registry+v1`` format against operator-controller's own rendering of public bundles.

``tests/assets/olm-bundles`` holds two bundles of operator-controller's regression suite (the
argocd operator, trimmed to one CRD, and its webhook test operator) and the files
operator-controller's renderer wrote for them (``test/regression/convert``, see the README
there). Each case here converts the same bundle with the same install and watch namespaces and
compares object for object. Normalisations, each because of how operator-controller writes
files, not what it applies: ``status`` is dropped (never applied), ``creationTimestamp: null``
is dropped (a Go serialisation artefact, on some kinds only), and cluster-scoped webhook
configurations lose the namespace operator-controller writes on them (the API server ignores
it; fleetlet does not write it).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.render.facts import ClusterFacts
from agent.render.formats import render_bundle
from agent.render.manifests import Manifest
from agent.render.plain import RenderRequest
from agent.render.registry_v1 import RegistryV1Error, convert, load_bundle

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "tests" / "assets" / "olm-bundles"
ARGOCD = ASSETS / "bundles" / "argocd-operator.v0.6.0"
WEBHOOK = ASSETS / "bundles" / "webhook-operator.v0.0.5"
_CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}

# (bundle, expected directory, install namespace, watch namespace), as in operator-controller's
# test/regression/convert/generate-manifests.go.
CASES = {
    "all-namespaces": ("argocd-operator.v0.6.0", "argocd-system", None),
    "single-namespace": ("argocd-operator.v0.6.0", "argocd-system", "argocd-watch"),
    "own-namespace": ("argocd-operator.v0.6.0", "argocd-system", "argocd-system"),
    "all-webhook-types": ("webhook-operator.v0.0.5", "webhook-system", None),
}


def _normal(obj: Manifest) -> Manifest:
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    meta = obj["metadata"]
    if "creationTimestamp" in meta and meta["creationTimestamp"] is None:
        del meta["creationTimestamp"]
    if obj["kind"] in _CLUSTER_SCOPED:
        meta.pop("namespace", None)
    return obj


def _keyed(objects: list[Manifest]) -> dict[tuple[str, str, str], Manifest]:
    normal = [_normal(o) for o in objects]
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in normal
    }


def _expected(bundle: str, case: str) -> list[Manifest]:
    directory = ASSETS / "expected" / bundle / case
    return [yaml.safe_load(p.read_text()) for p in sorted(directory.iterdir())]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_conversion_matches_operator_controllers_rendering(case: str) -> None:
    bundle_name, install, watch = CASES[case]
    bundle = load_bundle(ASSETS / "bundles" / bundle_name, request=RenderRequest())

    # operator-controller rendered these files without a certificate provider.
    got = _keyed(convert(bundle, install_namespace=install, watch_namespace=watch,
                         cert_manager=False))  # fmt: skip

    expected = _keyed(_expected(bundle_name, case))
    assert sorted(got) == sorted(expected)
    for key, obj in expected.items():
        assert got[key] == obj, key


def test_the_format_renders_what_the_conversion_gives_with_install_and_watch_options() -> None:
    request = RenderRequest(
        source="argocd",
        options={"installNamespace": "argocd-system", "watchNamespace": "argocd-watch"},
    )
    objects = render_bundle(ARGOCD, format="registry+v1", request=request)

    assert _keyed(objects) == _keyed(_expected("argocd-operator.v0.6.0", "single-namespace"))
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["olm.targetNamespaces"] == "argocd-watch"
    assert annotations["olm.operatorNamespace"] == "argocd-system"
    # The roles are where the operator watches, bound to its account where it runs.
    roles = [o for o in objects if o["kind"] in ("Role", "RoleBinding")]
    assert {o["metadata"]["namespace"] for o in roles} == {"argocd-watch"}


def test_target_namespace_is_the_install_namespace_when_none_is_given() -> None:
    request = RenderRequest(source="argocd", namespace="argocd-system")
    objects = render_bundle(ARGOCD, format="registry+v1", request=request)
    assert _keyed(objects) == _keyed(_expected("argocd-operator.v0.6.0", "all-namespaces"))


def test_webhooks_get_cert_manager_certificates_as_operator_controller_gives_them() -> None:
    """operator-controller's default certificate provider (cert-manager): the objects of its
    certproviders/certmanager.go, the Secret mounted where the operator expects it."""
    objects = render_bundle(
        WEBHOOK,
        format="registry+v1",
        request=RenderRequest(source="webhooks", options={"installNamespace": "webhook-system"}),
    )
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    service = "webhook-operator-controller-manager-service"
    cert = f"{service}-cert"
    issuer = "webhook-operator-controller-manager-service-c-selfsigned-issuer"  # cut to 63
    assert by_kind[("Issuer", issuer)]["spec"] == {"selfSigned": {}}
    assert by_kind[("Certificate", cert)]["spec"] == {
        "secretName": cert,
        "commonName": f"{service}.webhook-system",
        "usages": ["server auth"],
        "dnsNames": [
            f"{service}.webhook-system",
            f"{service}.webhook-system.svc",
            f"{service}.webhook-system.svc.cluster.local",
        ],
        "issuerRef": {"name": issuer},
        "duration": "17520h0m0s",
        "renewBefore": "24h0m0s",
    }
    inject = {"cert-manager.io/inject-ca-from": f"webhook-system/{cert}"}
    for key in (
        ("ValidatingWebhookConfiguration", "vwebhooktest-v1.kb.io"),
        ("MutatingWebhookConfiguration", "mwebhooktest-v1.kb.io"),
        ("CustomResourceDefinition", "webhooktests.webhook.operators.coreos.io"),
    ):
        annotations = by_kind[key]["metadata"]["annotations"]
        assert annotations.items() >= inject.items(), key
    pod = by_kind[("Deployment", "webhook-operator-controller-manager")]["spec"]["template"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    # The bundle's own volume at the certificate path is replaced by the Secret.
    assert set(volumes) == {"webhook-cert", "apiservice-cert"}
    assert volumes["webhook-cert"]["secret"]["secretName"] == cert
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {m["mountPath"] for m in mounts} == {
        "/tmp/k8s-webhook-server/serving-certs",
        "/apiserver.local.config/certificates",
    }


def test_webhooks_are_refused_on_a_cluster_without_cert_manager() -> None:
    facts = ClusterFacts.of(kube_version="v1.37.2", api_versions=["v1", "apps/v1"])
    request = RenderRequest(
        source="webhooks", options={"installNamespace": "webhook-system"}, cluster=facts
    )
    with pytest.raises(RegistryV1Error) as refused:
        render_bundle(WEBHOOK, format="registry+v1", request=request)
    assert refused.value.rule == "WebhooksNeedCertManager"
    assert "does not serve cert-manager.io/v1: install cert-manager first" in str(refused.value)

    served = ClusterFacts.of(kube_version="v1.37.2", api_versions=["v1", "cert-manager.io/v1"])
    request = RenderRequest(
        source="webhooks", options={"installNamespace": "webhook-system"}, cluster=served
    )
    assert render_bundle(WEBHOOK, format="registry+v1", request=request)


def _bundle_copy(tmp_path: Path, source: Path) -> Path:
    copied = tmp_path / source.name
    shutil.copytree(source, copied)
    return copied


def _edit_csv(bundle: Path, edit: Any) -> None:
    path = next((bundle / "manifests").glob("*clusterserviceversion.yaml"))
    csv = yaml.safe_load(path.read_text())
    edit(csv)
    path.write_text(yaml.safe_dump(csv))


@pytest.mark.parametrize(
    ("modes", "install", "watch", "message"),
    [
        (["OwnNamespace"], "ops", None, "watching all namespaces (no formatOptions.watchNamespace)"
         " is not supported; set formatOptions.watchNamespace (the CSV supports: OwnNamespace)"),
        (["AllNamespaces"], "ops", "ops", "watching its own namespace 'ops' is not supported"),
        (["OwnNamespace", "AllNamespaces"], "ops", "apps",
         "watching another namespace ('apps') is not supported (the CSV supports: "
         "AllNamespaces, OwnNamespace)"),
        (["MultiNamespace"], "ops", None, "the CSV supports none of the install modes"),
        (["AllNamespaces"], None, None, "no install namespace: set formatOptions.installNamespace"),
    ],
)  # fmt: skip
def test_install_modes_are_checked_against_the_csv(
    tmp_path: Path, modes: list[str], install: str | None, watch: str | None, message: str
) -> None:
    bundle = _bundle_copy(tmp_path, ARGOCD)

    def set_modes(csv: dict[str, Any]) -> None:
        csv["spec"]["installModes"] = [
            {"type": t, "supported": t in modes}
            for t in ("OwnNamespace", "SingleNamespace", "MultiNamespace", "AllNamespaces")
        ]

    _edit_csv(bundle, set_modes)
    options = {k: v for k, v in {"installNamespace": install, "watchNamespace": watch}.items() if v}
    with pytest.raises(RegistryV1Error) as refused:
        render_bundle(bundle, format="registry+v1", request=RenderRequest(options=options))
    assert message in str(refused.value)


def test_every_problem_of_a_bundle_is_reported_at_once(tmp_path: Path) -> None:
    bundle = _bundle_copy(tmp_path, WEBHOOK)

    def break_it(csv: dict[str, Any]) -> None:
        csv["spec"]["install"]["spec"]["deployments"][0]["name"] = "Not_A_Name"
        csv["spec"]["apiservicedefinitions"] = {"owned": [{"name": "v1.example.com"}]}
        csv["spec"]["webhookdefinitions"][1]["rules"][0]["apiGroups"] = ["*"]

    _edit_csv(bundle, break_it)
    (bundle / "manifests" / "job.yaml").write_text(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: migrate}\n"
    )
    with pytest.raises(RegistryV1Error) as refused:
        render_bundle(bundle, format="registry+v1", request=RenderRequest(namespace="ops"))
    text = str(refused.value)
    assert refused.value.rule == "InvalidBundle"
    for expected in (
        "strategy deployment name 'Not_A_Name' is not a DNS-1123 subdomain",
        "names deployment 'webhook-operator-controller-manager', which the CSV does not have",
        "webhook 'mwebhooktest-v1.kb.io' may not intercept API group '*'",
        "Job migrate: kind not supported in a registry+v1 bundle",
        "APIService definitions (spec.apiservicedefinitions.owned) are not supported",
    ):
        assert expected in text


def test_a_bundle_shipping_what_the_csv_generates_renders_one_of_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """security-profiles-operator and OpenShift's opentelemetry-operator ship the CSV's
    ServiceAccount and webhook Service as files: operator-controller renders both copies and
    applies them in order, so the later one is the object, and so does fleetlet."""
    bundle = _bundle_copy(tmp_path, WEBHOOK)
    for name in ("serviceaccount.yaml", "webhook-service.yaml"):
        shutil.copy(ASSETS / "own-objects" / name, bundle / "manifests" / name)
    with caplog.at_level("INFO", logger="agent.render.registry_v1"):
        objects = render_bundle(
            bundle, format="registry+v1", request=RenderRequest(namespace="ops")
        )
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert account["metadata"]["labels"]["app.kubernetes.io/part-of"] == "webhook-operator"
    assert account["metadata"]["namespace"] == "ops"
    (service,) = [o for o in objects if o["kind"] == "Service"]
    # The generated one, with its cert-manager wiring, is applied after the bundle's file.
    assert "labels" not in service["metadata"]
    assert [p.get("name") for p in service["spec"]["ports"]] != ["https"]
    merged = [r.getMessage() for r in caplog.records]
    assert any(
        "ServiceAccount ops/webhook-operator-controller-manager comes 2 times (generated from "
        "the CSV, manifests/): merged into the one from manifests/" in m
        for m in merged
    ), merged
    assert any(
        "Service ops/webhook-operator-controller-manager-service comes 2 times (manifests/, "
        "generated from the CSV): merged into the one generated from the CSV" in m
        for m in merged
    ), merged


def test_a_template_bundle_with_an_unfilled_version_is_refused(tmp_path: Path) -> None:
    bundle = _bundle_copy(tmp_path, WEBHOOK)
    _edit_csv(bundle, lambda csv: csv["spec"].__setitem__("version", "0${VERSION}"))
    with pytest.raises(
        RegistryV1Error,
        match=r"spec.version \"0\$\{VERSION\}\" is not a "
        "semantic version",
    ) as refused:
        render_bundle(bundle, format="registry+v1", request=RenderRequest(namespace="ops"))
    assert refused.value.rule == "InvalidBundle"


def test_a_bundle_without_a_csv_or_with_subdirectories_is_refused(tmp_path: Path) -> None:
    bundle = _bundle_copy(tmp_path, WEBHOOK)
    (bundle / "manifests" / "extra").mkdir()
    with pytest.raises(RegistryV1Error, match="subdirectories are not allowed"):
        render_bundle(bundle, format="registry+v1", request=RenderRequest(namespace="ops"))
    shutil.rmtree(bundle / "manifests")
    (bundle / "manifests").mkdir()
    with pytest.raises(RegistryV1Error, match="no ClusterServiceVersion in manifests/"):
        render_bundle(bundle, format="registry+v1", request=RenderRequest(namespace="ops"))


def test_metadata_properties_join_the_csvs_olm_properties(tmp_path: Path) -> None:
    bundle = _bundle_copy(tmp_path, ARGOCD)
    (bundle / "metadata" / "properties.yaml").write_text(
        "properties:\n- type: olm.maxOpenShiftVersion\n  value: '4.18'\n"
        "- type: olm.constraint\n  value: {failureMessage: needs <x> & y, cel: {rule: 'true'}}\n"
    )
    objects = render_bundle(bundle, format="registry+v1", request=RenderRequest(namespace="ops"))
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    properties = deployment["spec"]["template"]["metadata"]["annotations"]["olm.properties"]
    # Go's JSON: compact, keys in their order, HTML characters escaped.
    assert properties == (
        '[{"type":"olm.maxOpenShiftVersion","value":"4.18"},{"type":"olm.constraint",'
        '"value":{"failureMessage":"needs \\u003cx\\u003e \\u0026 y","cel":{"rule":"true"}}}]'
    )
    assert json.loads(properties)[1]["value"]["failureMessage"] == "needs <x> & y"


def test_fleetlet_render_detects_a_bundle_and_takes_the_namespace_flags() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "fleetlet", "render", str(ARGOCD), "-o", "json",
         "--install-namespace", "argocd-system", "--watch-namespace", "argocd-system"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=dict(os.environ),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "rendering as registry+v1 (metadata/annotations.yaml" in shown.stderr
    objects = json.loads(shown.stdout)["items"]
    assert _keyed(objects) == _keyed(_expected("argocd-operator.v0.6.0", "own-namespace"))
