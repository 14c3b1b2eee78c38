"""Which repository holds each cluster's branches: the fleet's shards.

A fleet with ``shards.count`` N keeps its cluster branches (and its agents their status
branches) in N repositories. A cluster goes to the shard its shard label names (``shards.label``,
``fleetlet.io/shard`` by default: ``"3"``), otherwise to the jump consistent hash (Lamping and
Veach, 2014) of the first 8 bytes of the SHA-256 of its name. The hash is stable across hubs,
versions and runs, and going from N to N+1 shards moves only about 1/(N+1) of the clusters.

Repository URLs are templates with ``{shard}``, replaced by the shard number in decimal.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.errors import FieldProblem
from hub.errors import FleetRepoError
from hub.fleet.jump import hash_key, jump_hash, shard_of_name
from hub.fleet.model import SHARD_PLACEHOLDER, Cluster, Fleet, Sharding

__all__ = ["ShardMap", "assign", "fleet_shards", "hash_key", "jump_hash", "shard_url"]


def shard_url(template: str, shard: int) -> str:
    """``template`` with ``{shard}`` replaced by the shard number (the template itself when it
    has no placeholder: a fleet of one shard)."""
    return template.replace(SHARD_PLACEHOLDER, str(shard))


@dataclass(frozen=True, slots=True)
class ShardMap:
    """Cluster name -> shard number for one fleet (see the module docstring)."""

    sharding: Sharding
    assignment: Mapping[str, int]

    @property
    def count(self) -> int:
        return self.sharding.count

    def shard_of(self, cluster: str) -> int:
        """The shard of a cluster of the fleet (KeyError for another name)."""
        return self.assignment[cluster]

    def members(self) -> dict[int, list[str]]:
        """Shard -> its clusters, sorted (every shard present, maybe empty)."""
        out: dict[int, list[str]] = {i: [] for i in range(self.count)}
        for name in sorted(self.assignment):
            out[self.assignment[name]].append(name)
        return out

    def urls(self, template: str) -> dict[int, str]:
        """Shard -> repository URL from ``template``.

        Raises FleetRepoError when the fleet has several shards and ``template`` has no
        ``{shard}`` (every shard would be the same repository).
        """
        if self.count > 1 and SHARD_PLACEHOLDER not in template:
            raise FleetRepoError(
                [
                    FieldProblem(
                        path="--repo",
                        expected=f"a URL template with {SHARD_PLACEHOLDER} "
                        f"(the fleet has {self.count} shards)",
                        found=template,
                    )
                ],
                origin="fleet.yaml: shards",
            )
        return {i: shard_url(template, i) for i in range(self.count)}


_LABELS = operator.attrgetter("labels")
_HASHED = operator.attrgetter("hashed_shard")
_NAME = operator.attrgetter("name")
_SECOND = operator.itemgetter(1)


def assign(sharding: Sharding, clusters: Iterable[Cluster]) -> ShardMap:
    """The shard of every cluster. Raises FleetRepoError naming every cluster whose shard
    label is not a shard number of the fleet."""
    count = sharding.count
    label = sharding.label
    clusters = list(clusters)
    # The common case without a loop per cluster: no label set pins a shard, and the
    # parsed-file cache knew every cluster's hashed shard for this count.
    every_labels = list(map(_LABELS, clusters))
    label_sets = dict(zip(map(id, every_labels), every_labels, strict=True))
    hints = list(map(_HASHED, clusters))
    if not any(label in labels for labels in label_sets.values()) and (
        None not in hints and {h[0] for h in set(hints)} == {count}
    ):
        return ShardMap(
            sharding=sharding,
            assignment=dict(zip(map(_NAME, clusters), map(_SECOND, hints), strict=True)),
        )
    problems: list[FieldProblem] = []
    assignment: dict[str, int] = {}
    for cluster in clusters:
        pinned = cluster.labels.get(label)
        if pinned is None:
            hashed = cluster.hashed_shard
            if hashed is None or hashed[0] != count:
                hashed = (count, shard_of_name(cluster.name, count))
            assignment[cluster.name] = hashed[1]
        elif pinned.isdigit() and int(pinned) < count:
            assignment[cluster.name] = int(pinned)
        else:
            problems.append(
                FieldProblem(
                    path=f"{cluster.file}: {cluster.name}: labels.{label}",
                    expected=f"a shard number from 0 to {count - 1}",
                    found=repr(pinned),
                )
            )
    if problems:
        raise FleetRepoError(problems, origin="fleet.yaml: shards")
    return ShardMap(sharding=sharding, assignment=assignment)


def fleet_shards(fleet: Fleet) -> ShardMap:
    """:func:`assign` over every cluster of ``fleet``."""
    return assign(fleet.settings.shards, fleet.clusters)
