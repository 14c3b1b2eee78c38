"""pytest fixtures: OCI registries on loopback (one plain, one with htpasswd basic auth).

``registry`` and ``auth_registry`` are shared by the whole session: do not stop them. Tests that
take a registry down use ``registry_factory``, whose registries are killed at the test's end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.realenv.registry import Registry

REGISTRY_USER = "fleetlet"
REGISTRY_PASSWORD = "registry-test-password"

RegistryFactory = Callable[..., Registry]


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A running registry without auth, shared by the session."""
    with Registry(workdir=tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A running registry with htpasswd (bcrypt) basic auth, shared by the session."""
    with Registry(
        workdir=tmp_path_factory.mktemp("auth-registry"),
        username=REGISTRY_USER,
        password=REGISTRY_PASSWORD,
    ) as running:
        yield running


@pytest.fixture
def registry_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryFactory]:
    """Start private registries (``factory(auth=False)``); all are killed when the test ends."""
    started: list[Registry] = []

    def factory(*, auth: bool = False) -> Registry:
        created = Registry(
            workdir=tmp_path_factory.mktemp("registry-private"),
            username=REGISTRY_USER if auth else None,
            password=REGISTRY_PASSWORD if auth else None,
        )
        started.append(created)
        created.start()
        return created

    yield factory
    for created in started:
        created.kill()
