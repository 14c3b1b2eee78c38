"""A content-addressed on-disk cache of unpacked source trees, bounded in bytes, LRU evicted.

Keys are content addresses (``image:sha256:...``, ``git:<commit>:<directory>``,
``http:<sha256>``): what a key names never changes, so a hit needs no network call and no
re-validation. Each entry is a directory ``entries/<sha256 of key>/`` holding ``tree/`` and
``meta.json``; the mtime of ``meta.json`` records the last use. Entries are filled in
``staging/`` and renamed into place, so a crash never leaves a half-written entry visible.
When the total exceeds ``max_bytes`` the least recently used entries go first (never the entry
just stored, even if it alone is larger than the bound).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.report.metrics import Metrics


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    size: int
    last_used: float


def tree_size(path: Path) -> int:
    """Bytes of regular files under ``path`` (symlinks not followed, not counted)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                total += os.lstat(full).st_size
    return total


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
        shutil.rmtree(self._staging_dir, ignore_errors=True)
        self._staging_dir.mkdir(parents=True, exist_ok=True)
        self._index: dict[str, CacheEntry] = {}
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
                )
            except (OSError, ValueError, KeyError, TypeError):
                shutil.rmtree(entry_dir, ignore_errors=True)
                continue
            if entry.path.is_dir() and self._dir_for(entry.key) == entry_dir:
                self._index[entry.key] = entry
            else:
                shutil.rmtree(entry_dir, ignore_errors=True)

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
        """The tree cached under ``key`` (and mark it used), or None."""
        found = self._use(key)
        if self._metrics is not None:
            self._metrics.cache_lookup(hit=found is not None)
        return found

    def _use(self, key: str) -> Path | None:
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return None
            now = time.time()
            # A monotonic bump keeps the LRU order exact even with a coarse clock.
            now = max(now, max(e.last_used for e in self._index.values()) + 1e-3)
            try:
                os.utime(self._dir_for(key) / "meta.json", (now, now))
            except OSError:
                self._index.pop(key, None)
                return None
            self._index[key] = CacheEntry(key=key, path=entry.path, size=entry.size, last_used=now)
            return entry.path

    def store(self, key: str, fill: Callable[[Path], None]) -> Path:
        """Run ``fill(tree_dir)`` on a fresh staging directory and cache the result as ``key``.

        Returns the cached tree. Whatever ``fill`` raises propagates and nothing is cached.
        Evicts least recently used entries until the cache fits ``max_bytes``.
        """
        existing = self._use(key)  # not a lookup of its own: the caller's lookup counted
        if existing is not None:
            return existing
        staging = self._staging_dir / uuid.uuid4().hex
        tree = staging / "tree"
        tree.mkdir(parents=True)
        try:
            fill(tree)
            size = tree_size(tree)
            now = time.time()
            (staging / "meta.json").write_text(json.dumps({"key": key, "size": size}))
            with self._lock:
                now = max([now, *(e.last_used + 1e-3 for e in self._index.values())])
                os.utime(staging / "meta.json", (now, now))
                final = self._dir_for(key)
                if key in self._index:
                    # Filled meanwhile by another thread: keep that one (it may be in use).
                    return self._index[key].path
                if final.exists():  # not indexed: a leftover, never handed out
                    shutil.rmtree(final)
                os.rename(staging, final)
                self._index[key] = CacheEntry(
                    key=key, path=final / "tree", size=size, last_used=now
                )
                self._evict(keep=key)
            return final / "tree"
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _evict(self, *, keep: str) -> None:
        total = sum(e.size for e in self._index.values())
        for entry in sorted(self._index.values(), key=lambda e: e.last_used):
            if total <= self.max_bytes:
                break
            if entry.key == keep:
                continue
            shutil.rmtree(self._dir_for(entry.key), ignore_errors=True)
            del self._index[entry.key]
            total -= entry.size

    def remove(self, key: str) -> None:
        """Drop ``key`` from the cache (no error if absent)."""
        with self._lock:
            if self._index.pop(key, None) is not None:
                shutil.rmtree(self._dir_for(key), ignore_errors=True)
