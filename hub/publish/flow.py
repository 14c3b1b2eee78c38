"""The hub's runs: ``render``, ``diff`` and ``publish`` a fleet directory.

A publish is a pipeline of stages, each a function below, so that a caller (a progressive
rollout) can drive it for a subset of clusters (:func:`prepare` with ``only``):

    load -> resolve -> plan          :func:`prepare` (nothing touches git)
    list -> recover -> diff          which clusters change, on which shards (compare.py)
    render -> sign                   the changed clusters' leaves, ONE signature (compose.py)
    write -> stage -> commit -> apply  packs, the two-phase commit across shards (commit.py)

Cost follows the change: the fleet's files are parsed again only when their bytes changed
(:mod:`hub.fleet.cache`), unchanged branches are known from the facts the last run kept
(:mod:`hub.publish.git`), only changed clusters are rendered, and only shards holding a
changed branch are written to, in parallel. Anything failing before the commit leaves every
branch untouched.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.errors import FieldProblem, TemporaryError, VerificationError
from agent.verify import TrustPolicy, verify_publication
from agent.verify.publication import BUNDLE_FILE, PROOF_FILE, SET_FILE, STATEMENT_FILE
from hub.errors import FleetRepoError, PublishError, PushRejectedError
from hub.fleet.agent import with_agent
from hub.fleet.commits import CommitPolicy, judge_commit
from hub.fleet.load import load_fleet
from hub.fleet.model import SignedPins
from hub.fleet.render import plan_clusters
from hub.fleet.shards import fleet_shards
from hub.fleet.source import fleet_source
from hub.publish import ledger
from hub.publish.commit import (
    Attachment,
    AttachmentMovedError,
    LostRace,
    StageClock,
    Writer,
    commit_publication,
    recover,
    serial_of,
    utc_text,
)
from hub.publish.compare import (
    STATUSES,
    ClusterChange,
    ContentCache,
    Decisions,
    Status,
    decide,
)
from hub.publish.compose import SetComposer
from hub.publish.diff import BundleDiff, ClusterDiff, diff, entry_fields
from hub.publish.git import BRANCH_PREFIX, BranchStore
from hub.publish.known import KnownHead
from hub.publish.prepared import (
    Prepared,
    UnsignedCommitError,
    UnsignedSourceError,
    sharded_stores,
)
from hub.publish.shards import ShardedStore
from hub.publish.sign import Leaf, PublicationSigner, SignedTree, sign_leaves
from hub.resolve import Resolver, ResolveSettings
from hub.resolve.signatures import verify_sources

Progress = Callable[[str], None]
ATTEMPTS = 3


class ConcurrentPublishError(TemporaryError):
    """Another hub committed a publication while this one was being made, every attempt."""


def prepare(
    fleet_dir: str | Path,
    *,
    only: Iterable[str] | None = None,
    resolve_settings: ResolveSettings | None = None,
    registry_credentials: Mapping[str, tuple[str, str]] | None = None,
    progress: Progress | None = None,
    cache_dir: Path | None = None,
    commit_policy: CommitPolicy | None = None,
    signature_cache: Path | None = None,
) -> Prepared:
    """Load ``fleet_dir``, pin every source its (selected) clusters use and plan every set.

    ``registry_credentials`` maps a registry host to (user, password) for tag resolution;
    ``cache_dir`` keeps parsed fleet files between runs. ``commit_policy``: the hub's trusted
    commit policy; the fleet commit's verdict is :attr:`Prepared.commit` (publish refuses a
    failed one, diff reports it). Image sources a signature policy covers are verified
    (:attr:`Prepared.signatures`; publish refuses a failed one), passes remembered in
    ``signature_cache``.

    Raises FleetRepoError (invalid fleet, unknown ``only`` cluster, bad shard label, unknown
    signature policy), ResolveError or SourceUnavailableError (a reference could not be
    pinned), SignaturesUnavailableError (a registry did not answer for signatures).
    """
    with _paused_gc():
        prepared = _prepare(
            fleet_dir,
            only,
            resolve_settings,
            registry_credentials,
            progress,
            cache_dir,
            signature_cache,
        )
    verdict = judge_commit(
        root=prepared.fleet.root,
        commit=prepared.source.commit,
        committed=prepared.source.committed,
        declared=prepared.fleet.settings.commit_signing,
        trusted=commit_policy,
    )
    return replace(prepared, commit=verdict) if verdict is not None else prepared


@contextlib.contextmanager
def _paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: 100,000 clusters make millions of objects, none in
    a cycle, and each collection they trigger would walk all of them again (seconds)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _prepare(
    fleet_dir: str | Path,
    only: Iterable[str] | None,
    resolve_settings: ResolveSettings | None,
    registry_credentials: Mapping[str, tuple[str, str]] | None,
    progress: Progress | None,
    cache_dir: Path | None,
    signature_cache: Path | None = None,
) -> Prepared:
    timings: dict[str, float] = {}
    started = time.perf_counter()
    fleet = with_agent(load_fleet(fleet_dir, cache_dir=cache_dir))
    names = sorted(set(only)) if only is not None else None
    if names is not None:
        unknown = [n for n in names if fleet.cluster(n) is None]
        if unknown:
            raise FleetRepoError(
                [
                    FieldProblem(path="--cluster", expected="a cluster of the fleet", found=n)
                    for n in unknown
                ],
                origin=str(fleet.root),
            )
    source = fleet_source(fleet.root, fleet.files, repo_url=fleet.settings.repo)
    shards = fleet_shards(fleet)
    timings["load"] = time.perf_counter() - started
    started = time.perf_counter()
    bundles = list(fleet.bundles)
    if names is not None:
        # Only what the selected clusters receive needs pinning.
        selected = [c for c in fleet.clusters if c.name in names]
        bundles = [b for b in bundles if any(t.matches(c) for c in selected for t in b.targets)]
    settings = resolve_settings or ResolveSettings(
        insecure_registries=fleet.settings.insecure_registries,
        registry_credentials=registry_credentials,
    )

    def resolve_progress(done: int, total: int, what: str) -> None:
        if progress is not None and (done == total or done % 25 == 0):
            progress(f"resolved {done}/{total} references")

    with Resolver(settings=settings, progress=resolve_progress) as resolver:
        pins = resolver.resolve_bundles(bundles)
    timings["resolve"] = time.perf_counter() - started
    started = time.perf_counter()
    signatures = verify_sources(fleet, bundles, pins, settings=settings, cache_dir=signature_cache)
    if signatures.verdicts:
        timings["signatures"] = time.perf_counter() - started
        if progress is not None:
            progress(
                f"verified the signatures of {len(signatures.verdicts)} sources "
                f"({signatures.checked} checked, {signatures.cached} from the cache, "
                f"{len(signatures.failed())} refused)"
            )
        pins = SignedPins(pins, signatures.proofs())
    started = time.perf_counter()
    plans = plan_clusters(fleet, pins, only=names)
    timings["plan"] = time.perf_counter() - started
    return Prepared(
        fleet=fleet,
        source=source,
        plans=plans,
        references=len(pins),
        timings=timings,
        shards=shards,
        signatures=signatures if signatures.verdicts else None,
    )


# --- render ---------------------------------------------------------------------------------


def render(prepared: Prepared, out: Path, *, issued_at: datetime | None = None) -> list[Path]:
    """Write ``<cluster>.yaml`` (canonical set.yaml, serial 1, unsigned) for every plan.

    ``issued_at`` defaults to the fleet commit's time, so the same commit renders the same
    bytes. Raises PublishError if ``out`` cannot be written.
    """
    issued = issued_at or prepared.source.time
    composer = SetComposer(
        issued_at=issued,
        expires_at=issued + prepared.fleet.settings.expires_after,
        source_repo=prepared.source.repo,
        source_commit=prepared.source.commit,
        source_signed_by=prepared.signed_by,
    )
    written: list[Path] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in sorted(prepared.plans):
            path = out / f"{name}.yaml"
            path.write_bytes(composer.set_bytes(prepared.plans[name], 1))
            written.append(path)
    except OSError as exc:
        raise PublishError(f"cannot write rendered sets to {out}: {exc}") from exc
    return written


# --- publish --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishReport:
    decisions: Decisions
    pushed: tuple[str, ...]
    signed: bool
    issued_at: datetime | None
    expires_at: datetime | None
    statement_sha256: str | None
    timings: Mapping[str, float]
    shards_pushed: tuple[int, ...] = ()
    removed: tuple[tuple[str, int], ...] = ()  # (cluster, shard): branches of finished moves
    attempts: int = 1
    publication: str | None = None
    peak_rss_mb: float | None = None

    @property
    def changes(self) -> tuple[ClusterChange, ...]:
        """Every cluster's record, by name (orphaned branches last)."""
        return tuple(self.decisions.changes)

    def count(self, *statuses: Status) -> int:
        return self.decisions.count(*statuses)

    def to_dict(self, *, bundles: int, references: int) -> dict[str, Any]:
        return {
            "clusters": {s: self.count(s) for s in STATUSES},
            "bundles": bundles,
            "references": references,
            "pushed": list(self.pushed),
            "shardsPushed": list(self.shards_pushed),
            "removed": [{"cluster": c, "shard": s} for c, s in self.removed],
            "signed": self.signed,
            "publication": self.publication,
            "attempts": self.attempts,
            "issuedAt": utc_text(self.issued_at),
            "expiresAt": utc_text(self.expires_at),
            "statementSha256": self.statement_sha256,
            "changes": [
                {
                    "cluster": c.cluster,
                    "status": c.status,
                    "serialBefore": c.serial_before,
                    "serialAfter": c.serial_after,
                    "shards": list(c.shards),
                }
                for c in self.decisions.acted
            ],
            "seconds": {k: round(v, 3) for k, v in self.timings.items()},
        }


