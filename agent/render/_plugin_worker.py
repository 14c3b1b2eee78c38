"""The child process a format plugin runs in (:mod:`agent.render.plugins` starts it isolated,
with an explicit ``sys.path``, and calls :func:`entry`).

It reads one job (JSON) on stdin, loads the plugin from its entry point value, and either
describes it (``applies_patches``, ``cache_identity``, ``api_version``) or renders a tree
(given by path) for a request rebuilt from plain data; it writes one JSON result to the
stdout it was started with. The plugin's own prints go to stderr (fd 1 is pointed there
before the plugin is imported), so nothing it writes can be taken for a result. A plugin's
error comes back as data (``error``: which kind, its type, reason, message); running out of
memory is reported as such when Python can still say so. The parent
(:mod:`agent.render.plugins`) bounds this process's time and memory.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, BinaryIO

from agent.errors import FleetletError, TemporaryError
from agent.render.facts import ClusterFacts
from agent.render.manifests import InvalidManifestError
from agent.render.plain import RenderRequest
from agent.render.plugin_api import ENTRY_POINT_GROUP, SUPPORTED_API_VERSIONS
from agent.render.tools import ToolSettings


def _request(data: dict[str, Any]) -> RenderRequest:
    tools = data.get("tools") or {}
    return RenderRequest(
        source=data["source"],
        namespace=data.get("namespace"),
        options=data.get("options") or {},
        patches=tuple(data.get("patches") or ()),
        cluster=ClusterFacts.of(
            kube_version=data.get("kubeVersion"), api_versions=data.get("apiVersions") or ()
        ),
        upgrade=bool(data.get("upgrade")),
        tools=ToolSettings(
            helm=tools.get("helm"),
            kustomize=tools.get("kustomize"),
            cache_root=Path(tools["cacheRoot"]) if tools.get("cacheRoot") else None,
        ),
    )


def _load(name: str, value: str) -> Any:
    loaded = EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP).load()
    # A class also "has" name and render: instantiate classes and factories.
    if isinstance(loaded, type) or not hasattr(loaded, "render"):
        loaded = loaded()
    if not callable(getattr(loaded, "render", None)):
        raise TypeError("the entry point names nothing with render(tree, request)")
    version = getattr(loaded, "api_version", 1)
    if version not in SUPPORTED_API_VERSIONS:
        raise _ApiVersionError(
            f"it is written for plugin API version {version!r}; this fleetlet runs "
            f"{', '.join(map(str, SUPPORTED_API_VERSIONS))}"
        )
    return loaded


class _ApiVersionError(Exception):
    pass


def _run(job: dict[str, Any]) -> dict[str, Any]:
    try:
        plugin = _load(job["name"], job["entry"])
    except MemoryError:
        return {"error": {"kind": "memory", "type": "MemoryError", "message": "while loading"}}
    except Exception as exc:  # the plugin's import or construction failed
        return {"error": {"kind": "load", "type": type(exc).__name__, "message": str(exc)}}
    request = _request(job["request"])
    if job["op"] == "describe":
        identity = getattr(plugin, "cache_identity", None)
        return {
            "description": {
                "appliesPatches": bool(getattr(plugin, "applies_patches", False)),
                "cacheIdentity": str(identity(request.tools)) if callable(identity) else None,
            }
        }
    objects = plugin.render(Path(job["tree"]), request)
    return {"objects": objects}


def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, MemoryError):
        return {"kind": "memory", "type": "MemoryError", "message": str(exc)}
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, TemporaryError):
        out.update(kind="temporary", reason=exc.reason, delay=exc.delay)
    elif isinstance(exc, FleetletError):
        out.update(kind="permanent", reason=exc.reason)
        if isinstance(exc, InvalidManifestError):
            out.update(rule=exc.rule, detail=exc.detail, file=exc.file)
    else:
        out["kind"] = "exception"
    return out


def main(stdin: BinaryIO, result: BinaryIO) -> int:
    job = json.loads(stdin.read())
    try:
        outcome = _run(job)
    except BaseException as exc:
        outcome = {"error": _error(exc)}
    try:
        data = json.dumps(outcome, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps(
            {"error": {"kind": "output", "type": type(exc).__name__, "message": str(exc)}}
        ).encode()
    result.write(data)
    result.flush()
    return 0


def entry() -> None:
    """Run one job from stdin: the result channel is the stdout we were given; the plugin's
    prints go to stderr."""
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.exit(main(sys.stdin.buffer, channel))


if __name__ == "__main__":
    entry()
