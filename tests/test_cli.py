"""The ``fleetlet`` command tree, as a user meets it: installed console script, help, exit codes."""

from __future__ import annotations

import shutil
import subprocess

import pytest

FLEETLET = shutil.which("fleetlet")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    assert FLEETLET, "the fleetlet console script is not installed (pip install -e .)"
    return subprocess.run([FLEETLET, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), ["hub", "agent", "render", "health", "installations", "approve", "deny", "import"]),
        ((), ["preview"]),
        ((), ["demo"]),
        (("import",), ["fleet"]),
        (("agent",), ["run", "sync"]),
        (("hub",), ["render", "publish", "diff", "serve", "rollout"]),
        (("hub", "rollout"), ["list", "status", "promote", "pause", "resume", "abort", "step"]),
        (("installations",), ["list", "show", "runs", "outputs"]),
    ],
)
def test_help_lists_the_command_tree_of_the_mission(
    argv: tuple[str, ...], expected: list[str]
) -> None:
    result = run(*argv, "--help")
    assert result.returncode == 0, result.stderr
    for word in expected:
        assert word in result.stdout


def test_unknown_command_is_a_usage_error_naming_it() -> None:
    result = run("frobnicate")
    assert result.returncode == 2
    assert "frobnicate" in result.stderr


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("fleetlet ")
