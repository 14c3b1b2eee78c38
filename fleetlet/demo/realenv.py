"""What the demo is made of: the modules of ``tests/realenv`` that start the real components
(control planes, git server, registry, mini Sigstore), found in a source checkout; the demo's
one error and its progress lines. Used by every module of :mod:`fleetlet.demo`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from agent.errors import PermanentError


class DemoError(PermanentError):
    """The demo could not start or did not reach its goal; the message says which part."""


def say(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def load_components() -> Any:
    """The test environment's modules (a source checkout is needed)."""
    # Imported by name: they are test code, outside the packages (and mypy's scope).
    names = ("binaries", "gitserver", "kube", "oci", "registry", "sigstore", "sigstore.mini")
    try:
        modules = {n: importlib.import_module(f"tests.realenv.{n}") for n in names}
    except ImportError as exc:
        raise DemoError(
            f"fleetlet demo runs from a source checkout of fleetlet (it starts the components "
            f"of tests/realenv): run `bash scripts/demo.sh` from the repository ({exc})"
        ) from exc
    return argparse.Namespace(**{n.rsplit(".", 1)[-1]: m for n, m in modules.items()})
