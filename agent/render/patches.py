"""Post-render ``patches`` for every format, applied by the pinned kustomize.

A strategic merge patch needs the schema of each kind (which lists merge by which key:
containers by ``name``, ports by ``containerPort``...). kustomize carries Kubernetes' OpenAPI
for that, and it is what Flux's Kustomization ``patches`` run on, so the same patch means the
same thing here as there: a list in a kind kustomize has no schema for (a custom resource) is
replaced, JSON 6902 operations apply as RFC 6902 says, and ``target`` selects with kustomize's
rules (``name``/``namespace`` are regular expressions, label and annotation selectors).

The rendered objects and the patches are written into a temporary kustomization
(``sortOptions: fifo`` keeps the objects' order) and built by the same bounded child process
as the ``kustomize`` format. Objects known only by ``metadata.generateName`` (hooks), which
kustomize refuses, get a placeholder name for the build and have it taken away after. A
targeted strategic merge patch may leave out ``apiVersion``, ``kind`` and ``metadata.name``
(kustomize needs them to read the patch, but with a target they select nothing): they are
filled in from the target.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.errors import PermanentError
from agent.render import confine
from agent.render._process import run_tool
from agent.render.manifests import (
    InvalidManifestError,
    Manifest,
    ParseLimits,
    load_documents,
    parse_manifests,
)
from agent.render.tools import find_tool


class PatchFailedError(InvalidManifestError):
    """A patch could not be applied (no object matches a strategic merge patch, a JSON 6902
    operation fails, the patch is not valid)."""

    reason = "PatchFailed"


def apply_patches(
    objects: Sequence[Manifest],
    patches: Sequence[Mapping[str, Any]],
    *,
    source: str,
    kustomize: Path | None = None,
    timeout: float = 120.0,
    max_memory: int = 1 << 30,
    limits: ParseLimits | None = None,
) -> list[Manifest]:
    """``objects`` with ``patches`` (API ``Patch`` dicts: ``patch`` and optional ``target``)
    applied in order; the objects themselves are not changed.

    Raises PatchFailedError, and the tool lookup's errors (kustomize missing).
    """
    if not patches:
        return list(objects)
    tool = kustomize or find_tool("kustomize")
    generated: dict[str, str] = {}  # placeholder name -> generateName
    placed = [_with_placeholder(obj, i, generated) for i, obj in enumerate(objects)]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["objects.yaml"],
        "sortOptions": {"order": "fifo"},
        "patches": kustomization_patches(patches, source=source),
    }
    with tempfile.TemporaryDirectory(prefix="fleetlet-patch-") as work:
        directory = Path(work)
        # JSON is YAML: one document per object, no YAML emitter in the way.
        (directory / "objects.yaml").write_text(
            "\n---\n".join(json.dumps(o, separators=(",", ":")) for o in placed)
        )
        (directory / "kustomization.yaml").write_text(json.dumps(kustomization))
        try:
            output = run_tool(
                [tool, "build", "."],
                cwd=directory,
                timeout=timeout,
                max_memory=max_memory,
                env=confine.environment(scratch=directory),
                confine=confine.for_tool(tool, tree=directory, scratch=directory),
            )
        except PermanentError as exc:
            raise PatchFailedError(
                explain_failure(str(exc)), source=source, file="patches", rule="PatchFailed"
            ) from exc
    patched = parse_manifests(
        output, source=source, file="patches (kustomize output)", limits=limits or _limits()
    )
    return [_without_placeholder(obj, generated) for obj in patched]


def kustomization_patches(
    patches: Sequence[Mapping[str, Any]], *, source: str
) -> list[dict[str, Any]]:
    """``patches`` as entries of a kustomization's ``patches`` field (see :func:`_named`).

    Raises InvalidManifestError (a patch that is not YAML).
    """
    return [_entry(p, source=source, index=i) for i, p in enumerate(patches)]


def _entry(patch: Mapping[str, Any], *, source: str, index: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"patch": patch["patch"]}
    target = patch.get("target")
    if target:
        entry["target"] = dict(target)
        entry["patch"] = _named(str(patch["patch"]), target, source=source, index=index)
    return entry


def _named(text: str, target: Mapping[str, Any], *, source: str, index: int) -> str:
    """A targeted strategic merge patch with the ``kind``, ``apiVersion`` and
    ``metadata.name`` kustomize needs to read it (they do not select: the target does), taken
    from the target or placeholders when the patch leaves them out, as Flux users are used to
    writing them."""
    documents = load_documents(text.encode(), source=source, file=f"patches[{index}]")
    mappings = [d for d in documents if isinstance(d, dict)]
    if not mappings or len(mappings) != len(documents):
        return text  # a JSON 6902 patch (a list), passed as written
    group, version = target.get("group") or "", target.get("version") or "v1"
    filled = []
    for document in mappings:
        document.setdefault("apiVersion", f"{group}/{version}" if group else version)
        document.setdefault("kind", target.get("kind") or "Patched")
        metadata = document.setdefault("metadata", {})
        if isinstance(metadata, dict):
            metadata.setdefault("name", "patched")
        filled.append(json.dumps(document))
    return "\n---\n".join(filled)


def _with_placeholder(obj: Manifest, index: int, generated: dict[str, str]) -> Manifest:
    meta = obj.get("metadata") or {}
    if meta.get("name") or not meta.get("generateName"):
        return obj
    generate = str(meta["generateName"])
    name = f"{generate}fleetlet-placeholder-{index}"
    generated[name] = generate
    named = {k: v for k, v in meta.items() if k != "generateName"}
    named["name"] = name
    return {**obj, "metadata": named}


def _without_placeholder(obj: Manifest, generated: dict[str, str]) -> Manifest:
    meta = obj["metadata"]
    generate = generated.get(meta.get("name"))
    if generate is not None:
        del meta["name"]
        meta["generateName"] = generate
    return obj


def _limits() -> ParseLimits:
    # The whole rendered bundle comes back as one stream: bounded like a tree, not a file.
    return ParseLimits(max_file_bytes=64 * 1024 * 1024, max_documents=10_000)


def explain_failure(message: str) -> str:
    """kustomize's message, with what to do when a strategic merge patch matched nothing."""
    if "no matches for Id" in message or "failed to find unique target" in message:
        return (
            f"{message} (a strategic merge patch without target must name an object as "
            "rendered: apiVersion, kind, metadata.name, and metadata.namespace when the object "
            "has one; or give a target)"
        )
    return message
