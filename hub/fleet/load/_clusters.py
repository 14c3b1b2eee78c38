"""``clusters/*.yaml``: the inventory, one cluster per file or ``clusters: [...]``, with the
parsed rows kept by content hash (:mod:`hub.fleet.cache`). Called by
:func:`hub.fleet.load.load_fleet`.
"""

from __future__ import annotations

import functools
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING

from hub.fleet.jump import shard_of_name
from hub.fleet.load._problems import _NAME, _found, _load_yaml, _Problems
from hub.fleet.model import Cluster
from hub.fleet.selectors import label_key_ok, label_value_ok

if TYPE_CHECKING:
    from hub.fleet.cache import ParsedFiles


# A Cluster from its four fields without a Python call each (tuple.__new__, as
# namedtuple's _make does, minus its length check: the rows always have four).
_NEW_CLUSTER = functools.partial(tuple.__new__, Cluster)


def _cluster_file(
    path: Path, rel: str, problems: _Problems, parsed: ParsedFiles | None, shards: int
) -> list[Cluster]:
    """The clusters of one file, from the parsed-file cache when its bytes were seen before."""
    if parsed is None:
        return _load_cluster_file(path, rel, problems)
    from hub.fleet.cache import content_key

    try:
        data = path.read_bytes()
    except OSError as exc:
        problems.add(rel, "", "a readable file", _found(str(exc.strerror or exc)))
        return []
    key = content_key(data)
    cached = parsed.clusters(key)
    if cached is not None:
        # Clusters with the same labels share one mapping (the cache stores each label set
        # once): memory at a million clusters, and one sort per label set when planning.
        names, labels = cached
        hints = parsed.shards(key, shards)
        if hints is None or len(hints) != len(names):
            hints = [shard_of_name(name, shards) for name in names]
            parsed.store_shards(key, shards, hints)
        pairs = [(shards, hint) for hint in range(shards)]  # one tuple per shard, shared
        fields = (names, labels, repeat(rel, len(names)), map(pairs.__getitem__, hints))
        rows = zip(*fields, strict=True)
        return list(map(_NEW_CLUSTER, rows))
    start = len(problems.items)
    found = _load_cluster_file(path, rel, problems, data=data)
    if len(problems.items) == start:
        # Each cluster's hashed shard is computed now, with the file, so that no later run
        # computes it (a SHA-256 per cluster).
        hints = [shard_of_name(c.name, shards) for c in found]
        parsed.store(key, ((c.name, dict(c.labels)) for c in found), shards=(shards, hints))
        pairs = [(shards, hint) for hint in range(shards)]
        found = [c._replace(hashed_shard=pairs[hint]) for c, hint in zip(found, hints, strict=True)]
    return found


def _load_cluster_file(
    path: Path, rel: str, problems: _Problems, *, data: bytes | None = None
) -> list[Cluster]:
    raw = _load_yaml(path, rel, problems, data=data)
    if raw is None:
        return []
    if isinstance(raw, dict) and "clusters" in raw and "name" not in raw:
        entries = raw["clusters"]
        if not isinstance(entries, list):
            problems.add(rel, "clusters", "a list of clusters", entries)
            return []
        for key in sorted(set(raw) - {"clusters"}, key=str):
            problems.add(rel, str(key), "only the field clusters", _found("unknown field"))
        prefix = "clusters"
    else:
        entries = [raw]
        prefix = ""
    out: list[Cluster] = []
    for i, entry in enumerate(entries):
        where = f"{prefix}[{i}]." if prefix else ""
        if not isinstance(entry, dict):
            problems.add(rel, where.rstrip(".") or "", "a cluster mapping (name, labels)", entry)
            continue
        for key in sorted(set(entry) - {"name", "labels"}, key=str):
            problems.add(rel, f"{where}{key}", "name or labels", _found("unknown field"))
        name = entry.get("name")
        ok = True
        if not isinstance(name, str) or not _NAME.match(name):
            problems.add(rel, f"{where}name", "a lowercase DNS label (cluster name)", name)
            ok = False
        labels = entry.get("labels", {}) or {}
        if not isinstance(labels, dict):
            problems.add(rel, f"{where}labels", "a mapping of label key to value", labels)
            ok = False
            labels = {}
        for k, v in labels.items():
            if not label_key_ok(k):
                problems.add(rel, f"{where}labels.{k}", "a label key", k)
                ok = False
            elif not label_value_ok(v):
                problems.add(rel, f"{where}labels.{k}", "a label value (string)", v)
                ok = False
        if ok:
            out.append(Cluster(name=str(name), labels=dict(labels), file=rel))
    return out
