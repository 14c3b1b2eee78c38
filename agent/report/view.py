"""What the agent knows of each bundle, and the one place that writes it to the cluster.

A :class:`BundleView` holds a bundle's conditions, revisions, health, counts and runs; its
``mark_*`` methods are the only way the reconcile sets conditions, so every state has one
spelling (Ready, Progressing and Degraded always move together). :class:`BundleViews` keeps the
views of the accepted set, loads them from the live BundleDeployments after a restart, and
writes each to its BundleDeployment's status (only when something changed: an idle pass
writes nothing). The status document pushed to git is built from the same views.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent.api import Revision, format_time, from_dict, parse_time, to_dict
from agent.api.reasons import Phase, Reason
from agent.api.status import HealthSummary, Run
from agent.errors import FleetletError
from agent.report.bundles import BundleDeployments, ConditionSpec
from agent.report.runs import RunLog


def now() -> datetime:
    """The time as the API writes it: UTC, whole seconds (RFC 3339, as Kubernetes does)."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass(kw_only=True)
class BundleView:
    """What the agent knows of one bundle: written to its BundleDeployment's status and to
    the status document."""

    name: str
    group: str
    conditions: dict[str, ConditionSpec] = field(default_factory=dict)
    phase: Phase = Phase.PENDING
    applied: Revision | None = None
    """The revision whose objects are in the cluster now."""
    last_healthy: Revision | None = None
    """The last revision that passed its health checks (what a rollback returns to)."""
    target: Revision | None = None
    """The revision the agent is moving to, or stopped short of (``applied`` when settled)."""
    health: HealthSummary | None = None
    resources: dict[str, int] = field(default_factory=dict)
    drift_count: int = 0
    runs: list[Run] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Optional objects left out because their API is not served."""
    since: dict[str, datetime] = field(default_factory=dict)
    """When each condition last changed status (its lastTransitionTime)."""

    def set(self, kind: str, status: str, reason: str, message: str = "") -> None:
        """Set one condition (keeping its transition time when its status is unchanged)."""
        old = self.conditions.get(kind)
        if old is None or old.status != status or kind not in self.since:
            self.since[kind] = now()
        self.conditions[kind] = ConditionSpec(kind, status, reason, message)

    def _triple(
        self, ready: str, progressing: str, degraded: str, reason: str, message: str
    ) -> None:
        self.set("Ready", ready, reason, message)
        self.set("Progressing", progressing, reason, message)
        self.set("Degraded", degraded, reason, message)

    def mark_progressing(self, phase: Phase, message: str) -> None:
        """The group is moving: Ready is Unknown (it says nothing of the target yet)."""
        self.phase = phase
        self._triple("Unknown", "True", "False", Reason.PROGRESSING, message)

    def mark_ready(self, message: str) -> None:
        """The applied revision is healthy."""
        self.phase = Phase.READY
        self.target = self.applied
        self._triple("True", "False", "False", Reason.HEALTHY, message)

    def mark_failed(
        self,
        reason: str,
        message: str,
        *,
        phase: Phase = Phase.FAILED,
        retrying: bool = False,
    ) -> None:
        """Not Ready and Degraded for ``reason``; ``retrying`` keeps Progressing True (the
        agent will try again by itself)."""
        self.phase = phase
        self._triple("False", "True" if retrying else "False", "True", reason, message)

    def mark_waiting(self, reason: str, message: str, *, phase: Phase = Phase.WAITING) -> None:
        """Not Ready, not Degraded: waiting for something outside the bundle (a dependency,
        an approval)."""
        self.phase = phase
        self._triple("False", "True", "False", reason, message)

    def mark_worker_failed(self, message: str) -> None:
        """The agent's previous worker died or hung: Progressing (it is retried) and Degraded
        say so; Ready keeps what it said, since nothing shows what runs has changed. The
        worker that reports it goes on to set the state it finds."""
        self.set("Progressing", "True", Reason.WORKER_FAILED, message)
        self.set("Degraded", "True", Reason.WORKER_FAILED, message)

    def mark_stopped(self, reason: str, message: str, *, phase: Phase) -> None:
        """Not Ready, not moving, not Degraded: held where it is by a decision (a denied
        approval); the running revision is unaffected."""
        self.phase = phase
        self._triple("False", "False", "False", reason, message)

    def mark_paused(self, message: str) -> None:
        """Paused: nothing is applied; Ready keeps what it said of the running revision."""
        self.phase = Phase.PAUSED
        self.set("Paused", "True", Reason.PAUSED, message)
        self.set("Progressing", "False", Reason.PAUSED, message)

    def unpause(self) -> None:
        self.conditions.pop("Paused", None)


class BundleViews:
    """The views of the accepted set's bundles, and their BundleDeployments' status.

    ``refusal``: the newest publication's refusal, or the running publication's expiry, shown
    on every bundle (Ready False, Degraded True) until a newer publication is accepted: they
    keep running what they have. ``degraded``: a server the agent needs is away (the git
    server, a registry, the API server), shown on every bundle as Degraded True with its
    reason, Ready and Progressing untouched: the running revision is as healthy as it was.
    """

    def __init__(
        self,
        *,
        bundles: BundleDeployments,
        runs: RunLog,
    ) -> None:
        self.bundles = bundles
        self._runs = runs
        self._views: dict[str, BundleView] = {}
        self._written: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.refusal: ConditionSpec | None = None
        self.degraded: ConditionSpec | None = None
        self.generation: int | None = None
        """The serial whose specs were last written (a new one rewrites every status)."""

    def __contains__(self, name: object) -> bool:
        return name in self._views

    def __getitem__(self, name: str) -> BundleView:
        return self._views[name]

    def get(self, name: str) -> BundleView | None:
        return self._views.get(name)

    def names(self) -> list[str]:
        return list(self._views)

    def view(self, name: str, group: str) -> BundleView:
        """The bundle's view; loaded from its BundleDeployment's status and its run history
        the first time (after a restart the agent knows what it knew). Raises the
        KubeClient's errors, RunLogError."""
        with self._lock:
            found = self._views.get(name)
        if found is None:
            found = self._load(name, group)
            with self._lock:
                found = self._views.setdefault(name, found)
        found.group = group
        return found

    def _load(self, name: str, group: str) -> BundleView:
        view = BundleView(name=name, group=group)
        live = self.bundles.status_of(name)
        if live:
            view.drift_count = int(live.get("driftCount") or 0)
            for key, attr in (
                ("appliedRevision", "applied"),
                ("lastHealthyRevision", "last_healthy"),
                ("targetRevision", "target"),
            ):
                if isinstance(live.get(key), dict):
                    with contextlib.suppress(FleetletError):
                        setattr(view, attr, from_dict(Revision, live[key]))
            with contextlib.suppress(ValueError):
                view.phase = Phase(str(live.get("phase") or Phase.PENDING))
            for c in live.get("conditions") or []:
                view.set(c["type"], c["status"], c["reason"], c.get("message", ""))
                # The transition time the cluster shows, not this process's start: a restart
                # (every worker of ``agent run`` is one) changes no condition.
                since = parse_time(str(c.get("lastTransitionTime") or ""))
                if since is not None:
                    view.since[c["type"]] = since
        view.runs = self._runs.runs(name)
        return view

    def forget(self, name: str) -> None:
        with self._lock:
            self._views.pop(name, None)
            self._written.pop(name, None)

    def rewrite_all(self, generation: int) -> None:
        """New specs were written (a new set): every status is written again."""
        self.generation = generation
        with self._lock:
            self._written.clear()

    def write(self, view: BundleView) -> None:
        """Write a bundle's view to its BundleDeployment's status, when it changed.

        Raises the KubeClient's errors.
        """
        status: dict[str, Any] = {"driftCount": view.drift_count, "phase": str(view.phase)}
        for key, revision in (
            ("appliedRevision", view.applied),
            ("lastHealthyRevision", view.last_healthy),
            ("targetRevision", view.target),
        ):
            if revision is not None:
                status[key] = to_dict(revision)
        if view.resources:
            status["resources"] = dict(view.resources)
        if view.runs:
            last = view.runs[0]
            status["lastRun"] = {
                "id": last.id,
                "result": last.result,
                "startedAt": format_time(last.started_at),
                "message": last.message[:32768],
                **({"finishedAt": format_time(last.finished_at)} if last.finished_at else {}),
            }
        conditions = self.shown(view.conditions)
        written = (self.generation, sorted(conditions.items()), repr(status))
        with self._lock:
            if self._written.get(view.name) == written:
                return
        self.bundles.set_conditions(view.name, list(conditions.values()), **status)
        with self._lock:
            self._written[view.name] = written

    def shown(self, conditions: Mapping[str, ConditionSpec]) -> dict[str, ConditionSpec]:
        """The conditions as shown: a server away overrides Degraded; a refused newest (or
        expired running) publication overrides Ready and Degraded."""
        shown = dict(conditions)
        if self.degraded is not None:
            shown["Degraded"] = self.degraded._replace(type="Degraded", status="True")
        if self.refusal is not None:
            for kind, value in (("Ready", "False"), ("Degraded", "True")):
                shown[kind] = self.refusal._replace(type=kind, status=value)
        return shown

    def write_all(self) -> None:
        """Write every view whose status (as shown) changed: after the overlays changed.
        Raises the KubeClient's errors."""
        with self._lock:
            views = list(self._views.values())
        for view in views:
            self.write(view)

    def progress(self, names: Iterable[str], phase: Phase, message: str) -> None:
        """Mark bundles as moving (``phase``, ``message``) and write them: progress is
        visible between the stages of a move."""
        for name in names:
            view = self._views[name]
            view.mark_progressing(phase, message)
            self.write(view)


ClockFn = Callable[[], datetime]

__all__ = ["BundleView", "BundleViews", "ClockFn", "now"]
