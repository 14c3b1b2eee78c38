"""The agent's Prometheus metrics, served at ``/metrics`` on the probe server.

One :class:`Metrics` object per agent holds every metric in its own registry (no global state:
two agents in one process, as in tests, never share a counter). The code that sees an event
calls one small recording method on the object it was given; nothing reads a module global.
Names follow the Prometheus conventions: ``fleetlet_agent_`` prefix, ``_total`` for counters,
base units (``_seconds``), ``_timestamp_seconds`` for points in time, bounded label values.

What records what (see docs/operations.md, "Metrics", for the list an operator alerts on):

- the poll loop, once per tick: :meth:`Metrics.record_tick` (or the small methods it calls:
  :meth:`~Metrics.poll_finished`, :meth:`~Metrics.sync_finished`,
  :meth:`~Metrics.serial_accepted`, :meth:`~Metrics.group_moved`,
  :meth:`~Metrics.rolled_back`, :meth:`~Metrics.refused`, :meth:`~Metrics.drift_corrected`);
- the lockstep move of a group: :meth:`~Metrics.health_waited`;
- the content cache: :meth:`~Metrics.cache_lookup`; the status pusher:
  :meth:`~Metrics.status_pushed`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from agent.errors import VerificationError

PREFIX = "fleetlet_agent"
CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of :meth:`Metrics.exposition` (the Prometheus text format)."""

SYNC_RESULTS = ("success", "failed", "error")
"""``success``: every group where it should be; ``failed``: a group failed (rolled back or
not); ``error``: the tick raised (git or API server away, a refused publication)."""

WORKER_FAILURE_CAUSES = ("signal", "exit", "timeout", "result")
"""Why a worker ended without a result (see :class:`agent.runner.launcher.WorkerFailedError`)."""
DRIFT_CHECK_RESULTS = ("unchanged", "changed", "unknown")

# Ticks take from milliseconds (an idle poll) to minutes (a large group waiting for health).
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _PassResult(Protocol):
    @property
    def moved(self) -> Sequence[str]: ...
    @property
    def rolled_back(self) -> Sequence[str]: ...
    @property
    def failed(self) -> Sequence[str]: ...
    @property
    def drift_corrected(self) -> int: ...


class _TickResult(Protocol):
    @property
    def inbound(self) -> str: ...
    @property
    def serial(self) -> int | None: ...
    @property
    def outbound(self) -> _PassResult | None: ...
    @property
    def error(self) -> BaseException | None: ...


class _Ticking(Protocol):
    """What :meth:`Metrics.instrument` wraps: :class:`agent.loop.Agent`."""

    @property
    def last(self) -> _TickResult | None: ...
    def tick(self) -> _TickResult: ...


