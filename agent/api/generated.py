"""Files generated from code (the CRDs, docs/api.md, the agent's kustomize base): one command
line that writes them, or checks that the files on disk are what the code generates."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_or_check(
    files: Callable[[], Mapping[str, bytes]],
    *,
    prog: str,
    description: str,
    argv: Sequence[str] | None = None,
) -> int:
    """``prog --write`` writes ``files()`` (paths relative to ``--root``), ``prog --check``
    exits 1 naming every file that is out of date. Returns the exit code."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the files")
    mode.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root")
    args = parser.parse_args(argv)
    stale = []
    for relative, content in files().items():
        path = args.root / relative
        if path.exists() and path.read_bytes() == content:
            continue
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            print(f"wrote {relative}")
        else:
            stale.append(relative)
    if stale:
        print(f"out of date (run {prog} --write): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


__all__ = ["REPO_ROOT", "write_or_check"]
