"""Parsed cluster files, cached by the SHA-256 of their bytes.

An inventory of 100,000 clusters is about 7 MB of YAML that takes seconds to parse; a publish
after a change to one bundle file reads it again unchanged. :class:`ParsedFiles` keeps the
validated result of each cluster file (names and labels) as compact JSON under the hub's
cache directory, keyed by the content hash, so an unchanged file costs a hash and a JSON read.
Only files that validated are cached; the key is the content itself, so a cached entry can
never describe other bytes. A damaged entry is ignored (the file is parsed again).
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
from collections.abc import Iterable
from pathlib import Path

from hub.fastjson import loads

_FORMAT = 1

_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def content_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ParsedFiles:
    """Validated cluster files by content hash, in ``directory`` (created when first written).

    Writes are atomic (temporary file, then rename); every failure to read or write the cache
    only costs a parse, so none is raised.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.used: set[str] = set()
        self._loaded: dict[str, dict[str, object]] = {}

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def clusters(self, key: str) -> tuple[list[str], list[dict[str, str]]] | None:
        """The clusters of the file whose content hash is ``key``, or None if not cached: their
        names and their labels in the file's order, clusters with the same labels sharing
        one dict (built without a loop per cluster: 100,000 of them)."""
        try:
            data = loads(self._path(key).read_bytes())
            if data.get("format") != _FORMAT:
                return None
            table = data["labels"]
            if not all(isinstance(t, dict) for t in table):
                return None
            rows = data["clusters"]
            names = list(map(_FIRST, rows))
            labels = list(map(table.__getitem__, map(_SECOND, rows)))
            if set(map(type, names)) - {str}:
                return None
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None
        self.used.add(key)
        self._loaded[key] = data
        return names, labels

    def shards(self, key: str, count: int) -> list[int] | None:
        """The hashed shard of each cluster of the file (loaded by :meth:`clusters`) among
        ``count`` shards, if computed before."""
        found = self._loaded.get(key, {}).get("shards")
        hints = found.get(str(count)) if isinstance(found, dict) else None
        return hints if isinstance(hints, list) else None

    def store_shards(self, key: str, count: int, hints: list[int]) -> None:
        """Remember the hashed shards of the file's clusters for ``count`` shards."""
        data = self._loaded.get(key)
        if data is None:
            return
        data["shards"] = {str(count): hints}
        self._write(key, json.dumps(data, separators=(",", ":")))

    def store(
        self,
        key: str,
        rows: Iterable[tuple[str, dict[str, str]]],
        *,
        shards: tuple[int, list[int]] | None = None,
    ) -> None:
        """Cache the clusters of a file that validated (label sets stored once each), and
        with ``shards`` (count, each cluster's hashed shard) their shards (:meth:`shards`)."""
        indexes: dict[tuple[tuple[str, str], ...], int] = {}
        table: list[dict[str, str]] = []
        clusters: list[tuple[str, int]] = []
        for name, labels in rows:
            label_key = tuple(sorted(labels.items()))
            index = indexes.get(label_key)
            if index is None:
                index = indexes[label_key] = len(table)
                table.append(dict(labels))
            clusters.append((name, index))
        data: dict[str, object] = {"format": _FORMAT, "labels": table, "clusters": clusters}
        if shards is not None:
            data["shards"] = {str(shards[0]): shards[1]}
        self._loaded[key] = data
        self._write(key, json.dumps(data, separators=(",", ":")))

    def _write(self, key: str, body: str) -> None:
        path = self._path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_text(body)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return
        self.used.add(key)

    def prune(self) -> None:
        """Remove the entries this load did not use (the cache holds one fleet's files)."""
        try:
            entries = list(self.directory.glob("*.json"))
        except OSError:
            return
        for path in entries:
            if path.stem not in self.used:
                path.unlink(missing_ok=True)
