"""The example fleet the demo runs (``fleet-examples/``): where it lives, the names the demo
counts on (the registry it pins to, the canary store) and its pins, which
``python -m fleetlet.demo pin [--check]`` (:func:`main`) recomputes from
``fleet-examples/content``. Used by every module of :mod:`fleetlet.demo`, by
``tests/test_examples.py`` and by ``bench/e2e_latency.py``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from fleetlet.demo.realenv import DemoError, load_components

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = REPO_ROOT / "fleet-examples"
CONTENT = EXAMPLES / "content"
CRDS = REPO_ROOT / "crds"
REGISTRY_PORT = 5000
PINNED_HOST = f"127.0.0.1:{REGISTRY_PORT}"
REPOSITORY_PREFIX = "retail/"
CANARY = "store-eu-1"
OPERATOR = "ops-oncall"  # the name of the demo's admin token: who promotes a rollout


_DIGEST_LINE = re.compile(r"^(\s*digest:\s*)(sha256:[0-9a-f]{64})\s*$", re.M)


def bundle_files(fleet: Path = EXAMPLES) -> dict[str, Path]:
    """Bundle name -> its file in the fleet directory."""
    out = {}
    for path in sorted((fleet / "bundles").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["name"]
        out[str(name)] = path
    return out


def content_digest(bundle: str, version: str) -> str:
    """The digest the artifact of ``content/<bundle>/<version>`` has (deterministic packing)."""
    directory = CONTENT / bundle / version
    if not directory.is_dir():
        raise DemoError(f"no content directory {directory}")
    digest: str = load_components().oci.artifact_digest(directory)
    return digest


def pin(*, check: bool) -> list[str]:
    """Point every example bundle at the digest of its ``v1`` content; returns the bundles
    whose pin was stale (``check``: nothing rewritten)."""
    stale = []
    for name, path in bundle_files().items():
        text = path.read_text()
        match = _DIGEST_LINE.search(text)
        if match is None:
            raise DemoError(f"{path}: no `digest: sha256:...` line")
        want = content_digest(name, "v1")
        if match.group(2) != want:
            stale.append(name)
            if not check:
                path.write_text(text[: match.start(2)] + want + text[match.end(2) :])
    return stale


def main(argv: list[str] | None = None) -> int:
    """``python -m fleetlet.demo pin [--check]``."""
    parser = argparse.ArgumentParser(prog="python -m fleetlet.demo")
    sub = parser.add_subparsers(dest="command", required=True)
    pin_cmd = sub.add_parser("pin", help="pin the example bundles to their content's digests")
    pin_cmd.add_argument("--check", action="store_true", help="only check; exit 1 when stale")
    args = parser.parse_args(argv)
    stale = pin(check=args.check)
    for name in stale:
        print(f"{name}: {'stale pin' if args.check else 'pinned anew'}")
    return 1 if args.check and stale else 0
