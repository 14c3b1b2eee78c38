"""Bundle outputs: read from a real cluster after a run, written to BundleOutputs (clear values)
and a Secret (sensitive values), and sealed or omitted in the status document."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nacl.public
import pytest
import yaml

from agent.api.models import GROUP_VERSION, ObjectReference, Output
from agent.api.status import Run
from agent.api.validation import to_dict
from agent.errors import PermanentError, TemporaryError
from agent.kube import ApiUnavailableError, KubeClient, ObjectRef
from agent.render.plain import BUNDLE_LABEL
from agent.report.outputs import (
    MAX_VALUE_BYTES,
    OUTPUTS_OF_LABEL,
    SECRET_TYPE,
    OutputError,
    OutputsStage,
    OutputsWriter,
    ReadOutput,
    decode_secret_value,
    output_text,
    read_outputs,
    render_value,
    secret_name,
    status_outputs,
)
from agent.report.seal import OutputPlace, open_sealed
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster, free_ports
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

NOW = datetime(2026, 11, 22, 22, 0, 0, tzinfo=UTC)
PASSWORD = "s3cr3t-hunter2"
DB_GROUP = "outputs-test.fleetlet.io"


def output(
    name: str,
    kind: str,
    obj: str,
    field_path: str,
    *,
    api_version: str = "v1",
    namespace: str | None = None,
    sensitive: bool = False,
) -> Output:
    return Output(
        name=name,
        object=ObjectReference(api_version=api_version, kind=kind, name=obj, namespace=namespace),
        field_path=field_path,
        sensitive=sensitive,
    )


def b64(text: str | bytes) -> str:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


# --- value rendering (no cluster) -----------------------------------------------------------


def test_non_string_values_are_canonical_json_and_strings_are_as_they_are() -> None:
    assert render_value("10.0.0.7") == "10.0.0.7"
    assert render_value("") == ""
    assert render_value(5432) == "5432"
    assert render_value(True) == "true"
    assert render_value(None) == "null"
    assert render_value(1.0) == "1"
    assert render_value(["a", "b"]) == '["a","b"]'
    assert render_value({"port": 80, "name": "http", "café": "é"}) == (
        '{"café":"é","name":"http","port":80}'
    )
    with pytest.raises(ValueError, match="canonical JSON"):
        render_value(2**60)


def test_secret_data_is_base64_decoded_and_configmap_data_is_not() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "data": {"password": b64(PASSWORD), "tls.crt": b64("CERT"), "port": b64("5432")},
    }
    assert output_text(secret, output("p", "Secret", "db", ".data.password")) == PASSWORD
    # stringData is write-only: the server keeps it in data, so the path reads data.
    assert output_text(secret, output("p", "Secret", "db", ".stringData.password")) == PASSWORD
    assert output_text(secret, output("c", "Secret", "db", ".data['tls.crt']")) == "CERT"
    assert output_text(secret, output("a", "Secret", "db", ".data")) == (
        '{"password":"s3cr3t-hunter2","port":"5432","tls.crt":"CERT"}'
    )
    assert output_text(secret, output("n", "Secret", "db", ".metadata.name")) == "db"

    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "shop"},
        "data": {"token": b64("looks-like-base64")},
    }
    value = output_text(configmap, output("t", "ConfigMap", "cfg", ".data.token"))
    assert value == b64("looks-like-base64")


def test_a_binary_secret_value_is_a_clear_error_without_the_bytes() -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "keys", "namespace": "shop"},
        "data": {"der": b64(b"\x30\x82\xff\xfe-QX7marker"), "bad": "not base64!"},
    }
    with pytest.raises(OutputError) as caught:
        output_text(secret, output("cert", "Secret", "keys", ".data.der", sensitive=True))
    message = str(caught.value)
    assert caught.value.reason == "OutputFailed"
    assert "output cert (Secret shop/keys .data.der)" in message
    assert "not UTF-8 text" in message
    assert "QX7marker" not in message  # the bytes are never shown
    with pytest.raises(ValueError, match="not valid base64"):
        decode_secret_value("not base64!")


def test_a_value_too_large_is_refused() -> None:
    configmap = {
        "metadata": {"name": "big", "namespace": "shop"},
        "data": {"blob": "x" * (MAX_VALUE_BYTES + 1), "fits": "y" * MAX_VALUE_BYTES},
    }
    assert len(output_text(configmap, output("f", "ConfigMap", "big", ".data.fits"))) == (
        MAX_VALUE_BYTES
    )
    with pytest.raises(OutputError, match=f"at most {MAX_VALUE_BYTES}"):
        output_text(configmap, output("b", "ConfigMap", "big", ".data.blob"))


def test_a_sensitive_value_is_never_in_a_repr() -> None:
    assert PASSWORD not in repr(ReadOutput("password", PASSWORD, sensitive=True))
    assert "10.0.0.7" in repr(ReadOutput("ip", "10.0.0.7"))


def test_status_form_seals_or_omits_sensitive_values() -> None:
    hub = nacl.public.PrivateKey.generate()
    values = [ReadOutput("ip", "10.0.0.7"), ReadOutput("password", PASSWORD, sensitive=True)]

    place = {"cluster": "edge-a", "bundle": "web", "run_id": "web.1"}
    sealed = status_outputs(values, hub_key=hub.public_key, **place)
    assert [o.name for o in sealed] == ["ip", "password"]
    assert sealed[0].value == "10.0.0.7"
    assert sealed[1].value is None and not sealed[1].omitted
    assert sealed[1].sealed is not None
    opened = open_sealed(
        hub,
        sealed[1].sealed,
        place=OutputPlace(cluster="edge-a", bundle="web", output="password", run="web.1"),
    )
    assert opened.value == PASSWORD
    # Nothing that leaves the cluster holds the clear value: the whole run, as JSON.
    run = Run(id="web.1", operation="install", started_at=NOW, result="Succeeded", outputs=sealed)
    assert PASSWORD not in json.dumps(to_dict(run))
    assert b64(PASSWORD) not in json.dumps(to_dict(run))

    omitted = status_outputs(values, hub_key=None, **place)
    assert omitted[0].value == "10.0.0.7"
    assert omitted[1].omitted is True
    assert omitted[1].value is None and omitted[1].sealed is None


# --- against a real API server --------------------------------------------------------------


@pytest.fixture(scope="module")
def kube(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeClient]:
    cache = tmp_path_factory.mktemp("discovery")
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=cache) as client:
        yield client


@pytest.fixture(scope="module")
def database_crd(kube: KubeClient) -> Iterator[str]:
    """A custom resource kind of a user's (``Database``, with a status subresource)."""
    name = f"databases.{DB_GROUP}"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": DB_GROUP,
            "names": {"kind": "Database", "plural": "databases", "singular": "database"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    kube.apply(crd, field_manager="fleetlet-tests", force=True)
    deadline = time.monotonic() + 60
    while True:
        live = kube.get(crd) or {}
        found = (live.get("status") or {}).get("conditions") or []
        conditions = {c["type"]: c["status"] for c in found}
        if conditions.get("Established") == "True":
            break
        assert time.monotonic() < deadline, f"{name} not Established: {conditions}"
        time.sleep(0.2)
    kube.forget_discovery()
    yield f"{DB_GROUP}/v1"
    kube.delete(crd)


@pytest.fixture
def agent_namespace(kube: KubeClient) -> Iterator[str]:
    name = f"fleetlet-agent-{uuid.uuid4().hex[:6]}"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    kube.apply(namespace, field_manager="fleetlet-tests")
    yield name
    kube.delete(namespace)


@pytest.fixture
def bundle(kube: KubeClient) -> Iterator[str]:
    """A unique bundle name (BundleOutputs are cluster-scoped); its objects removed after."""
    name = f"web-{uuid.uuid4().hex[:6]}"
    yield name
    kube.delete(ObjectRef(GROUP_VERSION, "BundleOutputs", name))


def bundle_outputs(kube: KubeClient, bundle: str) -> dict[str, Any] | None:
    return kube.get(ObjectRef(GROUP_VERSION, "BundleOutputs", bundle))


def outputs_secret(kube: KubeClient, agent_namespace: str, bundle: str) -> dict[str, Any] | None:
    return kube.get(ObjectRef("v1", "Secret", secret_name(bundle), agent_namespace))


def by_name(live: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["name"]: o for o in live["spec"].get("outputs", [])}


def secret_values(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def run_kubectl(cluster: Cluster, *args: str) -> str:
    return subprocess.run(
        [kubectl(), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def make_app(kube: KubeClient, namespace: str, database_api: str) -> None:
    """What a bundle installed: a Service, a ConfigMap, a Secret and a Database with status."""
    for obj in (
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"ports": [{"name": "http", "port": 80}], "selector": {"app": "web"}},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": namespace},
            "data": {"public.url": "https://shop.example", "replicas": "3"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db-credentials", "namespace": namespace},
            "stringData": {"password": PASSWORD},
        },
        {
            "apiVersion": database_api,
            "kind": "Database",
            "metadata": {"name": "orders", "namespace": namespace},
            "spec": {"engine": "postgres"},
        },
    ):
        kube.apply(obj, field_manager="fleetlet-tests")
    kube.apply(
        {
            "apiVersion": database_api,
            "kind": "Database",
            "metadata": {"name": "orders", "namespace": namespace},
            "status": {"endpoint": "orders.db.internal", "port": 5432, "ready": True},
        },
        field_manager="fleetlet-tests",
        subresource="status",
    )


def app_outputs(database_api: str) -> list[Output]:
    return [
        output("ip", "Service", "web", ".spec.clusterIP"),
        output("http_port", "Service", "web", ".spec.ports[0].port"),
        output("url", "ConfigMap", "settings", ".data['public.url']"),
        output("password", "Secret", "db-credentials", ".data.password", sensitive=True),
        output("endpoint", "Database", "orders", ".status.endpoint", api_version=database_api),
        output("db_port", "Database", "orders", ".status.port", api_version=database_api),
    ]


def test_outputs_are_read_written_to_bundleoutputs_and_a_secret_and_shown_by_kubectl(
    crds: Cluster,
    kube: KubeClient,
    namespace: str,
    agent_namespace: str,
    database_crd: str,
    bundle: str,
) -> None:
    make_app(kube, namespace, database_crd)
    service = kube.get(ObjectRef("v1", "Service", "web", namespace))
    assert service is not None
    cluster_ip = service["spec"]["clusterIP"]
    assert cluster_ip

    values = read_outputs(kube, app_outputs(database_crd), default_namespace=namespace)
    assert values == [
        ReadOutput("ip", cluster_ip),
        ReadOutput("http_port", "80"),
        ReadOutput("url", "https://shop.example"),
        ReadOutput("password", PASSWORD, sensitive=True),
        ReadOutput("endpoint", "orders.db.internal"),
        ReadOutput("db_port", "5432"),
    ]

    writer = OutputsWriter(kube=kube, agent_namespace=agent_namespace)
    writer.write(bundle=bundle, run_id=f"{bundle}.1", serial=7, values=values, now=NOW)

    live = bundle_outputs(kube, bundle)
    assert live is not None
    assert live["spec"]["bundleDeployment"] == bundle
    assert live["spec"]["runId"] == f"{bundle}.1"
    assert live["spec"]["serial"] == 7
    assert live["spec"]["updatedAt"] == "2026-11-22T22:00:00Z"
    outputs = by_name(live)
    assert [o["name"] for o in live["spec"]["outputs"]] == [v.name for v in values]
    assert outputs["ip"]["value"] == cluster_ip
    assert outputs["db_port"]["value"] == "5432"
    assert outputs["password"] == {
        "name": "password",
        "sensitive": True,
        "secretRef": {"name": f"fleetlet-outputs-{bundle}", "key": "password"},
    }
    assert PASSWORD not in json.dumps(live)
    assert b64(PASSWORD) not in json.dumps(live)

    secret = outputs_secret(kube, agent_namespace, bundle)
    assert secret is not None
    assert secret["type"] == SECRET_TYPE
    assert secret["metadata"]["labels"][OUTPUTS_OF_LABEL] == bundle
    assert secret_values(secret) == {"password": PASSWORD}

    assert writer.read(bundle) is not None

    # What a cluster admin sees, without the hub.
    table = run_kubectl(crds, "get", "bundleoutputs", bundle).splitlines()
    assert table[0].split() == ["NAME", "BUNDLEDEPLOYMENT", "RUN", "SERIAL", "AGE"]
    assert table[1].split()[:4] == [bundle, bundle, f"{bundle}.1", "7"]
    shown = yaml.safe_load(run_kubectl(crds, "get", "bo", bundle, "-o", "yaml"))
    assert by_name(shown)["url"]["value"] == "https://shop.example"
    assert by_name(shown)["password"]["secretRef"]["key"] == "password"
    ip = run_kubectl(
        crds, "get", "bo", bundle, "-o", "jsonpath={.spec.outputs[?(@.name=='ip')].value}"
    )
    assert ip == cluster_ip

    # The status document's form of the same values.
    hub = nacl.public.PrivateKey.generate()
    place = {"cluster": "edge-a", "bundle": bundle, "run_id": f"{bundle}.1"}
    reported = {o.name: o for o in status_outputs(values, hub_key=hub.public_key, **place)}
    assert reported["ip"].value == cluster_ip
    assert reported["password"].sealed is not None
    assert PASSWORD not in reported["password"].sealed
    password = OutputPlace(cluster="edge-a", bundle=bundle, output="password", run=f"{bundle}.1")
    assert open_sealed(hub, reported["password"].sealed, place=password).value == PASSWORD
    assert status_outputs(values, hub_key=None, **place)[3].omitted


def test_removed_outputs_disappear_from_bundleoutputs_and_the_secret(
    crds: Cluster, kube: KubeClient, agent_namespace: str, bundle: str
) -> None:
    writer = OutputsWriter(kube=kube, agent_namespace=agent_namespace)
    first = [
        ReadOutput("ip", "10.0.0.7"),
        ReadOutput("url", "https://shop.example"),
        ReadOutput("password", PASSWORD, sensitive=True),
        ReadOutput("token", "tok-1", sensitive=True),
    ]
    writer.write(bundle=bundle, run_id=f"{bundle}.1", serial=1, values=first, now=NOW)
    secret = outputs_secret(kube, agent_namespace, bundle)
    assert secret is not None
    assert secret_values(secret) == {"password": PASSWORD, "token": "tok-1"}
    live = bundle_outputs(kube, bundle)
    assert live is not None
    uids = (secret["metadata"]["uid"], live["metadata"]["uid"])

    # Run 2: `url` and `token` are no longer declared; `ip` changed.
    second = [ReadOutput("ip", "10.0.0.8"), ReadOutput("password", PASSWORD, sensitive=True)]
    writer.write(bundle=bundle, run_id=f"{bundle}.2", serial=2, values=second, now=NOW)
    live = bundle_outputs(kube, bundle)
    secret = outputs_secret(kube, agent_namespace, bundle)
    assert live is not None and secret is not None
    assert set(by_name(live)) == {"ip", "password"}
    assert by_name(live)["ip"]["value"] == "10.0.0.8"
    assert live["spec"]["runId"] == f"{bundle}.2"
    assert secret_values(secret) == {"password": PASSWORD}
    # The agent alone owns them: the removal is server-side apply's, not a re-creation.
    assert (secret["metadata"]["uid"], live["metadata"]["uid"]) == uids

    # Run 3: `password` is no longer sensitive (a value now), so the Secret goes.
    third = [ReadOutput("ip", "10.0.0.8"), ReadOutput("password", "public-now")]
    writer.write(bundle=bundle, run_id=f"{bundle}.3", serial=3, values=third, now=NOW)
    live = bundle_outputs(kube, bundle)
    assert live is not None
    assert by_name(live)["password"] == {
        "name": "password",
        "value": "public-now",
        "sensitive": False,
    }
    assert outputs_secret(kube, agent_namespace, bundle) is None

    # Run 4: a sensitive output again, then none at all: nothing is left.
    fourth = [ReadOutput("password", PASSWORD, sensitive=True)]
    writer.write(bundle=bundle, run_id=f"{bundle}.4", serial=4, values=fourth, now=NOW)
    live = bundle_outputs(kube, bundle)
    assert live is not None
    assert set(by_name(live)) == {"password"}
    assert "value" not in by_name(live)["password"]
    writer.write(bundle=bundle, run_id=f"{bundle}.5", serial=5, values=[], now=NOW)
    assert bundle_outputs(kube, bundle) is None
    assert outputs_secret(kube, agent_namespace, bundle) is None


def test_content_another_manager_added_or_co_owns_is_removed_too(
    crds: Cluster, kube: KubeClient, agent_namespace: str, bundle: str
) -> None:
    writer = OutputsWriter(kube=kube, agent_namespace=agent_namespace)
    values = [ReadOutput("ip", "10.0.0.7"), ReadOutput("token", "tok-1", sensitive=True)]
    writer.write(bundle=bundle, run_id=f"{bundle}.1", serial=1, values=values, now=NOW)
    # Someone else applies the same token (now co-owned) and keys and outputs of their own.
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret_name(bundle), "namespace": agent_namespace},
            "data": {"token": b64("tok-1"), "note": b64("mine")},
        },
        field_manager="someone-else",
    )
    kube.apply(
        {
            "apiVersion": GROUP_VERSION,
            "kind": "BundleOutputs",
            "metadata": {"name": bundle},
            "spec": {
                "bundleDeployment": bundle,
                "runId": f"{bundle}.1",
                "serial": 1,
                "updatedAt": "2026-11-22T22:00:00Z",
                "outputs": [{"name": "injected", "value": "x"}],
            },
        },
        field_manager="someone-else",
    )
    live = bundle_outputs(kube, bundle)
    assert live is not None and set(by_name(live)) == {"ip", "token", "injected"}

    # The next run no longer declares the token: the objects hold exactly the run's outputs.
    writer.write(
        bundle=bundle,
        run_id=f"{bundle}.2",
        serial=2,
        values=[ReadOutput("ip", "10.0.0.7"), ReadOutput("other", "v", sensitive=True)],
        now=NOW,
    )
    live = bundle_outputs(kube, bundle)
    secret = outputs_secret(kube, agent_namespace, bundle)
    assert live is not None and secret is not None
    assert set(by_name(live)) == {"ip", "other"}
    assert secret_values(secret) == {"other": "v"}
    assert secret["type"] == SECRET_TYPE