def publish(
    prepared: Prepared,
    store: BranchStore | ShardedStore,
    *,
    signer: PublicationSigner | None,
    now: datetime | None = None,
    progress: Progress | None = None,
    check: TrustPolicy | None = None,
    attempts: int = ATTEMPTS,
    writers: int | None = None,
    attach: Attachment | None = None,
) -> PublishReport:
    """Publish every changed or expiring cluster of ``prepared`` as ONE publication.

    ``store`` is one repository (a fleet of one shard) or the fleet's shards. ``signer`` None
    publishes WITHOUT a Sigstore bundle (agents refuse it; experiments only). ``check`` (the
    trust policy agents use) verifies one branch of the new publication with
    ``verify_publication`` before anything is pushed, so a signer that agents would refuse
    (wrong identity or issuer, foreign root) stops the run with PublishError. When another hub
    commits a publication first, this one starts over on top of it, up to ``attempts`` times.
    ``writers``: processes writing the packs (default: 2 for large publications, see
    :func:`_stage`). ``attach``: a ref moved together with the commit point (see
    :class:`Attachment`); it needs a server with atomic pushes.

    Raises AttachmentMovedError, GitTransportError (a server could not be reached; if the publication was already
    committed, the next publish finishes it), PushRejectedError (some branches refused:
    rerun), ConcurrentPublishError, PublishError, FleetRepoError, or the signing errors of
    ``sign_leaves``; nothing reaches a cluster branch when anything fails before the commit.
    """
    prepared.require_signed_commit()
    prepared.require_signed_sources()
    sharded = sharded_stores(prepared, store)
    say = progress or (lambda _msg: None)
    clock = StageClock(prepared.timings)
    attempt, trust = 1, True
    while True:
        try:
            with _paused_gc():
                report = _publish_once(
                    prepared, sharded, signer, now, say, check, clock, writers, attach, trust
                )
        except _StaleKnowledge:
            say("a branch moved since this hub's last publish; listing every shard")
            trust = False
            continue
        except LostRace as race:
            if attempt == attempts:
                raise ConcurrentPublishError(
                    f"another hub committed publication {race.winner} while this one was being "
                    f"made, {attempts} times in a row; rerun hub publish"
                ) from None
            say(f"another hub committed publication {race.winner} first; publishing again on top")
            attempt += 1
            continue
        return _replace_attempts(report, attempt)


