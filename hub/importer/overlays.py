"""Rancher Fleet's ``overlays/`` of a raw-YAML bundle as fleetlet ``patches``.

Fleet (``internal/helmdeployer/render/patch``) treats a bundle's ``overlays/<name>/`` files,
for each name a ``yaml.overlays`` list gives (in its order), this way:

- a file whose name holds ``_patch.`` patches the bundle file of the same path without it
  (``frontend-service_patch.yaml`` patches ``frontend-service.yaml``): a YAML list is a JSON
  patch; otherwise a strategic merge patch for the built-in kinds and a JSON merge patch for
  every other kind (CustomResourceDefinitions included);
- any other file replaces the bundle file of the same path (an empty one removes its objects)
  or adds a file;
- nothing under ``overlays/`` is deployed itself (fleetlet's plain format skips ``overlays/``
  beside a ``fleet.yaml`` too: :func:`agent.render.plain.manifest_files`).

Each becomes a fleetlet patch (applied by the agent after rendering) that gives the same
objects: a JSON patch as it is; a strategic merge patch as one, targeted at the file's
object; a merge patch as the JSON patch operations it amounts to on the file as it is at that
point (kustomize would merge lists of named items where a merge patch replaces them); a
replacement by a file holding the same object as top-level ``add``/``remove`` operations; an
empty replacement as ``$patch: delete`` of each of the file's objects.

An overlay that adds files or replaces a base file by other objects cannot be patches alone:
its directory becomes one more source of the bundle's tree (the same git repository and
commit, at ``fleet-overlays/<name>``, :data:`MOUNTED`), whose files the plain format renders
beside the base files, and each base file it replaces becomes ``$patch: delete`` of that
file's objects, so the clusters get the base files with the overlay's in their place, as
Fleet gives them. Such a directory must hold whole files only (a ``_patch`` file beside them
would be rendered as a manifest), none replacing a base file by the very objects it held
(both copies would be rendered) or a file an earlier overlay patched, and no later overlay may
change its files.

What has no faithful equivalent (those cases, a patched file holding several documents, a
missing base file) raises :class:`OverlayError`, and the importer leaves the bundle out,
naming why.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from agent.api.yamlio import KUBE_DUMPER
from agent.render.detect import is_known_non_manifest
from agent.render.manifests import InvalidManifestError, load_documents
from agent.render.scope import builtin_scope

OVERLAYS = "overlays"
MOUNTED = "fleet-overlays"
"""Where an overlay directory that adds or swaps files is placed in the bundle's tree."""
_SUFFIXES = (".yaml", ".yml", ".json")
_PATCH_MARK = "_patch."


class OverlayError(Exception):
    """An overlay has no faithful fleetlet equivalent (the message says which file and why)."""


@dataclass
class Converted:
    """Fleet's overlays as fleetlet has them: patches, and the overlay directories placed in
    the bundle's tree (at ``MOUNTED/<name>``) for the files they add or swap in."""

    patches: list[dict[str, Any]] = field(default_factory=list)
    mounted: list[str] = field(default_factory=list)


def overlay_patches(directory: Path, names: Sequence[str]) -> Converted:
    """Fleet's ``overlays`` ``names`` (in order) of the raw-YAML bundle in ``directory``.
    Raises OverlayError."""
    files = _base_files(directory)
    for rel in files:
        if rel.split("/", 1)[0] == MOUNTED:
            raise OverlayError(f"{rel}: the bundle has a {MOUNTED}/ directory of its own, where "
                               "the import would place its overlays")  # fmt: skip
    state = {rel: copy.deepcopy(docs) for rel, docs in files.items()}
    dirty: set[str] = set()  # files whose content after a patch this module does not compute
    placed: set[str] = set()  # files an overlay placed in the tree (nothing may change them)
    out = Converted()
    for name in names:
        overlay = directory / OVERLAYS / str(name)
        if not overlay.is_dir():
            continue  # Fleet finds no file under the prefix: nothing changes
        read = {rel: _read(overlay / rel, f"{OVERLAYS}/{name}/{rel}") for rel in _walk(overlay)}
        for rel in read:
            if _patched_file(rel) in placed:
                raise OverlayError(f"{OVERLAYS}/{name}/{rel}: changes {_patched_file(rel)}, "
                                   "which an earlier overlay placed")  # fmt: skip
        if any(_swaps(state, rel, docs) for rel, docs in read.items()):
            out.patches += _place(state, dirty, placed, name, read)
            out.mounted.append(str(name))
            continue
        for rel, docs in read.items():
            where = f"{OVERLAYS}/{name}/{rel}"
            if _PATCH_MARK in PurePosixPath(rel).name:
                out.patches.append(_patch(state, dirty, _patched_file(rel), docs, where))
            else:
                out.patches += _replace(state, dirty, rel, docs, where)
    return out


