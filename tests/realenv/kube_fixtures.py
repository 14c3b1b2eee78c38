"""pytest fixtures for real Kubernetes control planes (loaded through ``pytest_plugins``).

- ``kube_cluster`` (session): one running :class:`~tests.realenv.kube.Cluster`; tests isolate
  themselves by namespace (``namespace``) or by unique names for cluster-scoped objects.
- ``kube_fleet`` (session): three running clusters. The first one IS ``kube_cluster`` (it saves
  a control plane's start-up and ~0.5 GB); the other two are started only when a test asks.
- ``namespace`` (function): a fresh namespace on ``kube_cluster``, deleted afterwards.

Binaries are ensured (found or built, see ``tests.realenv.binaries``) once, before the first
cluster starts. With pytest-xdist each worker starts its own clusters.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from tests.realenv.binaries import ensure_binaries
from tests.realenv.kube import Cluster, start_clusters

FLEET_SIZE = 3


@pytest.fixture(scope="session")
def kube_binaries() -> dict[str, Path]:
    """``{name: path}`` of every control-plane binary (built into the cache when missing)."""
    return ensure_binaries()


def _cluster(name: str, factory: pytest.TempPathFactory, binaries: dict[str, Path]) -> Cluster:
    return Cluster(name=name, workdir=factory.mktemp(f"kube-{name}"), binaries=binaries)


@pytest.fixture(scope="session")
def kube_cluster(
    tmp_path_factory: pytest.TempPathFactory, kube_binaries: dict[str, Path]
) -> Iterator[Cluster]:
    """One running control plane shared by the whole session."""
    cluster = _cluster("c0", tmp_path_factory, kube_binaries).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_fleet(
    kube_cluster: Cluster,
    tmp_path_factory: pytest.TempPathFactory,
    kube_binaries: dict[str, Path],
) -> Iterator[list[Cluster]]:
    """Three running, independent control planes; ``kube_fleet[0] is kube_cluster``."""
    others = [_cluster(f"c{i}", tmp_path_factory, kube_binaries) for i in range(1, FLEET_SIZE)]
    try:
        # Started together: their start-ups overlap (about 1.5x faster than one by one).
        start_clusters(others)
        yield [kube_cluster, *others]
    finally:
        for cluster in others:
            cluster.stop()


@pytest.fixture
def namespace(kube_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on ``kube_cluster`` named after the test; deleted afterwards."""
    yield from _fresh_namespace(kube_cluster, request, "")


@pytest.fixture
def app_namespace(kube_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """Another fresh namespace, for bundle content: the agent's own namespace (``namespace``
    in most tests) is off limits to it."""
    yield from _fresh_namespace(kube_cluster, request, "-app")


def _fresh_namespace(
    kube_cluster: Cluster, request: pytest.FixtureRequest, suffix: str
) -> Iterator[str]:
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem or 't'}-{uuid.uuid4().hex[:6]}{suffix}"
    with kube_cluster.api_client() as api:
        core = k8s_client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name, "labels": {"fleetlet.io/test": "1"}}})
        try:
            yield name
        finally:
            try:
                core.delete_namespace(name, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
