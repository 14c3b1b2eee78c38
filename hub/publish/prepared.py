"""What the first stage of a publish makes (:func:`hub.publish.flow.prepare`: load, resolve,
plan, nothing touches git) and the later stages read: a loaded, resolved and planned fleet."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hub.fleet.model import Fleet
from hub.fleet.render import ClusterPlan
from hub.fleet.shards import ShardMap, fleet_shards
from hub.fleet.source import FleetSource


@dataclass(frozen=True, slots=True)
class Prepared:
    """A loaded, resolved and planned fleet."""

    fleet: Fleet
    source: FleetSource
    plans: Mapping[str, ClusterPlan]
    references: int
    timings: Mapping[str, float]
    shards: ShardMap | None = None

    @property
    def shard_map(self) -> ShardMap:
        return self.shards if self.shards is not None else fleet_shards(self.fleet)


__all__ = ["Prepared"]
