"""The example fleet (``fleet-examples/``) is consistent with its content: every bundle pins the
digest of its ``v1`` content, every content version renders, and every bundle file is a bundle
of the fleet. Running it on real clusters is ``tests/test_demo.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetlet.demo import CONTENT, EXAMPLES, bundle_files, content_digest
from tests.realenv.oci import artifact_digest

VERSIONS = sorted(p for p in CONTENT.glob("*/*") if p.is_dir())


def test_every_bundle_pins_the_digest_of_its_v1_content() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet.demo", "pin", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    files = bundle_files()
    assert sorted(files) == sorted(p.name for p in CONTENT.iterdir() if p.is_dir())
    for name, path in files.items():
        assert content_digest(name, "v1") in path.read_text(), name


def test_the_pin_is_of_the_bytes_not_the_place(tmp_path: Path) -> None:
    # The check is not vacuous: a copy elsewhere packs to the same digest, one changed byte
    # gives another.
    name = "payments-config"
    copy = tmp_path / "copy"
    shutil.copytree(CONTENT / name / "v1", copy)
    assert artifact_digest(copy) == content_digest(name, "v1")
    target = copy / "02_gateway.yaml"
    target.write_bytes(target.read_bytes() + b"# changed\n")
    assert artifact_digest(copy) != content_digest(name, "v1")


@pytest.mark.parametrize("version", VERSIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_content_version_renders(version: Path) -> None:
    bundle = yaml.safe_load((EXAMPLES / "bundles" / f"{version.parent.name}.yaml").read_text())
    namespace = (bundle.get("formatOptions") or {}).get("targetNamespace")
    args = ["render", str(version), "--format", "plain"]
    if namespace:
        args += ["--namespace", namespace]
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert objects, f"{version} renders no object"
    for obj in objects:
        assert obj["metadata"]["name"]
    if namespace:
        # Namespaced built-in kinds land in the target namespace.
        kinds = {o["kind"]: o["metadata"].get("namespace") for o in objects}
        for kind in ("ConfigMap", "Deployment", "Service"):
            if kind in kinds:
                assert kinds[kind] == namespace, (version, kind)
