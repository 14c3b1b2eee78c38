"""What a hub knows of its shards between runs, and when it may trust that without listing them.

A publish first needs every cluster branch of every shard: at 100,000 clusters, a listing of
100,000 refs. After a publish that ended with every shard applied, the hub records the head it
left (``refs/fleetlet/publication``) beside the branch facts it keeps (:mod:`hub.publish.git`).
The next publish asks shard 0 for that one ref (a protocol v2 ``ls-refs``: a few hundred bytes
whatever the size of the fleet). When it has not moved, no hub published meanwhile and the
branches are the ones the hub recorded, so no shard is listed. Every commit point moves the
head, so a run that failed after its commit point (some shard not applied) leaves a record
that no longer matches, and the next run lists and finishes the publication.

A branch moved by someone else meanwhile is caught by the compare-and-swap of the push (each ref
update names the old value the hub knows); the run then lists every shard and starts over. The
shards are listed at least every :data:`RELIST_AFTER` anyway, which also removes the staging refs
of hubs that died before their commit point.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.source.credentials import GitAuthError, GitCredentials
from agent.source.lsrefs import GitUnavailableError, NotProtocolV2, ls_ref_v2
from hub.errors import GitTransportError
from hub.publish.git import BranchStore
from hub.publish.ledger import HEAD_REF
from hub.publish.sendpack import ZERO
from hub.publish.shards import ShardedStore

RELIST_AFTER = timedelta(hours=1)
_FILE = "fleetlet-head.json"
_FORMAT = 1


@dataclass(frozen=True, slots=True)
class KnownHead:
    """The head this hub left with every shard applied, and when it last listed the shards."""

    head: str
    listed: datetime

    @classmethod
    def load(cls, sharded: ShardedStore) -> KnownHead | None:
        """The record in the cache, if it is for these shards' URLs."""
        try:
            data = json.loads(_path(sharded).read_bytes())
            if data.get("format") != _FORMAT or data.get("urls") != _urls(sharded):
                return None
            return cls(head=str(data["head"]), listed=datetime.fromisoformat(data["listed"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def trusted(self, sharded: ShardedStore, now: datetime) -> bool:
        """Whether the shards may be taken as recorded: the record is recent, shard 0's head
        has not moved (one small request), and every shard's facts are in the cache.

        Raises GitTransportError when shard 0 cannot be reached.
        """
        if now - self.listed > RELIST_AFTER or current_head(sharded.stores[0]) != self.head:
            return False
        return all(sharded.each(lambda _s, store: store.assume_listed()).values())

    def save(self, sharded: ShardedStore) -> None:
        """Record (atomically; a failure only costs a listing next time)."""
        path = _path(sharded)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        doc = {
            "format": _FORMAT,
            "urls": _urls(sharded),
            "head": self.head,
            "listed": self.listed.astimezone(UTC).isoformat(),
        }
        try:
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)


def current_head(store: BranchStore) -> str:
    """The head ref's oid in ``store``'s repository (ZERO: none), asked for alone where the
    server speaks protocol v2, else from a listing. Raises GitTransportError."""
    credentials = None
    if store.credentials is not None:
        user, password = store.credentials
        credentials = GitCredentials(username=user, password=password)
    try:
        found = ls_ref_v2(store.url, HEAD_REF, credentials, connect_timeout=10.0, io_timeout=60.0)
        return found or ZERO
    except NotProtocolV2:
        return store.list_refs().get(HEAD_REF, ZERO)
    except (GitUnavailableError, GitAuthError) as exc:
        raise GitTransportError(f"cannot read {HEAD_REF} of {store.url}: {exc}") from exc


def _path(sharded: ShardedStore) -> Path:
    return sharded.stores[0].cache_dir / _FILE


def _urls(sharded: ShardedStore) -> dict[str, str]:
    return {str(shard): store.url for shard, store in sorted(sharded.stores.items())}
