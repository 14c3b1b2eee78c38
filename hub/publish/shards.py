"""The fleet's cluster-branch repositories, one :class:`~hub.publish.git.BranchStore` per shard,
worked on in parallel (listings, fetches and pushes wait on the network and the git server,
not on this process)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from hub.publish.git import BranchStore

T = TypeVar("T")
# Shards worked on at once: enough to keep the git server busy while this process works (at
# 16 shards, 8 and 16 at a time measured the same: the server's CPU is what limits).
PARALLEL = 8
# ... but at most 4 connections at once to a git:// server: `git daemon` listens with a
# backlog of 5, and the connections past it wait for the client's SYN to be sent again,
# a second later (measured: 16 listings 0.02 s 4 at a time, 1.04 s 16 at a time).
PARALLEL_GIT_DAEMON = 4


def parallel_for(urls: Iterable[str]) -> int:
    """How many of these repositories to work on at once (see PARALLEL_GIT_DAEMON)."""
    return PARALLEL_GIT_DAEMON if any(u.startswith("git://") for u in urls) else PARALLEL


_THREADS = "fleetlet-shard"


class ShardedStore:
    """Shard number -> BranchStore. ``cache_dir/shard-<n>.git`` holds each shard's cache
    (a temporary directory when None). Raises PublishError if a cache cannot be created."""

    def __init__(
        self,
        *,
        urls: Mapping[int, str],
        cache_dir: Path | None = None,
        credentials: tuple[str, str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.stores: dict[int, BranchStore] = {}
        for shard, url in sorted(urls.items()):
            where = Path(cache_dir) / f"shard-{shard}.git" if cache_dir is not None else None
            self.stores[shard] = BranchStore(
                url=url, cache_dir=where, credentials=credentials, progress=progress
            )
        self._owned = True
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def of(cls, store: BranchStore) -> ShardedStore:
        """One repository as a fleet of one shard (the caller keeps owning ``store``)."""
        sharded = cls.__new__(cls)
        sharded.stores = {0: store}
        sharded._owned = False
        sharded._pool = None
        return sharded

    @property
    def parallel(self) -> int:
        """Shards worked on at once (:func:`parallel_for` their URLs)."""
        return parallel_for(store.url for store in self.stores.values())

    @property
    def count(self) -> int:
        return len(self.stores)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._owned:
            for store in self.stores.values():
                store.close()

    def __enter__(self) -> ShardedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def each(
        self, work: Callable[[int, BranchStore], T], shards: Iterable[int] | None = None
    ) -> dict[int, T]:
        """``work(shard, store)`` for each shard (all by default), in parallel; the results by
        shard. The first exception raised is raised here, after every call has ended."""
        chosen = sorted(self.stores if shards is None else set(shards))
        if len(chosen) <= 1 or threading.current_thread().name.startswith(_THREADS):
            # (one shard; or called from a worker of the pool: run here, never wait on it)
            return {s: work(s, self.stores[s]) for s in chosen}
        if self._pool is None:
            # One pool for the run: starting 16 threads costs a publication tens of ms each
            # time it works on every shard (listing, applying, saving).
            self._pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix=_THREADS)
        futures = {s: self._pool.submit(work, s, self.stores[s]) for s in chosen}
        errors = [f.exception() for f in futures.values()]
        for error in errors:
            if error is not None:
                raise error
        return {s: f.result() for s, f in futures.items()}