def _patched_file(rel: str) -> str:
    base = PurePosixPath(rel)
    if _PATCH_MARK not in base.name:
        return rel
    return str(base.with_name(base.name.replace(_PATCH_MARK, ".", 1)))


def _swaps(state: dict[str, list[Any]], rel: str, docs: list[Any]) -> bool:
    """Whether the whole file ``rel`` adds a file or replaces one by other objects."""
    if _PATCH_MARK in PurePosixPath(rel).name:
        return False
    old = state.get(rel)
    if old is None:
        return bool(docs)
    if not docs:
        return False
    return not (
        len(old) == 1 and len(docs) == 1 and isinstance(docs[0], dict)
        and isinstance(old[0], dict) and _target(docs[0]) == _target(old[0])
    )  # fmt: skip


def _place(
    state: dict[str, list[Any]], dirty: set[str], placed: set[str], name: str,
    read: dict[str, list[Any]],
) -> list[dict[str, Any]]:  # fmt: skip
    """The overlay directory placed in the tree: deletions of the base files it replaces."""
    deletions: list[dict[str, Any]] = []
    for rel, docs in read.items():
        where = f"{OVERLAYS}/{name}/{rel}"
        if _PATCH_MARK in PurePosixPath(rel).name:
            raise OverlayError(f"{where}: a patch beside files that add or swap objects in one "
                               "overlay (its directory is placed in the tree whole)")  # fmt: skip
        if is_known_non_manifest(PurePosixPath(rel).name):
            raise OverlayError(f"{where}: fleetlet's plain format never reads a file of this "
                               "name as manifests")  # fmt: skip
        old = state.get(rel, [])
        if rel in dirty:
            raise OverlayError(f"{where}: replaces {rel}, already patched by another overlay")
        same = {json.dumps(_target(d), sort_keys=True) for d in old if isinstance(d, dict)}
        if any(json.dumps(_target(d), sort_keys=True) in same for d in docs if isinstance(d, dict)):
            raise OverlayError(f"{where}: replaces {rel} by other objects, some of them the "
                               "same objects as before (not converted)")  # fmt: skip
        deletions += _deletions(old)
        state[rel] = docs
        placed.add(rel)
    return deletions


def _deletions(docs: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "patch": _dump({"$patch": "delete", "apiVersion": d.get("apiVersion"),
                            "kind": d.get("kind"), "metadata": d.get("metadata")}),
            "target": _target(d),
        }
        for d in docs
        if isinstance(d, dict)
    ]  # fmt: skip


def _base_files(directory: Path) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for rel in _walk(directory):
        if rel.split("/", 1)[0] == OVERLAYS or PurePosixPath(rel).name == "fleet.yaml":
            continue
        try:
            out[rel] = _read(directory / rel, rel)
        except OverlayError:
            continue  # not a manifest this module needs; the render check judges it
    return out


