"""One call per item, a few at a time: the agent's per-bundle reads and writes against its API
server (a BundleDeployment each, a run history each, a revision index each) wait on the
server, not on this process, so a pass does them side by side instead of one after another.

The KubeClient is safe to share between threads (its connection pool has room for them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

WORKERS = 6
"""Calls in flight at once: enough for the demo fleet's bundles, gentle on the API server."""


def each(call: Callable[[T], R], items: Iterable[T], *, workers: int = WORKERS) -> list[R]:
    """``[call(item) for item in items]``, up to ``workers`` calls at a time; the results in
    the items' order. Every call runs to its end; then the first item's exception (in the
    items' order) is raised, as the loop would have raised it first."""
    chosen = list(items)
    if len(chosen) <= 1 or workers <= 1:
        return [call(item) for item in chosen]
    with ThreadPoolExecutor(
        max_workers=min(workers, len(chosen)), thread_name_prefix="fanout"
    ) as pool:
        futures = [pool.submit(call, item) for item in chosen]
    return [future.result() for future in futures]


__all__ = ["WORKERS", "each"]
