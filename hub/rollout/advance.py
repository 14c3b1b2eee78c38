"""A rollout's next state from its evaluation, and the operator's actions. Pure logic: nothing
here reads git or status, and nothing publishes; the controller records the result and
publishes what it implies.

One step (:func:`advance`), in this order:

1. **Budget**: more failed members than ``maxFailures`` allows (members a ``resume`` forgave
   do not count) halts the rollout; with ``onFailure: revert`` every member that was given the
   new revision goes back to its previous one (status ``Reverted``), else they stay as they
   are (``Halted``) until an operator resumes or aborts.
2. **Release**: in the started waves, held members get the new revision while fewer than
   ``maxUnavailable`` members are on their way to it (released, neither passed nor failed).
3. **Waves**: once every member of the current wave is settled (passed, skipped, or failed
   within the budget) the hub notes when (``settledAt``); ``soakTime`` later, if still
   settled, the next wave starts, or waits for a promotion if it has ``pauseBefore``. A
   promoted wave starts at once. After the last wave the rollout is ``Completed``.
"""

from __future__ import annotations

from datetime import datetime

from agent.errors import PermanentError
from hub.rollout.evaluate import ClusterVerdict, Evaluation
from hub.rollout.names import ACTIONS
from hub.rollout.plan import clusters, spread
from hub.rollout.state import Event, Halt, Rollout, parse_stamp, stamp

CONTROLLER = "controller"

_SETTLED = ("passed", "skipped", "failed")


class RolloutActionError(PermanentError):
    """An action that does not apply to the rollout as it is (promote a halted rollout, ...)."""


def advance(rollout: Rollout, evaluation: Evaluation, now: datetime) -> list[Event]:
    """Move ``rollout`` (in place) as far as ``evaluation`` allows at ``now``; the events."""
    before = len(rollout.events)
    if rollout.final or rollout.status == "Halted":
        return []
    at = stamp(now)
    failures = evaluation.failures(rollout.forgiven)
    budget = rollout.strategy.budget(len(rollout.members))
    if len(failures) > budget:
        _halt(rollout, failures, budget, at)
        return rollout.events[before:]
    if rollout.status == "Paused":
        return []
    _release(rollout, evaluation, at)
    for _ in range(len(rollout.waves) + 1):
        if not _next_wave(rollout, evaluation, now, at):
            break
        _release(rollout, evaluation, at)
    return rollout.events[before:]


def _halt(rollout: Rollout, failures: dict[str, str], budget: int, at: str) -> None:
    limit = rollout.strategy.max_failures.text()
    reason = (
        f"{len(failures)} cluster{'s' if len(failures) != 1 else ''} failed, more than "
        f"maxFailures {limit} allows ({budget})"
    )
    rollout.halt = Halt(at=at, reason=reason, failures=dict(failures))
    shown = "; ".join(f"{n}: {r}" for n, r in list(failures.items())[:5])
    if rollout.strategy.on_failure == "revert":
        reverting = 0
        for member in rollout.members.values():
            if member.wants_target:
                member.phase = "reverting"
                reverting += 1
        rollout.status = "Reverted"
        message = f"{reason}; reverting {clusters(reverting)} to the previous revision ({shown})"
        rollout.record(Event(at=at, by=CONTROLLER, action="reverted", message=message))
    else:
        rollout.status = "Halted"
        message = f"{reason}; clusters stay as they are until resume or abort ({shown})"
        rollout.record(Event(at=at, by=CONTROLLER, action="halted", message=message))


def _release(rollout: Rollout, evaluation: Evaluation, at: str) -> None:
    """Give held members of the started waves the new revision, within maxUnavailable."""
    room = rollout.strategy.concurrency(len(rollout.members)) - evaluation.moving()
    if room <= 0:
        return
    current = rollout.current_wave()
    for index in range(current + 1):
        held = [n for n in rollout.in_wave(index) if rollout.members[n].phase == "held"]
        for name in spread(held)[:room]:
            rollout.members[name].phase = "releasing"
            evaluation.verdicts[name] = ClusterVerdict("pending", "being released")
            room -= 1
        if room <= 0:
            return


