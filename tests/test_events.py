"""Events on BundleDeployments (``agent.report.events``) against a real API server.

What a cluster admin sees: ``kubectl describe bd`` lists the events; a repeated event is one
Event counted up, not a flood; many similar events are combined; an object that keeps emitting
is rate limited; a recorder without the right to write Events never breaks the caller.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent.kube import KubeClient, ObjectRef
from agent.report.events import COMBINED_PREFIX, SIMILAR_LIMIT, EventRecorder
from tests.realenv.binaries import kubectl
from tests.realenv.kube import Cluster
from tests.test_crds import _valid_spec
from tests.test_crds import crds as crds  # the fixture: the CRDs installed


@pytest.fixture
def kube(crds: Cluster) -> Iterator[KubeClient]:
    with KubeClient(kubeconfig=str(crds.kubeconfig)) as client:
        yield client


@pytest.fixture
def bd(kube: KubeClient) -> Iterator[dict[str, Any]]:
    """A BundleDeployment (cluster-scoped), deleted afterwards."""
    name = f"events-{uuid.uuid4().hex[:6]}"
    obj = {
        "apiVersion": "fleetlet.io/v1alpha1",
        "kind": "BundleDeployment",
        "metadata": {"name": name},
        "spec": _valid_spec(),
    }
    live = kube.apply(obj, field_manager="fleetlet-tests")
    yield live
    kube.delete(ObjectRef.of(obj))


def events_of(kube: KubeClient, name: str) -> list[dict[str, Any]]:
    """The Events about object ``name`` in ``default``, oldest first."""
    found = kube.list(
        "v1", "Event", namespace="default", field_selector=f"involvedObject.name={name}"
    )
    return sorted(found, key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"]))


def test_events_appear_in_kubectl_describe_and_repeats_are_counted(
    kube: KubeClient, bd: dict[str, Any], crds: Cluster
) -> None:
    recorder = EventRecorder(kube=kube, namespace="default", component="fleetlet-agent")
    name = bd["metadata"]["name"]
    recorder.normal(bd, "Moved", "group apps moved to serial 7")
    for _ in range(3):
        recorder.warning(bd, "SignatureInvalid", "publication at commit abc refused")
    events = events_of(kube, name)
    assert [(e["type"], e["reason"], e["count"]) for e in events] == [
        ("Normal", "Moved", 1),
        ("Warning", "SignatureInvalid", 3),
    ]
    moved = events[0]
    assert moved["involvedObject"]["kind"] == "BundleDeployment"
    assert moved["involvedObject"]["uid"] == bd["metadata"]["uid"]
    assert moved["source"]["component"] == "fleetlet-agent"
    shown = subprocess.run(
        [kubectl(), "--kubeconfig", str(crds.kubeconfig), "describe", "bd", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    events_section = shown.stdout.split("Events:", 1)[1]
    assert "Moved" in events_section and "group apps moved to serial 7" in events_section
    assert "SignatureInvalid" in events_section and "(x3 over" in events_section


def test_many_similar_events_are_combined(kube: KubeClient, bd: dict[str, Any]) -> None:
    recorder = EventRecorder(kube=kube, namespace="default")
    for i in range(SIMILAR_LIMIT + 3):
        recorder.normal(bd, "DriftCorrected", f"{i + 1} drifted objects corrected")
    events = events_of(kube, bd["metadata"]["name"])
    single = [e for e in events if not e["message"].startswith(COMBINED_PREFIX)]
    combined = [e for e in events if e["message"].startswith(COMBINED_PREFIX)]
    assert len(single) == SIMILAR_LIMIT
    assert len(combined) == 1
    assert combined[0]["count"] == 3
    assert (
        combined[0]["message"] == COMBINED_PREFIX + f"{SIMILAR_LIMIT + 3} drifted objects corrected"
    )


def test_an_object_that_keeps_emitting_is_rate_limited(
    kube: KubeClient, bd: dict[str, Any]
) -> None:
    now = [1_800_000_000.0]
    recorder = EventRecorder(
        kube=kube, namespace="default", clock=lambda: now[0], burst=3, refill_seconds=300
    )
    for i in range(6):
        recorder.normal(bd, "Moved", f"move {i}")
    assert (recorder.written, recorder.dropped) == (3, 3)
    now[0] += 300  # one token back
    recorder.normal(bd, "Moved", "move after the wait")
    messages = [e["message"] for e in events_of(kube, bd["metadata"]["name"])]
    assert sorted(messages) == sorted(["move 0", "move 1", "move 2", "move after the wait"])


def test_a_recorder_without_rights_never_raises(
    crds: Cluster, kube: KubeClient, bd: dict[str, Any]
) -> None:
    nobody = crds.mint_user(f"nobody-{uuid.uuid4().hex[:6]}")
    with KubeClient(kubeconfig=nobody) as denied:
        recorder = EventRecorder(kube=denied, namespace="default")
        recorder.warning(bd, "RolledBack", "group apps rolled back")
        recorder.warning(bd, "RolledBack", "group apps rolled back")
    assert recorder.written == 0
    assert events_of(kube, bd["metadata"]["name"]) == []
