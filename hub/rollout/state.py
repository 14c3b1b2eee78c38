"""Rollouts as recorded in git: ``refs/fleetlet/rollouts`` in the repository of shard 0.

The ref points at a commit (its parent is the previous state: ``git log refs/fleetlet/rollouts``
is the record of every step and action, who and when) whose tree holds

- ``rollouts.json``: the order of the rollouts and the fleet commit last published;
- ``rollout-<id>.json``: one rollout: its group, strategy, status, waves, every member cluster
  (its wave, previous and new variant, phase, the serial that carries it), events, halt;
- ``variant-<sha256 hex>.json``: the entries of a variant (content-addressed, shared).

The ref only moves from the value a hub read (compare-and-swap, as the server checks the old
value of every ref update): of two hubs stepping a rollout at once one succeeds, the other
reads the new state and starts again. A publication that follows the state moves the ref in the
same atomic push as its commit point (see :mod:`hub.rollout.controller`), so a restarted hub
finds the state and the branches agreeing, and resumes exactly where they are.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import pygit2

from agent.errors import TemporaryError
from hub.errors import GitTransportError, PublishError
from hub.publish.git import BranchStore, CommitBatch
from hub.publish.sendpack import ZERO, RefUpdate
from hub.rollout.content import ABSENT, Entries, Variants, variant_bytes, variant_from_bytes
from hub.rollout.model import Strategy, strategy_from_dict
from hub.rollout.seal import check as check_seal
from hub.rollout.seal import key_source, load_key
from hub.rollout.seal import seal as seal_line

ROLLOUT_REF = "refs/fleetlet/rollouts"
INDEX_FILE = "rollouts.json"
KIND = "FleetletRollout"
INDEX_KIND = "FleetletRollouts"
MAX_EVENTS = 200
KEEP_FINISHED = 20

Phase = Literal["held", "releasing", "released", "reverting", "reverted"]
PHASES: tuple[Phase, ...] = ("held", "releasing", "released", "reverting", "reverted")
Status = Literal[
    "Progressing",
    "WaitingForPromotion",
    "Paused",
    "Halted",
    "Completed",
    "Reverted",
    "Aborted",
    "Superseded",
]
STATUSES: tuple[Status, ...] = (
    "Progressing",
    "WaitingForPromotion",
    "Paused",
    "Halted",
    "Completed",
    "Reverted",
    "Aborted",
    "Superseded",
)
FINAL: frozenset[str] = frozenset({"Completed", "Reverted", "Aborted", "Superseded"})
_TIME = "%Y-%m-%dT%H:%M:%SZ"


class RolloutStateError(PublishError):
    """The rollout state in git cannot be read (not written by a hub, or damaged)."""


class ForgedRolloutStateError(RolloutStateError):
    """The rollout state in git is not sealed by this fleet's hubs (see
    :mod:`hub.rollout.seal`), or was moved back to an older state: the hub does not act on
    it, and publishes nothing from it."""


class RolloutStateMovedError(TemporaryError):
    """Another hub moved the rollout state since it was read: read it again and redo."""


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(_TIME)


def parse_stamp(text: str) -> datetime:
    """Raises ValueError."""
    return datetime.strptime(text, _TIME).replace(tzinfo=UTC)


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


@dataclass(slots=True)
class Member:
    """One cluster of a rollout.

    ``phase``: ``held`` (keeps ``previous``), ``releasing`` (decided: gets ``target``),
    ``released`` (its branch carries ``target`` from ``serial`` on, since ``since``),
    ``reverting`` / ``reverted`` (back to ``previous``). ``since`` is epoch seconds.
    """

    wave: int
    previous: str
    target: str
    phase: Phase = "held"
    serial: int = 0
    since: int = 0

    @property
    def wants_target(self) -> bool:
        return self.phase in ("releasing", "released")

    @property
    def settled(self) -> bool:
        """The branch carries what the phase says (nothing left to publish for it)."""
        return self.phase in ("held", "released", "reverted")


@dataclass(slots=True)
class WaveState:
    name: str
    pause_before: bool
    started_at: str | None = None
    settled_at: str | None = None
    """When the hub first saw every member settled (the soak counts from it)."""
    promoted_by: str | None = None
    promoted_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pauseBefore": self.pause_before,
            "startedAt": self.started_at,
            "settledAt": self.settled_at,
            "promotedBy": self.promoted_by,
            "promotedAt": self.promoted_at,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> WaveState:
        return cls(
            name=str(raw["name"]),
            pause_before=bool(raw["pauseBefore"]),
            started_at=raw.get("startedAt"),
            settled_at=raw.get("settledAt"),
            promoted_by=raw.get("promotedBy"),
            promoted_at=raw.get("promotedAt"),
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to a rollout: who (a person, a token, ``controller``), when,
    what (``created``, ``wave-started``, ``promoted``, ``halted``, ...), the wave, a message."""

    at: str
    by: str
    action: str
    message: str = ""
    wave: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"at": self.at, "by": self.by, "action": self.action, "message": self.message}
        if self.wave is not None:
            out["wave"] = self.wave
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Event:
        return cls(
            at=str(raw["at"]),
            by=str(raw["by"]),
            action=str(raw["action"]),
            message=str(raw.get("message", "")),
            wave=raw.get("wave"),
        )


