"""The ``jsonnet`` format: a bundle written in jsonnet, evaluated with the official bindings.

fleetlet format plugin API version 1 (see fleetlet's ``docs/plugins.md``). The file evaluated
is ``main.jsonnet`` in ``formatOptions.path`` (default: the tree's root); external variables:
``values`` (``formatOptions.values``), ``namespace``, ``kubeVersion``, ``apiVersions``.
Imports resolve inside the bundle tree only: a jsonnet file must not read the agent's disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import _jsonnet

from agent.render.plugin_api import InvalidManifestError, Manifest, RenderRequest

MAIN = "main.jsonnet"
LIBRARY_DIRS = ("lib", "vendor")
MAX_STACK = 500


class JsonnetFormat:
    """The ``jsonnet`` format plugin."""

    name = "jsonnet"
    api_version = 1

    def cache_identity(self, tools: object) -> str:
        """The jsonnet implementation renders: its version shapes the output."""
        return f"jsonnet {_jsonnet.version}"

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]:
        """Evaluate ``main.jsonnet``; raises InvalidManifestError (JsonnetError, NoMain,
        ImportOutsideTree, NotObjects)."""
        root = Path(os.path.realpath(tree))
        directory = Path(os.path.realpath(root / str(request.options.get("path") or ".")))
        main = directory / MAIN
        if not _inside(root, main) or not main.is_file():
            raise InvalidManifestError(
                f"no {MAIN} in {request.options.get('path') or 'the bundle root'}",
                source=request.source,
                rule="NoMain",
            )
        refused: list[str] = []

        def load(base: str, rel: str) -> tuple[str, bytes]:
            for candidate in [Path(base) / rel, *(root / d / rel for d in LIBRARY_DIRS)]:
                real = Path(os.path.realpath(candidate))
                if not _inside(root, real):
                    refused.append(rel)
                    raise RuntimeError(f"import {rel!r} leaves the bundle tree")
                if real.is_file():
                    return str(real), real.read_bytes()
            raise RuntimeError(f"import {rel!r} not found in the bundle tree")

        values = request.options.get("values") or {}
        try:
            text = _jsonnet.evaluate_file(
                str(main),
                ext_vars={
                    "namespace": request.namespace or "",
                    "kubeVersion": request.cluster.kube_version or "",
                },
                ext_codes={
                    "values": json.dumps(values),
                    "apiVersions": json.dumps(list(request.cluster.api_versions)),
                },
                import_callback=load,
                max_stack=MAX_STACK,
            )
        except RuntimeError as exc:
            raise InvalidManifestError(
                _first_lines(str(exc), root),
                source=request.source,
                file=str(main.relative_to(root)),
                rule="ImportOutsideTree" if refused else "JsonnetError",
            ) from None
        return _objects(json.loads(text), request.source)


def _first_lines(text: str, root: Path) -> str:
    """jsonnet's message and where it happened, on one line, paths relative to the tree."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return "jsonnet failed"
    where = lines[1].split("\t")[0] if len(lines) > 1 else ""
    where = where.replace(f"{root}/", "")
    return f"{lines[0]} (at {where})" if where else lines[0]


def _inside(root: Path, path: Path) -> bool:
    return path == root or root in path.parents


def _objects(value: Any, source: str) -> list[Manifest]:
    if isinstance(value, dict) and value.get("kind") == "List" and "items" in value:
        value = value["items"]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(o, dict) for o in value):
        raise InvalidManifestError(
            "main.jsonnet must evaluate to an object, a list of objects or a v1 List",
            source=source,
            rule="NotObjects",
        )
    return value
