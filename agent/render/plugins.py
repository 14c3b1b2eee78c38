"""Format plugins (entry points of ``fleetlet.formats``), each run in a bounded child process.

A plugin is third-party code: if it hangs, eats memory or crashes, the agent must not. So the
agent never imports it. :class:`PluginFormat` starts :mod:`agent.render._plugin_worker` in
the same interpreter, isolated (``-I -S``, its working directory a scratch directory, its
``sys.path`` exactly fleetlet's code root and this process's own path without the bundle tree:
:func:`worker_path`), and confined (:mod:`agent.render.confine`: it reads the tree and its
libraries, writes its scratch directory, and has no network) for each render, passes the job as
JSON on stdin (the tree by path, the request as plain data) and reads the objects back as
JSON, with the child bounded like the external tools (:func:`agent.render._process.run_tool`):
a time limit (``FLEETLET_PLUGIN_TIMEOUT``, the whole process group killed when it runs over),
a memory limit (``RLIMIT_DATA``, ``FLEETLET_PLUGIN_MAX_MEMORY``), a cap on its output, no core
dumps, and an environment of its own (:func:`agent.render.confine.environment` and the
locale). What a plugin is (``applies_patches``, ``cache_identity``) is asked once, in a
child process too, when the format is first used.

How each misbehaviour reads (all permanent but the plugin's own TemporaryError):

- it raises: ``RenderFailed`` with its message (its own reason and rule when it raised one of
  fleetlet's errors);
- it runs too long: ``RenderTimeout``;
- it needs more memory than allowed: ``RenderOutOfMemory``;
- it crashes, prints something that is not a result, or returns something that is not a
  list of objects: ``RenderFailed`` saying so.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

from agent.errors import PermanentError, TemporaryError
from agent.render import confine
from agent.render._process import (
    ToolError,
    ToolFailedError,
    ToolMemoryError,
    ToolOutputTooLargeError,
    ToolTimeoutError,
    run_tool,
)
from agent.render.manifests import InvalidManifestError, Manifest
from agent.render.plain import RenderRequest
from agent.render.tools import ToolSettings

_PASSED_ENV = ("LANG", "LC_ALL")
_REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,63}$")
# Isolated (-I: no PYTHON* variables, no user site, neither the working directory nor a
# script's directory on sys.path) and without site (-S): the worker's sys.path is exactly
# the list it is given, so nothing in the bundle tree can stand in for a module.
_BOOTSTRAP = (
    "import sys; sys.path[:] = sys.argv[1:]; from agent.render._plugin_worker import entry; entry()"
)


class PluginError(InvalidManifestError):
    """A format plugin failed; ``rule`` says how (PluginFailed, PluginTimeout,
    PluginOutOfMemory, PluginCrashed, PluginLoadFailed, BadPluginOutput, or the rule the
    plugin's own InvalidManifestError named)."""

    reason = "RenderFailed"


class PluginTimeoutError(PluginError):
    """A format plugin ran longer than its time bound and was stopped."""

    reason = "RenderTimeout"


class PluginMemoryError(PluginError):
    """A format plugin needed more memory than its bound."""

    reason = "RenderOutOfMemory"


class PluginLoadError(PermanentError):
    """A plugin's entry point cannot be loaded (import error, not a format, an API version
    this fleetlet does not run)."""

    reason = "UnknownFormat"


class PluginTemporaryError(TemporaryError):
    """A format plugin raised a TemporaryError (a retry may help)."""


def _request_data(request: RenderRequest) -> dict[str, Any]:
    tools = request.tools
    return {
        "source": request.source,
        "namespace": request.namespace,
        "options": dict(request.options),
        "patches": [dict(p) for p in request.patches],
        "kubeVersion": request.cluster.kube_version,
        "apiVersions": list(request.cluster.api_versions),
        "upgrade": request.upgrade,
        "tools": {
            "helm": tools.helm,
            "kustomize": tools.kustomize,
            "cacheRoot": str(tools.cache_root) if tools.cache_root else None,
        },
    }


def _environment(scratch: Path) -> dict[str, str]:
    env = confine.environment(scratch=scratch)
    env.update({k: os.environ[k] for k in _PASSED_ENV if k in os.environ})
    return env


def fleetlet_root() -> Path:
    """The directory holding fleetlet's ``agent`` package (the worker imports it from there)."""
    return Path(__file__).resolve().parents[2]


def worker_path(tree: Path | None) -> list[str]:
    """The plugin worker's ``sys.path``: fleetlet's code root, then this process's own
    ``sys.path`` (the standard library and the installed distributions, plugins included),
    without any entry that is relative, is the working directory or the home directory (what
    ``python -m`` in a project or ``~`` adds; a plugin is an installed distribution), or is, or
    lies in, the bundle tree."""
    root = fleetlet_root()
    bounds = [os.path.realpath(tree)] if tree is not None else []
    dropped = {os.path.realpath(os.getcwd()), os.path.realpath(Path.home()), str(root)}
    found = [str(root)]
    for entry in sys.path:
        if not entry or not os.path.isabs(entry):
            continue
        real = os.path.realpath(entry)
        if real in dropped or real in found:
            continue
        if any(real == b or real.startswith(b + os.sep) for b in bounds):
            continue
        found.append(real)
    return found


class PluginFormat:
    """A format provided by a plugin, run in a bounded child process (see the module doc)."""

    def __init__(self, *, name: str, entry: EntryPoint) -> None:
        self.name = name
        self.entry = entry
        self._described: dict[ToolSettings, Mapping[str, Any]] = {}
        self._lock = threading.Lock()

    @property
    def distribution(self) -> str:
        """``name==version`` of the distribution that provides the plugin (or its entry)."""
        dist = self.entry.dist
        return f"{dist.name}=={dist.version}" if dist is not None else self.entry.value

    def describe(self, tools: ToolSettings) -> Mapping[str, Any]:
        """What the plugin says of itself (``appliesPatches``, ``cacheIdentity``), asked once
        per tool settings. Raises PluginLoadError, PluginError."""
        with self._lock:
            known = self._described.get(tools)
        if known is None:
            known = self._call("describe", None, RenderRequest(tools=tools))["description"]
            with self._lock:
                self._described[tools] = known
        return known

    def applies_patches_for(self, tools: ToolSettings) -> bool:
        return bool(self.describe(tools).get("appliesPatches"))

    def cache_identity(self, tools: ToolSettings) -> str:
        """The plugin's distribution and entry point, and its own cache identity."""
        own = self.describe(tools).get("cacheIdentity")
        return f"{self.distribution} {self.entry.value} {own or ''}".strip()

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]:
        """The plugin's objects for ``tree``. Raises PluginError (and its timeout and memory
        kinds), PluginTemporaryError, PluginLoadError."""
        objects = self._call("render", tree, request).get("objects")
        if not isinstance(objects, list):
            raise PluginError(
                f"format plugin {self.name!r} returned a {type(objects).__name__}, not a list",
                source=request.source,
                rule="BadPluginOutput",
            )
        return objects

    def _call(self, op: str, tree: Path | None, request: RenderRequest) -> dict[str, Any]:
        tools = request.tools
        job = {
            "op": op,
            "name": self.name,
            "entry": self.entry.value,
            "tree": str(tree) if tree is not None else None,
            "request": _request_data(request),
        }
        what = f"format plugin {self.name!r} ({self.distribution})"
        path = worker_path(tree)
        try:
            with tempfile.TemporaryDirectory(prefix="fleetlet-plugin-") as work:
                scratch = Path(work)
                out = run_tool(
                    [sys.executable, "-I", "-S", "-c", _BOOTSTRAP, *path],
                    cwd=scratch,  # never the tree: nothing there is importable
                    timeout=tools.plugin_timeout,
                    max_memory=tools.plugin_max_memory,
                    input=json.dumps(job).encode(),
                    env=_environment(scratch),
                    confine=confine.for_python(
                        tree=tree, scratch=scratch, path=path[1:], code=fleetlet_root()
                    ),
                )
        except ToolTimeoutError:
            raise PluginTimeoutError(
                f"{what} ran longer than {tools.plugin_timeout:g} s and was stopped",
                source=request.source,
                rule="PluginTimeout",
            ) from None
        except ToolMemoryError:
            raise self._out_of_memory(what, request) from None
        except ToolOutputTooLargeError as exc:
            raise PluginError(
                f"{what}: {exc}", source=request.source, rule="BadPluginOutput"
            ) from None
        except ToolFailedError as exc:
            if "MemoryError" in str(exc):
                raise self._out_of_memory(what, request) from None
            raise PluginError(
                f"{what} crashed: {exc}", source=request.source, rule="PluginCrashed"
            ) from None
        except ToolError as exc:  # pragma: no cover - every kind is handled above
            raise PluginError(
                f"{what}: {exc}", source=request.source, rule="PluginCrashed"
            ) from None
        try:
            result = json.loads(out)
        except ValueError:
            result = None
        if not isinstance(result, dict):
            raise PluginError(
                f"{what} wrote something that is not a result", source=request.source,
                rule="BadPluginOutput",
            )  # fmt: skip
        error = result.get("error")
        if isinstance(error, dict):
            raise self._raised(what, error, request)
        return result

    def _out_of_memory(self, what: str, request: RenderRequest) -> PluginMemoryError:
        limit = request.tools.plugin_max_memory // (1 << 20)
        return PluginMemoryError(
            f"{what} needed more than {limit} MiB of memory and was stopped",
            source=request.source,
            rule="PluginOutOfMemory",
        )

    def _raised(self, what: str, error: Mapping[str, Any], request: RenderRequest) -> Exception:
        kind = error.get("kind")
        text = f"{error.get('type')}: {error.get('message')}"
        if kind == "memory":
            return self._out_of_memory(what, request)
        if kind == "load":
            return PluginLoadError(f"{what} failed to load: {text}")
        if kind == "temporary":
            delay = error.get("delay")
            return PluginTemporaryError(
                f"{what}: {error.get('message')}",
                delay=float(delay) if isinstance(delay, int | float) else None,
            )
        if kind == "permanent":
            failed = PluginError(
                f"{what}: {error.get('detail') or error.get('message')}",
                source=request.source,
                file=str(error.get("file") or ""),
                rule=str(error.get("rule") or "PluginFailed"),
            )
            reason = str(error.get("reason") or "")
            if _REASON.match(reason) and reason not in ("Failed", "ContentRefused"):
                failed.reason = reason
            return failed
        if kind == "output":
            return PluginError(
                f"{what} returned objects that are not JSON: {text}",
                source=request.source,
                rule="BadPluginOutput",
            )
        # A refused access (the confinement) says so: the plugin's own message is errno's.
        text = confine.explain_refusal(text) or text
        return PluginError(f"{what} failed: {text}", source=request.source, rule="PluginFailed")


__all__ = [
    "PluginError",
    "PluginFormat",
    "PluginLoadError",
    "PluginMemoryError",
    "PluginTemporaryError",
    "PluginTimeoutError",
]