def _next_wave(rollout: Rollout, evaluation: Evaluation, now: datetime, at: str) -> bool:
    """Start the next wave when the current one allows it; True when one started."""
    current = rollout.current_wave()
    after = current + 1
    if current >= 0:
        wave = rollout.waves[current]
        names = [n for i in range(after) for n in rollout.in_wave(i)]
        settled = all(
            rollout.members[n].phase != "held" and evaluation.verdicts[n].verdict in _SETTLED
            for n in names
        )
        promoted = after < len(rollout.waves) and rollout.waves[after].promoted_at is not None
        if not settled:
            wave.settled_at = None
            if not promoted:
                return False
        else:
            if wave.settled_at is None:
                wave.settled_at = at
                counts = evaluation.counts(rollout, current)
                rollout.record(
                    Event(
                        at=at,
                        by=CONTROLLER,
                        action="wave-settled",
                        wave=wave.name,
                        message=f"{counts['passed']} passed, {counts['skipped']} skipped, "
                        f"{counts['failed']} failed",
                    )
                )
            soaked = now >= parse_stamp(wave.settled_at) + rollout.strategy.soak
            if not soaked and rollout.in_wave(current) and not promoted:
                return False
            if after == len(rollout.waves):
                rollout.status = "Completed"
                rollout.record(
                    Event(
                        at=at,
                        by=CONTROLLER,
                        action="completed",
                        message=f"every wave passed; {clusters(len(rollout.members))}",
                    )
                )
                return False
    nxt = rollout.waves[after]
    if nxt.pause_before and nxt.promoted_at is None:
        if rollout.status != "WaitingForPromotion":
            rollout.status = "WaitingForPromotion"
            rollout.record(
                Event(
                    at=at,
                    by=CONTROLLER,
                    action="waiting",
                    wave=nxt.name,
                    message=f"wave {nxt.name} waits for `fleetlet hub rollout promote {rollout.id}`",
                )
            )
        return False
    nxt.started_at = at
    rollout.status = "Progressing"
    by = f" (promoted by {nxt.promoted_by})" if nxt.promoted_by else ""
    rollout.record(
        Event(
            at=at,
            by=CONTROLLER,
            action="wave-started",
            wave=nxt.name,
            message=f"wave {nxt.name} started: {clusters(len(rollout.in_wave(after)))}{by}",
        )
    )
    return True


def act(rollout: Rollout, action: str, *, actor: str, now: datetime, reason: str = "") -> Event:
    """Apply an operator's ``action`` (promote, pause, resume, abort) in place; its event.

    Raises RolloutActionError when the action does not apply to the rollout as it is.
    """
    at = stamp(now)
    status = rollout.status
    note = f": {reason}" if reason else ""
    if action not in ACTIONS:
        raise RolloutActionError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    if rollout.final:
        raise RolloutActionError(f"rollout {rollout.id} is {status}: nothing to {action}")
    if action == "promote":
        if status not in ("Progressing", "WaitingForPromotion"):
            raise RolloutActionError(
                f"rollout {rollout.id} is {status}: resume it before promoting a wave"
            )
        after = rollout.current_wave() + 1
        if after >= len(rollout.waves):
            raise RolloutActionError(f"rollout {rollout.id}: every wave has started already")
        wave = rollout.waves[after]
        if wave.promoted_at is not None:
            raise RolloutActionError(
                f"rollout {rollout.id}: wave {wave.name} was promoted already by "
                f"{wave.promoted_by} at {wave.promoted_at}"
            )
        wave.promoted_by, wave.promoted_at = actor, at
        rollout.status = "Progressing"
        event = Event(
            at=at,
            by=actor,
            action="promoted",
            wave=wave.name,
            message=f"wave {wave.name} promoted{note}",
        )
    elif action == "pause":
        if status not in ("Progressing", "WaitingForPromotion"):
            raise RolloutActionError(f"rollout {rollout.id} is {status}: cannot pause it")
        rollout.status = "Paused"
        event = Event(
            at=at, by=actor, action="paused", message=f"no new clusters get the revision{note}"
        )
    elif action == "resume":
        if status == "Paused":
            message = f"resumed{note}"
        elif status == "Halted":
            assert rollout.halt is not None
            forgiven = sorted(rollout.halt.failures)
            rollout.forgiven.update(forgiven)
            rollout.halt = None
            message = f"resumed; {clusters(len(forgiven))} that failed no longer count against maxFailures{note}"
        else:
            raise RolloutActionError(f"rollout {rollout.id} is {status}: nothing to resume")
        rollout.status = "Progressing"
        event = Event(at=at, by=actor, action="resumed", message=message)
    else:  # abort
        reverting = 0
        for member in rollout.members.values():
            if member.wants_target:
                member.phase = "reverting"
                reverting += 1
        rollout.status = "Aborted"
        event = Event(
            at=at,
            by=actor,
            action="aborted",
            message=f"{clusters(reverting)} go back to the previous revision{note}",
        )
    rollout.record(event)
    return event


__all__ = ["ACTIONS", "CONTROLLER", "RolloutActionError", "act", "advance"]
