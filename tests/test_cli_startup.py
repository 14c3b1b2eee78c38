"""``fleetlet render`` loads only what a render uses (issue #29: the command line starts fast).

Each render runs as a user runs it, in its own interpreter with the real helm or kustomize, and
reports the modules it ended with; what it must not have loaded is named with why (each costs
start-up time that ``bench/render_cli.py`` measures; no wall-clock bound here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART = REPO_ROOT / "tests" / "assets" / "charts" / "podinfo"
FLUX_EXAMPLE = REPO_ROOT / "tests" / "assets" / "flux2-kustomize-helm-example"

# Runs the command as the console script does, then lists what it imported.
_PROBE = """
import contextlib, io, json, sys
from fleetlet.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "output": out.getvalue(), "modules": sorted(sys.modules)}))
"""

# Never needed by a render without a cluster, with why.
NOT_LOADED = {
    "agent.api.models._set": "the published set's types (only FormatOptions checks options)",
    "agent.api.models._status": "the status types",
    "agent.api.models._spec": "the BundleDeployment's types",
    "agent.api.signatures": "Sigstore verification",
    "hashlib": "no digest is taken (OpenSSL's library)",
    "logging": "a render that is confined logs nothing",
    "decimal": "only an integral float in a document needs it",
    "platform": "the architecture comes from os.uname",
    "hub": "the hub's code",
    "kubernetes": "the Kubernetes client",
    "cryptography": "no signature is checked",
}


def _render(*args: str) -> tuple[dict[str, object], set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "render", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return result, set(result["modules"])


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([str(CHART), "--release-name", "podinfo"], id="helm chart"),
        pytest.param([str(FLUX_EXAMPLE), "--path", "apps/production"], id="kustomize --path"),
    ],
)
def test_a_render_loads_only_what_it_uses(args: list[str]) -> None:
    result, modules = _render(*args)
    assert result["code"] == 0
    assert str(result["output"]).startswith("---\napiVersion: ")
    loaded = {
        name: why
        for name, why in NOT_LOADED.items()
        if name in modules or any(m.startswith(name + ".") for m in modules)
    }
    assert loaded == {}, f"a render loaded modules it does not use: {loaded}"
    # The C YAML parser reads helm's and kustomize's output.
    assert "yaml._yaml" in modules
