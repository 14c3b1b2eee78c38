"""Session-wide fixtures: every real component is started once per session, on loopback.

With pytest-xdist (``scripts/test.sh`` runs the default tier with ``-n 4 --dist loadfile``) a
session is one worker: each worker starts its own control plane, git servers, registries and
Sigstore on ports the OS picks, under its own ``tmp_path_factory`` directory. ``loadfile``
keeps each file on one worker, in order, so a module-scoped fixture is built once and the tests
that build on each other's state keep their order; a new test file needs nothing more.
(``--dist loadgroup`` would place tests by ``xdist_group`` marks, but pytest-xdist 3.8 marks
the group by rewriting ``item._nodeid``, which pytest 9.2 no longer reads: the marks are
ignored and every test is scheduled alone.)
"""

from __future__ import annotations

from typing import Any

import pytest

pytest_plugins = [
    "tests.realenv.kube_fixtures",
    "tests.realenv.registry_fixtures",
    "tests.realenv.git_fixtures",
    "tests.realenv.sigstore_fixtures",
    "tests.realenv.tool_fixtures",
    "tests.fleetlab",
]

# Files whose tests must never run at the same time as each other's, under one xdist scope (with
# ``--dist loadfile`` a scope runs on one worker, in order): each demo run prefers the registry
# port 5000 (two demos starting together could both pick it), and the image tests share
# podman's storage and build cache. Every other file is a scope of its own.
SHARED_SCOPES = {
    "tests/test_demo.py": "fleetlet demo",
    "tests/test_agent_upgrade.py": "fleetlet demo",
    "tests/test_image.py": "podman",
    "tests/test_readme_first_cluster.py": "podman",
}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """A test marked ``image`` outside the podman scope could run beside the others: refuse."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("image") and SHARED_SCOPES.get(path) != "podman":
            raise pytest.UsageError(
                f"{item.nodeid} is marked image: add {path} to SHARED_SCOPES in tests/conftest.py"
            )


@pytest.hookimpl(optionalhook=True)  # without xdist (-p no:xdist) there is no such hook
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """``--dist loadfile``, with the files of :data:`SHARED_SCOPES` grouped."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedScopes(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_SCOPES.get(path, path)

    return SharedScopes(config, log)
