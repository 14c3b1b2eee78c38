"""The agent's periodic work as APScheduler 3.x jobs: poll, drift check, heartbeat.

:class:`AgentScheduler` runs three interval jobs on a ``BackgroundScheduler``:

- **poll** every ``interval`` (plus up to ``jitter`` at random, so a fleet restarted at once
  does not poll in lockstep): one ref listing of the cluster's branch; when it moved, the new
  set is fetched, verified, rendered and applied;
- **drift** every ``drift_interval``: the outbound pass over the accepted set (drift put back,
  health assessed, retries that are due);
- **heartbeat** every ``heartbeat_interval``: the status document pushed to git.

Poll and drift share one single-thread executor, so they never run at once and a slow apply
never stacks polls behind it (``max_instances=1``, ``coalesce=True``: runs missed while one
ran collapse into one; a ``misfire_grace_time`` drops runs that are too late). The heartbeat
has its own executor: it still goes out while a group is moving.

After a :class:`~agent.errors.TemporaryError` (or an unexpected exception) the poll and drift
jobs each back off on their own (:class:`~agent.backoff.Backoff`: exponential from
``initial_backoff`` up to ``max_backoff``, or the ``delay`` the error suggests, plus up to
``jitter`` seconds at random): their runs return at once until the backoff is over. On their
own, because a git server away must not stop drift being corrected, and a drift pass that
succeeds must not cut the poll's backoff short. A :class:`~agent.errors.PermanentError` is
reported and does not slow the loop down: the inbound pipeline remembers the refused commit
and the next polls are idle until the branch moves.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from agent.backoff import Backoff
from agent.errors import PermanentError, TemporaryError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOutcome:
    """How one run of a job ended: ``error`` (None on success) and, after a failure, how long
    the job waits before working again (``delay``, 0 without a backoff)."""

    job: str
    error: BaseException | None
    delay: float = 0.0
    permanent: bool = False


class AgentScheduler:
    """The agent's jobs on a BackgroundScheduler until :meth:`stop`. See the module doc."""

    def __init__(
        self,
        *,
        poll: Callable[[], Any],
        drift: Callable[[], Any],
        heartbeat: Callable[[], Any] | None,
        interval: float,
        jitter: float = 0.0,
        drift_interval: float | None = None,
        heartbeat_interval: float = 60.0,
        max_backoff: float = 300.0,
        initial_backoff: float | None = None,
        on_outcome: Callable[[JobOutcome], None] | None = None,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        channel_up: Callable[[], bool] | None = None,
        channel_interval: float | None = None,
    ) -> None:
        """``drift_interval`` defaults to ten poll intervals; ``initial_backoff`` to
        min(interval, max_backoff); ``on_outcome`` is called after every poll and drift run.
        While ``channel_up()`` (the hub's notification channel, :mod:`agent.channel`), the
        poll job polls only every ``channel_interval``: :meth:`poll_now` does the rest.

        Raises ValueError for a non-positive interval, a negative jitter, or max_backoff below
        initial_backoff.
        """
        if interval <= 0:
            raise ValueError(f"poll interval must be positive, got {interval}")
        if jitter < 0:
            raise ValueError(f"poll jitter must not be negative, got {jitter}")
        self.interval = interval
        self.jitter = jitter
        self.drift_interval = drift_interval or interval * 10
        self.heartbeat_interval = heartbeat_interval
        initial = initial_backoff if initial_backoff is not None else min(interval, max_backoff)
        self._jobs: dict[str, Callable[[], Any]] = {"poll": poll, "drift": drift}
        self._backoffs = {job: Backoff(initial=initial, maximum=max_backoff) for job in self._jobs}
        self._resume_at = dict.fromkeys(self._jobs, 0.0)
        self._heartbeat = heartbeat
        self._on_outcome = on_outcome
        self._rng = rng
        self._clock = clock
        self._lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None
        self._stopped = threading.Event()
        self.runs = 0
        """Runs of the poll and drift jobs that did work (not skipped by a backoff)."""
        self.last: JobOutcome | None = None
        self.channel_up = channel_up
        self.channel_interval = channel_interval or interval
        self._polled_at = float("-inf")
        self._poll_asked = threading.Event()
        self.keep_polling: Callable[[], bool] | None = None
        """While it says so, the poll runs every ``interval`` even with the channel up: what
        it waits for (a decision on an approval request, made in the cluster) is not
        something the hub can tell."""
        self.told = 0
        """Polls run because the channel said to look."""

    def poll_now(self) -> None:
        """Poll as soon as the work executor is free (a notification). Calls made before
        that poll starts collapse into it; one made while it runs gives one more poll after
        it (it may have listed the branch before the move)."""
        scheduler = self._scheduler
        if scheduler is None or self._poll_asked.is_set():
            return
        self._poll_asked.set()
        scheduler.add_job(
            self._told,
            id="fleetlet-agent-poll-now",
            name="fleetlet agent poll (notified)",
            executor="work",
            replace_existing=True,
            max_instances=2,
            misfire_grace_time=None,
        )

    def _told(self) -> None:
        self._poll_asked.clear()
        self.told += 1
        self.run("poll", notified=True)

    # -- one run ------------------------------------------------------------------------------

    def run(self, job: str, *, notified: bool = False) -> JobOutcome | None:
        """Run job ``poll`` or ``drift`` now, in this thread, unless a backoff is running
        (then None), or the poll is not due while the channel is up (also None; ``notified``:
        it is due). Never raises for the job's errors (they are logged and in the outcome),
        except KeyboardInterrupt/SystemExit."""
        backoff = self._backoffs[job]
        with self._lock:
            if self._clock() < self._resume_at[job]:
                return None
            if job == "poll" and not notified and self._quiet():
                return None
            if job == "poll":
                self._polled_at = self._clock()
            self.runs += 1
            try:
                self._jobs[job]()
            except PermanentError as exc:
                # The server answered: no reason to slow down. The branch must move first.
                backoff.reset()
                log.error("%s refused (permanent, waiting for the branch to move): %s", job, exc)
                outcome = JobOutcome(job, exc, permanent=True)
            except TemporaryError as exc:
                # Jitter even on a suggested delay: agents that lost the same server must not
                # all come back to it at the same instant.
                wait = backoff.failure(exc.delay) + self._jitter(True)
                log.warning("%s failed (retry in %.1f s): %s", job, wait, exc)
                outcome = JobOutcome(job, exc, wait)
            except Exception as exc:
                # A bug or an unconverted library error: back off rather than spin on it.
                wait = backoff.failure() + self._jitter(True)
                log.exception("%s failed unexpectedly (retry in %.1f s)", job, wait)
                outcome = JobOutcome(job, exc, wait)
            else:
                backoff.reset()
                outcome = JobOutcome(job, None)
            self._resume_at[job] = self._clock() + outcome.delay
            self.last = outcome
        if self._on_outcome is not None:
            try:
                self._on_outcome(outcome)
            except Exception:
                log.exception("reporting the %s outcome failed", job)
        return outcome

    def _quiet(self) -> bool:
        """The channel is up and the slow poll is not due yet."""
        up = self.channel_up is not None and self.channel_up()
        if up and self.keep_polling is not None and self.keep_polling():
            return False
        return up and self._clock() - self._polled_at < self.channel_interval

    @property
    def backoff(self) -> Backoff:
        """The poll job's backoff (its failures in a row)."""
        return self._backoffs["poll"]

    def _jitter(self, wanted: bool) -> float:
        return self.jitter * self._rng() if wanted else 0.0

    def _beat(self) -> None:
        if self._heartbeat is None:
            return
        try:
            self._heartbeat()
        except Exception:
            log.warning("heartbeat failed", exc_info=True)

    # -- the scheduler ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the jobs in background threads; the first poll is immediate."""
        if self._scheduler is not None:
            return
        self._stopped.clear()
        scheduler = BackgroundScheduler(
            executors={
                "work": {"type": "threadpool", "max_workers": 1},
                "default": {"type": "threadpool", "max_workers": 1},
            },
            job_defaults={"max_instances": 1, "coalesce": True},
            timezone=UTC,
        )
        now = datetime.now(UTC)
        for job, every, first in (
            ("poll", self.interval, now),
            ("drift", self.drift_interval, None),
        ):
            scheduler.add_job(
                self.run,
                IntervalTrigger(seconds=every, jitter=self.jitter or None, timezone=UTC),
                args=[job],
                id=f"fleetlet-agent-{job}",
                name=f"fleetlet agent {job}",
                executor="work",
                misfire_grace_time=max(1, round(every)),
                **({"next_run_time": first} if first else {}),
            )
        if self._heartbeat is not None:
            scheduler.add_job(
                self._beat,
                IntervalTrigger(seconds=self.heartbeat_interval, timezone=UTC),
                id="fleetlet-agent-heartbeat",
                name="fleetlet agent heartbeat",
                misfire_grace_time=max(1, round(self.heartbeat_interval)),
            )
        self._scheduler = scheduler
        scheduler.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop scheduling; with ``wait``, return after the runs in progress ended."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None and scheduler.running:
            scheduler.shutdown(wait=wait)
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` (e.g. from a signal handler); False if ``timeout`` passed."""
        return self._stopped.wait(timeout)

    @property
    def running(self) -> bool:
        return self._scheduler is not None and self._scheduler.running

    def __enter__(self) -> AgentScheduler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


__all__ = ["AgentScheduler", "Backoff", "JobOutcome"]