def test_failed_outputs_are_all_named_in_one_error(
    crds: Cluster, kube: KubeClient, namespace: str
) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": namespace},
            "data": {"url": "https://shop.example"},
        },
        field_manager="fleetlet-tests",
    )
    outputs = [
        output("url", "ConfigMap", "settings", ".data.url"),
        output("missing_field", "ConfigMap", "settings", ".data.nope"),
        output("missing_object", "Service", "absent", ".spec.clusterIP", namespace=namespace),
        output("not_served", "Widget", "w", ".status.x", api_version="example.com/v1"),
    ]
    with pytest.raises(OutputError) as caught:
        read_outputs(kube, outputs, default_namespace=namespace)
    error = caught.value
    assert isinstance(error, PermanentError)
    assert error.reason == "OutputFailed"
    assert [(f.output, f.target, f.field_path) for f in error.failures] == [
        ("missing_field", f"ConfigMap {namespace}/settings", ".data.nope"),
        ("missing_object", f"Service {namespace}/absent", ".spec.clusterIP"),
        ("not_served", f"Widget {namespace}/w", ".status.x"),
    ]
    message = str(error)
    assert message.startswith("3 outputs cannot be read: ")
    assert f"output missing_field (ConfigMap {namespace}/settings .data.nope): no such field" in (
        message
    )
    assert f"output missing_object (Service {namespace}/absent .spec.clusterIP): the object " in (
        message
    )
    assert "does not serve kind Widget in example.com/v1" in message

    # A namespaced object needs a namespace: named, or the bundle's target namespace.
    with pytest.raises(OutputError, match=r"output url .*ConfigMap is namespaced"):
        read_outputs(kube, outputs[:1], default_namespace=None)


