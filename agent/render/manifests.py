"""Parse YAML and JSON manifest files safely: bounded, alias-bomb proof, validated.

YAML is read as Kubernetes reads it (:data:`agent.api.yamlio.KUBE_LOADER`: go-yaml's scalar
rules, C parser when libyaml is there), twice: first
the event stream is scanned without building anything, counting documents, nesting depth,
aliases and the number of nodes the document would have once every alias is expanded (each
anchor's expanded size is remembered, so an alias bomb is measured in one linear pass and
refused before anything is built); only then is it loaded. Objects are then copied through
JSON, which expands aliases (within the bound just checked) so nothing downstream shares
structure. A key written twice in one mapping is refused (go-yaml would keep the last one
silently), as the set loader refuses it.

Each refusal is an :class:`InvalidManifestError` naming the source, the file and the rule.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from agent.api.yamlio import KUBE_LOADER, DuplicateKeyError, json_number
from agent.source.content import ContentRefusedError

_Loader: type[Any] = KUBE_LOADER


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s object hook: refuse a key written twice in one object."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKeyError(f"key {json.dumps(key)} appears twice in one object")
        found[key] = value
    return found


def _json_float(text: str) -> int | float:
    return json_number(float(text))


def _json_int(text: str) -> int | float:
    return json_number(int(text))


# C0 controls except tab, newline and carriage return, and DEL: never in a text manifest.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

Manifest = dict[str, Any]


class InvalidManifestError(ContentRefusedError):
    """A manifest file or one of its documents was refused (``rule`` says which check)."""

    reason = "InvalidManifest"


@dataclass(frozen=True, kw_only=True)
class ParseLimits:
    """Caps for one manifest file. ``max_nodes`` counts nodes after alias expansion."""

    max_file_bytes: int = 8 * 1024 * 1024
    max_document_chars: int = 2 * 1024 * 1024
    max_documents: int = 2_000
    max_nodes: int = 500_000
    max_aliases: int = 1_000
    max_depth: int = 100


def decode_text(data: bytes, *, source: str, file: str, limits: ParseLimits) -> str:
    """Check size and encoding; return the text.

    Raises InvalidManifestError (FileTooLarge, BinaryContent, NotUtf8).
    """
    if len(data) > limits.max_file_bytes:
        raise InvalidManifestError(
            f"{len(data)} bytes, more than the limit of {limits.max_file_bytes}",
            source=source,
            file=file,
            rule="FileTooLarge",
        )
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InvalidManifestError(
            f"binary content (NUL byte at offset {nul})",
            source=source,
            file=file,
            rule="BinaryContent",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidManifestError(
            f"not UTF-8 (byte {data[exc.start]:#04x} at offset {exc.start})",
            source=source,
            file=file,
            rule="NotUtf8",
        ) from None
    text = text.removeprefix("\ufeff")
    control = _CONTROL.search(text)
    if control is not None:
        raise InvalidManifestError(
            f"binary content (control character {ord(control.group()):#04x} at offset "
            f"{control.start()})",
            source=source,
            file=file,
            rule="BinaryContent",
        )
    return text


def _scan_yaml(text: str, *, source: str, file: str, limits: ParseLimits) -> None:
    """Walk the YAML event stream and refuse what would be too big once built."""

    def refuse(message: str, rule: str) -> InvalidManifestError:
        return InvalidManifestError(message, source=source, file=file, rule=rule)

    anchors: dict[str, int] = {}
    stack: list[list[Any]] = []  # per open collection: [anchor, expanded node count]
    documents = 0
    aliases = 0
    doc_nodes = 0
    doc_start = 0

    def add(size: int) -> None:
        nonlocal doc_nodes
        doc_nodes += size
        if stack:
            stack[-1][1] += size
        if doc_nodes > limits.max_nodes:
            raise refuse(
                f"document {documents} expands to more than {limits.max_nodes} nodes "
                f"(alias expansion)",
                "AliasBomb" if aliases else "TooManyNodes",
            )

    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                doc_nodes = 0
                anchors.clear()
                doc_start = event.start_mark.index if event.start_mark else 0
                if documents > limits.max_documents:
                    raise refuse(f"more than {limits.max_documents} documents", "TooManyDocuments")
            elif isinstance(event, yaml.DocumentEndEvent):
                end = event.end_mark.index if event.end_mark else 0
                if end - doc_start > limits.max_document_chars:
                    raise refuse(
                        f"document {documents} is {end - doc_start} characters, more than "
                        f"{limits.max_document_chars}",
                        "DocumentTooLarge",
                    )
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > limits.max_aliases:
                    raise refuse(f"more than {limits.max_aliases} aliases", "AliasBomb")
                if event.anchor not in anchors:
                    raise refuse(f"alias *{event.anchor} has no anchor before it", "YamlSyntax")
                add(anchors[event.anchor])
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    anchors[event.anchor] = 1
                add(1)
            elif isinstance(event, yaml.CollectionStartEvent):
                stack.append([event.anchor, 0])
                if len(stack) > limits.max_depth:
                    raise refuse(f"nested deeper than {limits.max_depth} levels", "TooDeep")
                add(1)
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, size = stack.pop()
                if stack:
                    stack[-1][1] += size
                if anchor is not None:
                    anchors[anchor] = size + 1
    except yaml.YAMLError as exc:
        raise refuse(f"not valid YAML: {_one_line(exc)}", "YamlSyntax") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def load_documents(
    data: bytes, *, source: str, file: str, limits: ParseLimits | None = None
) -> list[object]:
    """Parse a YAML (multi-document) or JSON file into plain JSON-like values.

    JSON is chosen by a ``.json`` file name; empty YAML documents are dropped.
    Raises InvalidManifestError.
    """
    limits = limits or ParseLimits()
    text = decode_text(data, source=source, file=file, limits=limits)
    if file.endswith(".json"):
        try:
            # Numbers as Kubernetes decodes them (``1.0`` is ``1``; see json_number).
            return [
                json.loads(
                    text,
                    object_pairs_hook=_unique_pairs,
                    parse_float=_json_float,
                    parse_int=_json_int,
                )
            ]
        except DuplicateKeyError as exc:
            raise InvalidManifestError(
                str(exc), source=source, file=file, rule="DuplicateKey"
            ) from None
        except RecursionError:
            raise InvalidManifestError(
                "nested too deeply", source=source, file=file, rule="TooDeep"
            ) from None
        except ValueError as exc:
            raise InvalidManifestError(
                f"not valid JSON: {exc}", source=source, file=file, rule="JsonSyntax"
            ) from None
    _scan_yaml(text, source=source, file=file, limits=limits)
    try:
        raw = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except DuplicateKeyError as exc:
        raise InvalidManifestError(
            str(exc), source=source, file=file, rule="DuplicateKey"
        ) from None
    except yaml.YAMLError as exc:
        raise InvalidManifestError(
            f"not valid YAML: {_one_line(exc)}", source=source, file=file, rule="YamlSyntax"
        ) from None
    try:
        # Expands aliases (bounded by the scan), so nothing downstream shares structure; NaN and
        # infinities are refused, as Go's JSON refuses them.
        documents: list[object] = json.loads(json.dumps(raw, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidManifestError(
            f"value not representable in JSON: {exc}",
            source=source,
            file=file,
            rule="UnsupportedValue",
        ) from None
    return documents


_UNQUOTED = (
    "Kubernetes reads unquoted y, n, yes, no, on, off, true, false, null and numbers as "
    "non-strings: quote it"
)

# Annotations that make an object a hook (created at a stage, not applied): Argo CD's and Helm's.
HOOK_ANNOTATIONS = ("argocd.argoproj.io/hook", "helm.sh/hook")


def is_hook(document: dict[str, Any]) -> bool:
    """Whether the object carries a hook annotation (see :data:`HOOK_ANNOTATIONS`)."""
    metadata = document.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return isinstance(annotations, dict) and any(a in annotations for a in HOOK_ANNOTATIONS)


def validate_object(
    document: object, *, source: str, file: str, index: int, item: int | None = None
) -> Manifest:
    """Check one document is a Kubernetes object: a mapping with apiVersion, kind, metadata.name
    (or, for a hook, metadata.generateName; see :func:`is_hook`).

    Raises InvalidManifestError (DocumentIsList, DocumentIsScalar, MissingApiVersion,
    MissingKind, MissingName).
    """
    where = f"{file} (document {index + 1})"
    if item is not None:
        where = f"{file} (document {index + 1}, item {item + 1})"

    def refuse(message: str, rule: str) -> InvalidManifestError:
        return InvalidManifestError(message, source=source, file=where, rule=rule)

    if isinstance(document, list):
        raise refuse("document is a list, expected an object", "DocumentIsList")
    if not isinstance(document, dict):
        raise refuse(
            f"document is a {type(document).__name__} scalar, expected an object",
            "DocumentIsScalar",
        )
    api_version = document.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        raise refuse("no apiVersion", "MissingApiVersion")
    kind = document.get("kind")
    if not isinstance(kind, str) or not kind:
        raise refuse("no kind", "MissingKind")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        raise refuse(f"{kind} has no metadata", "MissingName")
    name = metadata.get("name")
    if name is None and is_hook(document):
        # Hooks (Argo CD's and Helm's) may be created under a generated name, never applied.
        generate = metadata.get("generateName")
        if isinstance(generate, str) and generate:
            name = generate
    if name is not None and not isinstance(name, str):
        raise refuse(
            f"{kind}: metadata.name is {json.dumps(name)}, not a string ({_UNQUOTED})",
            "MissingName",
        )
    if not isinstance(name, str) or not name:
        if metadata.get("generateName"):
            raise refuse(
                f"{kind} has only metadata.generateName: that is allowed for hooks "
                f"({', '.join(HOOK_ANNOTATIONS)} annotations); an applied object needs a name",
                "MissingName",
            )
        raise refuse(f"{kind} has no metadata.name", "MissingName")
    namespace = metadata.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise refuse(f"{kind} {name}: metadata.namespace is not a string", "InvalidNamespace")
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise refuse(
                f"{kind} {name}: metadata.{field} must map strings to strings", "InvalidMetadata"
            )
        for key, text in value.items():
            if not isinstance(text, str):
                raise refuse(
                    f"{kind} {name}: metadata.{field}.{key} is {json.dumps(text)}, not a string "
                    f"({_UNQUOTED})",
                    "InvalidMetadata",
                )
    return document


def parse_manifests(
    data: bytes, *, source: str, file: str, limits: ParseLimits | None = None
) -> list[Manifest]:
    """The Kubernetes objects in one file, in order (``kind: List`` items expanded).

    Raises InvalidManifestError.
    """
    objects: list[Manifest] = []
    for index, document in enumerate(load_documents(data, source=source, file=file, limits=limits)):
        if isinstance(document, dict) and _is_list_without_name(document):
            for item_index, item in enumerate(document["items"]):
                objects.append(
                    validate_object(item, source=source, file=file, index=index, item=item_index)
                )
            continue
        objects.append(validate_object(document, source=source, file=file, index=index))
    return objects


def _is_list_without_name(document: dict[str, Any]) -> bool:
    # kubectl's convention: a v1 List (or any *List) is a container, not an object to apply.
    return (
        isinstance(document.get("kind"), str)
        and document["kind"].endswith("List")
        and isinstance(document.get("items"), list)
        and not (isinstance(document.get("metadata"), dict) and document["metadata"].get("name"))
    )
