"""What the first stage of a publish makes (:func:`hub.publish.flow.prepare`: load, resolve,
plan, nothing touches git) and the later stages read: a loaded, resolved and planned fleet."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.api import CommitSignature
from hub.errors import PublishError
from hub.fleet.commits import CommitVerdict
from hub.fleet.model import Fleet
from hub.fleet.render import ClusterPlan
from hub.fleet.shards import ShardMap, fleet_shards
from hub.fleet.source import FleetSource
from hub.publish.git import BranchStore
from hub.publish.shards import ShardedStore
from hub.resolve.signatures import SourceSignatures


class UnsignedCommitError(PublishError):
    """The fleet commit is not signed as the commit policy requires; nothing was published."""


class UnsignedSourceError(PublishError):
    """A source is not signed as its signature policy requires; nothing was published."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A loaded, resolved and planned fleet."""

    fleet: Fleet
    source: FleetSource
    plans: Mapping[str, ClusterPlan]
    references: int
    timings: Mapping[str, float]
    shards: ShardMap | None = None
    commit: CommitVerdict | None = None
    """The fleet commit against the commit policy (None: no policy asks for signed commits)."""
    signatures: SourceSignatures | None = None
    """The image sources against their signature policies (None: no policy covers one)."""

    @property
    def signed_by(self) -> CommitSignature | None:
        """What the sets record about the commit's signature (only a verified one)."""
        verdict = self.commit
        if verdict is None or not verdict.ok:
            return None
        assert verdict.signer is not None and verdict.key is not None
        return CommitSignature(
            format="gitsign" if verdict.format == "gitsign" else "ssh",
            principal=verdict.signer,
            key=verdict.key,
            policy=verdict.policy,
            issuer=verdict.issuer,
        )

    def require_signed_commit(self) -> None:
        """Raise UnsignedCommitError when a commit policy is on and the commit fails it."""
        if self.commit is not None and not self.commit.ok:
            raise UnsignedCommitError(self.commit.refusal() + "; nothing was pushed")

    def require_signed_sources(self) -> None:
        """Raise UnsignedSourceError naming every source that fails its signature policy."""
        refusal = self.signatures.refusal() if self.signatures is not None else None
        if refusal is not None:
            raise UnsignedSourceError(f"{refusal}; nothing was pushed")

    @property
    def shard_map(self) -> ShardMap:
        return self.shards if self.shards is not None else fleet_shards(self.fleet)


def sharded_stores(prepared: Prepared, store: BranchStore | ShardedStore) -> ShardedStore:
    """The repositories of ``store`` as the fleet's shards. Raises PublishError when their
    number is not the fleet's."""
    sharded = ShardedStore.of(store) if isinstance(store, BranchStore) else store
    count = prepared.shard_map.count
    if sharded.count != count or set(sharded.stores) != set(range(count)):
        raise PublishError(
            f"the fleet has {count} shard(s) (fleet.yaml: shards.count) but "
            f"{sharded.count} repositories were given; give --repo a URL template with "
            "{shard}"
        )
    return sharded


__all__ = ["Prepared", "UnsignedCommitError", "UnsignedSourceError", "sharded_stores"]