def test_a_field_a_controller_fills_a_moment_later_is_waited_for_then_named(
    crds: Cluster, kube: KubeClient, namespace: str, agent_namespace: str
) -> None:
    # Healthy does not mean filled in: a token controller writes its Secret's data after the
    # run. The stage re-reads for `settle` seconds, then fails naming the field.
    late_bundle = f"late-{uuid.uuid4().hex[:6]}"
    settings = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        # Read as the agent itself (no ServiceAccount): only the bundle's own objects.
        "metadata": {
            "name": "late",
            "namespace": namespace,
            "labels": {BUNDLE_LABEL: late_bundle},
        },
        "data": {},
    }
    kube.apply(settings, field_manager="fleetlet-tests")
    waits: list[float] = []

    def controller_fills_it(seconds: float) -> None:
        waits.append(seconds)
        kube.apply({**settings, "data": {"token": "filled"}}, field_manager="fleetlet-tests")

    stage = OutputsStage(
        kube=kube,
        agent_namespace=agent_namespace,
        cluster="edge-a",
        hub_key=None,
        sleep=controller_fills_it,
    )
    late = [output("token", "ConfigMap", "late", ".data.token")]
    got = stage.collect(
        bundle=late_bundle, outputs=late, reader=kube,
        default_namespace=namespace, run_id="r.1", serial=1, now=NOW,
    )  # fmt: skip
    assert [(o.name, o.value) for o in got] == [("token", "filled")]
    assert len(waits) == 1

    never = [output("nope", "ConfigMap", "late", ".data.nope")]
    stage = OutputsStage(
        kube=kube, agent_namespace=agent_namespace, cluster="edge-a", hub_key=None, settle=1.0
    )
    started = time.monotonic()
    with pytest.raises(OutputError, match=r"output nope .*no such field"):
        stage.collect(
            bundle=late_bundle, outputs=never, reader=kube, default_namespace=namespace,
            run_id="r.1", serial=1, now=NOW,
        )  # fmt: skip
    assert time.monotonic() - started >= 1.0


def test_an_output_the_bundle_identity_may_not_read_is_forbidden(
    crds: Cluster, kube: KubeClient, namespace: str
) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db-credentials", "namespace": namespace},
            "stringData": {"password": PASSWORD},
        },
        field_manager="fleetlet-tests",
    )
    restricted = kube.impersonating("no-rights", namespace)
    outputs = [output("password", "Secret", "db-credentials", ".data.password", sensitive=True)]
    with pytest.raises(OutputError) as caught:
        read_outputs(restricted, outputs, default_namespace=namespace)
    (failure,) = caught.value.failures
    assert failure.output == "password"
    assert failure.target == f"Secret {namespace}/db-credentials"
    assert failure.problem.startswith("reading it is forbidden")
    assert PASSWORD not in str(caught.value)


def test_an_unreachable_api_server_is_temporary_not_an_output_failure(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    config = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    (port,) = free_ports(1)
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    with (
        KubeClient(kubeconfig=dead, discovery_cache_dir=tmp_path / "cache") as client,
        pytest.raises(ApiUnavailableError) as caught,
    ):
        read_outputs(
            client, [output("ip", "Service", "web", ".spec.clusterIP")], default_namespace="x"
        )
    assert isinstance(caught.value, TemporaryError)
