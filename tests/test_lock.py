"""The dependency locks in requirements/ (made by scripts/lock.sh) agree with pyproject.toml.

CI installs requirements/ci.txt, the images requirements/agent.txt and hub.txt: each pin must
satisfy what pyproject.toml asks, carry hashes, and the three must pin the same versions (what
CI tests is what the images run). Offline: regenerating needs PyPI, checking does not.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s\\]+)")


def pins(name: str) -> dict[str, str]:
    """``{package: version}`` of a lock; asserts every pin has at least one hash."""
    text = (LOCKS / name).read_text()
    found: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = _PIN.match(block)
        if match:
            assert "--hash=sha256:" in block, f"{name}: {match.group(1)} has no hash"
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


def requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return wanted


@pytest.mark.parametrize(
    ("lock", "extras"), [("ci.txt", ("hub", "test")), ("agent.txt", ()), ("hub.txt", ("hub",))]
)
def test_each_lock_satisfies_pyproject(lock: str, extras: tuple[str, ...]) -> None:
    locked = pins(lock)
    for requirement in requirements(*extras):
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{lock}: {requirement.name} is not locked (run scripts/lock.sh)"
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"{lock}: {name}=={locked[name]} does not satisfy {requirement} (run scripts/lock.sh)"
        )


def test_the_images_run_what_ci_tests() -> None:
    ci = pins("ci.txt")
    for lock in ("agent.txt", "hub.txt"):
        for name, version in pins(lock).items():
            assert ci.get(name) == version, f"{lock}: {name}=={version}, ci.txt: {ci.get(name)}"


def test_the_build_lock_has_the_build_backend() -> None:
    assert "setuptools" in pins("build.txt")
