"""Each member cluster's verdict, from what its agent reported.

A released cluster's branch carries the new revision from serial ``S`` on (``Member.serial``).
Its agent's report counts only once it is about that revision:

- **passed**: every bundle of the group is Ready with an applied revision of serial ``S`` or
  later (the agent records the set serial a group moved with, so Ready on the *old* revision,
  as reported between accepting ``S`` and moving, never passes);
- **failed**: the agent accepted ``S`` and a bundle of the group is ``Denied``, ``RolledBack``
  by a run of serial ``S`` or later, or ``Degraded`` on it; or nothing passed within the
  ``progressDeadline`` after the branch got ``S`` (silent, stale, still progressing, awaiting
  an approval: the deadline counts them all, so no cluster blocks a rollout forever);
- **skipped**: a bundle of the group is Paused on the cluster (its owner holds it);
- **pending**: anything else, until the deadline.

The verdicts read the hub's compact status summaries only (no status document is parsed), so a
wave of 10,000 clusters is judged in milliseconds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from hub.rollout.names import VERDICTS, Verdict
from hub.rollout.state import Member, Rollout


@dataclass(frozen=True, slots=True)
class Installation:
    """One bundle on a cluster as its agent last reported it: state (Ready, Degraded, ...; not
    Stale, which is the cluster's), the serial its applied revision came with, the serial its
    newest run targeted (0: none)."""

    state: str
    applied: int
    run: int


@dataclass(frozen=True, slots=True)
class Observation:
    """A cluster as the hub last heard of it."""

    heartbeat: datetime | None
    stale: bool
    accepted: int
    installations: Mapping[str, Installation]
    refusal: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterVerdict:
    verdict: Verdict
    reason: str = ""


@dataclass(slots=True)
class Evaluation:
    """A rollout's member clusters, judged at one moment."""

    verdicts: dict[str, ClusterVerdict] = field(default_factory=dict)

    def failures(self, forgiven: set[str]) -> dict[str, str]:
        """Failed members the budget counts (not forgiven by a resume): name -> reason."""
        return {
            n: v.reason
            for n, v in sorted(self.verdicts.items())
            if v.verdict == "failed" and n not in forgiven
        }

    def moving(self) -> int:
        """Members on their way to the new revision (released, neither passed nor failed)."""
        return sum(1 for v in self.verdicts.values() if v.verdict == "pending")

    def counts(self, rollout: Rollout, wave: int | None = None) -> dict[str, int]:
        found = Counter(
            v.verdict
            for n, v in self.verdicts.items()
            if wave is None or rollout.members[n].wave == wave
        )
        return {k: found.get(k, 0) for k in VERDICTS}


Observe = Callable[[str], Observation | None]


def evaluate(
    rollout: Rollout,
    observe: Observe,
    bundles: Callable[[str], tuple[str, ...]],
    now: datetime,
) -> Evaluation:
    """Every member's verdict. ``observe(cluster)``: what its agent last reported (None:
    never); ``bundles(variant)``: the bundle names of a variant."""
    deadline = rollout.strategy.progress_deadline
    out = Evaluation()
    for name, member in rollout.members.items():
        out.verdicts[name] = judge(member, observe(name), bundles(member.target), now, deadline)
    return out


def judge(
    member: Member,
    seen: Observation | None,
    bundles: tuple[str, ...],
    now: datetime,
    deadline: timedelta,
) -> ClusterVerdict:
    """One member's verdict (see the module docstring)."""
    if member.phase == "held":
        return ClusterVerdict("held")
    if member.phase == "releasing":
        return ClusterVerdict("pending", "the new revision is being published to its branch")
    if member.phase == "reverting":
        return ClusterVerdict("reverting", "the previous revision is being published back")
    if member.phase == "reverted":
        return ClusterVerdict(
            "reverted",
            f"its branch carries the previous revision again from serial {member.serial}",
        )
    serial = member.serial
    late = now.timestamp() - member.since > deadline.total_seconds()

    def waiting(why: str) -> ClusterVerdict:
        if late:
            return ClusterVerdict(
                "failed",
                f"not Ready on serial {serial} within the progress deadline "
                f"({int(deadline.total_seconds())}s): {why}",
            )
        return ClusterVerdict("pending", why)

    if seen is None:
        return waiting("its agent has not reported yet")
    if seen.stale:
        beat = seen.heartbeat.strftime("%Y-%m-%dT%H:%M:%SZ") if seen.heartbeat else "never"
        return waiting(f"silent (last heard {beat})")
    if seen.accepted < serial:
        refused = f"; it refused a publication: {seen.refusal}" if seen.refusal else ""
        return waiting(f"has not accepted serial {serial} yet (at {seen.accepted}){refused}")
    found = {b: seen.installations.get(b) for b in bundles}
    missing = sorted(b for b, i in found.items() if i is None)
    if missing:
        return waiting(f"{', '.join(missing)} not reported yet")
    reports = {b: i for b, i in found.items() if i is not None}
    for bundle, item in sorted(reports.items()):
        if item.state == "Paused":
            return ClusterVerdict("skipped", f"{bundle} is Paused on the cluster")
    for bundle, item in sorted(reports.items()):
        if item.state == "Denied":
            return ClusterVerdict("failed", f"{bundle}: the move to serial {serial} was Denied")
        if item.state == "RolledBack" and item.run >= serial:
            return ClusterVerdict(
                "failed", f"{bundle}: serial {item.run} failed and was RolledBack"
            )
        if item.state == "Degraded" and max(item.applied, item.run) >= serial:
            return ClusterVerdict(
                "failed", f"{bundle}: Degraded on serial {max(item.applied, item.run)}"
            )
    behind = {
        b: i for b, i in sorted(reports.items()) if not (i.state == "Ready" and i.applied >= serial)
    }
    if not behind:
        return ClusterVerdict("passed", f"Ready on serial {serial} or later")
    bundle, item = next(iter(behind.items()))
    return waiting(f"{bundle} is {item.state} (applied serial {item.applied})")


__all__ = [
    "VERDICTS",
    "ClusterVerdict",
    "Evaluation",
    "Installation",
    "Observation",
    "Observe",
    "Verdict",
    "evaluate",
    "judge",
]
