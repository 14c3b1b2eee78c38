"""The rollout controller: a publish that starts rollouts, one step of every rollout, actions.

Three entrances, each reading the rollout state from git first and writing it back with
compare-and-swap (:mod:`hub.rollout.state`):

- :meth:`Controller.publish` (``hub publish``): the fleet's plans, with every rolling group's
  entries as its rollout says for each cluster (the new ones for released clusters, the
  previous ones, read from their branches, for the others). A group with a strategy whose
  entries changed starts a rollout (the current one, if any, is superseded) and its first
  wave at once, unless that wave has ``pauseBefore``.
- :meth:`Controller.step` (``hub serve``'s loop, ``hub rollout step``): judge each rollout's
  clusters from the status agents reported, advance it (:mod:`hub.rollout.advance`) and publish
  what that implies, taking every other group's content from the branches as they are (a step
  never publishes an older fleet commit's content, whatever the hub's fleet checkout says).
- :meth:`Controller.act` (promote, pause, resume, abort): recorded in the state; the next step
  publishes what it implies.

A publication that carries out rollout decisions moves the state ref in the same atomic push as
its commit point (:class:`~hub.publish.commit.Attachment`), with the decisions in the
publication's record and a ``Rollout:`` line in each affected cluster's commit: the state and
the branches never disagree, a restarted hub resumes where they are, and of two hubs stepping at
once one wins and the other reads the new state and starts again (never a double step).
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from agent.verify import TrustPolicy
from hub.errors import PublishError
from hub.fleet.model import Cluster, Fleet
from hub.fleet.render import ClusterPlan
from hub.fleet.shards import fleet_shards
from hub.fleet.source import FleetSource
from hub.publish.compare import ClusterChange
from hub.publish.flow import Attachment, AttachmentMovedError, Prepared, PublishReport, publish
from hub.publish.git import CommitBatch
from hub.publish.shards import ShardedStore
from hub.publish.sign import PublicationSigner
from hub.rollout.advance import CONTROLLER, RolloutActionError, act, advance
from hub.rollout.content import ABSENT, BranchContent, Entries, Rewriter
from hub.rollout.evaluate import ClusterVerdict, Evaluation, Installation, Observation, evaluate
from hub.rollout.model import Strategy
from hub.rollout.plan import clusters, plan_waves
from hub.rollout.state import (
    ROLLOUT_REF,
    Event,
    Member,
    Rollout,
    RolloutStateMovedError,
    RolloutStore,
    State,
    epoch,
    members_of,
    new_rollout_id,
    stamp,
)
from hub.status.aggregate import FleetStatus

ATTEMPTS = 5
Progress = Callable[[str], None]
_CHANGED = ("added", "changed", "moved", "refreshed")


class RolloutConflictError(PublishError):
    """A publish that cannot honour a rollout (``--cluster`` with a rolling group changed)."""


def signer_identity(signer: PublicationSigner | None) -> str:
    """Who publishes: the signing identity (the OIDC subject), else the local user."""
    if signer is not None:
        try:
            return str(signer.identity_token.identity)
        except Exception:  # a token without the claim: fall back to the local user
            pass
    return getpass.getuser()


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one publish or step did: the events recorded, the publication (None: nothing
    published), the rollouts as they now are, and the attempts it took."""

    events: tuple[tuple[str, Event], ...]
    publication: PublishReport | None
    rollouts: tuple[Rollout, ...]
    attempts: int = 1
    wrote_state: bool = False


@dataclass(slots=True)
class _Run:
    """One attempt: the state read, what changed in it, the events to record."""

    state: State
    now: datetime
    events: list[tuple[str, Event]] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> None:
        self.before = {r.id: r.to_dict() for r in self.state.rollouts.values() if not r.final}

    def changed(self) -> bool:
        now = {r.id: r.to_dict() for r in self.state.rollouts.values() if r.id in self.before}
        return bool(self.events) or now != self.before

    def note(self) -> dict[str, Any]:
        return {
            "rollouts": [{"rollout": rid, **event.to_dict()} for rid, event in self.events[-50:]]
        }


