"""The external renderers (helm, kustomize): which release is pinned, and where to find it.

fleetlet runs the real tools, not a reimplementation, as bounded child processes
(:mod:`agent.render._process`). One release of each is pinned (:data:`PINNED_TOOLS`) and built
from the Go module proxy into the cache by ``python -m tests.realenv.binaries`` (what
``scripts/install.sh`` runs); the agent image ships them on PATH.

:func:`find_tool` looks, in order, at:

1. an explicit override (``FLEETLET_HELM`` / ``FLEETLET_KUSTOMIZE``, read at the CLI edge into
   :class:`ToolSettings` and passed down; never read here);
2. ``PATH``;
3. the cache: ``$FLEETLET_CACHE`` (default ``~/.cache/fleetlet``) ``/tools/<name>-<version>/<name>``.

The pins, the tools' memory bounds and that search live in ``_pins`` (re-exported here), which
imports nothing but ``os``: ``fleetlet render``'s head start finds helm with it before the rest
of fleetlet loads.

Pins: Helm v4.3.1, because Helm 3's announced support ended in November 2026 (bug fixes until
July, security fixes until November), Helm 4 renders the same ``apiVersion: v1/v2`` charts with
the same ``helm template`` flags, and kustomize 5.8's ``helmCharts`` accepts Helm 3 or 4.
kustomize v5.8.2: the newest release whose go.mod the Go 1.26 toolchain builds (v5.8.3 asks
for Go 1.27).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.errors import ConfigurationError, PermanentError
from agent.render import _pins
from agent.render._pins import (
    HELM_MAX_MEMORY,
    KUSTOMIZE_MAX_MEMORY,
    OVERRIDE_VARIABLES,
    PINNED_TOOLS,
    cache_path,
    locate,
)


class ToolNotFoundError(PermanentError):
    """A tool fleetlet needs (helm, kustomize) is not installed; the message says how to
    provide it."""

    reason = "ToolNotFound"


def default_cache_root() -> Path:
    """``$FLEETLET_CACHE``, else ``~/.cache/fleetlet``: the tools' cache, shared with the test
    environment's binaries (a location convention, like ``PATH``)."""
    return Path(_pins.default_cache_root())


def cached_tool_path(name: str, *, cache_root: Path | None = None) -> Path:
    """Where the pinned release of ``name`` lives in the cache (whether or not it is there).

    Raises ToolNotFoundError for a tool fleetlet does not know.
    """
    version = _pin(name)
    return Path(cache_path(name, version, os.fspath(cache_root) if cache_root else None))


def find_tool(name: str, *, override: str | None = None, cache_root: Path | None = None) -> Path:
    """The binary of ``name`` (``helm`` or ``kustomize``): ``override``, PATH, then the cache.

    ``override`` is a path (or a command name looked up on PATH) given by the user; when set
    and not executable, that is an error (no silent fallback to another binary).
    Raises ToolNotFoundError naming what was tried and how to provide the tool.
    """
    variable = OVERRIDE_VARIABLES.get(name)
    version = _pin(name)
    root = os.fspath(cache_root) if cache_root else None
    found = locate(name, override=override, cache_root=root)
    if found is not None:
        return Path(found)
    if override:
        raise ToolNotFoundError(
            f"{variable}={override}: not an executable file (set it to the path of a "
            f"{name} binary, {version} is the release fleetlet is tested with)"
        )
    cached = cached_tool_path(name, cache_root=cache_root)
    raise ToolNotFoundError(
        f"{name} is not installed: not on PATH and not in the cache ({cached}). Provide it by "
        f"setting {variable} to its path, by putting it on PATH, or by building the pinned "
        f"{version} into the cache with `python3 -m tests.realenv.binaries {name}` "
        f"(what scripts/install.sh runs)"
    )


DEFAULT_PLUGIN_TIMEOUT = 60.0
"""Seconds one render by a format plugin may take (its child process is then killed)."""
DEFAULT_PLUGIN_MAX_MEMORY = 1 << 30
"""Bytes of memory a format plugin's child process may write to (``RLIMIT_DATA``)."""


@dataclass(frozen=True, kw_only=True)
class ToolSettings:
    """Where the external tools are, and the bounds of the format plugins' child processes,
    as configured at the edge (CLI flags or environment).

    ``None`` tool fields mean "look on PATH, then in the cache".
    """

    helm: str | None = None
    """``FLEETLET_HELM``: the helm binary to use."""
    kustomize: str | None = None
    """``FLEETLET_KUSTOMIZE``: the kustomize binary to use."""
    cache_root: Path | None = None
    """The cache holding the pinned releases (default: :func:`default_cache_root`)."""
    plugin_timeout: float = DEFAULT_PLUGIN_TIMEOUT
    """``FLEETLET_PLUGIN_TIMEOUT``: seconds a format plugin may render for."""
    plugin_max_memory: int = DEFAULT_PLUGIN_MAX_MEMORY
    """``FLEETLET_PLUGIN_MAX_MEMORY`` (in MiB there): bytes a format plugin may write to."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ToolSettings:
        """Read ``FLEETLET_HELM``, ``FLEETLET_KUSTOMIZE``, ``FLEETLET_CACHE``,
        ``FLEETLET_PLUGIN_TIMEOUT`` (seconds) and ``FLEETLET_PLUGIN_MAX_MEMORY`` (MiB).

        Raises ToolSettingsError for a bound that is not a positive number.
        """
        env = os.environ if environ is None else environ
        cache = env.get("FLEETLET_CACHE")
        return cls(
            helm=env.get("FLEETLET_HELM") or None,
            kustomize=env.get("FLEETLET_KUSTOMIZE") or None,
            cache_root=Path(cache).expanduser() if cache else None,
            plugin_timeout=_positive(env, "FLEETLET_PLUGIN_TIMEOUT", DEFAULT_PLUGIN_TIMEOUT),
            plugin_max_memory=int(
                _positive(env, "FLEETLET_PLUGIN_MAX_MEMORY", DEFAULT_PLUGIN_MAX_MEMORY / (1 << 20))
                * (1 << 20)
            ),
        )

    def find(self, name: str) -> Path:
        """The binary of ``name`` under these settings. Raises ToolNotFoundError."""
        override = {"helm": self.helm, "kustomize": self.kustomize}.get(name)
        return find_tool(name, override=override, cache_root=self.cache_root)


class ToolSettingsError(ConfigurationError):
    """A tool setting from the environment is malformed."""


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ToolSettingsError(f"{name}={text}: expected a positive number")
    return value


def _pin(name: str) -> str:
    version = PINNED_TOOLS.get(name)
    if version is None:
        raise ToolNotFoundError(
            f"unknown tool {name!r} (fleetlet runs: {', '.join(sorted(PINNED_TOOLS))})"
        )
    return version


__all__ = [
    "DEFAULT_PLUGIN_MAX_MEMORY",
    "DEFAULT_PLUGIN_TIMEOUT",
    "HELM_MAX_MEMORY",
    "KUSTOMIZE_MAX_MEMORY",
    "OVERRIDE_VARIABLES",
    "PINNED_TOOLS",
    "ToolNotFoundError",
    "ToolSettings",
    "ToolSettingsError",
    "cached_tool_path",
    "default_cache_root",
    "find_tool",
]
