"""A content-addressed on-disk cache of unpacked source trees, bounded in bytes, LRU evicted.

Keys are content addresses (``image:sha256:...``, ``git:<commit>:<directory>``,
``http:<sha256>``): what a key names never changes, so a hit needs no network call. Each entry
is a directory ``entries/<sha256 of key>/`` holding ``tree/`` and ``meta.json``; the mtime of
``meta.json`` records the last use. Entries are filled in ``staging/`` and renamed into place,
so a crash never leaves a half-written entry visible.

A cached tree is immutable and verified: once filled it is made read-only (files and
directories lose their write bits), and ``meta.json`` records a digest of the whole tree
(every path, its kind, executable bit, link target and content, :func:`tree_digest`). Each
:meth:`ContentCache.lookup` hashes the tree again and compares: an entry that changed since it
was stored (a write that got through a link, a tampered disk) is dropped and reported as a
miss, so the content is fetched and checked again instead of being used.

When the total exceeds ``max_bytes`` the least recently used entries go first (never the entry
just stored, even if it alone is larger than the bound).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.report.metrics import Metrics

from agent.source.content import LOCAL_STORAGE_ERRNOS, LocalStorageError

_log = logging.getLogger(__name__)
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    size: int
    last_used: float
    digest: str


def tree_size(path: Path) -> int:
    """Bytes of regular files under ``path`` (symlinks not followed, not counted)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                total += os.lstat(full).st_size
    return total


def tree_digest(path: Path) -> str:
    """``sha256:<hex>`` over everything a tree holds, links not followed: each entry's path,
    kind (directory, file, executable file, link, other), link target and file content, in
    sorted order. Two trees with the same digest render the same."""
    hasher = hashlib.sha256()
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(path / rel_dir if rel_dir else path) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            info = entry.stat(follow_symlinks=False)
            hasher.update(os.fsencode(rel) + b"\0")
            if stat.S_ISDIR(info.st_mode):
                hasher.update(b"d\0")
                pending.append(rel)
            elif stat.S_ISLNK(info.st_mode):
                hasher.update(b"l\0" + os.fsencode(os.readlink(entry.path)) + b"\0")
            elif stat.S_ISREG(info.st_mode):
                hasher.update(b"x\0" if info.st_mode & 0o111 else b"f\0")
                hasher.update(str(info.st_size).encode() + b"\0")
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as data:
                    while chunk := data.read(_CHUNK):
                        hasher.update(chunk)
            else:
                hasher.update(b"?\0")
    return "sha256:" + hasher.hexdigest()


def _freeze(path: Path) -> None:
    """Remove every write bit under ``path`` (links untouched: their mode means nothing)."""
    for dirpath, dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, stat.S_IMODE(os.lstat(full).st_mode) & ~0o222)
        for name in dirs:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o555)
    os.chmod(path, 0o555)


def _remove(path: Path) -> None:
    """Delete a (possibly frozen) entry: directories get their write bit back first."""
    if not os.path.lexists(path):
        return
    for dirpath, dirs, _files in os.walk(path):
        os.chmod(dirpath, 0o755)
        for name in dirs:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755)
    shutil.rmtree(path, ignore_errors=True)


