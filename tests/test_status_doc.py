"""The status document (``status.json``): wire form, round trip, validation, size bound, sealing.

Pure unit tests: the bytes an agent writes and the messages a hub or an operator sees.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from datetime import UTC, datetime, timedelta

import nacl.public
import pytest
import rfc8785

from agent.api import Condition, Revision
from agent.api.status import (
    MAX_STATUS_BYTES,
    TRUNCATION_MARKER,
    BundleStatusReport,
    ClusterStatus,
    HealthSummary,
    OutputValue,
    Refusal,
    Run,
    RunCounts,
    bound_status,
    dump_status,
    load_status,
    status_from_dict,
    status_to_dict,
)
from agent.errors import ValidationError
from agent.report.seal import (
    OutputPlace,
    SealError,
    agent_sealing_key,
    generate_keypair,
    open_sealed,
    private_key_from_text,
    public_key_from_text,
    seal,
    sensitive_output,
)

T0 = datetime(2026, 11, 22, 23, 0, 0, tzinfo=UTC)
PLACE = OutputPlace(cluster="edge-a", bundle="db", output="password", run="r1")
DIGEST = "sha256:" + "ab" * 32


def make_run(bundle: str, n: int, *, result: str = "Succeeded", message: str = "applied") -> Run:
    return Run(
        id=f"edge-a.{bundle}.{n}.1",
        operation="install" if n == 1 else "upgrade",
        serial=n,
        source_digests=(DIGEST,),
        started_at=T0 + timedelta(minutes=n),
        finished_at=T0 + timedelta(minutes=n, seconds=30),
        result=result,  # type: ignore[arg-type]
        message=message,
        counts=RunCounts(created=1, unchanged=3),
        outputs=(OutputValue(name="ip", value=f"10.0.0.{n}"),),
    )


def make_status(*, bundles: int = 1, runs: int = 3, message: str = "applied") -> ClusterStatus:
    reports = []
    for b in range(bundles):
        name = f"web-{b}"
        reports.append(
            BundleStatusReport(
                name=name,
                group="apps",
                conditions=(
                    Condition(
                        type="Ready",
                        status="True",
                        reason="Applied",
                        message=message,
                        last_transition_time=T0,
                        observed_generation=3,
                    ),
                ),
                applied_revision=Revision(serial=runs, sources=(DIGEST,)),
                last_healthy_revision=Revision(serial=runs, sources=(DIGEST,)),
                health=HealthSummary(status="Current", message="all objects current"),
                runs=tuple(make_run(name, n, message=message) for n in range(runs, 0, -1)),
            )
        )
    return ClusterStatus(
        schema_version=1,
        cluster="edge-a",
        agent_version="0.1.0",
        heartbeat=T0 + timedelta(hours=1),
        sequence=17,
        last_accepted_serial=runs,
        last_refusal=Refusal(
            reason="SignatureInvalid", message="bad signature", commit="c" * 40, at=T0
        ),
        bundles=tuple(reports),
    )


def test_round_trip_is_canonical_and_keyed_by_name() -> None:
    status = make_status(bundles=2, runs=3)
    data = dump_status(status)
    # Canonical RFC 8785 bytes: what any JCS implementation produces from the same data.
    assert data == rfc8785.dumps(json.loads(data))
    assert data == rfc8785.dumps(status_to_dict(status))
    wire = json.loads(data)
    assert wire["apiVersion"] == "fleetlet.io/v1alpha1"
    assert wire["kind"] == "ClusterStatus"
    assert wire["schemaVersion"] == 1
    assert wire["truncated"] is False
    assert set(wire["bundles"]) == {"web-0", "web-1"}
    run = wire["bundles"]["web-0"]["runs"][0]
    assert run["id"] == "edge-a.web-0.3.1"
    assert run["outputs"] == {"ip": {"value": "10.0.0.3"}}
    assert run["counts"] == {"created": 1, "unchanged": 3}
    assert load_status(data, origin="status.json") == status
    loaded = load_status(data, origin="status.json")
    bundle = loaded.bundle("web-1")
    assert bundle is not None
    latest = bundle.latest_successful_run()
    assert latest is not None and latest.output("ip") == OutputValue(name="ip", value="10.0.0.3")


def test_nulls_and_missing_defaults_read_the_same() -> None:
    wire = json.loads(dump_status(make_status()))
    wire["lastRefusal"] = None
    wire["truncated"] = False
    wire["bundles"]["web-0"]["runs"][0]["failedObject"] = None
    loaded = status_from_dict(wire)
    assert loaded.last_refusal is None and not loaded.truncated
    assert b"null" not in dump_status(loaded)
    empty = status_from_dict({k: v for k, v in wire.items() if k != "bundles"})
    # Always there, even empty: readers index them.
    assert json.loads(dump_status(empty))["bundles"] == {}
    assert json.loads(dump_status(empty))["truncated"] is False


def test_validation_reports_every_problem_with_wire_paths() -> None:
    wire = json.loads(dump_status(make_status()))
    wire["sequence"] = -1
    wire["schemaVersion"] = 3  # a version this reader does not know
    wire["bundles"]["web-0"]["runs"][0]["outputs"]["ip"] = {"value": "a", "sealed": "AAAA"}
    wire["bundles"]["web-0"]["runs"][1]["result"] = "exploded"
    wire["bundles"]["Not_A_Label"] = {}
    with pytest.raises(ValidationError) as info:
        status_from_dict(wire, origin="status.json")
    err = info.value
    paths = {p.path for p in err.problems}
    assert paths == {
        "sequence",
        "schemaVersion",
        "bundles.web-0.runs[0].outputs.ip",
        "bundles.web-0.runs[1].result",
        "bundles.Not_A_Label",
    }
    text = str(err)
    assert text.startswith("status.json: ")
    assert "exactly one of value, sealed or omitted: true" in text
    assert "one of Running, Succeeded, Failed, RolledBack" in text


def test_load_refuses_bad_bytes() -> None:
    with pytest.raises(ValidationError, match="at most 100 bytes"):
        load_status(b"{" + b" " * 200 + b"}", origin="s", max_bytes=100)
    with pytest.raises(ValidationError, match="each key once"):
        load_status(b'{"sequence": 1, "sequence": 2}', origin="s")
    with pytest.raises(ValidationError, match="UTF-8 JSON"):
        load_status(b"\xff\xfe", origin="s")
    with pytest.raises(ValidationError, match="UTF-8 JSON"):
        load_status(b'{"sequence": NaN}', origin="s")
    with pytest.raises(ValidationError, match=r"kind: expected \"ClusterStatus\""):
        load_status(b'{"kind": "Other"}', origin="s")


def test_small_document_is_left_untouched() -> None:
    status = make_status()
    assert bound_status(status) is status
    assert not bound_status(status).truncated


def test_history_is_trimmed_to_max_runs() -> None:
    status = make_status(runs=15)
    bounded = bound_status(status, max_runs=10)
    bundle = bounded.bundles[0]
    # Newest first: the ten newest are kept.
    assert [r.serial for r in bundle.runs] == list(range(15, 5, -1))
    assert bounded.truncated
    assert load_status(dump_status(bounded), origin="s").truncated


def test_long_messages_are_cut_with_the_marker() -> None:
    status = make_status(message="x" * 10_000)
    bounded = bound_status(status, max_message=2000)
    texts = [bounded.bundles[0].conditions[0].message] + [
        r.message for r in bounded.bundles[0].runs
    ]
    for text in texts:
        assert len(text) == 2000
        assert text.endswith(TRUNCATION_MARKER)
    assert bounded.truncated
    # Canonical bytes with non-ASCII text (the marker) and escapes too.
    tricky = bound_status(make_status(message='é\u2028"\\\n\x01 ' * 1000), max_message=100)
    assert dump_status(tricky) == rfc8785.dumps(status_to_dict(tricky))
    assert load_status(dump_status(tricky), origin="s") == tricky


@pytest.mark.parametrize(("bundles", "runs"), [(60, 10), (400, 10), (3000, 3)])
def test_a_huge_fleet_stays_under_the_bound(bundles: int, runs: int) -> None:
    status = make_status(bundles=bundles, runs=runs, message="m" * 30_000)
    bounded = bound_status(status)
    data = dump_status(bounded)
    assert len(data) <= MAX_STATUS_BYTES
    loaded = load_status(data, origin="s")
    assert loaded.truncated
    assert loaded.sequence == status.sequence


def test_oldest_runs_go_first_across_bundles() -> None:
    status = make_status(bundles=30, runs=10, message="m" * 1500)
    bounded = bound_status(status, max_bytes=120_000)
    assert len(dump_status(bounded)) <= 120_000
    # Every bundle keeps at least its newest run before any newest run is dropped.
    assert all(b.runs and b.runs[0].serial == 10 for b in bounded.bundles)
    counts = {len(b.runs) for b in bounded.bundles}
    assert max(counts) - min(counts) <= 1


def test_sealed_output_opens_only_with_the_hub_key() -> None:
    private_text, public_text = generate_keypair()
    public = public_key_from_text(public_text)
    output = sensitive_output("s3cret-value", public, place=PLACE)
    assert output.sealed is not None and output.value is None
    assert (
        "s3cret-value"
        not in dump_status(
            ClusterStatus(
                schema_version=1,
                cluster="edge-a",
                agent_version="0.1.0",
                heartbeat=T0,
                sequence=1,
                bundles=(
                    BundleStatusReport(
                        name="db",
                        runs=(
                            Run(
                                id="r1",
                                operation="install",
                                started_at=T0,
                                result="Succeeded",
                                outputs=(output,),
                            ),
                        ),
                    ),
                ),
            )
        ).decode()
    )
    opened = open_sealed(private_key_from_text(private_text), output.sealed, place=PLACE)
    assert opened.value == "s3cret-value"
    other_private, _ = generate_keypair()
    with pytest.raises(SealError):
        open_sealed(private_key_from_text(other_private), output.sealed, place=PLACE)
    assert sensitive_output("s3cret-value", None, place=PLACE) == OutputValue(
        name="password", omitted=True
    )


def test_a_sealed_value_opens_only_for_its_place_and_tells_who_sealed_it() -> None:
    hub = nacl.public.PrivateKey.generate()
    agent_key = agent_sealing_key(hub, PLACE.cluster)
    by_agent = seal(hub.public_key, "s3cret-value", place=PLACE, sender=agent_key)
    opened = open_sealed(hub, by_agent, place=PLACE)
    assert (opened.value, opened.from_agent) == ("s3cret-value", True)
    assert "s3cret-value" not in repr(opened)
    # Replayed under another cluster, bundle, output name or run: it does not open there.
    for moved in (
        dataclasses.replace(PLACE, cluster="edge-b"),
        dataclasses.replace(PLACE, bundle="web"),
        dataclasses.replace(PLACE, output="token"),
        dataclasses.replace(PLACE, run="r2"),
    ):
        with pytest.raises(SealError, match="does not open"):
            open_sealed(hub, by_agent, place=moved)
    # Anybody holding only the hub's public key can seal for the right place, and the hub
    # says so; another cluster's agent key is not this cluster's.
    by_anyone = seal(hub.public_key, "planted", place=PLACE)
    assert open_sealed(hub, by_anyone, place=PLACE).from_agent is False
    by_other_agent = seal(
        hub.public_key, "planted", place=PLACE, sender=agent_sealing_key(hub, "edge-b")
    )
    assert open_sealed(hub, by_other_agent, place=PLACE).from_agent is False
    # The older unbound format (a bare sealed box) is refused, not shown as genuine.
    legacy = base64.b64encode(nacl.public.SealedBox(hub.public_key).encrypt(b"x")).decode()
    with pytest.raises(SealError, match="not a sealed value of version 2"):
        open_sealed(hub, legacy, place=PLACE)
    # The key is the hub's to derive: the same cluster always gets the same key.
    assert bytes(agent_sealing_key(hub, "edge-a")) == bytes(agent_key)
    assert bytes(agent_sealing_key(hub, "edge-b")) != bytes(agent_key)


def test_schema_2_reports_formats_and_schema_1_documents_are_still_read() -> None:
    old = json.loads(dump_status(make_status()))
    assert old["schemaVersion"] == 1 and "formats" not in old
    assert status_from_dict(old).formats == ()  # not reported

    new = dataclasses.replace(
        make_status(), schema_version=2, formats=("helm", "jsonnet", "plain", "registry+v1")
    )
    wire = json.loads(dump_status(new))
    assert wire["formats"] == ["helm", "jsonnet", "plain", "registry+v1"]
    assert load_status(dump_status(new), origin="s") == new

    wire["formats"] = ["Not A Format"]
    with pytest.raises(ValidationError) as refused:
        status_from_dict(wire, origin="status.json")
    assert {p.path for p in refused.value.problems} == {"formats[0]"}