@dataclass(slots=True)
class Halt:
    at: str
    reason: str
    failures: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "reason": self.reason,
            "failures": dict(sorted(self.failures.items())),
        }


@dataclass(slots=True)
class Rollout:
    """One group's move to a new revision, wave by wave."""

    id: str
    group: str
    created_at: str
    created_by: str
    source_repo: str
    source_commit: str
    strategy: Strategy
    status: Status
    waves: list[WaveState]
    members: dict[str, Member]
    forgiven: set[str] = field(default_factory=set)
    halt: Halt | None = None
    events: list[Event] = field(default_factory=list)
    updated_at: str = ""

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def record(self, event: Event) -> None:
        self.events.append(event)
        del self.events[:-MAX_EVENTS]
        self.updated_at = event.at

    def current_wave(self) -> int:
        """The index of the last started wave (-1: none yet)."""
        return max((i for i, w in enumerate(self.waves) if w.started_at), default=-1)

    def in_wave(self, index: int) -> list[str]:
        return [n for n, m in self.members.items() if m.wave == index]

    def variants(self) -> set[str]:
        return {v for m in self.members.values() for v in (m.previous, m.target)}

    def to_dict(self) -> dict[str, Any]:
        names = sorted(self.variants())
        index = {v: i for i, v in enumerate(names)}
        return {
            "kind": KIND,
            "id": self.id,
            "group": self.group,
            "createdAt": self.created_at,
            "createdBy": self.created_by,
            "updatedAt": self.updated_at or self.created_at,
            "source": {"repo": self.source_repo, "commit": self.source_commit},
            "strategy": self.strategy.to_dict(),
            "status": self.status,
            "waves": [w.to_dict() for w in self.waves],
            "variants": names,
            # [wave, previous, target, phase, serial, since]: compact for 10,000 members.
            "members": {
                n: [m.wave, index[m.previous], index[m.target], m.phase, m.serial, m.since]
                for n, m in sorted(self.members.items())
            },
            "forgiven": sorted(self.forgiven),
            "halt": self.halt.to_dict() if self.halt is not None else None,
            "events": [e.to_dict() for e in self.events],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, origin: str) -> Rollout:
        """Raises RolloutStateError naming ``origin``."""
        try:
            if raw.get("kind") != KIND:
                raise ValueError(f"kind {raw.get('kind')!r}")
            names = [str(v) for v in raw["variants"]]
            members = {}
            for name, row in raw["members"].items():
                wave, previous, target, phase, serial, since = row
                if phase not in PHASES:
                    raise ValueError(f"member {name}: phase {phase!r}")
                members[str(name)] = Member(
                    wave=int(wave),
                    previous=names[previous],
                    target=names[target],
                    phase=phase,
                    serial=int(serial),
                    since=int(since),
                )
            halt_raw = raw.get("halt")
            halt = (
                Halt(
                    at=str(halt_raw["at"]),
                    reason=str(halt_raw["reason"]),
                    failures=dict(halt_raw.get("failures") or {}),
                )
                if halt_raw
                else None
            )
            status = raw["status"]
            if status not in STATUSES:
                raise ValueError(f"status {status!r}")
            return cls(
                id=str(raw["id"]),
                group=str(raw["group"]),
                created_at=str(raw["createdAt"]),
                created_by=str(raw["createdBy"]),
                updated_at=str(raw.get("updatedAt") or raw["createdAt"]),
                source_repo=str(raw["source"]["repo"]),
                source_commit=str(raw["source"]["commit"]),
                strategy=strategy_from_dict(raw["strategy"], origin=f"{origin}: strategy"),
                status=status,
                waves=[WaveState.from_dict(w) for w in raw["waves"]],
                members=members,
                forgiven={str(n) for n in raw.get("forgiven") or ()},
                halt=halt,
                events=[Event.from_dict(e) for e in raw.get("events") or ()],
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise RolloutStateError(f"{origin}: not a rollout this hub can read ({exc})") from exc


def new_rollout_id(group: str, now: datetime) -> str:
    """``<group>-<UTC time>-<random>``: unique, sorted by time within a group."""
    return f"{group}-{now.astimezone(UTC).strftime('%Y%m%dt%H%M%S')}-{secrets.token_hex(2)}"


@dataclass(slots=True)
class State:
    """Every rollout, in creation order, as read from (or to be written to) git.

    ``oid``: the commit the ref pointed at when read (ZERO: no state yet); ``files``: that
    commit's tree (name -> blob id), whose blobs need not be sent again.
    """

    oid: str = ZERO
    rollouts: dict[str, Rollout] = field(default_factory=dict)
    last_source: tuple[str, str] | None = None
    files: dict[str, str] = field(default_factory=dict)
    variants: Variants = field(default_factory=Variants)

    def latest(self, group: str) -> Rollout | None:
        """The group's newest rollout that is not superseded."""
        found = [r for r in self.rollouts.values() if r.group == group and r.status != "Superseded"]
        return found[-1] if found else None

    def active(self) -> list[Rollout]:
        """Rollouts that still decide what their clusters get (one per group at most): the
        newest of each group unless superseded."""
        groups = dict.fromkeys(r.group for r in self.rollouts.values())
        return [r for g in groups if (r := self.latest(g)) is not None]

    def add(self, rollout: Rollout) -> None:
        self.rollouts[rollout.id] = rollout


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _json(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data, indent=None, sort_keys=True, separators=(",", ":")).encode() + b"\n"


class RolloutStore:
    """The rollout state in ``store`` (shard 0's repository)."""

    def __init__(self, store: BranchStore, *, key: bytes | None = None) -> None:
        self.store = store
        self._key = key
        self.seen = ZERO
        """The newest state this store read or wrote: a later read must descend from it."""

    @property
    def key(self) -> bytes:
        """The hub's state key, read when first needed (a publish without rollouts needs
        none). Raises StateKeyError."""
        if self._key is None:
            self._key = load_key()
        return self._key

    def read(self) -> State:
        """The state now (a fresh listing of the ref). Raises GitTransportError,
        RolloutStateError."""
        oid = self.store.list_refs().get(ROLLOUT_REF, ZERO)
        return self.read_at(oid)

    def read_at(self, oid: str) -> State:
        """The state at commit ``oid`` of the ref (fetched when missing). Raises
        GitTransportError, RolloutStateError."""
        if oid == ZERO:
            return State()
        self.store.fetch_ref(ROLLOUT_REF, oid)
        repo = self.store.repo
        try:
            commit = repo[pygit2.Oid(hex=oid)].peel(pygit2.Commit)
            tree = commit.tree
        except (KeyError, ValueError, pygit2.GitError) as exc:
            raise GitTransportError(
                f"{ROLLOUT_REF} of {self.store.url} moved while it was fetched; retry"
            ) from exc
        self._authenticate(oid, commit, tree)
        files = {str(entry.name): str(entry.id) for entry in tree}
        state = State(oid=oid, files=files)
        index = self._doc(files, INDEX_FILE)
        source = index.get("lastSource")
        if isinstance(source, dict):
            state.last_source = (str(source.get("repo")), str(source.get("commit")))
        for rid in index.get("rollouts") or []:
            name = f"rollout-{rid}.json"
            state.add(Rollout.from_dict(self._doc(files, name), origin=f"{ROLLOUT_REF}:{name}"))
        for rollout in state.rollouts.values():
            for variant in rollout.variants():
                self.load_variant(state, variant)
        return state

    def _authenticate(self, oid: str, commit: pygit2.Commit, tree: pygit2.Tree) -> None:
        """Refuse a state commit no hub of this fleet wrote, and one older than a state this
        store already saw (a forged or replayed ref). Raises ForgedRolloutStateError."""
        entries = [(str(e.name), int(e.filemode), str(e.id)) for e in tree]
        parents = [str(p) for p in commit.parent_ids]
        why = check_seal(self.key, commit.message, parents, entries)
        if why is not None:
            raise ForgedRolloutStateError(
                f"{ROLLOUT_REF} of {self.store.url} at {oid[:12]} is refused: {why}; no hub of "
                "this fleet wrote it (someone with push access to the repository, such as a "
                "cluster's status credential, did). The hub acts on no rollout and publishes "
                "nothing until the ref points at a sealed state again (this hub's state key: "
                f"{key_source()}; see docs/rollouts.md)"
            )
        seen = self.seen
        if seen not in (ZERO, oid):
            repo = self.store.repo
            if seen in repo and not repo.descendant_of(pygit2.Oid(hex=oid), pygit2.Oid(hex=seen)):
                raise ForgedRolloutStateError(
                    f"{ROLLOUT_REF} of {self.store.url} moved back from {seen[:12]} to "
                    f"{oid[:12]}, a state that does not follow it: refused (a replayed older "
                    "state)"
                )
        self.seen = oid

    def load_variant(self, state: State, name: str) -> Entries:
        """The entries of variant ``name`` (from the state's tree). Raises RolloutStateError."""
        if name in state.variants.known:
            return state.variants.entries(name)
        file = variant_file(name)
        blob = state.files.get(file)
        if blob is None:
            raise RolloutStateError(f"{ROLLOUT_REF}: variant {name} is not recorded ({file})")
        data: bytes = self.store.repo[pygit2.Oid(hex=blob)].peel(pygit2.Blob).data
        entries = variant_from_bytes(data, name=name)
        state.variants.add(name, entries)
        return entries

    def _doc(self, files: Mapping[str, str], name: str) -> dict[str, Any]:
        blob = files.get(name)
        if blob is None:
            raise RolloutStateError(f"{ROLLOUT_REF} has no {name}")
        data = self.store.repo[pygit2.Oid(hex=blob)].peel(pygit2.Blob).data
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise RolloutStateError(f"{ROLLOUT_REF}:{name}: not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise RolloutStateError(f"{ROLLOUT_REF}:{name}: not an object")
        return doc

    # --- writing ----------------------------------------------------------------------------

    def commit(self, batch: CommitBatch, state: State, *, message: str, when: datetime) -> str:
        """The state's commit, written into ``batch`` (blobs the previous state already has
        are not written again); its id. Raises RolloutContentError (a variant not known)."""
        kept = _kept(state)
        files: dict[str, bytes] = {
            INDEX_FILE: _json(
                {
                    "kind": INDEX_KIND,
                    "rollouts": [r.id for r in kept],
                    "lastSource": {"repo": state.last_source[0], "commit": state.last_source[1]}
                    if state.last_source
                    else None,
                }
            )
        }
        variants: set[str] = set()
        for rollout in kept:
            files[f"rollout-{rollout.id}.json"] = _json(rollout.to_dict())
            variants |= rollout.variants()
        ids: dict[str, str] = {}
        for name in sorted(variants):
            file = variant_file(name)
            if file in state.files:
                ids[file] = state.files[file]
            else:
                files[file] = variant_bytes(state.variants.entries(name))
        for name, data in files.items():
            blob = _blob_id(data)
            ids[name] = blob if state.files.get(name) == blob else batch.blob(data)
        parents = [state.oid] if state.oid != ZERO else []
        sealed = seal_line(self.key, parents, [(n, 0o100644, i) for n, i in ids.items()])
        message = f"{message.rstrip()}\n\n{sealed}\n"
        return batch.commit(ids, parents=parents, message=message, when=when)

    def write(self, state: State, *, message: str, when: datetime) -> str:
        """Move the ref from ``state.oid`` to a commit of ``state`` (one push); the new oid.

        Raises RolloutStateMovedError (another hub moved it first), GitTransportError.
        """
        batch = CommitBatch(self.store)
        oid = self.commit(batch, state, message=message, when=when)
        pack = batch.write()
        outcome = self.store.push([RefUpdate(ref=ROLLOUT_REF, old=state.oid, new=oid)], pack=pack)
        if outcome.refused:
            raise RolloutStateMovedError(
                f"{ROLLOUT_REF} of {self.store.url} moved since it was read "
                f"({outcome.refused[ROLLOUT_REF]}); read it again"
            )
        self.seen = oid
        return oid


def variant_file(name: str) -> str:
    return f"variant-{name.removeprefix('sha256:')}.json"


def _kept(state: State) -> list[Rollout]:
    """The rollouts worth keeping in the tree: the newest of each group (it still decides
    what its clusters get), and the most recent others (git history has the rest)."""
    latest = {r.id for r in state.active()}
    others = [r.id for r in state.rollouts.values() if r.id not in latest]
    keep = latest | set(others[-KEEP_FINISHED:])
    return [r for r in state.rollouts.values() if r.id in keep]


def members_of(
    waves: Iterable[tuple[str, bool, Iterable[str]]],
    previous: Mapping[str, str],
    target: Mapping[str, str],
) -> tuple[list[WaveState], dict[str, Member]]:
    """Wave states and members from planned waves ((name, pauseBefore, clusters))."""
    states: list[WaveState] = []
    members: dict[str, Member] = {}
    for index, (name, pause, names) in enumerate(waves):
        states.append(WaveState(name=name, pause_before=pause))
        for cluster in names:
            members[cluster] = Member(
                wave=index, previous=previous.get(cluster, ABSENT), target=target[cluster]
            )
    return states, members


__all__ = [
    "FINAL",
    "ROLLOUT_REF",
    "Event",
    "ForgedRolloutStateError",
    "Halt",
    "Member",
    "Phase",
    "Rollout",
    "RolloutStateError",
    "RolloutStateMovedError",
    "RolloutStore",
    "State",
    "Status",
    "WaveState",
    "epoch",
    "members_of",
    "new_rollout_id",
    "parse_stamp",
    "stamp",
]
