"""Rendered bundles, cached by exactly what shapes them, so an idle reconcile renders nothing.

The key (:func:`render_key`) is a sha256 over:

- the content: the digest of the bundle's pinned sources (:func:`sources_digest`, in the
  agent: pins are immutable, so the tree need not even be composed to know it) or of a
  directory's files (:func:`tree_digest`, for ``fleetlet render``);
- the format's name and its ``cache_identity()`` when it has one (the kustomize binary it
  would run: another kustomize is another render), the kustomize that would apply patches,
  and fleetlet's version;
- every field of the :class:`~agent.render.plain.RenderRequest` that shapes the output: the
  format options, patches, target namespace, limits, cluster facts (Kubernetes version and
  APIs), and any field added later; of the cluster's age keyring, its public keys (whether
  SOPS files are opened, and with which keys). Only ``source`` (a name in messages), ``scope`` and
  ``ownership`` are left out: they are applied by :func:`~agent.render.plain.finish` after the
  cache, on every call (cheap, and the scope is the live cluster's).

What is kept is the output of :func:`~agent.render.formats.render_objects` (validated and
patched), as compressed JSON: each hit decodes a fresh copy, so callers may change it. The
cache is bounded in memory (bytes, least recently used first out) and, given a directory, also
kept on disk (bounded in files) so a restarted agent does not run the tools again either.
Failures are not cached. A render that opened SOPS files (:mod:`agent.secrets.tree`, between
composing the tree and rendering it) or decrypted a bundle's encrypted values
(:mod:`agent.secrets.values`) is kept in memory only: decrypted values are never written to
the cache's directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from agent import __version__
from agent.render.formats import get_format, render_objects
from agent.render.manifests import Manifest
from agent.render.plain import RenderRequest, finish
from agent.secrets.tree import open_tree
from agent.secrets.values import open_values

# RenderRequest fields applied after the cache (see the module doc).
_NOT_IN_KEY = frozenset({"source", "scope", "ownership", "tools", "keyring"})


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"a {type(value).__name__} cannot be part of a render cache key")


def file_identity(path: Path) -> str:
    """Which binary a path is, cheaply: the path, its size and modification time."""
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def render_key(*, format: str, content: str, request: RenderRequest) -> str:
    """The cache key of rendering ``content`` with ``format`` for ``request`` (hex sha256).

    Raises UnknownFormatError, and the tool lookup's errors when patches need kustomize.
    """
    renderer = get_format(format)
    identity = getattr(renderer, "cache_identity", None)
    fields = {
        f.name: getattr(request, f.name)
        for f in dataclasses.fields(request)
        if f.name not in _NOT_IN_KEY
    }
    key = {
        "fleetlet": __version__,
        "format": format,
        "renderer": identity(request.tools) if callable(identity) else type(renderer).__qualname__,
        "patcher": file_identity(request.tools.find("kustomize")) if request.patches else None,
        "content": content,
        "request": fields,
        # Whether SOPS content is opened, and with which keys (public halves): a preview
        # without keys never answers for an agent, and a rotated keyring renders again.
        "recipients": list(request.keyring.recipients) if request.keyring is not None else None,
    }
    encoded = json.dumps(key, sort_keys=True, separators=(",", ":"), default=_plain)
    return hashlib.sha256(encoded.encode()).hexdigest()


def sources_digest(sources: Iterable[Mapping[str, Any]]) -> str:
    """Digest of a bundle's pinned sources (API ``Source`` dicts; credentials left out)."""
    pinned = [{k: v for k, v in s.items() if k != "auth"} for s in sources]
    encoded = json.dumps(pinned, sort_keys=True, separators=(",", ":"))
    return "sources:" + hashlib.sha256(encoded.encode()).hexdigest()


