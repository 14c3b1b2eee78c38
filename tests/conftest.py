"""Session-wide fixtures: every real component is started once per session, on loopback.

With pytest-xdist (``scripts/test.sh`` runs the default tier with ``-n``, ``--dist loadgroup``)
a session is one worker: each worker starts its own control plane, git servers, registries and
Sigstore on free ports, under its own ``tmp_path_factory`` directory. Which tests must share a
worker is decided here, from the fixtures each test uses, so that a new test needs no mark:

- the tests of a file where any test uses a module-, class- or package-scoped fixture run on
  one worker, in file order (group ``file:<path>``): the fixture is built once, the tests that
  build on each other's state (a published world, an installed agent) keep their order, and
  the file's other tests do not race them for what the file sets up (the demo's ports);
- the other tests that use a rarely used, expensive session fixture
  (``EXPENSIVE_SESSION_FIXTURES``) run on one worker (group ``fixture:<name>``), so that only
  one worker starts it.

Tests that already carry an ``xdist_group`` mark keep it. Without xdist the marks do nothing.
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.realenv.kube_fixtures",
    "tests.realenv.registry_fixtures",
    "tests.realenv.git_fixtures",
    "tests.realenv.sigstore_fixtures",
    "tests.realenv.tool_fixtures",
    "tests.fleetlab",
]

# Session fixtures few tests use, each costly to start on every worker: two more control
# planes (~0.5 GB and ~20 s each), the agent image built with podman.
EXPENSIVE_SESSION_FIXTURES = ("kube_fleet", "agent_image")

_SHARED_SCOPES = frozenset({"module", "class", "package"})


def _uses_shared_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a module-, class- or package-scoped fixture."""
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is None:
        return False
    return any(
        definition.scope in _SHARED_SCOPES
        for name in item.fixturenames  # type: ignore[attr-defined]
        for definition in fixtureinfo.name2fixturedefs.get(name) or ()
    )


def xdist_groups(items: list[pytest.Item]) -> dict[str, str]:
    """The worker group of each test that has one (node id -> group), see the module
    docstring; the others may run on any worker."""
    grouped_files = {_file(item) for item in items if _uses_shared_fixture(item)}
    groups = {}
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        expensive = [name for name in EXPENSIVE_SESSION_FIXTURES if name in used]
        if _file(item) in grouped_files:
            groups[item.nodeid] = f"file:{_file(item)}"
        elif expensive:
            groups[item.nodeid] = f"fixture:{expensive[0]}"
    return groups


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups = xdist_groups(items)
    for item in items:
        group = groups.get(item.nodeid)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