class _StaleKnowledge(Exception):
    """The commit point was refused while the branches were taken from the hub's cache: a
    branch moved some other way. Nothing moved; the run lists the shards and starts over."""


def _replace_attempts(report: PublishReport, attempts: int) -> PublishReport:
    return replace(report, attempts=attempts, peak_rss_mb=_peak_rss_mb())


def _publish_once(
    prepared: Prepared,
    sharded: ShardedStore,
    signer: PublicationSigner | None,
    now: datetime | None,
    say: Progress,
    check: TrustPolicy | None,
    clock: StageClock,
    writers: int | None = None,
    attach: Attachment | None = None,
    trust: bool = True,
) -> PublishReport:
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    settings = prepared.fleet.settings
    stores = sharded.stores

    with clock.stage("list"):
        # Unlisted when nothing but this hub moved the shards since its last clean run.
        known = KnownHead.load(sharded) if trust else None
        if known is not None and not known.trusted(sharded, now):
            known = None
        if known is None:
            many = "y" if sharded.count == 1 else "ies"
            say(f"listing the branches of {sharded.count} repositor{many}")
            sharded.each(lambda _s, st: st.fetch())
    with clock.stage("recover"):
        head = known.head if known is not None else recover(sharded, now, say)
    listed = known.listed if known is not None else now
    with clock.stage("diff"):
        cache = ContentCache()
        decisions = decide(
            prepared.plans,
            set(prepared.fleet.by_name) or {c.name for c in prepared.fleet.clusters},
            stores,
            prepared.shard_map,
            now=now,
            refresh_before=settings.refresh_before,
            move_window=settings.expires_after,
            cache=cache,
            signed=signer is not None,
        )
    todo = decisions.todo
    if not todo and not decisions.deletions:
        sharded.each(lambda _s, st: st.save_facts())  # what a cold cache learnt
        KnownHead(head=head, listed=listed).save(sharded)
        return PublishReport(
            decisions=decisions,
            pushed=(),
            signed=signer is not None,
            issued_at=None,
            expires_at=None,
            statement_sha256=None,
            timings=clock.timings,
        )
    expires = now + settings.expires_after
    composer = SetComposer(
        issued_at=now,
        expires_at=expires,
        source_repo=prepared.source.repo,
        source_commit=prepared.source.commit,
        source_signed_by=prepared.signed_by,
    )
    signed: SignedTree | None = None
    if todo:
        with clock.stage("render"):
            leaves = [
                Leaf(
                    cluster=c.cluster,
                    serial=serial_of(c),
                    set_digest=composer.digest(prepared.plans[c.cluster], serial_of(c)),
                )
                for c in todo
            ]
        with clock.stage("sign"):
            say(f"signing one publication for {len(todo)} clusters")
            signed = sign_leaves(
                leaves=leaves,
                signer=signer,
                issued_at=now,
                expires_at=expires,
                source_repo=prepared.source.repo,
                source_commit=prepared.source.commit,
            )
            if check is not None and signer is not None:
                _self_check(prepared, composer, signed, todo[0], check, now)
    publication = ledger.new_publication_id(now)
    writer = Writer(
        prepared=prepared,
        composer=composer,
        signed=signed,
        cache=cache,
        now=now,
        signer=signer is not None,
        publication=publication,
        trailer=attach.trailer if attach is not None else None,
    )
    plan = writer.plan(todo, decisions, stores)
    say(f"writing {len(todo)} cluster commits to {len(plan)} shard(s)")
    joined = (attach, decisions.changes) if attach is not None else None
    try:
        new_head, staged = commit_publication(
            writer, sharded, plan, head, signed, clock, writers, joined
        )
    except PushRejectedError:
        if known is not None:
            raise _StaleKnowledge() from None
        raise
    say(f"publication {publication} committed; moving the branches of {len(staged)} shard(s)")
    refused: dict[int, dict[str, str]] = {s: {} for s in plan}
    with clock.stage("apply"):
        refused.update(sharded.each(lambda s, st: writer.apply(st, plan[s], staged[s]), staged))
    sharded.each(lambda _s, st: st.save_facts())
    problems = {ref: reason for s in refused for ref, reason in refused[s].items()}
    pushed = sorted(
        {
            u.cluster
            for s in plan
            for u in plan[s]
            if u.change is not None and u.ref not in refused[s]
        }
    )
    if problems:
        raise PushRejectedError(problems, pushed=[f"{BRANCH_PREFIX}{c}" for c in pushed])
    KnownHead(head=new_head, listed=listed).save(sharded)
    return PublishReport(
        decisions=decisions,
        pushed=tuple(pushed),
        signed=signer is not None,
        issued_at=now if todo else None,
        expires_at=expires if todo else None,
        statement_sha256=hashlib.sha256(signed.statement_bytes).hexdigest() if signed else None,
        timings=clock.timings,
        shards_pushed=tuple(sorted(plan)),
        removed=tuple((d.cluster, d.shard) for d in decisions.deletions),
        publication=publication,
    )


