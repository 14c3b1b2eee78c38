"""The pinned external renderers: which release of each, the memory each may write to, and
where its binary is found (:func:`locate`). Part of :mod:`agent.render.tools` (which re-exports
it and says why these pins), kept apart and lean for ``fleetlet render``'s head start
(:mod:`agent.render.headstart`), which finds helm or kustomize before the rest loads.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself is not imported: it costs ~2 ms at start
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Final

PINNED_TOOLS: Final[Mapping[str, str]] = {"helm": "v4.3.1", "kustomize": "v5.8.2"}
"""The release of each tool fleetlet is tested with (and builds into the cache)."""

OVERRIDE_VARIABLES: Final[Mapping[str, str]] = {
    "helm": "FLEETLET_HELM",
    "kustomize": "FLEETLET_KUSTOMIZE",
}
"""The environment variable that names each tool's binary (read at the CLI edge)."""

HELM_MAX_MEMORY = 512 * 1024 * 1024
"""Bytes of memory one ``helm template`` may write to (``RLIMIT_DATA``)."""
KUSTOMIZE_MAX_MEMORY = 1 << 30
"""Bytes of memory one ``kustomize build`` may write to (``RLIMIT_DATA``)."""


def default_cache_root() -> str:
    """``$FLEETLET_CACHE``, else ``~/.cache/fleetlet``: the tools' cache, shared with the test
    environment's binaries (a location convention, like ``PATH``)."""
    return os.path.expanduser(os.environ.get("FLEETLET_CACHE") or "~/.cache/fleetlet")


def cache_path(name: str, version: str, cache_root: str | None) -> str:
    """Where release ``version`` of ``name`` lives in the cache (``cache_root``, else
    :func:`default_cache_root`), whether or not it is there."""
    root = cache_root or default_cache_root()
    return os.path.join(root, "tools", f"{name}-{version}", name)


def which(command: str) -> str | None:
    """``command`` as a shell would run it: itself when it names a path, else the first
    executable file of that name on ``PATH`` (what :func:`shutil.which` answers)."""
    if os.path.dirname(command):
        return command if _executable(command) else None
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, command)
        if _executable(candidate):
            return candidate
    return None


def locate(name: str, *, override: str | None, cache_root: str | None) -> str | None:
    """The binary of pinned tool ``name``: ``override`` (a path or a command on PATH; when
    set, nothing else), else ``name`` on PATH, else the pinned release in the cache. None when
    none is there (:func:`agent.render.tools.find_tool` says what was tried)."""
    if override:
        return which(override)
    found = which(name)
    if found is not None:
        return found
    cached = cache_path(name, PINNED_TOOLS[name], cache_root)
    return cached if _executable(cached) else None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


__all__ = [
    "HELM_MAX_MEMORY",
    "KUSTOMIZE_MAX_MEMORY",
    "OVERRIDE_VARIABLES",
    "PINNED_TOOLS",
    "cache_path",
    "default_cache_root",
    "locate",
    "which",
]