class Metrics:
    """Every metric of one agent, in ``registry`` (a new one by default).

    ``cluster`` and ``version`` go into the ``fleetlet_agent_info`` metric only, not onto
    every series (one agent per cluster: the scrape target already says which).
    """

    content_type = CONTENT_TYPE
    """The ``Content-Type`` of :meth:`exposition`."""

    def __init__(
        self,
        *,
        cluster: str,
        version: str,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._clock = clock
        r = self.registry
        self.info = Info(f"{PREFIX}", "The agent: its cluster and version.", registry=r)
        self.info.info({"cluster": cluster, "version": version})
        self.polls = Counter(
            f"{PREFIX}_polls_total",
            "Polls of the cluster's branch, by outcome (unchanged, rendered, serial-advanced, "
            "refused-before, failed).",
            ["outcome"],
            registry=r,
        )
        self.poll_duration = Histogram(
            f"{PREFIX}_poll_duration_seconds",
            "Time of the inbound half of a tick: ref listing, and when the branch moved, fetch, "
            "verification and rendering.",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.syncs = Counter(
            f"{PREFIX}_syncs_total",
            "Ticks (poll, then reconcile of the accepted set), by result (success, failed, error).",
            ["result"],
            registry=r,
        )
        self.sync_duration = Histogram(
            f"{PREFIX}_sync_duration_seconds",
            "Time of a whole tick, by result.",
            ["result"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.accepted_serial = Gauge(
            f"{PREFIX}_accepted_serial",
            "Serial of the publication the agent accepted last (0 before the first).",
            registry=r,
        )
        self.last_success = Gauge(
            f"{PREFIX}_last_successful_sync_timestamp_seconds",
            "Unix time at which a tick last ended with every group where it should be.",
            registry=r,
        )
        self.group_moves = Counter(
            f"{PREFIX}_group_moves_total",
            "Groups moved to a new target and found healthy, by group.",
            ["group"],
            registry=r,
        )
        self.rollbacks = Counter(
            f"{PREFIX}_group_rollbacks_total",
            "Groups rolled back to their previous healthy revision, by group.",
            ["group"],
            registry=r,
        )
        self.health_waits = Histogram(
            f"{PREFIX}_health_wait_duration_seconds",
            "Time spent waiting for a moved group to become healthy, by result (healthy, "
            "unhealthy).",
            ["result"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.refusals = Counter(
            f"{PREFIX}_verification_refusals_total",
            "Publications refused, by reason (SignatureInvalid, SerialNotNewer, ...).",
            ["reason"],
            registry=r,
        )
        self.drift = Counter(
            f"{PREFIX}_drift_corrections_total",
            "Objects found drifted from their applied revision and corrected.",
            registry=r,
        )
        self.cache_lookups = Counter(
            f"{PREFIX}_content_cache_lookups_total",
            "Lookups of content by digest in the local cache, by result (hit, miss).",
            ["result"],
            registry=r,
        )
        self.status_pushes = Counter(
            f"{PREFIX}_status_pushes_total",
            "Pushes of the status document to git, by result (success, failure).",
            ["result"],
            registry=r,
        )
        self.worker_runs = Counter(
            f"{PREFIX}_worker_runs_total",
            "Worker processes run (agent run), by job (tick, drift) and result (ok: it wrote "
            "its result, whatever the job's outcome; failed: it died or hung).",
            ["job", "result"],
            registry=r,
        )
        self.worker_failures = Counter(
            f"{PREFIX}_worker_failures_total",
            "Workers that ended without a result, by cause (signal: killed, e.g. out of "
            "memory; exit: an error exit; timeout: killed after --worker-timeout; result: "
            "unreadable result).",
            ["cause"],
            registry=r,
        )
        self.worker_duration = Histogram(
            f"{PREFIX}_worker_duration_seconds",
            "Time a worker process ran, by job.",
            ["job"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.channel_up = Gauge(
            f"{PREFIX}_notify_channel_up",
            "1 while the hub's notification channel is held (--notify-url), else 0 (polling only).",
            registry=r,
        )
        self.notifications = Counter(
            f"{PREFIX}_notifications_total",
            "Times the notification channel said to look (each gives at most one extra poll).",
            registry=r,
        )
        self.worker_max_rss = Gauge(
            f"{PREFIX}_worker_max_resident_bytes",
            "Peak resident memory of the last worker that finished.",
            registry=r,
        )
        self.drift_checks = Counter(
            f"{PREFIX}_drift_checks_total",
            "Drift checks of the supervisor, by result (unchanged: nothing the set owns moved, "
            "no worker ran; changed; unknown: the check could not be made, a worker checked).",
            ["result"],
            registry=r,
        )
        self.approval_checks = Counter(
            f"{PREFIX}_approval_checks_total",
            "Checks of the supervisor, while a group awaits a decision, of the requests and "
            "ApprovalPolicies it waits on, by result (unchanged: no worker ran; changed: a "
            "worker acts on it; unknown: the check could not be made, a worker looked).",
            ["result"],
            registry=r,
        )
        self.api_requests = Counter(
            f"{PREFIX}_supervisor_api_requests_total",
            "Requests of agent run's supervisor to the API server (drift and approval checks, "
            "the agent's Lease and upgrade ConfigMap), by method; a worker's are not counted.",
            ["method"],
            registry=r,
        )
        self.render_confinement = Gauge(
            f"{PREFIX}_render_confinement",
            "How renderers (helm, kustomize, format plugins) are confined, by mechanism: "
            "landlock (the kernel's Landlock ABI version; 0: none, so renderers are not "
            "confined to their files and keep only their time, memory and output bounds) and "
            "seccomp (1: their sockets are denied).",
            ["mechanism"],
            registry=r,
        )
        from agent.render.confine import support

        found = support()
        self.render_confinement.labels(mechanism="landlock").set(found.landlock_abi)
        self.render_confinement.labels(mechanism="seccomp").set(int(found.seccomp))
        # Every label value known up front is exported at 0, so rate() works from the start.
        for result in SYNC_RESULTS:
            self.syncs.labels(result=result)
        for value in ("hit", "miss"):
            self.cache_lookups.labels(result=value)
        for value in ("success", "failure"):
            self.status_pushes.labels(result=value)
        for value in WORKER_FAILURE_CAUSES:
            self.worker_failures.labels(cause=value)
        for value in DRIFT_CHECK_RESULTS:
            self.drift_checks.labels(result=value)
            self.approval_checks.labels(result=value)

    # --- the small recording methods -----------------------------------------------------

    def poll_finished(self, outcome: str, seconds: float | None = None) -> None:
        """The inbound half of a tick ended with ``outcome`` (after ``seconds``, when known)."""
        self.polls.labels(outcome=outcome).inc()
        if seconds is not None:
            self.poll_duration.observe(seconds)

    def sync_finished(self, result: str, seconds: float) -> None:
        """A tick ended: ``result`` is one of :data:`SYNC_RESULTS`.

        Raises ValueError for another result (a typo would create a new series silently).
        """
        if result not in SYNC_RESULTS:
            raise ValueError(f"sync result must be one of {SYNC_RESULTS}, got {result!r}")
        self.syncs.labels(result=result).inc()
        self.sync_duration.labels(result=result).observe(seconds)
        if result == "success":
            self.last_success.set(self._clock())

    def serial_accepted(self, serial: int) -> None:
        """The agent runs the publication with this serial."""
        self.accepted_serial.set(serial)

    def group_moved(self, group: str) -> None:
        """``group`` reached its new target, healthy."""
        self.group_moves.labels(group=group).inc()

    def rolled_back(self, group: str) -> None:
        """``group`` went back to its previous healthy revision."""
        self.rollbacks.labels(group=group).inc()

    def health_waited(self, seconds: float, *, healthy: bool) -> None:
        """A moved group's health check took ``seconds`` and ended healthy or not."""
        self.health_waits.labels(result="healthy" if healthy else "unhealthy").observe(seconds)

    def refused(self, reason: str) -> None:
        """A publication was refused for ``reason`` (the condition reason, e.g. SerialNotNewer)."""
        self.refusals.labels(reason=reason).inc()

    def drift_corrected(self, objects: int) -> None:
        """``objects`` drifted objects were put back."""
        if objects > 0:
            self.drift.inc(objects)

    def cache_lookup(self, *, hit: bool) -> None:
        """Content was looked up in the cache by digest."""
        self.cache_lookups.labels(result="hit" if hit else "miss").inc()

    def status_pushed(self, *, ok: bool) -> None:
        """A status push succeeded or failed."""
        self.status_pushes.labels(result="success" if ok else "failure").inc()

    def worker_finished(
        self,
        job: str,
        seconds: float,
        *,
        failure: str | None = None,
        max_rss: int | None = None,
    ) -> None:
        """A worker ran ``job`` for ``seconds``: it wrote its result (``failure`` None; its
        peak memory ``max_rss`` in bytes when known) or ended without one for ``failure``, one
        of :data:`WORKER_FAILURE_CAUSES`.

        Raises ValueError for another cause.
        """
        if failure is not None and failure not in WORKER_FAILURE_CAUSES:
            raise ValueError(f"worker failure must be one of {WORKER_FAILURE_CAUSES}")
        self.worker_runs.labels(job=job, result="failed" if failure else "ok").inc()
        self.worker_duration.labels(job=job).observe(seconds)
        if failure is not None:
            self.worker_failures.labels(cause=failure).inc()
        if max_rss is not None:
            self.worker_max_rss.set(max_rss)

    def drift_checked(self, result: str) -> None:
        """A drift check of the supervisor ended with ``result``, one of
        :data:`DRIFT_CHECK_RESULTS`. Raises ValueError for another result."""
        if result not in DRIFT_CHECK_RESULTS:
            raise ValueError(f"drift check result must be one of {DRIFT_CHECK_RESULTS}")
        self.drift_checks.labels(result=result).inc()

    def approval_checked(self, result: str) -> None:
        """A check of what a group awaiting a decision waits on ended with ``result``, one of
        :data:`DRIFT_CHECK_RESULTS`. Raises ValueError for another result."""
        if result not in DRIFT_CHECK_RESULTS:
            raise ValueError(f"approval check result must be one of {DRIFT_CHECK_RESULTS}")
        self.approval_checks.labels(result=result).inc()

    def api_requested(self, method: str) -> None:
        """The supervisor sent one request to the API server (GET, POST, PATCH)."""
        self.api_requests.labels(method=method).inc()

    # --- a whole tick ----------------------------------------------------------------------

    def record_tick(self, result: _TickResult | None, seconds: float) -> None:
        """Everything a tick's result says: poll outcome, sync result and duration, the
        accepted serial, groups moved and rolled back, drift corrected, a refusal's reason.

        ``result`` is ``None`` when the tick raised before it had one (the API server away).
        """
        if result is None:
            self.sync_finished("error", seconds)
            return
        # The inbound half's own duration, when the tick result carries it (``inbound_seconds``).
        inbound_seconds = getattr(result, "inbound_seconds", None)
        if result.inbound != "skipped":  # a drift check does not poll
            self.poll_finished(
                result.inbound, inbound_seconds if isinstance(inbound_seconds, float) else None
            )
        if result.serial is not None:
            self.serial_accepted(result.serial)
        out = result.outbound
        if out is not None:
            for group in out.moved:
                self.group_moved(group)
            for group in out.rolled_back:
                self.rolled_back(group)
            self.drift_corrected(out.drift_corrected)
        if isinstance(result.error, VerificationError):
            self.refused(result.error.reason)
        if result.error is not None:
            self.sync_finished("error", seconds)
        elif out is not None and out.failed:
            self.sync_finished("failed", seconds)
        else:
            self.sync_finished("success", seconds)

    def instrument(
        self, agent: _Ticking, job: Callable[[], _TickResult] | None = None
    ) -> Callable[[], _TickResult]:
        """``job`` (default ``agent.tick``; the scheduler's ``agent.poll`` or
        ``agent.correct_drift``) that also records what it did (:meth:`record_tick`). Raises
        what the job raises."""
        run = job or agent.tick

        def tick() -> _TickResult:
            before = agent.last
            started = time.perf_counter()
            try:
                result = run()
            except BaseException:
                last = agent.last
                self.record_tick(
                    last if last is not None and last is not before else None,
                    time.perf_counter() - started,
                )
                raise
            self.record_tick(result, time.perf_counter() - started)
            return result

        return tick

    # --- exposition ----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