def tree_digest(tree: Path) -> str:
    """Digest of every file under ``tree`` (paths, contents, executable bits, symlink
    targets), ``.git`` left out."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(tree, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(Path(dirpath, d))]):
            full = Path(dirpath, name)
            relative = full.relative_to(tree).as_posix()
            if full.is_symlink():
                digest.update(f"L {relative}\0{os.readlink(full)}\0".encode())
                continue
            executable = os.access(full, os.X_OK)
            digest.update(f"F {relative}\0{int(executable)}\0".encode())
            digest.update(hashlib.sha256(full.read_bytes()).digest())
    return "tree:" + digest.hexdigest()


class RenderCache:
    """Rendered objects by key, bounded in memory (``max_bytes`` of compressed JSON) and,
    with ``directory``, on disk (``max_files``). Safe to share between threads."""

    def __init__(
        self,
        *,
        max_bytes: int = 32 * 1024 * 1024,
        directory: Path | None = None,
        max_files: int = 512,
    ) -> None:
        self.max_bytes = max_bytes
        self.directory = directory
        self.max_files = max_files
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._clock = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> list[Manifest] | None:
        """A fresh copy of the objects stored under ``key``, or None."""
        with self._lock:
            blob = self._entries.get(key)
            if blob is not None:
                self._entries.move_to_end(key)
        if blob is None:
            blob = self._read(key)
            if blob is not None:
                self._remember(key, blob)
        if blob is None:
            self.misses += 1
            return None
        try:
            objects: list[Manifest] = json.loads(zlib.decompress(blob))
        except (zlib.error, ValueError):  # a damaged file on disk: render again
            self._forget(key)
            self.misses += 1
            return None
        self.hits += 1
        return objects

    def put(self, key: str, objects: list[Manifest], *, disk: bool = True) -> None:
        """Keep a copy of ``objects`` under ``key`` (in memory only when not ``disk``)."""
        blob = zlib.compress(json.dumps(objects, separators=(",", ":")).encode(), 1)
        self._remember(key, blob)
        if disk:
            self._write(key, blob)

    def render(
        self,
        *,
        format: str,
        content: str,
        request: RenderRequest,
        tree: Callable[[], Path],
    ) -> list[Manifest]:
        """The finished objects of rendering ``content``: from the cache, or by calling
        ``tree()`` (which composes the tree, only on a miss) and rendering it.

        Raises what :func:`~agent.render.formats.render_objects`, ``tree`` and
        :func:`~agent.render.plain.finish` raise.
        """
        key = render_key(format=format, content=content, request=request)
        objects = self.get(key)
        if objects is None:
            root = tree()
            secrets = open_tree(
                root, request.keyring, source=request.source, limits=request.limits.parse
            )
            opened, values = open_values(request)
            objects = render_objects(root, format=format, request=opened)
            # What SOPS files rendered to is kept in memory only, never on disk.
            self.put(key, objects, disk=not (secrets.files and secrets.opened) and not values)
        return finish(objects, request)

    # -- memory ------------------------------------------------------------------------------

    def _remember(self, key: str, blob: bytes) -> None:
        if len(blob) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._size -= len(old) if old is not None else 0
            self._entries[key] = blob
            self._size += len(blob)
            while self._size > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._size -= len(evicted)

    def _forget(self, key: str) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            self._size -= len(old) if old is not None else 0
        if self.directory is not None:
            (self.directory / f"{key}.json.z").unlink(missing_ok=True)

    # -- disk --------------------------------------------------------------------------------

    def _read(self, key: str) -> bytes | None:
        if self.directory is None:
            return None
        path = self.directory / f"{key}.json.z"
        try:
            blob = path.read_bytes()
            self._stamp(path)  # least recently used goes first
        except OSError:
            return None
        return blob

    def _stamp(self, path: Path) -> None:
        # File times are as coarse as the kernel's tick: strictly increasing ones keep the
        # eviction order exact for renders written within one tick.
        with self._lock:
            self._clock = max(time.time_ns(), self._clock + 1)
            now = self._clock
        os.utime(path, ns=(now, now))

    def _write(self, key: str, blob: bytes) -> None:
        if self.directory is None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            temporary = self.directory / f".{key}.{os.getpid()}.{threading.get_ident()}"
            temporary.write_bytes(blob)
            self._stamp(temporary)
            os.replace(temporary, self.directory / f"{key}.json.z")
            files = sorted(self.directory.glob("*.json.z"), key=lambda p: p.stat().st_mtime_ns)
            for old in files[: max(0, len(files) - self.max_files)]:
                old.unlink(missing_ok=True)
        except OSError:
            return  # a cache that cannot write is only slower
