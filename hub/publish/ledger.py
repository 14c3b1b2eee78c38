"""One publication at a time across every shard, whatever the number of hubs publishing.

A publication spreads over several repositories, and no git server updates refs in several
repositories at once. So a publish is a two-phase commit with its decision in git:

1. **stage**: in every shard it changes, the hub pushes its pack and ONE staging ref,
   ``refs/fleetlet/staging/<publication>``, at a commit whose parents are the publication's new
   cluster commits and whose tree lists the ref updates (``updates``: ``old new ref`` lines).
   Agents read only their own ``refs/heads/fleetlet/clusters/<cluster>``: nothing staged is
   visible to them.
2. **commit**: the hub moves ``refs/fleetlet/publication`` in shard 0 from the value it read
   at the start to a record naming the publication and each shard's staging commit. The server
   moves a ref only from the old value the client names: of two hubs publishing at once,
   exactly one succeeds; the other deletes what it staged and starts over on top of the
   winner's publication (or gives up after a few attempts with a clear error).
3. **apply**: in each shard, every cluster branch moves to its new commit and the staging ref
   is deleted (one push per shard). A hub that finds a staging ref of the publication the head
   names (its publisher died or lost the network between 2 and 3) finishes it before anything
   else: a committed publication is always applied whole, an uncommitted one never at all.

A small publication skips the staging pushes: the push that moves the head *carries* what the
other shards need, in shard 0 (``carried``: for each shard a tree with the ``updates`` file,
each new commit's tree, and each new commit's bytes as a blob, since the commit's parents live
in the other shard). Then one push per other shard moves its branches with its own pack; a
hub finishing such a publication rebuilds those commits from shard 0 (same bytes, same ids)
and pushes the updates still pending.

Staging refs of publications that never committed are deleted once they are older than
:data:`STALE_STAGING` (their publisher may still be about to commit).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hub.errors import PublishError
from hub.publish.sendpack import ZERO, RefUpdate

HEAD_REF = "refs/fleetlet/publication"
CARRIED_TREE = "shard-{shard}"  # in the record commit's tree: a shard's carried tree
STAGING_PREFIX = "refs/fleetlet/staging/"
RECORD_FILE = "publication.json"
UPDATES_FILE = "updates"
STALE_STAGING = timedelta(hours=1)
_RECORD_KIND = "FleetletPublication"
_ID_TIME = "%Y%m%dT%H%M%SZ"


def new_publication_id(now: datetime) -> str:
    """``<UTC time>-<random>``: unique per attempt, and ordered by time."""
    return f"{now.astimezone(UTC).strftime(_ID_TIME)}-{secrets.token_hex(6)}"


def staging_ref(publication: str) -> str:
    return STAGING_PREFIX + publication


def publication_time(publication: str) -> datetime | None:
    try:
        return datetime.strptime(publication.split("-", 1)[0], _ID_TIME).replace(tzinfo=UTC)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class HeadRecord:
    """What ``refs/fleetlet/publication`` says: the last committed publication."""

    publication: str
    issued_at: str
    statement_sha256: str | None
    staging: Mapping[int, str] = field(default_factory=dict)  # shard -> staging commit
    carried: Mapping[int, str] = field(default_factory=dict)  # shard -> tree in shard 0
    note: Mapping[str, Any] | None = None
    """What else the publication carries out (the rollout steps and actions behind it)."""
    source: Mapping[str, Any] | None = None
    """The fleet commit published (``repo``, ``commit``) and, with a commit policy, who signed
    it (``signedBy``, as every set records it). For people: agents trust only the sets."""

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "kind": _RECORD_KIND,
            "publication": self.publication,
            "issuedAt": self.issued_at,
            "statementSha256": self.statement_sha256,
            "staging": {str(k): v for k, v in sorted(self.staging.items())},
        }
        if self.carried:
            doc["carried"] = {str(k): v for k, v in sorted(self.carried.items())}
        if self.note:
            doc["note"] = dict(self.note)
        if self.source:
            doc["source"] = dict(self.source)
        return (
            json.dumps(
                doc,
                indent=1,
                sort_keys=True,
            ).encode()
            + b"\n"
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> HeadRecord:
        """Raises PublishError for a record this hub cannot read."""
        try:
            doc = json.loads(data)
            if doc.get("kind") != _RECORD_KIND:
                raise ValueError(f"kind {doc.get('kind')!r}")
            return cls(
                publication=str(doc["publication"]),
                issued_at=str(doc["issuedAt"]),
                statement_sha256=doc.get("statementSha256"),
                staging={int(k): str(v) for k, v in doc["staging"].items()},
                carried={int(k): str(v) for k, v in doc.get("carried", {}).items()},
                note=doc.get("note") if isinstance(doc.get("note"), dict) else None,
                source=doc.get("source") if isinstance(doc.get("source"), dict) else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PublishError(
                f"{HEAD_REF} holds no publication record this hub can read ({exc}); "
                "fix or delete the ref"
            ) from exc


def updates_bytes(updates: list[RefUpdate]) -> bytes:
    """The ``updates`` file of a staging commit: one ``old new ref`` line per update."""
    return "".join(f"{u.old} {u.new} {u.ref}\n" for u in updates).encode()


def parse_updates(data: bytes) -> list[RefUpdate]:
    """Raises PublishError for a malformed ``updates`` file."""
    out = []
    for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
        parts = line.split(" ")
        if len(parts) != 3 or len(parts[0]) != 40 or len(parts[1]) != 40:
            raise PublishError(f"staging {UPDATES_FILE} line {number} is malformed: {line!r:.80}")
        out.append(RefUpdate(ref=parts[2], old=parts[0], new=parts[1]))
    return out


def pending(updates: list[RefUpdate], current: Mapping[str, str]) -> list[RefUpdate]:
    """The updates of a committed publication a shard has not applied yet (a ref still at its
    old value)."""
    return [u for u in updates if current.get(u.ref, ZERO) == u.old and u.old != u.new]


__all__ = [
    "HEAD_REF",
    "STAGING_PREFIX",
    "HeadRecord",
    "new_publication_id",
    "parse_updates",
    "pending",
    "publication_time",
    "staging_ref",
    "updates_bytes",
]
