"""The fleetlet.io/v1alpha1 types: round trips, canonical digests, validation messages.

Pure unit tests: these are the documents and the messages a fleet operator and the agent see.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import rfc8785
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    BundleDeploymentSpec,
    BundleDeploymentStatus,
    Condition,
    FormatOptions,
    Revision,
    RunSummary,
    SetSource,
    Source,
    canonical_bytes,
    dump_set,
    dump_yaml,
    from_dict,
    load_set,
    load_yaml,
    set_digest,
    set_from_dict,
    set_to_dict,
    to_dict,
)
from agent.errors import FloatingReferenceError, ValidationError

DIGEST = "sha256:" + "0123456789abcdef" * 4
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA = "f" * 64


def example() -> dict[str, Any]:
    """A set as a fleet operator would read it: four bundles in three groups."""
    return {
        "apiVersion": "fleetlet.io/v1alpha1",
        "kind": "BundleDeploymentSet",
        "cluster": "edge-1",
        "serial": 42,
        "issuedAt": "2026-11-22T22:00:00Z",
        "expiresAt": "2026-11-29T22:00:00Z",
        "source": {"repo": "https://git.example/fleet.git", "commit": COMMIT},
        "groups": ["crds", "infra", "apps"],
        "bundleDeployments": [
            {
                "name": "crds",
                "spec": {
                    "sources": [
                        {"kind": "http", "uri": "https://files.example/crds.tgz", "sha256": SHA}
                    ]
                },
            },
            {
                "name": "cert-manager",
                "spec": {
                    "group": "infra",
                    "dependsOn": ["crds"],
                    "format": "helm",
                    "formatOptions": {
                        "values": {
                            "replicas": 2,
                            "ratio": 0.25,
                            "tags": ["a", "ü"],
                            "nested": {"yes": "no", "on": None},
                        },
                        "targetNamespace": "cert-manager",
                    },
                    "sources": [
                        {
                            "kind": "image",
                            "uri": "registry.example/charts/cm:v1.15",
                            "digest": DIGEST,
                            "auth": {"secretRef": {"name": "pull"}},
                        }
                    ],
                    "healthChecks": {
                        "timeoutSeconds": 120,
                        "checks": [
                            {
                                "object": {
                                    "apiVersion": "apps/v1",
                                    "kind": "Deployment",
                                    "name": "cert-manager",
                                    "namespace": "cert-manager",
                                },
                                "condition": {"type": "Available"},
                            }
                        ],
                    },
                },
            },
            {
                "name": "monitoring",
                "spec": {
                    "group": "infra",
                    "dependsOn": ["crds"],
                    "sources": [
                        {
                            "kind": "git",
                            "uri": "https://git.example/mon.git",
                            "commit": COMMIT,
                            "directory": "deploy/base",
                            "destination": "mon",
                        }
                    ],
                    "format": "kustomize",
                    "formatOptions": {"path": "mon/overlays/edge"},
                    "optional": [{"apiGroup": "monitoring.coreos.com", "kind": "ServiceMonitor"}],
                },
            },
            {
                "name": "web",
                "spec": {
                    "group": "apps",
                    "dependsOn": ["infra"],
                    "approval": "manual",
                    "serviceAccountName": "deployer",
                    "deletionPolicy": "Orphan",
                    "takeOwnership": True,
                    "sources": [
                        {"kind": "image", "uri": "registry.example/web", "digest": DIGEST},
                        {
                            "kind": "git",
                            "uri": "ssh://git@git.example/cfg.git",
                            "commit": COMMIT,
                            "destination": "config",
                        },
                    ],
                    "outputs": [
                        {
                            "name": "password",
                            "sensitive": True,
                            "fieldPath": ".data.password",
                            "object": {"apiVersion": "v1", "kind": "Secret", "name": "web"},
                        },
                        {
                            "name": "ip",
                            "fieldPath": ".spec.clusterIP",
                            "object": {"apiVersion": "v1", "kind": "Service", "name": "web"},
                        },
                    ],
                },
            },
        ],
    }


def problems_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        set_from_dict(data, origin="set.yaml")
    assert str(raised.value).startswith("set.yaml: ")
    return [str(p) for p in raised.value.problems]


# --- round trips and digests ----------------------------------------------------------------


def test_round_trip_types_yaml_types_is_identity() -> None:
    s = set_from_dict(example(), origin="example")
    data = dump_set(s)
    again = load_set(data, origin="set.yaml")
    assert again == s
    assert dump_set(again) == data
    assert set_from_dict(set_to_dict(s), origin="dict") == s
    assert set_to_dict(s) == example() | {"bundleDeployments": set_to_dict(s)["bundleDeployments"]}
    assert isinstance(s.issued_at, datetime) and s.issued_at.tzinfo is not None
    assert s.bundle_deployments[2].spec.sources[0].commit == COMMIT
    assert [e.group for e in s.bundle_deployments] == ["crds", "infra", "infra", "apps"]


def test_set_yaml_is_readable_canonical_yaml() -> None:
    text = dump_set(set_from_dict(example(), origin="example")).decode()
    assert text.startswith("apiVersion: fleetlet.io/v1alpha1\nbundleDeployments:\n- name: crds\n")
    assert "    - digest: sha256:0123456789abcdef" in text
    assert 'expiresAt: "2026-11-29T22:00:00Z"' in text
    assert '"yes": "no"' in text  # YAML 1.1 booleans stay strings
    # Any YAML reader gets the same data back.
    assert yaml.safe_load(text)["bundleDeployments"][1]["spec"]["formatOptions"]["values"][
        "nested"
    ] == {"yes": "no", "on": None}


def _reorder(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reorder(v) for v in value]
    return value


def test_independent_serialisations_have_the_same_digest() -> None:
    reference = set_digest(set_from_dict(example(), origin="a"))
    # Keys in another order, with explicit defaults, through flow-style YAML and through JSON.
    reordered = _reorder(example())
    explicit = example()
    explicit["bundleDeployments"][0]["spec"] |= {
        "format": "plain",
        "paused": False,
        "keepCRDs": True,
        "dependsOn": [],
        "outputs": [],
        "healthChecks": {"builtin": True, "timeoutSeconds": 300},
        "approval": "none",
    }
    flow = yaml.safe_dump(reordered, default_flow_style=True, sort_keys=False).encode()
    as_json = json.dumps(example(), indent=3).encode()
    digests = {
        set_digest(set_from_dict(reordered, origin="b")),
        set_digest(set_from_dict(explicit, origin="c")),
        set_digest(load_set(flow, origin="flow.yaml")),
        set_digest(load_set(as_json, origin="set.json")),
    }
    assert digests == {reference}
    assert reference.startswith("sha256:") and len(reference) == 71


def test_canonical_bytes_are_rfc8785() -> None:
    s = set_from_dict(example(), origin="a")
    assert canonical_bytes(s) == rfc8785.dumps(set_to_dict(s))
    assert dump_set(s) == dump_yaml(set_to_dict(s))


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.__setitem__("serial", 43),
        lambda d: d["bundleDeployments"][1]["spec"]["sources"][0].__setitem__(
            "digest", DIGEST[:-1] + "0"
        ),
        lambda d: d["bundleDeployments"][1]["spec"]["formatOptions"]["values"].__setitem__(
            "replicas", 3
        ),
        lambda d: d["bundleDeployments"][3]["spec"].__setitem__("paused", True),
        lambda d: d.__setitem__("cluster", "edge-2"),
        lambda d: d.__setitem__("groups", ["crds", "infra", "apps"][:]),  # unchanged control
    ],
    ids=["serial", "digest", "helm-value", "paused", "cluster", "unchanged"],
)
def test_a_changed_field_changes_the_digest(edit: Any) -> None:
    original = example()
    edited = copy.deepcopy(original)
    edit(edited)
    before = set_digest(set_from_dict(original, origin="a"))
    after = set_digest(set_from_dict(edited, origin="b"))
    assert (before == after) == (edited == original)


# --- validation messages --------------------------------------------------------------------


def test_message_names_path_expectation_and_found_value() -> None:
    data = example()
    data["bundleDeployments"][3]["spec"]["sources"][0]["digest"] = "latest"
    with pytest.raises(FloatingReferenceError) as raised:
        set_from_dict(data, origin="clusters/edge-1/set.yaml")
    assert str(raised.value) == (
        "clusters/edge-1/set.yaml: bundleDeployments[3].spec.sources[0].digest: "
        'expected sha256:<64 hex>, got "latest"'
    )


def test_every_problem_is_reported() -> None:
    data = example()
    data["serial"] = 0
    data["clsuter"] = "typo"
    data["expiresAt"] = "2026-11-29 22:00"
    data["bundleDeployments"][0]["name"] = "Bad_Name"
    data["bundleDeployments"][1]["spec"]["approval"] = "maybe"
    data["bundleDeployments"][2]["spec"]["sources"][0]["destination"] = "../../etc"
    data["bundleDeployments"][3]["spec"]["outputs"][1]["name"] = "password"
    assert problems_of(data) == [
        "clsuter: expected one of the known fields (cluster, serial, issuedAt, expiresAt, "
        "source, bundleDeployments, groups), got an unknown field",
        "serial: expected an integer from 1 to 9007199254740991, got 0",
        "expiresAt: expected an RFC 3339 UTC time such as 2026-11-22T22:00:00Z, "
        'got "2026-11-29 22:00"',
        "bundleDeployments[0].name: expected a DNS-1123 label (lower case letters, digits and "
        "'-', at most 63), got \"Bad_Name\"",
        'bundleDeployments[1].spec.approval: expected one of none, manual, got "maybe"',
        "bundleDeployments[2].spec.sources[0].destination: expected a path without '..' "
        'segments (it must stay inside the bundle tree), got "../../etc"',
        "bundleDeployments[3].spec.outputs[1].name: expected a name not used by another item, "
        'got "password"',
    ]


def test_wrong_types_and_missing_fields_are_named() -> None:
    data = example()
    del data["source"]["commit"]
    data["serial"] = "42"
    data["bundleDeployments"][0]["spec"]["paused"] = "yes"
    data["bundleDeployments"][1]["spec"]["sources"] = []
    data["kind"] = "BundleDeployment"
    assert problems_of(data) == [
        'kind: expected "BundleDeploymentSet", got "BundleDeployment"',
        'serial: expected an integer from 1 to 9007199254740991, got "42"',
        "source.commit: expected a full commit id (40 lower-case hex), got nothing",
        'bundleDeployments[0].spec.paused: expected true or false, got "yes"',
        "bundleDeployments[1].spec.sources: expected at least 1 item, got 0 items",
    ]


def test_source_rules_pin_must_match_kind() -> None:
    data = example()
    data["bundleDeployments"][0]["spec"]["sources"][0]["commit"] = COMMIT
    data["bundleDeployments"][1]["spec"]["sources"][0]["uri"] = "reg.example/cm@sha256:ab"
    data["bundleDeployments"][2]["spec"]["sources"][0]["sha256"] = SHA
    assert problems_of(data) == [
        "bundleDeployments[0].spec.sources[0].commit: expected commit only on git sources, "
        f'got "{COMMIT}"',
        "bundleDeployments[1].spec.sources[0].uri: expected an image repository without scheme "
        "or @digest (registry/repository[:tag]; the pin goes in digest), got "
        '"reg.example/cm@sha256:ab"',
        f"bundleDeployments[2].spec.sources[0].sha256: expected sha256 only on http or helm "
        f'sources, got "{SHA}"',
    ]


HELM_SOURCE = {
    "kind": "helm",
    "uri": "https://charts.example/stable",
    "chart": "podinfo",
    "version": "6.5.1",
    "archiveUrl": "https://charts.example/stable/podinfo-6.5.1.tgz",
    "sha256": SHA,
}


def test_helm_source_is_pinned_by_version_archive_and_sha256() -> None:
    data = example()
    data["bundleDeployments"][0]["spec"]["sources"] = [dict(HELM_SOURCE)]
    source = set_from_dict(data).bundle_deployments[0].spec.sources[0]
    assert (source.chart, source.version, source.pin) == ("podinfo", "6.5.1", SHA)
    loose = dict(HELM_SOURCE, version="^6.5")
    del loose["sha256"]
    data["bundleDeployments"][0]["spec"]["sources"] = [loose]
    with pytest.raises(FloatingReferenceError) as raised:
        set_from_dict(data)
    assert [str(p) for p in raised.value.problems] == [
        "bundleDeployments[0].spec.sources[0].version: expected one exact version such as "
        '1.2.3 (ranges are resolved by the hub), got "^6.5"',
    ]
    unhashed = dict(HELM_SOURCE)
    del unhashed["sha256"]
    data["bundleDeployments"][0]["spec"]["sources"] = [unhashed]
    with pytest.raises(FloatingReferenceError) as raised:
        set_from_dict(data)
    assert [str(p) for p in raised.value.problems] == [
        "bundleDeployments[0].spec.sources[0].sha256: expected <64 hex> (the sha256 of the "
        "archive) (helm sources are pinned by sha256), got nothing",
    ]


def test_helm_fields_only_on_helm_sources() -> None:
    data = example()
    data["bundleDeployments"][2]["spec"]["sources"][0]["chart"] = "podinfo"
    no_chart = dict(HELM_SOURCE)
    del no_chart["chart"]
    data["bundleDeployments"][0]["spec"]["sources"] = [no_chart]
    assert problems_of(data) == [
        "bundleDeployments[0].spec.sources[0].chart: expected chart (the chart's name in the "
        "repository) on a helm source, got nothing",
        "bundleDeployments[2].spec.sources[0].chart: expected chart only on helm sources, "
        'got "podinfo"',
    ]


def test_floating_references_are_refused() -> None:
    data = example()
    data["bundleDeployments"][0]["spec"]["sources"][0].pop("sha256")  # URL without a hash
    data["bundleDeployments"][1]["spec"]["sources"][0].pop("digest")  # a tag only
    data["bundleDeployments"][2]["spec"]["sources"][0]["commit"] = "main"  # a branch
    with pytest.raises(FloatingReferenceError) as raised:
        set_from_dict(data, origin="set.yaml")
    assert [p.path for p in raised.value.problems] == [
        "bundleDeployments[0].spec.sources[0].sha256",
        "bundleDeployments[1].spec.sources[0].digest",
        "bundleDeployments[2].spec.sources[0].commit",
    ]
    assert "(image sources are pinned by digest), got nothing" in str(raised.value)
    # Together with another kind of problem it is a plain ValidationError listing both.
    data["serial"] = -1
    with pytest.raises(ValidationError) as mixed:
        set_from_dict(data, origin="set.yaml")
    assert not isinstance(mixed.value, FloatingReferenceError)
    assert len(mixed.value.problems) == 4


def test_constructors_validate_too() -> None:
    with pytest.raises(FloatingReferenceError, match=r"^digest: expected sha256:<64 hex>"):
        Source(kind="image", uri="registry.example/web", digest="latest")
    with pytest.raises(ValidationError, match="issuedAt: expected an RFC 3339 UTC time"):
        BundleDeploymentSet(
            cluster="c",
            serial=1,
            issued_at=datetime(2026, 11, 22, 22),  # naive
            expires_at=datetime(2026, 11, 23, tzinfo=UTC),
            source=SetSource(repo="https://x", commit=COMMIT),
        )
    spec = BundleDeploymentSpec(
        sources=[Source(kind="http", uri="https://x/a.tgz", sha256=SHA)], depends_on=["infra"]
    )  # type: ignore[arg-type]
    assert spec.sources[0].pin == SHA and spec.depends_on == ("infra",)  # lists become tuples
    values = FormatOptions(values={"a": [1, {"b": 2}]})
    with pytest.raises(TypeError):
        values.values["a"] = 2  # type: ignore[index]
    assert to_dict(values) == {"values": {"a": [1, {"b": 2}]}}


# --- groups ---------------------------------------------------------------------------------


def _entry(name: str, group: str | None = None, depends_on: tuple[str, ...] = ()) -> Any:
    source = Source(kind="git", uri="https://g/x", commit=COMMIT)
    return BundleDeploymentEntry(
        name=name, spec=BundleDeploymentSpec(sources=(source,), group=group, depends_on=depends_on)
    )


def _set(entries: list[Any], groups: list[str]) -> BundleDeploymentSet:
    now = datetime(2026, 11, 22, 22, tzinfo=UTC)
    return BundleDeploymentSet(
        cluster="c",
        serial=1,
        issued_at=now,
        expires_at=now + timedelta(days=1),
        source=SetSource(repo="https://x", commit=COMMIT),
        bundle_deployments=tuple(entries),
        groups=tuple(groups),
    )


def test_group_consistency() -> None:
    with pytest.raises(ValidationError) as raised:
        _set(
            [_entry("a", "g1", ("g9",)), _entry("b"), _entry("c", "g1", ("g1",))], ["g1", "unused"]
        )
    assert [str(p) for p in raised.value.problems] == [
        'bundleDeployments[0].spec.dependsOn[0]: expected a group listed in groups, got "g9"',
        'bundleDeployments[1].name: expected a group listed in groups, got "b" (the default group)',
        "bundleDeployments[2].spec.dependsOn[0]: expected another group than the bundle's own "
        '(g1), got "g1"',
        'groups[1]: expected a group that has at least one bundle, got "unused"',
    ]


def test_dependency_cycle_and_order() -> None:
    with pytest.raises(
        ValidationError,
        match=r'expected no dependency cycle, got "a" '
        r"\(cycle a -> b -> c -> a\)",
    ):
        _set(
            [
                _entry("a", depends_on=("b",)),
                _entry("b", depends_on=("c",)),
                _entry("c", depends_on=("a",)),
            ],
            ["a", "b", "c"],
        )
    with pytest.raises(
        ValidationError,
        match=r'groups\[0\]: expected "a" after the groups it '
        r'depends on \("b"\), got "a" at 0, "b" at 1',
    ):
        _set([_entry("a", depends_on=("b",)), _entry("b")], ["a", "b"])
    ok = _set([_entry("a", depends_on=("b",)), _entry("b")], ["b", "a"])
    assert ok.groups == ("b", "a") and ok.entry("a") is not None


def test_expiry_after_issue() -> None:
    data = example()
    data["expiresAt"] = data["issuedAt"]
    assert problems_of(data) == [
        "expiresAt: expected a time after issuedAt, got 2026-11-22T22:00:00Z"
    ]


# --- safe loading ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (b"a: &x [1, 2]\nb: *x\n", "expected no YAML aliases"),
        (b"lol: &a [x, x]\nl2: &b [*a, *a, *a]\nl3: [*b, *b, *b]\n", "expected no YAML aliases"),
        (b"a: 1\na: 2\n", "expected each key once per mapping"),
        (b"a: !!binary aGVsbG8=\n", "expected a YAML document"),
        (b"a: !!python/object:os.system ls\n", "expected a YAML document"),
        (b"a: 1\n---\nb: 2\n", "expected a YAML document"),
        (b"a: [1, 2\n", "expected a YAML document"),
        (b"a: \xff\xfe\n", "expected UTF-8 text"),
        (b"[" * 200 + b"]" * 200, "levels of nesting"),
    ],
    ids=[
        "alias",
        "billion-laughs",
        "duplicate-key",
        "binary",
        "python-tag",
        "two-documents",
        "syntax",
        "not-utf8",
        "deep",
    ],
)
def test_hostile_yaml_is_refused(document: bytes, expected: str) -> None:
    with pytest.raises(ValidationError, match=expected) as raised:
        load_yaml(document, origin="set.yaml")
    assert raised.value.origin == "set.yaml"


def test_oversize_document_is_refused() -> None:
    with pytest.raises(ValidationError, match="expected at most 100 bytes, got 101 bytes"):
        load_yaml(b"#" * 101, origin="x", max_bytes=100)


def test_timestamps_stay_text_and_duplicates_are_reported_with_the_rest() -> None:
    assert load_yaml(b"t: 2026-11-22T22:00:00Z\nd: 2026-11-22\n", origin="x") == {
        "t": "2026-11-22T22:00:00Z",
        "d": "2026-11-22",
    }
    text = dump_set(set_from_dict(example(), origin="a")) + b"serial: 0\n"
    with pytest.raises(ValidationError) as raised:
        load_set(text, origin="set.yaml")
    assert raised.value.problems[0].expected == "each key once per mapping"
    assert any(p.path == "serial" for p in raised.value.problems)


# --- other documents ------------------------------------------------------------------------


def test_status_round_trip() -> None:
    now = datetime(2026, 11, 22, 22, 5, tzinfo=UTC)
    status = BundleDeploymentStatus(
        observed_generation=3,
        conditions=(
            Condition(
                type="Ready",
                status="False",
                reason="HealthCheckFailed",
                message="deployment web: 0/2 ready",
                last_transition_time=now,
            ),
        ),
        applied_revision=Revision(serial=5, sources=(DIGEST, COMMIT)),
        last_healthy_revision=Revision(serial=4, sources=(DIGEST, COMMIT)),
        last_run=RunSummary(id="run-17", result="RolledBack", started_at=now, finished_at=now),
        drift_count=2,
    )
    data = to_dict(status)
    assert data["conditions"][0]["lastTransitionTime"] == "2026-11-22T22:05:00Z"
    assert from_dict(BundleDeploymentStatus, json.loads(json.dumps(data))) == status
    with pytest.raises(ValidationError, match=r"conditions\[1\].type: expected a type not used"):
        from_dict(BundleDeploymentStatus, {"conditions": [data["conditions"][0]] * 2})


# --- properties -----------------------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_canonical_bytes_equal_rfc8785_for_any_json(data: Any) -> None:
    assert canonical_bytes({"v": data}) == rfc8785.dumps({"v": data})


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_canonical_yaml_reads_back_as_the_same_data(data: Any) -> None:
    assert load_yaml(dump_yaml(data), origin="x") == data


_LABEL = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?\Z")
_HEX = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


@st.composite
def _sets(draw: st.DrawFn) -> BundleDeploymentSet:
    names = draw(st.lists(_LABEL, min_size=1, max_size=5, unique=True))
    entries = []
    for name in names:
        kind = draw(st.sampled_from(["image", "git", "http"]))
        pin = draw(_HEX)
        source = Source(
            kind=kind,
            uri={
                "image": "reg.example/" + name,
                "git": "https://g/" + name,
                "http": "https://h/" + name + ".tgz",
            }[kind],
            digest="sha256:" + pin if kind == "image" else None,
            commit=pin[:40] if kind == "git" else None,
            sha256=pin if kind == "http" else None,
            destination=draw(st.none() | _LABEL),
        )
        values = draw(st.none() | st.dictionaries(_TEXT, _JSON, max_size=3))
        spec = BundleDeploymentSpec(
            sources=(source,),
            format="helm" if values is not None else "plain",
            format_options=FormatOptions(values=values),
            paused=draw(st.booleans()),
        )
        entries.append(BundleDeploymentEntry(name=name, spec=spec))
    issued = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=draw(st.integers(0, 10**8)))
    return BundleDeploymentSet(
        cluster=draw(_LABEL),
        serial=draw(st.integers(1, 2**53 - 1)),
        issued_at=issued,
        expires_at=issued + timedelta(seconds=draw(st.integers(1, 10**7))),
        source=SetSource(repo="https://git.example/fleet", commit=draw(_HEX)[:40]),
        bundle_deployments=tuple(entries),
        groups=tuple(names),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sets())
def test_any_set_round_trips_with_a_stable_digest(s: BundleDeploymentSet) -> None:
    data = dump_set(s)
    again = load_set(data, origin="set.yaml")
    assert again == s
    assert set_digest(again) == set_digest(s)
    assert canonical_bytes(s) == rfc8785.dumps(set_to_dict(s))


def test_agent_api_exports_every_name_its_lazy_module_imports() -> None:
    # agent.api imports its names on first use from agent.api._all; both must list the same
    # names, or a type added to one is silently not exported (or fails on first use).
    import agent.api
    from agent.api import _all

    assert sorted(agent.api.__all__) == sorted(_all.__all__)
    for name in agent.api.__all__:
        assert getattr(agent.api, name) is getattr(_all, name)


def test_agent_api_models_exports_every_name_of_its_private_modules() -> None:
    # agent.api.models imports each name on first use from the private module declaring it;
    # every name it lists must resolve to that module's object.
    import importlib

    import agent.api.models

    modules = [importlib.import_module(m) for m in agent.api.models._MODULES]
    for name in agent.api.models.__all__:
        value = getattr(agent.api.models, name)
        assert any(vars(m).get(name) is value for m in modules), name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        agent.api.models.Nope  # noqa: B018