class ContentCache:
    """The cache under ``root`` holding at most about ``max_bytes`` of unpacked content.

    ``metrics``, when given, counts each :meth:`lookup` as a hit or a miss.
    """

    def __init__(self, *, root: Path, max_bytes: int, metrics: Metrics | None = None) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._entries_dir = self.root / "entries"
        self._staging_dir = self.root / "staging"
        self._lock = threading.Lock()
        self._entries_dir.mkdir(parents=True, exist_ok=True)
        # Leftovers of a crash mid-fill are garbage: nothing points at them.
        _remove(self._staging_dir)
        self._staging_dir.mkdir(parents=True, exist_ok=True)
        self._index: dict[str, CacheEntry] = {}
        self.dropped = 0  # entries found altered and dropped (for tests, metrics)
        self._load()

    def _load(self) -> None:
        for entry_dir in self._entries_dir.iterdir():
            meta_path = entry_dir / "meta.json"
            try:
                meta = json.loads(meta_path.read_text())
                entry = CacheEntry(
                    key=str(meta["key"]),
                    path=entry_dir / "tree",
                    size=int(meta["size"]),
                    last_used=meta_path.stat().st_mtime,
                    digest=str(meta["digest"]),
                )
            except (OSError, ValueError, KeyError, TypeError):
                _remove(entry_dir)
                continue
            if entry.path.is_dir() and self._dir_for(entry.key) == entry_dir:
                self._index[entry.key] = entry
            else:
                _remove(entry_dir)

    def _dir_for(self, key: str) -> Path:
        return self._entries_dir / hashlib.sha256(key.encode()).hexdigest()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._index.values())

    def keys(self) -> list[str]:
        """The cached keys, least recently used first."""
        with self._lock:
            return [e.key for e in sorted(self._index.values(), key=lambda e: e.last_used)]

    def lookup(self, key: str) -> Path | None:
        """The tree cached under ``key`` (and mark it used), or None: also when the tree is no
        longer what was stored (it is then dropped, and logged)."""
        found = self._use(key)
        if self._metrics is not None:
            self._metrics.cache_lookup(hit=found is not None)
        return found

    def _use(self, key: str) -> Path | None:
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return None
            try:
                intact = tree_digest(entry.path) == entry.digest
            except OSError:
                intact = False
            if not intact:
                _log.warning("content cache: %s was altered since it was stored; dropped", key)
                self.dropped += 1
                self._index.pop(key, None)
                _remove(self._dir_for(key))
                return None
            now = time.time()
            # A monotonic bump keeps the LRU order exact even with a coarse clock.
            now = max(now, max(e.last_used for e in self._index.values()) + 1e-3)
            try:
                os.utime(self._dir_for(key) / "meta.json", (now, now))
            except OSError:
                self._index.pop(key, None)
                return None
            self._index[key] = CacheEntry(
                key=key, path=entry.path, size=entry.size, last_used=now, digest=entry.digest
            )
            return entry.path

    def store(self, key: str, fill: Callable[[Path], None]) -> Path:
        """Run ``fill(tree_dir)`` on a fresh staging directory and cache the result as ``key``.

        Returns the cached tree (read-only from now on). Whatever ``fill`` raises propagates
        and nothing is cached. Evicts least recently used entries until the cache fits
        ``max_bytes``.
        """
        existing = self._use(key)  # not a lookup of its own: the caller's lookup counted
        if existing is not None:
            return existing
        staging = self._staging_dir / uuid.uuid4().hex
        tree = staging / "tree"
        try:
            tree.mkdir(parents=True)
        except OSError as exc:
            raise LocalStorageError.of(exc, doing="cache content", source=key) from exc
        try:
            fill(tree)
            return self._keep(key, staging, tree)
        finally:
            _remove(staging)

    def _keep(self, key: str, staging: Path, tree: Path) -> Path:
        """Freeze a filled tree and move it into place; the cached tree. Raises
        LocalStorageError when the disk refuses (full, read-only)."""
        try:
            size = tree_size(tree)
            _freeze(tree)
            digest = tree_digest(tree)
            now = time.time()
            meta = {"key": key, "size": size, "digest": digest}
            (staging / "meta.json").write_text(json.dumps(meta))
            with self._lock:
                now = max([now, *(e.last_used + 1e-3 for e in self._index.values())])
                os.utime(staging / "meta.json", (now, now))
                final = self._dir_for(key)
                if key in self._index:
                    # Filled meanwhile by another thread: keep that one (it may be in use).
                    return self._index[key].path
                if final.exists():  # not indexed: a leftover, never handed out
                    _remove(final)
                os.rename(staging, final)
                self._index[key] = CacheEntry(
                    key=key, path=final / "tree", size=size, last_used=now, digest=digest
                )
                self._evict(keep=key)
            return final / "tree"
        except OSError as exc:
            if exc.errno in LOCAL_STORAGE_ERRNOS:
                raise LocalStorageError.of(exc, doing="cache content", source=key) from exc
            raise

    def _evict(self, *, keep: str) -> None:
        total = sum(e.size for e in self._index.values())
        for entry in sorted(self._index.values(), key=lambda e: e.last_used):
            if total <= self.max_bytes:
                break
            if entry.key == keep:
                continue
            _remove(self._dir_for(entry.key))
            del self._index[entry.key]
            total -= entry.size

    def remove(self, key: str) -> None:
        """Drop ``key`` from the cache (no error if absent)."""
        with self._lock:
            if self._index.pop(key, None) is not None:
                _remove(self._dir_for(key))
