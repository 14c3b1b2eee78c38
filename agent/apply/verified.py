"""Objects known to be as the agent wants them: when their dry run can be skipped.

A group's dry run before any write is what guarantees that nothing is written when any object
is refused; for an object the apply would not change, it also decides that nothing is sent
at all. :class:`VerifiedObjects` remembers, per object (and identity), the digest of the
manifest last applied or found unchanged, and the digest of the live object as it was then
(without status and server bookkeeping, as the dry run's comparison sees it). When both are
the same again, the apply could change nothing: the object is ``unchanged`` without a dry run
(the live object comes from the LIST the apply reads anyway, or a GET, never a write). Any
change to the live object (drift, another manager taking a field) or to the manifest misses,
and the object takes the dry run as before.

It is a cache, under the agent's cache directory: losing it (a new pod) or a damaged file
only costs the dry runs it would have saved. Thread-safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.kube import ObjectRef

MAX_ENTRIES = 200_000
_VERSION = 1

Key = tuple[str, str, str, str, str]


def digest(obj: Mapping[str, Any]) -> str:
    """A stable digest of a JSON-like object."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def key_of(ref: ObjectRef, user: str | None) -> Key:
    return (user or "", ref.api_version, ref.kind, ref.namespace or "", ref.name)


class VerifiedObjects:
    """See the module docstring. ``path`` None keeps it in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[Key, tuple[str, str]] = {}
        self._dirty = False
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            doc = json.loads(path.read_bytes())
            if doc.get("version") != _VERSION:
                return
            for row in doc.get("entries") or []:
                key = tuple(str(part) for part in row[:5])
                self._entries[key] = (str(row[5]), str(row[6]))  # type: ignore[index]
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            self._entries.clear()  # a cache: a damaged file is only dry runs not saved

    def known(self, key: Key, manifest: str) -> bool:
        """Whether ``manifest`` is the one last verified for the object (then reading the
        live object may save its dry run)."""
        with self._lock:
            found = self._entries.get(key)
        return found is not None and found[0] == manifest

    def unchanged(self, key: Key, manifest: str, live: Mapping[str, Any] | None) -> bool:
        """Whether ``live`` is, for ``manifest``, what it was when last verified."""
        if live is None:
            return False
        with self._lock:
            found = self._entries.get(key)
        return found is not None and found == (manifest, digest(live))

    def remember(self, key: Key, manifest: str, live: Mapping[str, Any]) -> None:
        """``live`` is as ``manifest`` wants it (found unchanged, or just applied)."""
        entry = (manifest, digest(live))
        with self._lock:
            if self._entries.get(key) != entry:
                self._entries.pop(key, None)
                self._entries[key] = entry
                self._dirty = True
            while len(self._entries) > MAX_ENTRIES:
                self._entries.pop(next(iter(self._entries)))

    def forget(self, key: Key) -> None:
        with self._lock:
            if self._entries.pop(key, None) is not None:
                self._dirty = True

    def save(self) -> None:
        """Write the entries (atomically) when they changed; a failure is ignored (a cache)."""
        if self.path is None:
            return
        with self._lock:  # groups move in threads: one writer at a time
            if not self._dirty:
                return
            rows = [[*key, *value] for key, value in self._entries.items()]
            self._dirty = False
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            with contextlib.suppress(OSError):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps({"version": _VERSION, "entries": rows}))
                os.replace(tmp, self.path)


__all__ = ["MAX_ENTRIES", "Key", "VerifiedObjects", "digest", "key_of"]
