"""Dependency cycles between lockstep groups, found the same way by the agent (validating a set)
and the hub (validating a fleet repo), with the standard library's :mod:`graphlib`."""

from __future__ import annotations

import graphlib
from collections.abc import Iterable, Mapping


def find_cycle(deps: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A dependency cycle as ``[a, b, ..., a]``, each depending on the next, started at its
    smallest name (the same cycle is always reported the same way); None when there is none.
    ``deps`` maps each node to the nodes it depends on."""
    graph = {node: sorted(needs) for node, needs in sorted(deps.items())}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        # graphlib lists each node before the one that depends on it: reversed, each node
        # depends on the next.
        ring = list(reversed(exc.args[1]))[:-1]
        start = ring.index(min(ring))
        ring = ring[start:] + ring[:start]
        return [*ring, ring[0]]
    return None


__all__ = ["find_cycle"]
