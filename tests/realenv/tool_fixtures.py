"""The pinned kustomize and helm the render tests run, found as the agent finds them.

``agent.render.tools.find_tool``: ``$FLEETLET_KUSTOMIZE``/``$FLEETLET_HELM``, then PATH, then
the pinned builds in the cache. A missing tool fails the test that needs it (never a skip):
the tools are part of the test environment like the control plane.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import PermanentError
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
    """A wrapper script around a tool that counts its runs (to show a cache hit runs none)."""

    def __init__(self, real: Path, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / "runs.log"
        self.log.touch()
        self.path = directory / real.name
        self.path.write_text(f'#!/bin/sh\necho run >> "{self.log}"\nexec "{real}" "$@"\n')
        self.path.chmod(0o755)

    @property
    def runs(self) -> int:
        return len(self.log.read_text().splitlines())


@pytest.fixture
def counted_kustomize(
    kustomize_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> ToolCounter:
    """``$FLEETLET_KUSTOMIZE`` pointed at a counting wrapper of the real kustomize (for this
    test only)."""
    counter = ToolCounter(kustomize_binary, tmp_path / "counted-kustomize")
    monkeypatch.setenv("FLEETLET_KUSTOMIZE", str(counter.path))
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