def _walk(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(_SUFFIXES) and not name.startswith("."):
                found.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(found)


def _read(path: Path, where: str) -> list[Any]:
    try:
        return load_documents(path.read_bytes(), source="overlays", file=where)
    except (OSError, InvalidManifestError) as exc:
        raise OverlayError(f"{where}: {exc}") from None


def _one(state: dict[str, list[Any]], rel: str, where: str) -> dict[str, Any]:
    if rel not in state:
        raise OverlayError(f"{where}: no file {rel} to patch (Fleet fails to deploy it too)")
    docs = state[rel]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise OverlayError(
            f"{where}: {rel} holds {len(docs)} documents (Fleet patches a file as one object)"
        )
    return docs[0]


def _target(obj: dict[str, Any]) -> dict[str, Any]:
    api_version = str(obj.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    found = obj.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    target: dict[str, Any] = {"version": version, "kind": obj.get("kind"),
                              "name": metadata.get("name")}  # fmt: skip
    if group:
        target["group"] = group
    if metadata.get("namespace"):
        target["namespace"] = metadata["namespace"]
    return target


def _patch(
    state: dict[str, list[Any]], dirty: set[str], rel: str, docs: list[Any], where: str
) -> dict[str, Any]:
    obj = _one(state, rel, where)
    if len(docs) != 1:
        raise OverlayError(f"{where}: a patch file holds one document")
    patch = docs[0]
    if isinstance(patch, list):  # a JSON patch: kept as it is
        dirty.add(rel)
        return {"patch": json.dumps(patch), "target": _target(obj)}
    if not isinstance(patch, dict):
        raise OverlayError(f"{where}: not a patch (a mapping or a list of operations)")
    builtin = builtin_scope(str(obj.get("apiVersion")), str(obj.get("kind"))) is not None
    if builtin and obj.get("kind") != "CustomResourceDefinition":
        # A strategic merge patch, as Fleet applies one to a built-in kind.
        dirty.add(rel)
        return {"patch": _dump(patch), "target": _target(obj)}
    if rel in dirty:
        raise OverlayError(f"{where}: a merge patch of {rel} after another kind of patch of it")
    ops = _merge_ops(obj, patch, "")
    state[rel] = [_merge(obj, patch)]
    return {"patch": json.dumps(ops), "target": _target(obj)}


def _replace(
    state: dict[str, list[Any]], dirty: set[str], rel: str, docs: list[Any], where: str
) -> list[dict[str, Any]]:
    if rel not in state:
        if not docs:
            return []  # an empty file added: nothing to deploy
        raise OverlayError(f"{where}: adds {rel}, and fleetlet's overrides cannot add objects")
    old = state[rel]
    if rel in dirty and docs:
        raise OverlayError(f"{where}: replaces {rel}, already patched by another overlay")
    if not docs:  # an empty file: the file's objects are gone
        state[rel] = []
        return _deletions(old)
    if len(old) != 1 or len(docs) != 1 or not isinstance(docs[0], dict):
        raise OverlayError(f"{where}: replaces {rel} by other objects (fleetlet patches change "
                           "objects, they cannot swap them)")  # fmt: skip
    new, before = docs[0], old[0]
    if _target(new) != _target(before):
        raise OverlayError(f"{where}: replaces the object of {rel} by another object")
    ops: list[dict[str, Any]] = [
        {"op": "remove", "path": f"/{_escape(k)}"} for k in before if k not in new
    ]
    ops += [{"op": "add", "path": f"/{_escape(k)}", "value": v} for k, v in new.items()
            if before.get(k) != v]  # fmt: skip
    state[rel] = [new]
    return [{"patch": json.dumps(ops), "target": _target(before)}] if ops else []


def _merge_ops(obj: Any, patch: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """JSON patch operations doing what the merge patch (RFC 7386) does to ``obj``."""
    ops: list[dict[str, Any]] = []
    for key, value in patch.items():
        here = f"{path}/{_escape(str(key))}"
        present = isinstance(obj, dict) and key in obj
        if value is None:
            if present:
                ops.append({"op": "remove", "path": here})
        elif isinstance(value, dict) and present and isinstance(obj[key], dict):
            ops += _merge_ops(obj[key], value, here)
        else:
            ops.append({"op": "add", "path": here, "value": _merge(None, value)})
    return ops


def _merge(obj: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(obj) if isinstance(obj, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _dump(data: Any) -> str:
    return str(yaml.dump(data, Dumper=KUBE_DUMPER, sort_keys=False))


__all__ = ["MOUNTED", "OVERLAYS", "Converted", "OverlayError", "overlay_patches"]
