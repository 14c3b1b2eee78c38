"""The revision store against a real API server: chunked Secrets under 1 MiB, integrity,
bounded history, crash leftovers."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any

import pytest

from agent.apply.inventory import Inventory
from agent.apply.store import (
    REVISION_OF_LABEL,
    RevisionStore,
    RevisionStoreError,
)
from agent.kube import KubeClient
from tests.realenv.kube import Cluster

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def kube(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeClient]:
    cache = tmp_path_factory.mktemp("discovery")
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=cache) as client:
        yield client


def configmaps(namespace: str, count: int, size: int) -> list[dict[str, Any]]:
    # Random bytes do not compress: the stored size stays close to the manifests' size.
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"blob-{i}", "namespace": namespace},
            "data": {"blob": base64.b64encode(os.urandom(size)).decode()},
        }
        for i in range(count)
    ]


def secrets_of(kube: KubeClient, namespace: str, bundle: str) -> list[dict[str, Any]]:
    return kube.list(
        "v1", "Secret", namespace=namespace, label_selector=f"{REVISION_OF_LABEL}={bundle}"
    )


def test_a_3_mib_revision_round_trips_through_secrets_under_1_mib(
    kube: KubeClient, namespace: str
) -> None:
    store = RevisionStore(kube, namespace=namespace)
    manifests = configmaps("app", 12, 256 * 1024)  # 12 x 256 KiB random = ~4 MiB of base64
    assert len(str(manifests)) > 3 * MIB
    inventory = Inventory.from_objects(manifests)

    saved = store.save("web", manifests=manifests, inventory=inventory, info={"serial": 7})
    assert saved.number == 1

    stored = secrets_of(kube, namespace, "web")
    chunks = [s for s in stored if s["metadata"]["labels"]["fleetlet.io/revision"] != "index"]
    assert len(chunks) >= 3
    for secret in stored:
        size = sum(len(base64.b64decode(v)) for v in secret["data"].values())
        assert size < MIB
    assert {s["metadata"]["labels"]["fleetlet.io/chunks"] for s in chunks} == {str(len(chunks))}

    # A fresh store (e.g. after a restart) reads it back from the cluster alone.
    loaded = RevisionStore(kube, namespace=namespace).load("web")
    assert loaded is not None
    assert loaded.number == 1
    assert list(loaded.manifests) == manifests
    assert loaded.inventory == inventory
    assert loaded.info == {"serial": 7}
    assert store.load("absent") is None


def test_a_corrupted_chunk_is_detected(kube: KubeClient, namespace: str) -> None:
    store = RevisionStore(kube, namespace=namespace, chunk_bytes=64 * 1024)
    manifests = configmaps("app", 2, 100 * 1024)
    store.save("db", manifests=manifests, inventory=Inventory.from_objects(manifests))
    victim = "fleetlet-rev-db-1-1"
    live = kube.get(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": victim, "namespace": namespace}}
    )
    assert live is not None
    data = bytearray(base64.b64decode(live["data"]["chunk"]))
    data[100] ^= 0xFF
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": victim, "namespace": namespace},
            "data": {"chunk": base64.b64encode(bytes(data)).decode()},
        },
        field_manager="vandal",
        force=True,
    )
    with pytest.raises(RevisionStoreError, match="does not match the recorded"):
        store.load("db")

    kube.delete(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": victim, "namespace": namespace}}
    )
    with pytest.raises(RevisionStoreError, match=f"chunk Secret {namespace}/{victim} is missing"):
        store.load("db")


def test_history_is_bounded_and_leftovers_are_cleaned(kube: KubeClient, namespace: str) -> None:
    store = RevisionStore(kube, namespace=namespace, history=3, chunk_bytes=32 * 1024)
    # Leftover chunks of a save that crashed before its index was written.
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "fleetlet-rev-api-1-0",
                "namespace": namespace,
                "labels": {
                    REVISION_OF_LABEL: "api",
                    "fleetlet.io/revision": "1",
                    "fleetlet.io/chunk": "0",
                },
            },
            "data": {"chunk": base64.b64encode(b"half-written").decode()},
        },
        field_manager="fleetlet",
    )
    assert store.load("api") is None

    for serial in range(1, 6):
        manifests = configmaps("app", 1, 50 * 1024 * serial)
        store.save(
            "api",
            manifests=manifests,
            inventory=Inventory.from_objects(manifests),
            info={"serial": serial},
        )

    assert [e.number for e in store.entries("api")] == [5, 4, 3]
    numbers = {
        s["metadata"]["labels"]["fleetlet.io/revision"] for s in secrets_of(kube, namespace, "api")
    }
    assert numbers == {"index", "3", "4", "5"}
    latest = store.load("api")
    assert latest is not None and latest.info == {"serial": 5}
    older = store.load("api", 3)
    assert older is not None and older.info == {"serial": 3}
    assert store.load("api", 1) is None
    assert store.bundles() == ["api"]

    assert store.delete("api") > 0
    assert secrets_of(kube, namespace, "api") == []
    assert store.load("api") is None


def test_the_latest_of_several_bundles_is_what_each_one_reads_alone(
    kube: KubeClient, namespace: str
) -> None:
    store = RevisionStore(kube, namespace=namespace, chunk_bytes=64 * 1024)
    for bundle, count in (("api", 1), ("web", 2), ("jobs", 3)):
        for _ in range(count):
            manifests = configmaps(bundle, 2, 50 * 1024)
            store.save(bundle, manifests=manifests, inventory=Inventory.from_objects(manifests))
    # An index whose label someone edited away is still the bundle's index (read by name).
    kube.patch(
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "fleetlet-rev-jobs", "namespace": namespace}},
        {"metadata": {"labels": {"fleetlet.io/revision": None}}},
    )  # fmt: skip
    fresh = RevisionStore(kube, namespace=namespace)  # nothing in memory
    found = fresh.latest_of(["web", "none", "jobs", "api"])
    assert list(found) == ["web", "none", "jobs", "api"]
    assert found["none"] is None
    for bundle, number in (("api", 1), ("web", 2), ("jobs", 3)):
        alone = RevisionStore(kube, namespace=namespace).latest(bundle)
        got = found[bundle]
        assert alone is not None and got is not None
        assert (got.number, got.manifests, got.inventory) == (
            number, alone.manifests, alone.inventory,
        )  # fmt: skip
    # Integrity is checked as when read alone.
    victim = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "fleetlet-rev-web-2-0", "namespace": namespace}}  # fmt: skip
    kube.delete(victim)
    with pytest.raises(RevisionStoreError, match="fleetlet-rev-web-2-0 is missing"):
        RevisionStore(kube, namespace=namespace).latest_of(["api", "web"])
