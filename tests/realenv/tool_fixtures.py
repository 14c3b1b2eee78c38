"""The pinned kustomize and helm the render tests run, found as the agent finds them.

``agent.render.tools.find_tool``: ``$FLEETLET_KUSTOMIZE``/``$FLEETLET_HELM``, then PATH, then
the pinned builds in the cache. A missing tool fails the test that needs it (never a skip):
the tools are part of the test environment like the control plane.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.errors import PermanentError
from agent.render import kustomize, patches
from agent.render.tools import find_tool


def _tool(name: str) -> Path:
    try:
        return find_tool(name)
    except PermanentError as exc:
        pytest.fail(f"{exc} (the pinned tools are built by scripts/install.sh)")


@pytest.fixture(scope="session")
def kustomize_binary() -> Path:
    """The kustomize binary fleetlet runs."""
    return _tool("kustomize")


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    """The helm binary fleetlet runs."""
    return _tool("helm")


class ToolCounter:
    """The tool under a name of its own, whose runs (by this process's renderers) are counted,
    to show that a cache hit runs none.

    A link, not a wrapper script: a renderer runs confined (``agent.render.confine``), so a
    script could neither run its shell nor write a log outside the tree. The runs are counted
    where fleetlet starts the tool (``run_tool`` as the kustomize format and the patches use it).
    """

    def __init__(self, real: Path, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / real.name
        self.path.symlink_to(real)
        self.runs = 0

    def counting(self, run: Callable[..., bytes]) -> Callable[..., bytes]:
        def counted(argv: Sequence[object], **kwargs: Any) -> bytes:
            if argv and str(argv[0]) == str(self.path):
                self.runs += 1
            return run(argv, **kwargs)

        return counted


@pytest.fixture
def counted_kustomize(
    kustomize_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> ToolCounter:
    """``$FLEETLET_KUSTOMIZE`` pointed at a counted name of the real kustomize (for this test
    only; renders of this process are counted)."""
    counter = ToolCounter(kustomize_binary, tmp_path / "counted-kustomize")
    monkeypatch.setenv("FLEETLET_KUSTOMIZE", str(counter.path))
    for module in (kustomize, patches):
        monkeypatch.setattr(module, "run_tool", counter.counting(module.run_tool))
    return counter


@pytest.fixture(scope="session")
def sops_binary() -> Path:
    """The pinned ``sops`` the tests encrypt with (built into the cache when missing, like
    the control plane: ``python3 -m tests.realenv.binaries sops``)."""
    from tests.realenv.binaries import BinaryError, ensure_tools

    try:
        return ensure_tools(["sops"])["sops"]
    except BinaryError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def cosign_binary() -> Path:
    """The pinned ``cosign`` the tests sign OCI artifacts with (built into the cache when
    missing: ``python3 -m tests.realenv.binaries cosign``)."""
    from tests.realenv.binaries import BinaryError, ensure_tools

    try:
        return ensure_tools(["cosign"])["cosign"]
    except BinaryError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def gitsign_binary() -> Path:
    """The pinned ``gitsign`` the tests sign fleet commits with, keyless (built into the
    cache when missing: ``python3 -m tests.realenv.binaries gitsign``)."""
    from tests.realenv.binaries import BinaryError, ensure_tools

    try:
        return ensure_tools(["gitsign"])["gitsign"]
    except BinaryError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def notation_binary() -> Path:
    """The pinned ``notation`` the tests sign OCI artifacts with X.509 certificates (built
    into the cache when missing: ``python3 -m tests.realenv.binaries notation``)."""
    from tests.realenv.binaries import BinaryError, ensure_tools

    try:
        return ensure_tools(["notation"])["notation"]
    except BinaryError as exc:
        pytest.fail(str(exc))
