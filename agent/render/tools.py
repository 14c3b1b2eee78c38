"""Pinned external tools (kustomize, helm): where they are, and running them with bounds.

STAND-IN on branch wip/olm: the helm branch owns this module (the pinned builds from the Go
module proxy, the cache layout, the real child-process runner). This copy only has the two
names the kustomize format uses, with the same signatures, so the branches merge by taking
theirs.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from agent.errors import PermanentError


class ToolError(PermanentError):
    """A tool is missing, failed, ran out of time or memory (the message says which)."""

    reason = "RenderFailed"


def _cache_root() -> Path:
    configured = os.environ.get("FLEETLET_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "fleetlet"


def find_tool(name: str, *, override: str | Path | None = None) -> Path:
    """``override``, else ``$FLEETLET_<NAME>``, else ``name`` on PATH, else the newest pinned
    build in the cache (``tools/<name>-<version>/<name>``).

    Raises ToolError when none is executable.
    """
    candidates: list[Path] = []
    env = os.environ.get(f"FLEETLET_{name.upper()}")
    if override is not None:
        candidates.append(Path(override))
    elif env:
        candidates.append(Path(env))
    else:
        found = shutil.which(name)
        if found:
            candidates.append(Path(found))
        candidates.extend(sorted((_cache_root() / "tools").glob(f"{name}-*/{name}"), reverse=True))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    where = str(candidates[0]) if candidates else f"PATH or {_cache_root() / 'tools'}"
    raise ToolError(f"{name}: not found ({where}); set FLEETLET_{name.upper()}")


def run_tool(
    argv: Sequence[str | Path],
    *,
    cwd: Path,
    timeout: float,
    max_memory: int,
    input: bytes | None = None,
) -> bytes:
    """Run ``argv`` in ``cwd`` and return its standard output.

    The child's data segment is capped at ``max_memory`` bytes and it is killed after
    ``timeout`` seconds. Raises ToolError (failed, timed out, out of memory).
    """
    command = [str(a) for a in argv]
    name = Path(command[0]).name
    try:
        # No preexec_fn: it makes subprocess fork instead of vfork, about 4 ms per run here.
        # The limit is set on the child right after it starts instead.
        child = subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        raise ToolError(f"{name}: cannot run: {exc}") from exc
    with child:
        # Already gone: its exit status says how it went.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            resource.prlimit(child.pid, resource.RLIMIT_DATA, (max_memory, max_memory))
        try:
            stdout, stderr = child.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise ToolError(f"{name}: no result after {timeout:g} s (stopped)") from None
    if child.returncode != 0:
        detail = " ".join(stderr.decode(errors="replace").split())[-2000:]
        raise ToolError(f"{name} failed (exit {child.returncode}): {detail}")
    return stdout
