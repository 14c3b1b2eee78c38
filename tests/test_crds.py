"""The generated CRDs against a real kube-apiserver, and the generated files against the generator.

Each refusal case is checked twice: the API server refuses the object (schema or CEL rule) naming
the field, and fleetlet's own validation refuses the same spec naming the same field, because
both come from one declaration.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from agent.api import (
    API_GROUP,
    API_VERSION,
    BundleDeploymentSpec,
    BundleDeploymentStatus,
    Condition,
    ResourceCounts,
    Revision,
    Source,
    from_dict,
    parse_time,
    to_dict,
)
from agent.api.crds import CRDS, REPO_ROOT, generated_files, main
from agent.api.validation import all_types, fields_of
from agent.errors import ValidationError
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster

DIGEST = "sha256:" + "ab" * 32
COMMIT = "c" * 40


def test_generated_files_are_up_to_date() -> None:
    """crds/*.yaml and docs/api.md are exactly what the generator writes now."""
    for relative, content in generated_files().items():
        path = REPO_ROOT / relative
        assert path.exists(), f"{relative} missing: run python -m agent.api.crds --write"
        assert path.read_bytes() == content, f"{relative} is stale: run --write"
    assert main(["--check"]) == 0


def test_api_md_documents_every_field() -> None:
    text = (REPO_ROOT / "docs/api.md").read_text()
    roots = [crd.spec for crd in CRDS] + [crd.status for crd in CRDS if crd.status]
    for root in roots:
        for cls in all_types(root):
            assert f"### {cls.__name__}" in text
            for spec in fields_of(cls):
                assert f"| `{spec.name}` |" in text, f"{cls.__name__}.{spec.name} undocumented"


# --- against a real API server --------------------------------------------------------------


@pytest.fixture(scope="module")
def crds(kube_cluster: Cluster) -> Iterator[Cluster]:
    """The generated CRDs applied (server-side, as a user would) and Established."""
    files = [str(REPO_ROOT / crd.file) for crd in CRDS]
    args = [
        kubectl(),
        "--kubeconfig",
        str(kube_cluster.kubeconfig),
        "apply",
        "--server-side",
        "--field-manager=fleetlet-tests",
        "--force-conflicts",
    ]
    for path in files:
        args += ["-f", path]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with kube_cluster.api_client() as api:
        ext = k8s_client.ApiextensionsV1Api(api)
        deadline = time.monotonic() + 60
        for crd in CRDS:
            while True:
                obj = ext.read_custom_resource_definition(crd.name)
                conditions = {c.type: c.status for c in (obj.status.conditions or [])}
                if conditions.get("Established") == "True":
                    break
                assert time.monotonic() < deadline, f"{crd.name} not Established: {conditions}"
                time.sleep(0.2)
    # The CRDs stay installed: other tests of the session use them, and they are the same.
    yield kube_cluster


@pytest.fixture
def custom(crds: Cluster) -> Iterator[k8s_client.CustomObjectsApi]:
    with crds.api_client() as api:
        yield k8s_client.CustomObjectsApi(api)


def _name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _object(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def _delete(custom: k8s_client.CustomObjectsApi, plural: str, name: str) -> None:
    try:
        custom.delete_cluster_custom_object(API_GROUP, API_VERSION, plural, name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _valid_spec() -> dict[str, Any]:
    spec = BundleDeploymentSpec(
        sources=(Source(kind="image", uri="127.0.0.1:5000/apps/web:v1", digest=DIGEST),),
        group="apps",
    )
    return to_dict(spec)


def test_crds_established_with_names(crds: Cluster) -> None:
    with crds.api_client() as api:
        ext = k8s_client.ApiextensionsV1Api(api)
        bd = ext.read_custom_resource_definition("bundledeployments.fleetlet.io")
    assert bd.spec.scope == "Cluster"
    assert bd.spec.names.short_names == ["bd"]
    assert bd.spec.names.categories == ["fleetlet"]
    assert bd.spec.versions[0].subresources.status is not None


def test_valid_bundledeployment_is_accepted_and_shown_by_kubectl(
    crds: Cluster, custom: k8s_client.CustomObjectsApi
) -> None:
    name = _name()
    body = _object(
        "BundleDeployment",
        name,
        {
            "sources": [
                {
                    "kind": "git",
                    "uri": "https://git.example/web.git",
                    "commit": COMMIT,
                    "directory": "deploy",
                    "destination": "web",
                }
            ],
            "group": "apps",
            "format": "helm",
            "formatOptions": {"values": {"replicas": 2, "image": {"tag": "v1"}}},
            "outputs": [
                {
                    "name": "ip",
                    "object": {"apiVersion": "v1", "kind": "Service", "name": "web"},
                    "fieldPath": ".spec.clusterIP",
                }
            ],
        },
    )
    created = custom.create_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", body)
    try:
        # The server filled in the schema's defaults: the same as Python's.
        stored = from_dict(BundleDeploymentSpec, created["spec"])
        assert stored == from_dict(BundleDeploymentSpec, body["spec"])
        assert created["spec"]["healthChecks"] == {
            "builtin": True,
            "timeoutSeconds": 300,
            "waitForLoadBalancer": False,
            "apiServices": "Available",
        }
        assert created["spec"]["takeOwnership"] is False
        status = BundleDeploymentStatus(
            observed_generation=1,
            conditions=(
                Condition(
                    type="Ready",
                    status="True",
                    reason="Healthy",
                    last_transition_time=parse_time("2026-11-22T22:00:00Z"),  # type: ignore[arg-type]
                    observed_generation=1,
                ),
            ),
            phase="Ready",
            applied_revision=Revision(serial=7, sources=(COMMIT,)),
            target_revision=Revision(serial=7, sources=(COMMIT,)),
            resources=ResourceCounts(total=3, ready=3),
        )
        created["status"] = to_dict(status)
        custom.replace_cluster_custom_object_status(
            API_GROUP, API_VERSION, "bundledeployments", name, created
        )
        out = subprocess.run(
            [kubectl(), "--kubeconfig", str(crds.kubeconfig), "get", "bd", name],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        header, row = out.splitlines()[:2]
        assert header.split() == [
            "NAME", "GROUP", "TARGET", "APPLIED", "READY", "PHASE", "REASON", "AGE"
        ]  # fmt: skip
        assert row.split()[:7] == [name, "apps", "7", "7", "True", "Ready", "Healthy"]
        listed = subprocess.run(
            [kubectl(), "--kubeconfig", str(crds.kubeconfig), "get", "fleetlet", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert f"bundledeployment.fleetlet.io/{name}" in listed
    finally:
        _delete(custom, "bundledeployments", name)


def _source_case(**source: Any) -> dict[str, Any]:
    spec = _valid_spec()
    spec["sources"] = [source]
    return spec


# (id, spec, field the API server and fleetlet must both name)
REFUSED = [
    ("bad-enum", _source_case(kind="svn", uri="x", digest=DIGEST), "spec.sources[0].kind"),
    (
        "bad-pattern",
        _source_case(kind="image", uri="r/x", digest="latest"),
        "spec.sources[0].digest",
    ),
    ("missing-pin", _source_case(kind="image", uri="r/x"), "spec.sources[0].digest"),
    (
        "two-pins",
        _source_case(kind="image", uri="r/x", digest=DIGEST, commit=COMMIT),
        "spec.sources[0].commit",
    ),
    (
        "pin-not-matching-kind",
        _source_case(kind="git", uri="https://g/x", digest=DIGEST),
        "spec.sources[0].digest",
    ),
    (
        "destination-escapes",
        _source_case(kind="image", uri="r/x", digest=DIGEST, destination="a/../../etc"),
        "spec.sources[0].destination",
    ),
    (
        "destination-absolute",
        _source_case(kind="image", uri="r/x", digest=DIGEST, destination="/etc"),
        "spec.sources[0].destination",
    ),
    (
        "values-on-plain",
        {**_valid_spec(), "formatOptions": {"values": {"a": 1}}},
        "spec.formatOptions.values",
    ),
    ("bad-approval", {**_valid_spec(), "approval": "maybe"}, "spec.approval"),
]


@pytest.mark.parametrize(("spec", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_invalid_bundledeployment_is_refused_naming_the_field(
    custom: k8s_client.CustomObjectsApi, spec: dict[str, Any], field: str
) -> None:
    name = _name()
    with pytest.raises(ApiException) as refused:
        custom.create_cluster_custom_object(
            API_GROUP, API_VERSION, "bundledeployments", _object("BundleDeployment", name, spec)
        )
        _delete(custom, "bundledeployments", name)
    assert refused.value.status == 422, refused.value.body
    message = json.loads(refused.value.body)["message"]
    assert field in message, message
    # fleetlet refuses the same spec, naming the same field.
    with pytest.raises(ValidationError) as ours:
        from_dict(BundleDeploymentSpec, spec, path="spec")
    assert any(p.path == field for p in ours.value.problems), ours.value


def test_bundleoutputs_sensitive_value_needs_a_secret_reference(
    custom: k8s_client.CustomObjectsApi,
) -> None:
    name = _name()
    spec = {
        "bundleDeployment": name,
        "runId": "run-1",
        "serial": 3,
        "updatedAt": "2026-11-22T22:00:00Z",
        "outputs": [
            {"name": "ip", "value": "10.0.0.1"},
            {
                "name": "password",
                "sensitive": True,
                "secretRef": {"name": f"{name}-outputs", "key": "password"},
            },
        ],
    }
    custom.create_cluster_custom_object(
        API_GROUP, API_VERSION, "bundleoutputs", _object("BundleOutputs", name, spec)
    )
    _delete(custom, "bundleoutputs", name)
    leaky = copy.deepcopy(spec)
    leaky["outputs"][1] = {"name": "password", "sensitive": True, "value": "hunter2"}
    with pytest.raises(ApiException) as refused:
        custom.create_cluster_custom_object(
            API_GROUP, API_VERSION, "bundleoutputs", _object("BundleOutputs", _name(), leaky)
        )
    message = json.loads(refused.value.body)["message"]
    assert "spec.outputs[1]" in message, message


def test_bundledeploymentrequest_pins_its_spec_and_one_decision(
    crds: Cluster, custom: k8s_client.CustomObjectsApi
) -> None:
    """The CRD's own rules (the ValidatingAdmissionPolicy of deploy/agent/approvals, tested in
    test_approvals.py, adds who may decide): an immutable spec, one consistent, final
    decision."""
    from agent.kube import KubeClient

    me = KubeClient(kubeconfig=str(crds.kubeconfig)).whoami()
    name = _name()
    spec = {
        "cluster": "edge-1",
        "group": "apps",
        "serial": 4,
        "setDigest": DIGEST,
        "requestedBy": me,
        "bundles": [{"name": "web", "specDigest": DIGEST, "contentDigest": DIGEST}],
        "preview": {"changed": 1, "created": 1},
    }
    created = custom.create_cluster_custom_object(
        API_GROUP,
        API_VERSION,
        "bundledeploymentrequests",
        _object("BundleDeploymentRequest", name, spec),
    )
    try:
        changed = copy.deepcopy(created)
        changed["spec"]["setDigest"] = "sha256:" + "cd" * 32
        with pytest.raises(ApiException) as refused:
            custom.replace_cluster_custom_object(
                API_GROUP, API_VERSION, "bundledeploymentrequests", name, changed
            )
        assert refused.value.status == 422, refused.value.body
        assert "spec" in json.loads(refused.value.body)["message"]
        now = "2026-11-22T22:00:00Z"

        def condition(kind: str) -> dict[str, str]:
            return {"type": kind, "status": "True", "reason": kind, "lastTransitionTime": now}

        both = copy.deepcopy(created)
        both["status"] = {
            "conditions": [condition("Approved"), condition("Denied")],
            "decision": "Approved",
            "decidedBy": me,
        }
        with pytest.raises(ApiException) as refused:
            custom.replace_cluster_custom_object_status(
                API_GROUP, API_VERSION, "bundledeploymentrequests", name, both
            )
        assert "status.conditions" in json.loads(refused.value.body)["message"]
        approved = copy.deepcopy(created)
        approved["status"] = {
            "conditions": [condition("Approved")],
            "decision": "Approved",
            "decidedBy": me,
        }
        current = custom.replace_cluster_custom_object_status(
            API_GROUP, API_VERSION, "bundledeploymentrequests", name, approved
        )
        assert current["status"]["decidedBy"] == me
        # A decision is final: turning the approval into a denial is refused.
        flipped = copy.deepcopy(current)
        flipped["status"] = {
            "conditions": [condition("Denied")],
            "decision": "Denied",
            "decidedBy": me,
            "reason": "no",
        }
        with pytest.raises(ApiException) as refused:
            custom.replace_cluster_custom_object_status(
                API_GROUP, API_VERSION, "bundledeploymentrequests", name, flipped
            )
        assert "status.decision" in json.loads(refused.value.body)["message"]
    finally:
        _delete(custom, "bundledeploymentrequests", name)


def test_status_writes_after_one_list_see_the_spec_and_the_conditions_as_a_read_would(
    crds: Cluster, custom: k8s_client.CustomObjectsApi
) -> None:
    """The agent's BundleDeployments read what one LIST showed (then what its own status
    writes returned) instead of a GET before each status write."""
    import itertools
    from datetime import UTC, datetime, timedelta

    from agent.kube import KubeClient
    from agent.report.bundles import MANAGED_LABEL, BundleDeployments, ConditionSpec

    owner = _name()
    names = [_name() for _ in range(3)]
    for name in names:
        body = _object("BundleDeployment", name, _valid_spec())
        body["metadata"]["labels"] = {MANAGED_LABEL: owner}
        custom.create_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", body)
    try:
        with KubeClient(kubeconfig=str(crds.kubeconfig)) as kube:
            ticks = itertools.count()
            start = datetime(2030, 1, 1, tzinfo=UTC)
            bundles = BundleDeployments(
                kube=kube, owner=owner, clock=lambda: start + timedelta(seconds=next(ticks))
            )
            first, second, third = names
            # Listed; then a user edits the first one's spec (its generation moves) and
            # deletes the third: the second is not shown by the LIST (label edited away).
            custom.patch_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", second, {"metadata": {"labels": {MANAGED_LABEL: None}}})  # fmt: skip
            assert bundles.names() == sorted([first, third])
            custom.delete_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", third)
            bundles.set_conditions(third, [ConditionSpec("Ready", "True", "Applied")])  # skipped
            bundles.set_conditions(
                second, [ConditionSpec("Ready", "True", "Applied")], phase="Ready"
            )
            assert bundles.status_of(second)["phase"] == "Ready"  # read by name, then written
            bundles.set_conditions(first, [ConditionSpec("Ready", "True", "Applied")])
            bundles.set_conditions(first, [ConditionSpec("Ready", "False", "Failed")])
            bundles.set_conditions(first, [ConditionSpec("Ready", "False", "Failed", "again")])
            live = custom.get_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", first)  # fmt: skip
            (ready,) = live["status"]["conditions"]
            # The transition of the second write kept by the third (it read the second's answer).
            assert (ready["status"], ready["message"], ready["lastTransitionTime"]) == ("False", "again", "2030-01-01T00:00:03Z")  # fmt: skip
            assert live["status"]["observedGeneration"] == live["metadata"]["generation"] == 1
            # A spec edited after the LIST: the next pass's LIST shows the new generation.
            custom.patch_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", first, {"spec": {"paused": True}})  # fmt: skip
            bundles.annotations()
            bundles.set_conditions(first, [ConditionSpec("Ready", "False", "Failed", "again")])
            live = custom.get_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", first)  # fmt: skip
            assert live["status"]["observedGeneration"] == live["metadata"]["generation"] == 2
            assert live["status"]["conditions"][0]["lastTransitionTime"] == "2030-01-01T00:00:03Z"
            with pytest.raises(ApiException, match="Not Found"):
                custom.get_cluster_custom_object(API_GROUP, API_VERSION, "bundledeployments", third)
    finally:
        for name in names:
            _delete(custom, "bundledeployments", name)
