"""Wave arithmetic: which of a rollout's clusters go in which wave.

The clusters are taken in a stable, spread-out order (by the SHA-256 of their name), so a
percentage picks clusters from every region and rack, and every hub computes the same waves.
Wave by wave, a wave takes the clusters its selector matches among those no earlier wave took
(all of them without a selector), at most ``size`` of them: a count, or a percentage of those
it could take, rounded up. Clusters left after the last written wave form one more,
:data:`~hub.rollout.model.REMAINING`. A wave that matches nobody stays, empty: it passes at
once (but its ``pauseBefore`` still waits for a promotion).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hub.rollout.model import REMAINING, Strategy, Wave


@dataclass(frozen=True, slots=True)
class WavePlan:
    """A wave as planned: its name, gate and members (in release order)."""

    name: str
    pause_before: bool
    members: tuple[str, ...]


def clusters(count: int) -> str:
    """``1 cluster``, ``3 clusters``."""
    return f"{count} cluster{'' if count == 1 else 's'}"


def spread(names: Sequence[str]) -> list[str]:
    """``names`` in the rollout order: by the SHA-256 of each name (then the name)."""
    return sorted(names, key=lambda n: (hashlib.sha256(n.encode()).digest(), n))


def plan_waves(strategy: Strategy, clusters: Mapping[str, Mapping[str, str]]) -> list[WavePlan]:
    """The waves of ``clusters`` (name -> labels) under ``strategy``; every cluster is in
    exactly one wave."""
    left = spread(list(clusters))
    out: list[WavePlan] = []
    for wave in strategy.waves:
        taken = _take(wave, left, clusters)
        chosen = set(taken)
        left = [n for n in left if n not in chosen]
        out.append(WavePlan(name=wave.name, pause_before=wave.pause_before, members=tuple(taken)))
    if left:
        out.append(WavePlan(name=REMAINING, pause_before=False, members=tuple(left)))
    return out


def _take(wave: Wave, left: list[str], labels: Mapping[str, Mapping[str, str]]) -> list[str]:
    selector = wave.selector
    candidates = left if selector is None else [n for n in left if selector.matches(labels[n])]
    if wave.size is None:
        return list(candidates)
    return candidates[: wave.size.of(len(candidates), up=True)]


__all__ = ["WavePlan", "clusters", "plan_waves", "spread"]