def _self_check(
    prepared: Prepared,
    composer: SetComposer,
    signed: SignedTree,
    first: ClusterChange,
    check: TrustPolicy,
    now: datetime,
) -> None:
    assert signed.bundle_json is not None
    files = {
        SET_FILE: composer.set_bytes(prepared.plans[first.cluster], serial_of(first)),
        STATEMENT_FILE: signed.statement_bytes,
        BUNDLE_FILE: signed.bundle_json,
        PROOF_FILE: signed.proof(first.cluster).to_bytes(),
    }
    try:
        verify_publication(
            files=files,
            cluster=first.cluster,
            last_serial=first.serial_before,
            trust=check,
            now=now,
        )
    except VerificationError as exc:
        raise PublishError(
            f"the new publication would be refused by agents ({exc.reason}): {exc}; "
            "nothing was pushed"
        ) from exc


def _peak_rss_mb() -> float | None:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except (ImportError, OSError):
        return None


__all__ = [
    "Attachment",
    "AttachmentMovedError",
    "BundleDiff",
    "ClusterChange",
    "ClusterDiff",
    "Prepared",
    "PublishReport",
    "UnsignedCommitError",
    "UnsignedSourceError",
    "diff",
    "entry_fields",
    "prepare",
    "publish",
    "render",
]
