"""Group records read with one LIST against a real API server: what each group reads is what a
read by name gives, a record the LIST does not show is still read, a damaged one still fails,
and what a pass listed is taken once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.apply.intent import (
    NAME_PREFIX,
    FailedTarget,
    GroupRecord,
    GroupRecords,
    IntentStoreError,
)
from agent.kube import KubeClient
from tests.realenv.kube import Cluster


@pytest.fixture(scope="module")
def kube(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeClient]:
    cache = tmp_path_factory.mktemp("discovery")
    with KubeClient(kubeconfig=str(kube_cluster.kubeconfig), discovery_cache_dir=cache) as client:
        yield client


def failed(group: str, attempts: int) -> GroupRecord:
    return GroupRecord(
        failure=FailedTarget(
            target=f"sha256:{group}", serial=7, reason="HealthCheckFailed", message=group,
            attempts=attempts,
        )
    )  # fmt: skip


def configmap(namespace: str, group: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NAME_PREFIX + group, "namespace": namespace}}  # fmt: skip


def test_records_listed_at_once_are_what_each_group_reads_alone(
    kube: KubeClient, namespace: str
) -> None:
    records = GroupRecords(kube, namespace=namespace)
    for attempts, group in enumerate(("db", "web", "jobs"), start=1):
        records.save(group, failed(group, attempts))
    # A record whose label someone edited away is still the group's record (read by name).
    kube.patch(configmap(namespace, "jobs"), {"metadata": {"labels": {"fleetlet.io/group-record": None}}})  # fmt: skip
    fresh = GroupRecords(kube, namespace=namespace)
    listed = fresh.load_all(["web", "none", "jobs", "db"])
    alone = [GroupRecords(kube, namespace=namespace).load(g) for g in ("web", "none", "jobs", "db")]
    assert listed == alone
    assert [r.failure.attempts if r.failure else None for r in listed] == [2, None, 3, 1]

    # A pass's first read of a group takes the listed record, once; a save replaces it.
    fresh.prefetch(["db", "web", "jobs"])
    assert fresh.load("db") == failed("db", 1)
    fresh.save("web", failed("web", 5))
    assert fresh.load("web") == failed("web", 5)  # read by name after the write
    records.save("db", failed("db", 9))  # written since the LIST (by another instance)
    assert fresh.load("db") == failed("db", 9)  # the listed one was taken already
    fresh.forget_listed()

    # A damaged record fails as a read by name does, listed or not.
    kube.patch(configmap(namespace, "web"), {"data": {"failure.json": "{not json"}})
    with pytest.raises(IntentStoreError, match=f"{NAME_PREFIX}web: unreadable group record"):
        GroupRecords(kube, namespace=namespace).load_all(["db", "web"])
    damaged = GroupRecords(kube, namespace=namespace)
    damaged.prefetch(["web"])
    with pytest.raises(IntentStoreError, match=f"{NAME_PREFIX}web: unreadable group record"):
        damaged.load("web")
