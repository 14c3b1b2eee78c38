"""The gate of the outbound reconcile: may a lockstep group move now, and if not, why.

:func:`decide` reads a group's bundles as the set wants them and as the cluster has them, and
returns one :class:`Decision`:

- bundles **paused** by the set (``spec.paused``) or by a cluster admin (the
  ``fleetlet.io/paused`` annotation) are held out: nothing is applied, drift is only reported;
- a group with a bundle that needs an **approval** (``approval: manual``) moves only under an
  approved request for the whole group (``Decision.approval`` names those bundles; the "request
  approval" step of the move, :mod:`agent.approve.gate`, asks and waits);
- the group **waits** while a group it depends on (``dependsOn``) is not healthy;
- a group whose every bundle is at its target is **steady**: drift is corrected, health assessed;
- a target that already **failed** is not tried again until the target changes or a
  BundleDeployment asks (a changed ``fleetlet.io/retry`` annotation), except a refusal the
  cluster caused (a missing namespace or CRD, a webhook that is down), which is retried by
  itself when its backoff is over;
- otherwise the group **moves**.

Pure logic over what the caller read: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from agent.api import BundleDeploymentEntry, canonical_bytes, digest_of, parse_time, to_dict
from agent.apply.intent import FailedTarget

PAUSED_ANNOTATION = "fleetlet.io/paused"
RETRY_ANNOTATION = "fleetlet.io/retry"

CLUSTER_CAUSED = frozenset(
    {"NotFound", "ApiNotServed", "WebhookFailed", "CRDNotEstablished", "ApiUnavailable"}
)
"""Refusal reasons the cluster, not the content, caused and that usually go away by
themselves: a namespace or CRD not there yet, a webhook that is down. The same target is tried
again by itself, with backoff. (Forbidden and Conflict need an admin: after fixing RBAC or the
other field manager, they set the retry annotation.)"""

RETRY_BACKOFF_MAX = timedelta(minutes=10)


class Verdict(StrEnum):
    MOVE = "move"
    STEADY = "steady"
    BLOCKED = "blocked"
    """The same target failed before: stay where the group is."""
    WAITING = "waiting"
    """A dependency is not healthy yet."""
    HELD = "held"
    """Every bundle is paused."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What a group does in this pass, and about which of its bundles."""

    verdict: Verdict
    active: tuple[BundleDeploymentEntry, ...] = ()
    """The bundles that take part (not paused)."""
    paused: tuple[tuple[BundleDeploymentEntry, str], ...] = ()
    """Paused bundles and why."""
    approval: tuple[BundleDeploymentEntry, ...] = ()
    """Active bundles that ask for an approval (``approval: manual``): the group's move needs
    one."""
    waiting_for: tuple[str, ...] = ()
    """Groups this one depends on that are not healthy."""
    targets: Mapping[str, str] = field(default_factory=dict)
    """Each active bundle's target (its spec digest)."""
    failure: FailedTarget | None = None
    """The failure that blocks the group (``BLOCKED``) or is being retried (``MOVE``)."""


def spec_digest(entry: BundleDeploymentEntry) -> str:
    """What makes a bundle's revision the same or another: its spec and group, not the
    serial (a refreshed publication with the same content moves nothing)."""
    return digest_of(canonical_bytes({"group": entry.group, "spec": to_dict(entry.spec)}))


def group_target(targets: Mapping[str, str]) -> str:
    """One digest over a group's bundle targets."""
    return digest_of(canonical_bytes(dict(sorted(targets.items()))))


def paused_reason(
    entry: BundleDeploymentEntry, annotations: Mapping[str, Mapping[str, str]]
) -> str | None:
    """Why a bundle is paused, or None."""
    if entry.spec.paused:
        return "the set pauses this bundle (spec.paused)"
    value = annotations.get(entry.name, {}).get(PAUSED_ANNOTATION, "")
    if value.strip().lower() in ("true", "1", "yes"):
        return f"paused by a cluster admin (annotation {PAUSED_ANNOTATION})"
    return None


def retry_tokens(
    names: Iterable[str], annotations: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The ``fleetlet.io/retry`` annotation of each bundle (a changed value asks for a retry)."""
    return {n: annotations.get(n, {}).get(RETRY_ANNOTATION, "") for n in names}


def retry_at(
    causes: Iterable[str], attempts: int, now: datetime, *, backoff: float = 30.0
) -> datetime | None:
    """When a failed target is tried again by itself: when every cause is one the cluster
    caused (:data:`CLUSTER_CAUSED`), after a backoff that doubles with each attempt (from
    ``backoff`` seconds up to 10 min); otherwise never."""
    causes = set(causes)
    if not causes or not causes <= CLUSTER_CAUSED:
        return None
    wait: timedelta = min(
        timedelta(seconds=backoff) * 2 ** min(attempts - 1, 16), RETRY_BACKOFF_MAX
    )
    return now + wait


def decide(
    *,
    members: Sequence[BundleDeploymentEntry],
    annotations: Mapping[str, Mapping[str, str]],
    healthy_groups: Iterable[str],
    current: Mapping[str, str | None],
    failure: FailedTarget | None,
    now: datetime,
) -> Decision:
    """The group's decision (see the module docstring).

    ``current``: each bundle's stored (last healthy) spec digest, None when it has none;
    ``failure``: the group's recorded failed target.
    """
    paused = tuple((e, why) for e in members if (why := paused_reason(e, annotations)))
    held = {e.name for e, _ in paused}
    active = tuple(e for e in members if e.name not in held)
    approval = tuple(e for e in active if e.spec.approval == "manual")

    def decision(verdict: Verdict, **more: Any) -> Decision:
        return Decision(verdict=verdict, paused=paused, approval=approval, active=active, **more)

    if not active:
        return decision(Verdict.HELD)
    needs = sorted({d for e in active for d in e.spec.depends_on} - set(healthy_groups))
    if needs:
        return decision(Verdict.WAITING, waiting_for=tuple(needs))
    targets = {e.name: spec_digest(e) for e in active}
    if all(current.get(n) == t for n, t in targets.items()):
        return decision(Verdict.STEADY, targets=targets)
    if failure is not None and failure.target == group_target(targets):
        asked = retry_tokens(targets, annotations) != {
            n: failure.retry_tokens.get(n, "") for n in targets
        }
        when = parse_time(failure.retry_at) if failure.retry_at else None
        due = when is not None and when <= now
        if not (asked or due):
            return decision(Verdict.BLOCKED, targets=targets, failure=failure)
    return decision(Verdict.MOVE, targets=targets, failure=failure)


__all__ = [
    "CLUSTER_CAUSED",
    "PAUSED_ANNOTATION",
    "RETRY_ANNOTATION",
    "Decision",
    "Verdict",
    "decide",
    "group_target",
    "paused_reason",
    "retry_at",
    "retry_tokens",
    "spec_digest",
]
