"""The compact summary the hub keeps of one cluster's status (not the document), and what a
refresh did."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hub.fastjson import loads
from hub.status.document import installation_state, parse_time


@dataclass(slots=True)
class ClusterView:
    """One cluster as its status branch in one shard last said, in compact form.

    ``states`` is (bundle, state) per installation, the state as the document says it (Stale
    is the clock's, applied when read). ``source`` is the commit the summary was read from
    (None: never a good document); ``error`` why the tip's document was not used.
    """

    name: str
    shard: int
    tip: str
    source: str | None = None
    error: str | None = None
    heartbeat: str | None = None
    sequence: int | None = None
    agent_version: str | None = None
    notify_channel: str | None = None
    """``up``/``down``: the agent holds (or tries to hold) the hub's channel; None: it only polls."""
    last_accepted_serial: int | None = None
    last_refusal: Any = None
    states: tuple[tuple[str, str], ...] = ()
    serials: bytes = b""
    """Per item of ``states``: the serial of its applied revision and of its newest run (0:
    none), packed as unsigned 64-bit pairs (a few bytes per installation, at 100,000 clusters)."""
    beat: datetime | None = field(default=None, compare=False)  # the heartbeat, parsed

    def __post_init__(self) -> None:
        # Parsed once: staleness is asked of every cluster on every pass over the fleet.
        self.beat = parse_time(self.heartbeat, origin=self.name) if self.heartbeat else None

    def stale(self, now: datetime, stale_after: timedelta) -> bool:
        beat = self.beat
        return beat is None or now - beat > stale_after

    def revisions(self) -> dict[str, tuple[str, int, int]]:
        """Bundle -> (state as reported, applied serial, newest run's serial); 0 for none."""
        count = len(self.states)
        pairs = (
            struct.unpack(f"<{2 * count}Q", self.serials) if len(self.serials) == 16 * count else ()
        )
        return {
            bundle: (state, pairs[2 * i] if pairs else 0, pairs[2 * i + 1] if pairs else 0)
            for i, (bundle, state) in enumerate(self.states)
        }

    def rank(self) -> tuple[str, int, int]:
        """Which of a cluster's views (one per shard holding its status) is shown: newest."""
        return (self.heartbeat or "", self.sequence or 0, -self.shard)

    def summarised(self, doc: Mapping[str, Any], commit: str) -> ClusterView:
        items = sorted(doc["bundles"].items())
        accepted = doc.get("lastAcceptedSerial")
        states = tuple(
            (sys.intern(name), sys.intern(installation_state(item, stale=False, accepted=accepted)))
            for name, item in items
        )
        serials = struct.pack(
            f"<{2 * len(items)}Q", *(n for _, item in items for n in _serials(item))
        )
        version = doc.get("agentVersion")
        return ClusterView(
            name=self.name,
            shard=self.shard,
            tip=self.tip,
            source=commit,
            error=None,
            heartbeat=doc["heartbeat"],
            sequence=doc["sequence"],
            agent_version=sys.intern(version) if isinstance(version, str) else None,
            notify_channel=_channel(doc.get("notifyChannel")),
            last_accepted_serial=doc.get("lastAcceptedSerial"),
            last_refusal=doc.get("lastRefusal"),
            states=states,
            serials=serials,
        )

    def row(self) -> tuple[int, str, str, str | None, str | None, str]:
        data = {
            "h": self.heartbeat,
            "s": self.sequence,
            "v": self.agent_version,
            "c": self.notify_channel,
            "a": self.last_accepted_serial,
            "r": self.last_refusal,
            "b": self.states,
            "n": self.serials.hex(),
        }
        return (self.shard, self.name, self.tip, self.source, self.error, json.dumps(data))

    @classmethod
    def of_row(cls, row: Sequence[Any]) -> ClusterView:
        shard, name, tip, source, error, blob = row
        data = loads(blob)
        return cls(
            name=name,
            shard=shard,
            tip=tip,
            source=source,
            error=error,
            heartbeat=data["h"],
            sequence=data["s"],
            agent_version=sys.intern(data["v"]) if data["v"] else None,
            notify_channel=_channel(data.get("c")),
            last_accepted_serial=data["a"],
            last_refusal=data["r"],
            states=tuple((sys.intern(b), sys.intern(st)) for b, st in data["b"]),
            serials=bytes.fromhex(data["n"]),
        )


_MAX_SERIAL = 2**53 - 1


def _channel(value: Any) -> str | None:
    return value if value in ("up", "down") else None


def _serials(item: Mapping[str, Any]) -> tuple[int, int]:
    """(applied revision's serial, newest run's serial) of an installation; 0 for none."""
    applied = item.get("appliedRevision")
    runs = item.get("runs") or []
    first = applied.get("serial") if isinstance(applied, dict) else None
    last = runs[0].get("serial") if runs and isinstance(runs[0], dict) else None
    return tuple(  # type: ignore[return-value]
        v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_SERIAL else 0
        for v in (first, last)
    )


@dataclass(slots=True)
class RefreshResult:
    """What one refresh did: branches listed, moved (fetched), removed, and seconds spent."""

    listed: int
    moved: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