class Controller:
    """The rollouts of one fleet, whose cluster branches are in ``sharded``.

    ``status`` (the agents' reports) is needed by :meth:`step`; ``check`` is the agents' trust
    policy (a publication they would refuse is never pushed); ``clock`` gives the time.
    """

    def __init__(
        self,
        *,
        sharded: ShardedStore,
        status: FleetStatus | None = None,
        check: TrustPolicy | None = None,
        clock: Callable[[], datetime] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.sharded = sharded
        self.store = RolloutStore(sharded.stores[0])
        self.status = status
        self.check = check
        self.clock = clock or (lambda: datetime.now(UTC).replace(microsecond=0))
        self.say = progress or (lambda _m: None)

    def read(self) -> State:
        """The rollout state now. Raises GitTransportError, RolloutStateError."""
        return self.store.read()

    # --- publish: the fleet's content, as the rollouts allow ---------------------------------

    def publish(
        self,
        prepared: Prepared,
        *,
        signer: PublicationSigner | None,
        actor: str | None = None,
        partial: bool = False,
    ) -> StepReport:
        """Publish ``prepared`` with its rolling groups held back as their rollouts say,
        starting a rollout for each group with a strategy whose content changed.

        ``partial``: ``prepared`` plans some clusters only (``--cluster``): no rollout starts,
        and a rolling group that changed for them is refused (RolloutConflictError).
        Raises what :func:`~hub.publish.flow.publish` raises (UnsignedCommitError first of
        all), RolloutStateError,
        RolloutContentError, RolloutConflictError.
        """
        prepared.require_signed_commit()  # before the rollout state is even read
        who = actor or signer_identity(signer)
        for attempt in range(1, ATTEMPTS + 1):
            run = _Run(state=self.store.read(), now=self.clock())
            run.snapshot()
            if not prepared.fleet.rollouts and not run.state.rollouts:
                report = publish(
                    prepared, self.sharded, signer=signer, check=self.check, progress=self.say
                )
                return StepReport(events=(), publication=report, rollouts=(), attempts=attempt)
            self.sharded.each(lambda _s, st: st.fetch())
            content = BranchContent(self.sharded.stores, prepared.shard_map.shard_of)
            self._start(run, prepared, content, who, partial)
            if not partial:
                run.state.last_source = (prepared.source.repo, prepared.source.commit)
            adjusted = self._adjust(run.state, prepared.plans)
            try:
                return self._carry_out(run, replace(prepared, plans=adjusted), signer, attempt)
            except (AttachmentMovedError, RolloutStateMovedError) as exc:
                self.say(f"the rollout state moved meanwhile ({exc}); reading it again")
        raise RolloutStateMovedError(
            f"{ROLLOUT_REF} moved during each of {ATTEMPTS} attempts; rerun"
        )

    def _start(
        self,
        run: _Run,
        prepared: Prepared,
        content: BranchContent,
        actor: str,
        partial: bool,
    ) -> None:
        """Start, supersede or extend each group's rollout for the fleet's plans."""
        state = run.state
        variants = state.variants
        plans = prepared.plans
        branch_cache: dict[str, str] = {}

        def branch(cluster: str, group: str) -> str:
            key = f"{group}\0{cluster}"
            if key not in branch_cache:
                found = content.of(cluster)
                branch_cache[key] = variants.of(found[0], group) if found else ABSENT
            return branch_cache[key]

        groups = {r.group for r in state.active()} | set(prepared.fleet.rollouts)
        for group in sorted(groups):
            strategy = prepared.fleet.rollouts.get(group)
            current = state.latest(group)
            targets = {
                c: v
                for c, plan in plans.items()
                if (v := variants.of(plan.entries, group)) != ABSENT
            }
            if strategy is None:
                if current is not None and not partial:
                    self._supersede(run, current, "the group has no rollout strategy any more")
                continue
            same = current is not None and all(
                m.target == targets[c] for c, m in current.members.items() if c in targets
            )
            if partial:
                if current is not None and same:
                    continue
                changed = sorted(c for c, v in targets.items() if branch(c, group) != v)
                if changed:
                    raise RolloutConflictError(
                        f"group {group!r} has a rollout strategy and changed for "
                        f"{', '.join(changed[:5])}: publish the whole fleet (without --cluster) "
                        "to start its rollout"
                    )
                continue
            if current is not None and same:
                self._joiners(run, current, targets, branch, prepared.fleet)
                continue
            diff = {c: v for c, v in targets.items() if branch(c, group) != v}
            if current is not None:
                why = (
                    "a new revision of the group"
                    if diff
                    else "the clusters run what the fleet says"
                )
                self._supersede(run, current, why)
            if diff:
                self._create(run, prepared, group, strategy, diff, branch, actor)

    def _supersede(self, run: _Run, rollout: Rollout, why: str) -> None:
        was = rollout.status
        rollout.status = "Superseded"
        event = Event(
            at=stamp(run.now), by=CONTROLLER, action="superseded", message=f"{why} (was {was})"
        )
        rollout.record(event)
        run.events.append((rollout.id, event))

    def _joiners(
        self,
        run: _Run,
        rollout: Rollout,
        targets: Mapping[str, str],
        branch: Callable[[str, str], str],
        fleet: Fleet,
    ) -> None:
        """Clusters newly targeted join the last wave; members no longer targeted leave."""
        gone = sorted(c for c in rollout.members if c not in targets)
        for name in gone:
            del rollout.members[name]
        last = len(rollout.waves) - 1
        joined = []
        for name, target in sorted(targets.items()):
            if name in rollout.members:
                continue
            previous = branch(name, rollout.group)
            if previous == target:
                continue
            member = Member(wave=last, previous=previous, target=target)
            if rollout.status == "Completed":
                member.phase = "releasing"
            rollout.members[name] = member
            joined.append(name)
        if joined or gone:
            parts = []
            if joined:
                parts.append(f"{clusters(len(joined))} joined wave {rollout.waves[last].name}")
            if gone:
                parts.append(f"{clusters(len(gone))} no longer receive the group")
            event = Event(
                at=stamp(run.now), by=CONTROLLER, action="membership", message="; ".join(parts)
            )
            rollout.record(event)
            run.events.append((rollout.id, event))

    def _create(
        self,
        run: _Run,
        prepared: Prepared,
        group: str,
        strategy: Strategy,
        diff: Mapping[str, str],
        branch: Callable[[str, str], str],
        actor: str,
    ) -> None:
        fleet = prepared.fleet
        labels = {c: dict(fleet.by_name[c].labels) if c in fleet.by_name else {} for c in diff}
        planned = plan_waves(strategy, labels)
        waves, members = members_of(
            ((w.name, w.pause_before, w.members) for w in planned),
            {c: branch(c, group) for c in diff},
            diff,
        )
        at = stamp(run.now)
        rollout = Rollout(
            id=new_rollout_id(group, run.now),
            group=group,
            created_at=at,
            created_by=actor,
            source_repo=prepared.source.repo,
            source_commit=prepared.source.commit,
            strategy=strategy,
            status="Progressing",
            waves=waves,
            members=members,
        )
        sizes = ", ".join(f"{w.name} {len(w.members)}" for w in planned)
        event = Event(
            at=at,
            by=actor,
            action="created",
            message=f"group {group} at {prepared.source.commit[:12]}: {clusters(len(members))} "
            f"in {len(waves)} waves ({sizes})",
        )
        rollout.record(event)
        run.events.append((rollout.id, event))
        run.state.add(rollout)
        # The first wave starts now (or waits for its promotion): nothing was released yet.
        evaluation = Evaluation({n: _HELD for n in rollout.members})
        run.events += [(rollout.id, e) for e in advance(rollout, evaluation, run.now)]

    def _adjust(self, state: State, plans: Mapping[str, ClusterPlan]) -> dict[str, ClusterPlan]:
        """The plans with each rolling group as its rollout wants it on each member."""
        rewriter = Rewriter(state.variants)
        wanted = _wanted(state)
        out = dict(plans)
        for name, groups in wanted.items():
            plan = out.get(name)
            if plan is None:
                continue
            entries: Entries = plan.entries
            order = plan.groups
            for group, variant in sorted(groups.items()):
                if state.variants.of(entries, group) == variant:
                    continue
                entries, order = rewriter.replace(entries, group, variant, cluster=name)
            if entries is not plan.entries:
                out[name] = ClusterPlan(cluster=plan.cluster, entries=entries, groups=order)
        return out

    # --- step: judge, advance, publish ---------------------------------------------------------

    def step(
        self,
        fleet: Fleet,
        *,
        signer: PublicationSigner | None,
        refresh: bool = True,
    ) -> StepReport:
        """Advance every rollout as its clusters' reports allow, and publish what that implies.

        ``fleet`` gives the settings and the cluster names (never content); ``refresh``:
        refresh the status first. Raises GitTransportError, RolloutStateError,
        RolloutContentError, PublishError and the signing errors; RolloutStateMovedError when
        other hubs kept moving the state.
        """
        if refresh and self.status is not None:
            self.status.refresh()
        for attempt in range(1, ATTEMPTS + 1):
            run = _Run(state=self.store.read(), now=self.clock())
            run.snapshot()
            state = run.state
            for rollout in state.active():
                if rollout.final or self.status is None:
                    continue
                found = evaluate(rollout, self.observer(run.now), self.bundle_names(state), run.now)
                run.events += [(rollout.id, e) for e in advance(rollout, found, run.now)]
            pending = _wanted(state, pending_only=True)
            if not pending and not run.changed():
                return StepReport(events=(), publication=None, rollouts=tuple(state.active()))
            try:
                if not pending:
                    self._write(run, "steps")
                    return StepReport(
                        events=tuple(run.events),
                        publication=None,
                        rollouts=tuple(state.active()),
                        attempts=attempt,
                        wrote_state=True,
                    )
                self.sharded.each(lambda _s, st: st.fetch())
                content = BranchContent(self.sharded.stores, fleet_shards(fleet).shard_of)
                plans = self._branch_plans(state, pending, content, fleet)
                prepared = Prepared(
                    fleet=fleet,
                    source=_source(state, run.now),
                    plans=plans,
                    references=0,
                    timings={},
                    shards=fleet_shards(fleet),
                )
                return self._carry_out(run, prepared, signer, attempt)
            except (AttachmentMovedError, RolloutStateMovedError) as exc:
                self.say(f"the rollout state moved meanwhile ({exc}); reading it again")
        raise RolloutStateMovedError(f"{ROLLOUT_REF} moved during each of {ATTEMPTS} attempts")

    def judge(self, state: State, now: datetime | None = None) -> dict[str, Evaluation]:
        """Each rollout of ``state`` judged from the status (empty without status)."""
        if self.status is None:
            return {}
        moment = now or self.clock()
        observe, names = self.observer(moment), self.bundle_names(state)
        return {r.id: evaluate(r, observe, names, moment) for r in state.rollouts.values()}

    def observer(self, now: datetime) -> Callable[[str], Observation | None]:
        """What each cluster's agent last reported, as the verdicts read it."""
        status = self.status
        assert status is not None

        def observe(cluster: str) -> Observation | None:
            view = status.view(cluster)
            if view is None:
                return None
            refusal = view.last_refusal
            return Observation(
                heartbeat=view.beat,
                stale=view.stale(now, status.stale_after),
                accepted=view.last_accepted_serial or 0,
                installations={
                    b: Installation(state=s, applied=a, run=r)
                    for b, (s, a, r) in view.revisions().items()
                },
                refusal=str(refusal.get("reason")) if isinstance(refusal, dict) else None,
            )

        return observe

    def bundle_names(self, state: State) -> Callable[[str], tuple[str, ...]]:
        """The bundle names of a variant of ``state``."""
        names: dict[str, tuple[str, ...]] = {}

        def bundles(variant: str) -> tuple[str, ...]:
            if variant not in names:
                names[variant] = tuple(e.name for e in self.store.load_variant(state, variant))
            return names[variant]

        return bundles

    def _branch_plans(
        self,
        state: State,
        pending: Mapping[str, Mapping[str, str]],
        content: BranchContent,
        fleet: Fleet,
    ) -> dict[str, ClusterPlan]:
        """Each pending cluster's branch set with its rolling groups replaced."""
        rewriter = Rewriter(state.variants)
        plans: dict[str, ClusterPlan] = {}
        skipped = []
        for name, groups in sorted(pending.items()):
            found = content.of(name)
            if found is None:
                skipped.append(name)  # no set yet: the next hub publish gives it one
                continue
            entries, order = found
            for group, variant in sorted(groups.items()):
                if state.variants.of(entries, group) != variant:
                    entries, order = rewriter.replace(entries, group, variant, cluster=name)
            cluster = fleet.by_name.get(name) or Cluster(name=name, labels={}, file="")
            plans[name] = ClusterPlan(cluster=cluster, entries=entries, groups=order)
        if skipped:
            self.say(f"{clusters(len(skipped))} without a branch yet: {', '.join(skipped[:5])}")
        return plans

    # --- carrying out: one publication and the state, together --------------------------------

    def _carry_out(
        self, run: _Run, prepared: Prepared, signer: PublicationSigner | None, attempt: int
    ) -> StepReport:
        state = run.state
        pending = _wanted(state, pending_only=True)
        trailers = _trailers(state, pending)
        store = self.store

        def write(batch: CommitBatch, publication: str, changes: Sequence[ClusterChange]) -> str:
            _confirm(state, changes, run.now)
            return store.commit(batch, state, message=_message(run, publication), when=run.now)

        attach = Attachment(
            ref=ROLLOUT_REF,
            old=state.oid,
            write=write,
            trailer=trailers.get,
            note=run.note() if run.events else None,
        )
        report = publish(
            prepared,
            self.sharded,
            signer=signer,
            check=self.check,
            attach=attach,
            progress=self.say,
        )
        wrote = report.publication is not None
        if not wrote:
            # Nothing to publish (every branch holds what it should): the state alone.
            _confirm(state, report.changes, run.now)
            if run.changed():
                self._write(run, "records")
                wrote = True
        return StepReport(
            events=tuple(run.events),
            publication=report,
            rollouts=tuple(state.active()),
            attempts=attempt,
            wrote_state=wrote,
        )

    def _write(self, run: _Run, what: str) -> None:
        self.store.write(run.state, message=_message(run, None, what), when=run.now)

    # --- actions ------------------------------------------------------------------------------

    def act(self, rollout_id: str, action: str, *, actor: str, reason: str = "") -> Rollout:
        """Record an operator's action on a rollout (the next step carries it out).

        Raises RolloutActionError (unknown rollout or action, or one that does not apply),
        GitTransportError, RolloutStateError, RolloutStateMovedError.
        """
        for _ in range(ATTEMPTS):
            run = _Run(state=self.store.read(), now=self.clock())
            rollout = run.state.rollouts.get(rollout_id)
            if rollout is None:
                raise RolloutActionError(
                    f"no rollout {rollout_id!r} (see fleetlet hub rollout list)"
                )
            run.events.append(
                (rollout.id, act(rollout, action, actor=actor, now=run.now, reason=reason))
            )
            try:
                self._write(run, "records")
                return rollout
            except RolloutStateMovedError as exc:
                self.say(f"the rollout state moved meanwhile ({exc}); reading it again")
        raise RolloutStateMovedError(f"{ROLLOUT_REF} moved during each of {ATTEMPTS} attempts")


_HELD = ClusterVerdict("held")


def _wanted(state: State, *, pending_only: bool = False) -> dict[str, dict[str, str]]:
    """Cluster -> group -> the variant its rollout wants it to hold (``pending_only``: only
    where the branch does not carry it yet)."""
    out: dict[str, dict[str, str]] = {}
    for rollout in state.active():
        for name, member in rollout.members.items():
            if pending_only and member.settled:
                continue
            variant = member.target if member.wants_target else member.previous
            out.setdefault(name, {})[rollout.group] = variant
    return out


def _confirm(state: State, changes: Sequence[ClusterChange], now: datetime) -> None:
    """Members whose branch now carries what their phase says: released / reverted, with the
    serial that carries it."""
    serials = {
        c.cluster: (c.serial_after if c.status in _CHANGED else c.serial_before)
        for c in changes
        if c.status != "orphaned"
    }
    for rollout in state.active():
        for name, member in rollout.members.items():
            if member.settled or name not in serials:
                continue
            serial = serials[name]
            if serial is None:
                continue
            member.serial = serial
            member.since = epoch(now)
            member.phase = "released" if member.phase == "releasing" else "reverted"


def _trailers(state: State, pending: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for rollout in state.active():
        for name in pending:
            member = rollout.members.get(name)
            if member is None or member.settled:
                continue
            what = "new" if member.wants_target else "previous"
            wave = rollout.waves[member.wave].name
            line = f"Rollout: {rollout.id} wave={wave} revision={what}"
            out[name] = f"{out[name]}\n{line}" if name in out else line
    return out


def _message(run: _Run, publication: str | None, what: str = "follows") -> str:
    head = (
        f"fleetlet: rollouts, publication {publication}\n"
        if publication
        else f"fleetlet: rollouts ({what})\n"
    )
    lines = [f"{rid}: {e.action} by {e.by} at {e.at}: {e.message}" for rid, e in run.events[-50:]]
    return head + ("\n" + "\n".join(lines) + "\n" if lines else "")


def _source(state: State, now: datetime) -> FleetSource:
    """The fleet commit a step's sets name: the one last published with ``hub publish``."""
    if state.last_source is not None:
        repo, commit = state.last_source
    else:
        newest = max(state.rollouts.values(), key=lambda r: r.created_at)
        repo, commit = newest.source_repo, newest.source_commit
    return FleetSource(repo=repo, commit=commit, time=now, committed=True)


__all__ = ["Controller", "RolloutConflictError", "StepReport", "signer_identity"]
