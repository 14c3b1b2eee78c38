"""The two-phase commit of a publication across shards (the records are in :mod:`ledger`).

Each shard but 0 gets one pack with its changed clusters' commits and a staging commit that
lists the ref updates, pushed under a staging ref (:func:`stage_shards`); then shard 0's branches
move in the same atomic push as the head ref naming the publication (:func:`commit_point`,
the commit point); then every other shard's branches move (:meth:`Writer.apply`). A hub that
dies after the commit point leaves staging refs that the next publish finishes
(:func:`recover`); before it, nothing any agent reads has moved.

A publication changing at most :data:`CARRY_MAX` clusters outside shard 0 skips the staging
pushes: the commit point carries what the other shards need (:func:`carries`), then each other
shard gets one push with its pack. A publication spread thinly over many shards (1% of the
fleet) so costs one push per shard instead of two.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pygit2

from agent.errors import TemporaryError
from agent.verify.publication import BUNDLE_FILE, PROOF_FILE, SET_FILE, STATEMENT_FILE
from hub.errors import GitTransportError, PublishError, PushRejectedError
from hub.publish import ledger
from hub.publish.compare import ClusterChange, ContentCache, Decisions
from hub.publish.compose import SetComposer
from hub.publish.facts import BranchFacts
from hub.publish.git import BRANCH_PREFIX, BranchStore, CommitBatch
from hub.publish.prepared import Prepared
from hub.publish.sendpack import ZERO, AtomicUnsupportedError, RefUpdate
from hub.publish.shards import ShardedStore
from hub.publish.sign import SignedTree

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Attachment:
    """A ref of shard 0 that moves in the same atomic push as the publication's commit point
    (the rollouts' state follows the publications that carry it out).

    ``old``: its value when read (ZERO: none), checked by the server; ``write(batch,
    publication, changes)`` writes the commit it moves to (into the publication's pack) and
    returns its id, given the publication's id and every cluster's change; ``trailer(cluster)``
    is a line for that cluster's commit message (or None); ``note`` goes into the
    publication's record (``refs/fleetlet/publication``).
    """

    ref: str
    old: str
    write: Callable[[CommitBatch, str, Sequence[ClusterChange]], str]
    trailer: Callable[[str], str | None] | None = None
    note: Mapping[str, Any] | None = None


class AttachmentMovedError(TemporaryError):
    """The ref attached to a publication (the rollouts' state) moved since it was read:
    nothing was published; read it again and redo."""


def utc_text(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


class StageClock:
    """Seconds per stage, the stages in the order they ran."""

    def __init__(self, start: Mapping[str, float]) -> None:
        self.timings = dict(start)
        self._lock = threading.Lock()

    def stage(self, name: str) -> _Stage:
        return _Stage(self, name)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.timings[name] = self.timings.get(name, 0.0) + seconds


class _Stage:
    def __init__(self, clock: StageClock, name: str) -> None:
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.clock.add(self.name, time.perf_counter() - self.started)


class LostRace(Exception):
    def __init__(self, winner: str) -> None:
        super().__init__(winner)
        self.winner = winner


def serial_of(change: ClusterChange) -> int:
    assert change.serial_after is not None
    return change.serial_after


@dataclass(slots=True)
class Update:
    """One ref update of a shard: a cluster branch moved to its new commit (``new`` set when
    written) or deleted (``new`` ZERO)."""

    cluster: str
    ref: str
    old: str
    new: str = ""
    change: ClusterChange | None = None


@dataclass(frozen=True, slots=True)
class Carried:
    """A shard whose commits the commit point carried: ``pack`` holds them for its push."""

    pack: Path | None


Staged = str | Carried
"""How a shard's commits wait for the commit point: its staging commit, or carried."""

# Clusters outside shard 0 up to which a publication is carried by its commit point: each
# of them costs shard 0 a few small objects more to index (tens of µs), each shard it skips
# staging saves a push (0.1-0.4 s of the server's work at 6,000-16,000 refs). A 1% change
# of a million clusters in 64 shards (10,000) is carried; a full publication is staged.
CARRY_MAX = 20_000


def carries(plan: Mapping[int, Sequence[Update]]) -> bool:
    """Whether the commit point carries this publication (see the module docstring)."""
    return sum(len(updates) for shard, updates in plan.items() if shard != 0) <= CARRY_MAX


@dataclass(slots=True)
class Writer:
    """Writes, stages and applies one publication's commits, shard by shard."""

    prepared: Prepared
    composer: SetComposer
    signed: SignedTree | None
    cache: ContentCache
    now: datetime
    signer: bool
    publication: str
    trailer: Callable[[str], str | None] | None = None

    _expires: str = ""
    _signed_by_trailer: str = ""

    def __post_init__(self) -> None:
        self._expires = utc_text(self.now + self.prepared.fleet.settings.expires_after) or ""
        signed = self.prepared.signed_by
        if signed is not None:
            keyless = f" gitsign {signed.issuer}" if signed.format == "gitsign" else ""
            self._signed_by_trailer = (
                f"Source-Signed-By: {signed.principal} {signed.key}{keyless}\n"
            )

    def source_record(self) -> dict[str, Any]:
        """The fleet commit for the publication's record (``refs/fleetlet/publication``)."""
        source = self.prepared.source
        out: dict[str, Any] = {"repo": source.repo, "commit": source.commit}
        signed = self.prepared.signed_by
        if signed is not None:
            out["signedBy"] = {"principal": signed.principal, "key": signed.key}
            if signed.format == "gitsign":
                out["signedBy"].update(format="gitsign", issuer=signed.issuer)
            out["policy"] = signed.policy
        return out

    def plan(
        self, todo: list[ClusterChange], decisions: Decisions, stores: Mapping[int, BranchStore]
    ) -> dict[int, list[Update]]:
        """Shard -> its updates: each changed cluster on each of its shards, each deletion."""
        out: dict[int, list[Update]] = {}
        for c in todo:
            for s in c.shards:
                old = stores[s].tips.get(c.cluster, ZERO)
                out.setdefault(s, []).append(
                    Update(c.cluster, BRANCH_PREFIX + c.cluster, old, "", c)
                )
        for d in decisions.deletions:
            ref = BRANCH_PREFIX + d.cluster
            out.setdefault(d.shard, []).append(Update(d.cluster, ref, d.tip, ZERO))
        return out

    def write(
        self,
        store: BranchStore,
        updates: list[Update],
        *,
        entries: dict[bytes, bytes] | None = None,
        compress: bool = True,
    ) -> CommitBatch:
        """The commits of ``updates`` (their ``new`` set), in a batch for one pack
        (``entries``, ``compress``: see PackWriter)."""
        batch = CommitBatch(store, entries=entries, compress=compress)
        shared: dict[str, str] = {}
        if self.signed is not None:
            shared[STATEMENT_FILE] = batch.blob(self.signed.statement_bytes)
            if self.signed.bundle_json is not None:
                shared[BUNDLE_FILE] = batch.blob(self.signed.bundle_json)
        bases: dict[tuple[int, tuple[str, ...]], tuple[str, int, int, int]] = {}
        for u in updates:
            u.new = self._commit(batch, u.change, shared, bases) if u.change else ZERO
        return batch

    def stage(self, store: BranchStore, updates: list[Update], clock: StageClock) -> str:
        """:meth:`write_staged` and :meth:`push_staged` in one go."""
        staging, pack = self.write_staged(store, updates, clock)
        return self.push_staged(store, staging, pack, clock)

    def write_staged(
        self, store: BranchStore, updates: list[Update], clock: StageClock
    ) -> tuple[str, Path | None]:
        """Write this shard's commits and its staging commit as one pack: (staging commit,
        pack). Raises PublishError."""
        started = time.perf_counter()
        batch = self.write(store, updates)
        real = [RefUpdate(ref=u.ref, old=u.old, new=u.new) for u in updates]
        staging = batch.commit(
            {ledger.UPDATES_FILE: batch.blob(ledger.updates_bytes(real))},
            parents=sorted({u.new for u in updates if u.new != ZERO}),
            message=f"fleetlet: staging publication {self.publication}\n",
            when=self.now,
        )
        pack = batch.write()
        clock.add("write", time.perf_counter() - started)
        return staging, pack

    def push_staged(
        self, store: BranchStore, staging: str, pack: Path | None, clock: StageClock
    ) -> str:
        """Push a shard's pack with its staging ref. Raises GitTransportError, PublishError."""
        started = time.perf_counter()
        ref = ledger.staging_ref(self.publication)
        outcome = store.push([RefUpdate(ref=ref, old=ZERO, new=staging)], pack=pack)
        clock.add("push", time.perf_counter() - started)
        if outcome.refused:
            raise PublishError(f"{store.url} refused {ref}: {outcome.refused[ref]}")
        return staging

    def _commit(
        self,
        batch: CommitBatch,
        change: ClusterChange,
        shared: Mapping[str, str],
        bases: dict[tuple[int, tuple[str, ...]], tuple[str, int, int, int]],
    ) -> str:
        plan = self.prepared.plans[change.cluster]
        serial = serial_of(change)
        data = self.composer.set_bytes(plan, serial)
        parts = self.composer.parts(plan, serial)
        shape = self.composer.shape(plan)
        base = bases.get(shape) if parts is not None else None
        if base is None or parts is None:
            # The first set of its shape in this pack is stored whole, the others as deltas.
            set_id = batch.blob(data)
            if parts is not None:
                bases[shape] = (set_id, len(data), len(parts[0]), len(parts[2]))
        else:
            base_id, base_size, head, tail = base
            set_id = batch.blob_delta(
                data,
                base=base_id,
                base_size=base_size,
                ops=[(0, head), parts[1], (base_size - tail, tail)],
            )
        files = {**shared, SET_FILE: set_id}
        if self.signed is not None:
            files[PROOF_FILE] = batch.blob(self.signed.proof_bytes(change.cluster))
        expires = self._expires
        # Trailers let the next run skip unchanged clusters cheaply (see compare.py); the set
        # itself stays the only thing agents trust.
        message = (
            f"fleetlet: {change.status} {change.cluster}, serial {serial}\n\n"
            f"Source: {self.prepared.source.repo}@{self.prepared.source.commit}\n"
            + self._signed_by_trailer
            + f"Serial: {serial}\n"
            f"Expires-At: {expires}\n"
            f"Content-Digest: {self.cache.digest(plan)}\n"
            f"Signed: {'true' if self.signer else 'false'}\n"
            + (f"Moving-Since: {change.moving_since}\n" if change.moving_since else "")
            + f"Publication: {self.publication}\n"
        )
        extra = self.trailer(change.cluster) if self.trailer is not None else None
        if extra:
            message += extra.rstrip("\n") + "\n"
        parents = [change.parent] if change.parent else []
        return batch.commit(files, parents=parents, message=message, when=self.now)

    def apply(self, store: BranchStore, updates: list[Update], staged: Staged) -> dict[str, str]:
        """Move this shard's branches (one push): from its staging commit, deleting the staging
        ref, or with its own pack when the commit point carried it. Returns the refused updates
        (ref -> reason). Raises GitTransportError."""
        real = [RefUpdate(ref=u.ref, old=u.old, new=u.new) for u in updates]
        if isinstance(staged, Carried):
            outcome = store.push(real, pack=staged.pack)
            self.settle(store, updates, outcome.refused)
            return dict(outcome.refused)
        ref = ledger.staging_ref(self.publication)
        outcome = store.push([*real, RefUpdate(ref=ref, old=staged, new=ZERO)], pack=None)
        self.settle(store, updates, outcome.refused)
        return {r: m for r, m in outcome.refused.items() if r != ref}

    def settle(self, store: BranchStore, updates: list[Update], refused: Mapping[str, str]) -> None:
        """Remember what the moved branches now hold (the next run's diff reads it)."""
        expires = utc_text(self.now + self.prepared.fleet.settings.expires_after) or ""
        for u in updates:
            if u.ref in refused:
                continue
            if u.change is None:
                store.remember(u.cluster, None)
                continue
            store.remember(
                u.cluster,
                BranchFacts(
                    tip=u.new,
                    digest=self.cache.digest(self.prepared.plans[u.cluster]),
                    serial=serial_of(u.change),
                    expires_at=expires,
                    signed=self.signer,
                    moving_since=u.change.moving_since,
                ),
            )


# Commits to write above which the packs are written by worker processes: writing is Python
# work (about 130 µs per cluster), the pushes are the git server's.
PROCESS_WRITE_MIN = 20_000
_FORKED: tuple[Writer, Mapping[int, BranchStore], Mapping[int, list[Update]]] | None = None


def _write_in_child(shard: int) -> tuple[int, str, str | None, list[str], float]:
    """A forked worker's share of :func:`_stage`: one shard's pack, written into its cache
    repository; (shard, staging commit, pack path, the new commits in order, seconds)."""
    assert _FORKED is not None
    writer, stores, plan = _FORKED
    started = time.perf_counter()
    staging, pack = writer.write_staged(stores[shard], plan[shard], StageClock({}))
    news = [u.new for u in plan[shard]]
    return shard, staging, str(pack) if pack else None, news, time.perf_counter() - started


def stage_shards(
    writer: Writer,
    sharded: ShardedStore,
    plan: Mapping[int, list[Update]],
    clock: StageClock,
    writers: int | None = None,
) -> dict[int, str]:
    """Stage every shard but 0: packs written one shard after the other, each pushed in the
    background while the next is written (the git server's work). Large publications are
    written by ``writers`` forked worker processes (default: 2 from :data:`PROCESS_WRITE_MIN`
    commits on, where the system can fork), which share this process's plans copy-on-write."""
    global _FORKED
    later = [s for s in sorted(plan) if s != 0]
    if len(later) <= 1:
        return {s: writer.stage(sharded.stores[s], plan[s], clock) for s in later}
    if writers is None:
        count = sum(len(plan[s]) for s in later)
        writers = min(2, os.cpu_count() or 1) if count >= PROCESS_WRITE_MIN else 1
    if "fork" not in multiprocessing.get_all_start_methods():
        writers = 1
    futures = {}
    with ThreadPoolExecutor(max_workers=sharded.parallel) as pool:
        try:
            if writers > 1:
                _FORKED = (writer, sharded.stores, plan)
                context = multiprocessing.get_context("fork")
                with ProcessPoolExecutor(max_workers=writers, mp_context=context) as procs:
                    for shard, staging, pack, news, seconds in procs.map(_write_in_child, later):
                        for update, new in zip(plan[shard], news, strict=True):
                            update.new = new
                        clock.add("write", seconds)
                        store = sharded.stores[shard]
                        path = Path(pack) if pack else None
                        futures[shard] = pool.submit(
                            writer.push_staged, store, staging, path, clock
                        )
            else:
                for s in later:
                    store = sharded.stores[s]
                    staging, pack_path = writer.write_staged(store, plan[s], clock)
                    futures[s] = pool.submit(writer.push_staged, store, staging, pack_path, clock)
        finally:
            _FORKED = None
            done = {s: f.exception() for s, f in futures.items()}
        staged = {s: f.result() for s, f in futures.items() if done[s] is None}
    errors = [e for e in done.values() if e is not None]
    if errors:
        unstage(sharded, writer.publication, staged)
        raise errors[0]
    return staged


def read_head(store: BranchStore) -> tuple[str, ledger.HeadRecord | None]:
    """(oid of the head ref or ZERO, its record). Raises GitTransportError, PublishError."""
    oid = store.fetch_ref(ledger.HEAD_REF)
    if oid is None:
        return ZERO, None
    data = store.read_blob(oid, ledger.RECORD_FILE)
    if data is None:
        raise PublishError(f"{ledger.HEAD_REF} in {store.url} has no {ledger.RECORD_FILE}")
    return oid, ledger.HeadRecord.from_bytes(data)


def recover(sharded: ShardedStore, now: datetime, say: Progress) -> str:
    """Finish the committed publication a hub left half-applied; delete stale staging refs.
    Returns the head's oid (ZERO when none) that this publication must replace."""
    head, record = read_head(sharded.stores[0])
    if record is not None and record.carried:
        _finish_carried(sharded, record, say)

    def recover(shard: int, store: BranchStore) -> None:
        changed = False
        for ref, oid in sorted(store.refs.items()):
            if not ref.startswith(ledger.STAGING_PREFIX):
                continue
            publication = ref[len(ledger.STAGING_PREFIX) :]
            if record is not None and publication == record.publication:
                say(f"finishing publication {publication} in {store.url}")
                store.fetch_ref(ref)
                data = store.read_blob(oid, ledger.UPDATES_FILE) or b""
                todo = ledger.pending(ledger.parse_updates(data), store.refs)
                store.push([*todo, RefUpdate(ref=ref, old=oid, new=ZERO)], pack=None)
                changed = True
            else:
                began = ledger.publication_time(publication)
                if began is None or now - began > ledger.STALE_STAGING:
                    store.push([RefUpdate(ref=ref, old=oid, new=ZERO)], pack=None)
        if changed:
            store.fetch()

    sharded.each(recover)
    return head


def _finish_carried(sharded: ShardedStore, record: ledger.HeadRecord, say: Progress) -> None:
    """Push what a carried publication's shards still lack: each pending update's commit,
    rebuilt from the bytes shard 0 carries (its id checked), with its tree and blobs."""
    source = sharded.stores[0]
    odb = source.repo.odb

    def finish(shard: int, store: BranchStore) -> None:
        carried = source.repo[pygit2.Oid(hex=record.carried[shard])].peel(pygit2.Tree)
        updates = ledger.parse_updates(odb.read(carried[ledger.UPDATES_FILE].id)[1])
        todo = ledger.pending(updates, store.refs)
        if not todo:
            return
        say(f"finishing publication {record.publication} in {store.url}")
        batch = CommitBatch(store)
        for update in todo:
            if update.new == ZERO:
                continue
            body = odb.read(carried[f"{update.new}.commit"].id)[1]
            if batch.pack.add("commit", body) != update.new:
                raise PublishError(
                    f"{ledger.HEAD_REF} of {source.url} carries a commit that is not "
                    f"{update.new}; fix or delete the ref"
                )
            tree = carried[update.new].id
            batch.pack.add("tree", odb.read(tree)[1])
            for entry in source.repo[tree].peel(pygit2.Tree):
                kind, data = odb.read(entry.id)
                batch.pack.add(_KINDS[kind], data)
        outcome = store.push(todo, pack=batch.write())
        if outcome.refused:
            raise PushRejectedError(dict(outcome.refused), pushed=[])
        store.fetch()

    # (read_head fetched the record, and with it everything it carries.)
    sharded.each(finish, [s for s in record.carried if s in sharded.stores])


_KINDS = {pygit2.enums.ObjectType.BLOB: "blob", pygit2.enums.ObjectType.TREE: "tree"}


def commit_point(
    writer: Writer,
    store: BranchStore,
    head: str,
    signed: SignedTree | None,
    staged: Mapping[int, str],
    updates: list[Update],
    clock: StageClock,
    joined: tuple[Attachment, Sequence[ClusterChange]] | None = None,
    carried: Mapping[int, tuple[BranchStore, list[Update]]] | None = None,
) -> tuple[str, dict[int, Carried]]:
    """Move the head from ``head`` to this publication's record, with ``updates`` (shard 0's
    branches) and the attached ref (``joined``: the attachment and the publication's changes)
    in the same atomic push: the commit point. ``carried``: the other shards (store and
    updates) whose commits this push carries. Returns the head's new commit, and the carried
    shards with the packs that move them.

    Raises LostRace when another hub moved the head first, AttachmentMovedError when the
    attached ref moved, PushRejectedError when the server refused a branch (then nothing
    moved), AtomicUnsupportedError, PublishError (a pack could not be written).
    """
    started = time.perf_counter()
    # Each carried object goes into two packs (its shard's and shard 0's): compressed once.
    entries: dict[bytes, bytes] = {}
    small = carried is not None  # carried: at most CARRY_MAX clusters, stored uncompressed
    batch = writer.write(store, updates, entries=entries, compress=not small)
    trees: dict[int, str] = {}
    packs: dict[int, Carried] = {}
    for shard, (shard_store, shard_updates) in sorted((carried or {}).items()):
        shard_batch = writer.write(shard_store, shard_updates, entries=entries, compress=False)
        trees[shard] = _carry(batch, shard_batch, shard_updates)
        packs[shard] = Carried(pack=shard_batch.write())
    record = ledger.HeadRecord(
        publication=writer.publication,
        issued_at=utc_text(writer.now) or "",
        statement_sha256=hashlib.sha256(signed.statement_bytes).hexdigest() if signed else None,
        staging=dict(staged),
        carried=trees,
        note=joined[0].note if joined is not None else None,
        source=writer.source_record(),
    )
    commit = batch.commit(
        {ledger.RECORD_FILE: batch.blob(record.to_bytes())},
        parents=[],
        message=f"fleetlet: publication {writer.publication}\n",
        when=writer.now,
        dirs={ledger.CARRIED_TREE.format(shard=s): tree for s, tree in trees.items()},
    )
    extra: list[RefUpdate] = []
    if joined is not None:
        attach, changes = joined
        new = attach.write(batch, writer.publication, changes)
        extra.append(RefUpdate(ref=attach.ref, old=attach.old, new=new))
    pack = batch.write()
    clock.add("write", time.perf_counter() - started)
    started = time.perf_counter()
    real = [RefUpdate(ref=u.ref, old=u.old, new=u.new) for u in updates]
    outcome = store.push(
        [*real, *extra, RefUpdate(ref=ledger.HEAD_REF, old=head, new=commit)],
        pack=pack,
        atomic=bool(real or extra),
    )
    clock.add("push", time.perf_counter() - started)
    if outcome.refused:
        refs = store.list_refs()
        for moved in extra:
            if refs.get(moved.ref, ZERO) != moved.old:
                raise AttachmentMovedError(
                    f"{moved.ref} of {store.url} moved since it was read; nothing was published"
                )
        current = refs.get(ledger.HEAD_REF, ZERO)
        if current != head:
            raise LostRace(current[:12])
        reasons = {r: m for r, m in outcome.refused.items() if "atomic" not in m}
        raise PushRejectedError(reasons or dict(outcome.refused), pushed=[])
    writer.settle(store, updates, {})
    return commit, packs


def _carry(into: CommitBatch, batch: CommitBatch, updates: Sequence[Update]) -> str:
    """One shard's carried tree, written into ``into``: its ``updates`` file, and for each new
    commit its tree (named by the commit's id) and its bytes (``<id>.commit``)."""
    commits = into.pack.carry(batch.pack)
    real = [RefUpdate(ref=u.ref, old=u.old, new=u.new) for u in updates]
    files = {ledger.UPDATES_FILE: into.blob(ledger.updates_bytes(real))}
    dirs: dict[str, str] = {}
    for commit, (blob, tree) in commits.items():
        files[f"{commit}.commit"] = blob
        dirs[commit] = tree
    return into.pack.tree(files, dirs)


def head_unmoved(store: BranchStore, head: str) -> bool:
    """Whether the head is still where this publish found it (False when unknown)."""
    try:
        return store.list_refs().get(ledger.HEAD_REF, ZERO) == head
    except GitTransportError:  # unknown: keep what was staged
        return False


def unstage(sharded: ShardedStore, publication: str, staged: Mapping[int, str]) -> None:
    ref = ledger.staging_ref(publication)
    for shard, oid in staged.items():
        # Best effort: a later publish deletes stale staging refs.
        with contextlib.suppress(Exception):
            sharded.stores[shard].push([RefUpdate(ref=ref, old=oid, new=ZERO)], pack=None)


def commit_publication(
    writer: Writer,
    sharded: ShardedStore,
    plan: Mapping[int, list[Update]],
    head: str,
    signed: SignedTree | None,
    clock: StageClock,
    writers: int | None,
    joined: tuple[Attachment, Sequence[ClusterChange]] | None,
) -> tuple[str, dict[int, Staged]]:
    """Carry or stage the other shards' commits and pass the commit point (shard 0's branches
    moving with the head); the head's new commit, and the shards whose branches must still
    move, and how.

    Raises what :func:`commit_point` and :func:`stage_shards` raise; nothing any agent reads
    has moved when it raises, except after a failure whose outcome is unknown (the connection
    broke during the commit push), which the next publish finishes or forgets.
    """
    stores = sharded.stores
    if carries(plan):
        others = {s: (stores[s], plan[s]) for s in plan if s != 0}
        try:
            with clock.stage("commit"):
                new_head, carried = commit_point(
                    writer, stores[0], head, signed, {}, plan.get(0, []), clock, joined, others
                )
            return new_head, dict(carried)
        except AtomicUnsupportedError:
            pass  # nothing moved: staged below, shard 0 with the others
    staged: dict[int, str] = {}
    try:
        with clock.stage("write+stage"):
            staged = stage_shards(writer, sharded, plan, clock, writers)
        with clock.stage("commit"):
            try:
                new_head, _ = commit_point(
                    writer, stores[0], head, signed, staged, plan.get(0, []), clock, joined
                )
            except AtomicUnsupportedError:
                if joined is not None:
                    raise PublishError(
                        f"{stores[0].url}: rollouts need a git server with atomic pushes "
                        "(git:// or http(s)://, git 2.4 or later)"
                    ) from None
                # Without atomic pushes shard 0 is staged and applied like the others.
                if 0 in plan:
                    staged[0] = writer.stage(stores[0], plan[0], clock)
                new_head, _ = commit_point(writer, stores[0], head, signed, staged, [], clock)
    except BaseException as failure:
        # What this attempt staged is garbage if it did not commit; after a failure whose
        # outcome is unknown (the connection broke during the commit push) it is left for
        # the next publish, which finishes the publication if the head names it, and
        # deletes the staging refs an hour later otherwise.
        if isinstance(failure, LostRace | PushRejectedError | AttachmentMovedError) or head_unmoved(
            stores[0], head
        ):
            unstage(sharded, writer.publication, staged)
        raise
    return new_head, dict(staged)
