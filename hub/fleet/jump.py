"""Jump consistent hash (Lamping and Veach, 2014) of cluster names, for shard assignment.

A cluster's key is the first 8 bytes of the SHA-256 of its name, big-endian; it goes to
``jump_hash(key, shards)``. Stable across hubs, versions and runs; going from N to N+1 shards
moves only about 1/(N+1) of the clusters.
"""

from __future__ import annotations

import hashlib

_MASK = (1 << 64) - 1


def hash_key(name: str) -> int:
    """The 64-bit key of a cluster name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash of a 64-bit ``key`` into ``buckets`` (>= 1) buckets."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def shard_of_name(name: str, shards: int) -> int:
    """The hashed shard of a cluster name (0 for a fleet of one shard)."""
    return 0 if shards == 1 else jump_hash(hash_key(name), shards)
