"""The ``plain`` format: a directory tree of YAML/JSON manifests, and the finishing every
format's output gets (target namespace, ownership labels).

Files ending in ``.yaml``, ``.yml`` or ``.json`` are read (hidden files and directories are
skipped, and so are the well-known files that configure a tool rather than describe objects:
Rancher Fleet's ``fleet.yaml`` and the ``overlays/`` directory beside it, Helm's ``Chart.yaml``
and ``values*.yaml``, kustomize's ``kustomization.yaml``; see
:func:`agent.render.detect.is_known_non_manifest`), in a stable
order: each path component is ordered by its numeric prefix (``01_``,
``2-``, ``10.``; so ``01_namespace.yaml`` comes before ``02_app.yaml`` and ``9_`` before
``10_``), unnumbered components after the numbered ones, then by name. Documents keep their
order inside a file. Symlinks are followed only when they stay inside the tree (every one is
judged, hidden or not, and none may climb out of the tree on its way). Every bad file is
reported, not only the first (:class:`InvalidManifestsError`). ``formatOptions.path`` renders
one directory of the tree (:func:`render_root`).

:func:`finish` then gives namespaced objects without a namespace the target namespace (scope
from a :data:`~agent.render.scope.ScopeLookup`, the bundle's own CRDs first), and adds the
ownership labels ``fleetlet.io/bundle``, ``fleetlet.io/group`` and the annotation
``fleetlet.io/revision``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agent.errors import TemporaryError
from agent.render.detect import detect_format, is_known_non_manifest
from agent.render.facts import ClusterFacts
from agent.render.manifests import InvalidManifestError, Manifest, ParseLimits, parse_manifests
from agent.render.scope import ScopeLookup, builtin_scope, with_bundle_crds
from agent.render.tools import ToolSettings
from agent.source.tree import LinkEscapeError, resolve_inside

if TYPE_CHECKING:
    from agent.secrets.keys import Keyring

BUNDLE_LABEL = "fleetlet.io/bundle"
GROUP_LABEL = "fleetlet.io/group"
REVISION_ANNOTATION = "fleetlet.io/revision"

_SUFFIXES = (".yaml", ".yml", ".json")
_PREFIX = re.compile(r"^(\d+)(?=[_.\-])")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_UNNUMBERED = 1 << 62
_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class Ownership:
    """Who owns rendered objects: bundle and group names (label values), the revision."""

    bundle: str
    group: str
    revision: str

    def __post_init__(self) -> None:
        for what, value in (("bundle", self.bundle), ("group", self.group)):
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise ValueError(f"{what} name {value!r} is not a valid label value")


@dataclass(frozen=True, kw_only=True)
class RenderLimits:
    """Caps for one bundle tree (per file caps are in ``parse``)."""

    max_files: int = 5_000
    max_total_bytes: int = 64 * 1024 * 1024
    max_objects: int = 10_000
    parse: ParseLimits = field(default_factory=ParseLimits)


@dataclass(frozen=True, kw_only=True)
class RenderRequest:
    """What a format renders for: ``source`` names the bundle in messages; ``options`` are the
    format's options from the BundleDeployment (``formatOptions``, camelCase keys; the plain
    format reads only ``path``). ``patches`` (API ``Patch`` dicts) are applied by
    :func:`agent.render.formats.render_bundle` after the format, never by the format itself.
    ``cluster`` is what is known of the cluster (version, served APIs); ``upgrade`` whether the
    bundle is already installed there (helm's ``.Release.IsUpgrade``); ``tools`` where helm
    and kustomize are. ``helm_set`` are ``fleetlet render``'s ``--set*`` flags
    (``--set=a=1``), given to helm as they were written after the values (so that helm types
    them itself: an integer there stays an int64, where one in values is a float64);
    ``keyring`` the cluster's age keys, which open the tree's SOPS files before the format
    reads them (None: they stay encrypted, as in the hub's previews).

    Every field but ``source``, ``scope``, ``ownership``, ``tools`` and ``keyring`` is part of
    the render cache key (:mod:`agent.render.cache`): a field added here changes the key, so it is never
    stale.
    """

    source: str = "bundle"
    namespace: str | None = None
    scope: ScopeLookup = builtin_scope
    ownership: Ownership | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    limits: RenderLimits = field(default_factory=RenderLimits)
    patches: Sequence[Mapping[str, Any]] = ()
    cluster: ClusterFacts = field(default_factory=ClusterFacts)
    upgrade: bool = False
    tools: ToolSettings = field(default_factory=ToolSettings)
    helm_set: Sequence[str] = ()
    keyring: Keyring | None = None


class InvalidManifestsError(InvalidManifestError):
    """Several files of a tree were refused; ``errors`` has each, in render order."""

    def __init__(self, errors: Sequence[InvalidManifestError], *, source: str) -> None:
        self.errors = list(errors)
        rules = sorted({e.rule for e in self.errors})
        listed = "; ".join(f"{e.file}: {e.detail} [{e.rule}]" for e in self.errors)
        super().__init__(
            f"{len(self.errors)} files refused: {listed}",
            source=source,
            rule=",".join(rules),
        )


def render_root(tree: Path, request: RenderRequest) -> Path:
    """The directory to render: ``tree``, or ``options["path"]`` inside it.

    Raises InvalidManifestError (PathNotFound, PathEscapes).
    """
    path = request.options.get("path")
    if not path:
        return tree
    root = tree / str(path)
    real_tree = os.path.realpath(tree)
    real = os.path.realpath(root)
    if real != real_tree and not real.startswith(real_tree + os.sep):
        raise InvalidManifestError(
            f"path {path!r} leaves the bundle tree", source=request.source, rule="PathEscapes"
        )
    if not root.is_dir():
        raise InvalidManifestError(
            f"path {path!r}: no such directory in the bundle tree",
            source=request.source,
            rule="PathNotFound",
        )
    return root


def order_key(relative: str) -> tuple[tuple[int, str], ...]:
    """Sort key of a relative path: per component, numeric prefix first, then name."""
    key = []
    for part in relative.split("/"):
        match = _PREFIX.match(part)
        key.append((int(match.group(1)) if match else _UNNUMBERED, part))
    return tuple(key)


FLEET_FILE = "fleet.yaml"
_FLEET_OVERLAYS = "overlays"


def manifest_files(tree: Path, *, source: str, limits: RenderLimits) -> list[str]:
    """The manifest files under ``tree`` (relative POSIX paths), in render order.

    Every symlink of the tree is judged, hidden ones and those in hidden directories too
    (other formats' tools may read what this one skips): each must resolve inside the tree
    without climbing out on the way. Raises InvalidManifestError (SymlinkEscapes,
    TooManyFiles).
    """
    found: list[str] = []
    # Rancher Fleet's overlays (files patching or replacing the bundle's, per cluster) are not
    # manifests: Fleet never deploys them as they are (the importer makes them patches).
    fleet_overlays = (tree / FLEET_FILE).is_file()
    for dirpath, dirnames, filenames in os.walk(tree, followlinks=False):
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                _inside(Path(full).relative_to(tree).as_posix(), tree, source)
        # Hidden directories are walked for their links only: their files are not read.
        relative = Path(dirpath).relative_to(tree).as_posix()
        if any(part.startswith(".") for part in relative.split("/") if part != "."):
            continue
        if fleet_overlays and relative.split("/", 1)[0] == _FLEET_OVERLAYS:
            continue
        for name in filenames:
            if name.startswith(".") or not name.endswith(_SUFFIXES):
                continue
            if is_known_non_manifest(name):
                continue
            found.append(Path(os.path.join(dirpath, name)).relative_to(tree).as_posix())
            if len(found) > limits.max_files:
                raise InvalidManifestError(
                    f"more than {limits.max_files} manifest files",
                    source=source,
                    file=found[-1],
                    rule="TooManyFiles",
                )
    # Symlinked directories are not walked (they could loop); their files are not read.
    return sorted(found, key=order_key)


def _inside(relative: str, tree: Path, source: str) -> None:
    try:
        resolve_inside(tree, relative)
    except LinkEscapeError as exc:
        raise InvalidManifestError(
            f"symlink points outside the bundle: {exc}",
            source=source,
            file=relative,
            rule="SymlinkEscapes",
        ) from None


def load_tree(tree: Path, request: RenderRequest) -> list[Manifest]:
    """Every object of the tree's manifest files, in render order (not yet finished).

    A file that does not parse or holds something that is not an object does not stop the
    walk: every such file is reported in one error. The tree's bounds (files, bytes, objects)
    do stop it at once.
    Raises InvalidManifestError (one bad file), InvalidManifestsError (several).
    """
    limits = request.limits
    objects: list[Manifest] = []
    origins: list[str] = []
    refused: list[InvalidManifestError] = []
    total = 0
    for relative in manifest_files(tree, source=request.source, limits=limits):
        path = tree / relative
        size = _size(path, relative, request.source)
        total += size
        if total > limits.max_total_bytes:
            raise InvalidManifestError(
                f"manifests exceed {limits.max_total_bytes} bytes in total",
                source=request.source,
                file=relative,
                rule="TooManyBytes",
            )
        if size > limits.parse.max_file_bytes:
            raise InvalidManifestError(
                f"{size} bytes, more than the limit of {limits.parse.max_file_bytes}",
                source=request.source,
                file=relative,
                rule="FileTooLarge",
            )
        data = _guard_read(path.read_bytes, relative, request.source)
        try:
            found = parse_manifests(data, source=request.source, file=relative, limits=limits.parse)
        except InvalidManifestError as exc:
            refused.append(exc)
        else:
            objects.extend(found)
            origins.extend([relative] * len(found))
        if len(objects) > limits.max_objects:
            raise InvalidManifestError(
                f"more than {limits.max_objects} objects",
                source=request.source,
                file=relative,
                rule="TooManyObjects",
            )
    if len(refused) == 1:
        raise refused[0]
    if refused:
        raise InvalidManifestsError(refused, source=request.source)
    refuse_duplicates(objects, origins, source=request.source)
    return objects


# What a file named by the content itself can do to a read: a dangling link, a link loop, a
# link to a directory. Anything else is our own disk.
_CONTENT_ERRNOS = {errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG}


def _guard_read(read: Callable[[], _T], relative: str, source: str) -> _T:
    """``read()``; a failure the content caused is an InvalidManifestError (UnreadableFile),
    one of the local disk a TemporaryError."""
    try:
        return read()
    except OSError as exc:
        if exc.errno in _CONTENT_ERRNOS:
            raise InvalidManifestError(
                f"cannot be read: {exc.strerror}",
                source=source,
                file=relative,
                rule="UnreadableFile",
            ) from None
        raise TemporaryError(f"{source}: {relative}: cannot be read: {exc}") from exc


def _size(path: Path, relative: str, source: str) -> int:
    return _guard_read(lambda: path.stat().st_size, relative, source)


def _identity(obj: Manifest, index: int) -> tuple[str, str, str, str]:
    api_version = str(obj["apiVersion"])
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    meta = obj["metadata"]
    # A hook known by generateName gets its name from the API server: never a duplicate.
    name = meta.get("name") or f"{meta.get('generateName')}<generated #{index + 1}>"
    return (group, str(obj["kind"]), str(meta.get("namespace") or ""), str(name))


def refuse_duplicates(objects: Sequence[Manifest], origins: Sequence[str], *, source: str) -> None:
    """Refuse an object written twice, naming where each copy came from (``origins``: the file
    of each object, parallel to ``objects``). Namespaces as written: :func:`finish` catches
    what defaulting makes equal.

    Raises InvalidManifestError (DuplicateObject).
    """
    seen: dict[tuple[str, str, str, str], str] = {}
    for index, (obj, origin) in enumerate(zip(objects, origins, strict=True)):
        identity = _identity(obj, index)
        if identity in seen:
            group, kind, namespace, name = identity
            where = f"{namespace}/{name}" if namespace else name
            raise InvalidManifestError(
                f"{kind}{'.' + group if group else ''} {where} appears twice: in {seen[identity]} "
                f"and in {origin}",
                source=source,
                file=origin,
                rule="DuplicateObject",
            )
        seen[identity] = origin


def finish(objects: list[Manifest], request: RenderRequest) -> list[Manifest]:
    """Default namespaces, add ownership, refuse duplicates; returns the same objects.

    A namespaced object without a namespace gets ``request.namespace`` (when set); a kind the
    lookup does not know is left as written (applying it will say what is wrong).
    Raises InvalidManifestError (DuplicateObject).
    """
    scope = with_bundle_crds(objects, request.scope)
    seen: dict[tuple[str, str, str, str], int] = {}
    for index, obj in enumerate(objects):
        meta = obj["metadata"]
        if (
            request.namespace
            and not meta.get("namespace")
            and scope(str(obj["apiVersion"]), str(obj["kind"]))
        ):
            meta["namespace"] = request.namespace
        identity = _identity(obj, index)
        if identity in seen:
            group, kind, namespace, name = identity
            where = f"{namespace}/{name}" if namespace else name
            raise InvalidManifestError(
                f"{kind}{'.' + group if group else ''} {where} appears twice "
                f"(objects {seen[identity] + 1} and {index + 1})",
                source=request.source,
                file=f"object {index + 1}",
                rule="DuplicateObject",
            )
        seen[identity] = index
        _own(meta, request.ownership)
    return objects


def _own(meta: dict[str, Any], owner: Ownership | None) -> None:
    if owner is not None:
        labels = meta.get("labels") or {}
        labels[BUNDLE_LABEL] = owner.bundle
        labels[GROUP_LABEL] = owner.group
        meta["labels"] = labels
        annotations = meta.get("annotations") or {}
        annotations[REVISION_ANNOTATION] = owner.revision
        meta["annotations"] = annotations


class PlainFormat:
    """The built-in ``plain`` format."""

    name = "plain"

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]:
        """The objects of ``formatOptions.path`` (default: the tree), in order.

        Raises InvalidManifestError (InvalidManifestsError for several bad files; the message
        says so when the directory looks like another format).
        """
        root = render_root(tree, request)
        try:
            return load_tree(root, request)
        except InvalidManifestError as exc:
            detected = detect_format(root)
            if detected.format == "plain":
                raise
            # The same error (type, rule, files); only its message gains the hint.
            exc.args = (
                f"{exc} (the directory looks like a {detected.format} bundle: "
                f"{detected.evidence}; render it with format {detected.format})",
            )
            raise
