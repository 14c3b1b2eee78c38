"""The agent's poll loop: one APScheduler 3.x job, at most one run at a time, with backoff.

:class:`Poller` runs ``reconcile()`` every ``interval`` seconds plus a random jitter (so a fleet
restarted at once does not poll in lockstep). The job has ``max_instances=1`` (never two runs at
once), ``coalesce=True`` (runs missed while the process was stalled collapse into one) and a
``misfire_grace_time``. After each run the next run time is set from the outcome:

- success: ``interval`` + jitter, and the backoff is reset;
- :class:`TemporaryError` (or an unexpected exception): exponential backoff from
  ``initial_backoff``, doubling up to ``max_backoff``; a ``TemporaryError.delay`` given by the
  failing code is used instead (still capped at ``max_backoff``);
- :class:`PermanentError`: reported, then the normal interval. Retrying the same input cannot
  help, so :class:`OnBranchChange` remembers the commit that failed and makes the following
  runs idle until the branch moves.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from agent.errors import PermanentError, TemporaryError
from agent.source.branch import BranchNotFoundError

log = logging.getLogger(__name__)

JOB_ID = "fleetlet-agent-poll"


class Backoff:
    """Exponential backoff with a cap: ``initial * 2**(n-1)`` after the n-th failure in a row."""

    def __init__(self, *, initial: float, maximum: float) -> None:
        """Raises ValueError unless 0 < initial <= maximum."""
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff needs 0 < initial ({initial}) <= maximum ({maximum})")
        self.initial = initial
        self.maximum = maximum
        self.failures = 0

    def failure(self, suggested: float | None = None) -> float:
        """Count one more failure; return the delay before the next attempt.

        ``suggested`` (a ``TemporaryError.delay``) replaces the computed delay, capped.
        """
        self.failures += 1
        if suggested is not None:
            return min(max(suggested, 0.0), self.maximum)
        # The exponent is bounded so a very long outage cannot overflow the float.
        return min(self.initial * 2.0 ** min(self.failures - 1, 60), self.maximum)

    def reset(self) -> None:
        self.failures = 0


@dataclass(frozen=True)
class RunOutcome:
    """What one run ended with: ``error`` (None on success) and the ``delay`` chosen after it."""

    error: BaseException | None
    delay: float
    permanent: bool = False


class Poller:
    """Runs ``reconcile`` on a BackgroundScheduler until :meth:`stop`. See the module doc."""

    def __init__(
        self,
        *,
        interval: float,
        jitter: float = 0.0,
        max_backoff: float = 300.0,
        initial_backoff: float | None = None,
        misfire_grace_time: float | None = None,
        reconcile: Callable[[], Any],
        on_outcome: Callable[[RunOutcome], None] | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        """``initial_backoff`` defaults to min(interval, max_backoff); ``misfire_grace_time``
        to ``interval``; ``on_outcome`` is called after every run (status reporting);
        ``rng`` returns a float in [0, 1) for the jitter.

        Raises ValueError for a non-positive interval, a negative jitter, or max_backoff below
        initial_backoff.
        """
        if interval <= 0:
            raise ValueError(f"poll interval must be positive, got {interval}")
        if jitter < 0:
            raise ValueError(f"poll jitter must not be negative, got {jitter}")
        self.interval = interval
        self.jitter = jitter
        self.backoff = Backoff(
            initial=initial_backoff if initial_backoff is not None else min(interval, max_backoff),
            maximum=max_backoff,
        )
        self.misfire_grace_time = misfire_grace_time if misfire_grace_time else interval
        self._reconcile = reconcile
        self._on_outcome = on_outcome
        self._rng = rng
        self._lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None
        self._stopped = threading.Event()
        self.runs = 0
        self.last: RunOutcome | None = None

    def _jitter(self) -> float:
        return self.jitter * self._rng()

    def tick(self) -> RunOutcome:
        """Run ``reconcile`` once, now, in this thread; return the outcome and next delay.

        Never raises for errors of ``reconcile`` (they are logged and in the outcome), except
        KeyboardInterrupt/SystemExit.
        """
        with self._lock:
            self.runs += 1
            try:
                self._reconcile()
            except PermanentError as exc:
                # The server answered: no reason to slow down. The branch must move first.
                self.backoff.reset()
                log.error("poll refused (permanent, waiting for the branch to move): %s", exc)
                outcome = RunOutcome(exc, self.interval + self._jitter(), permanent=True)
            except TemporaryError as exc:
                delay = self.backoff.failure(exc.delay)
                if exc.delay is None:
                    delay += self._jitter()
                log.warning("poll failed (retry in %.1f s): %s", delay, exc)
                outcome = RunOutcome(exc, delay)
            except Exception as exc:
                # A bug or an unconverted library error: back off rather than spin on it.
                delay = self.backoff.failure() + self._jitter()
                log.exception("poll failed unexpectedly (retry in %.1f s)", delay)
                outcome = RunOutcome(exc, delay)
            else:
                self.backoff.reset()
                outcome = RunOutcome(None, self.interval + self._jitter())
            self.last = outcome
        if self._on_outcome is not None:
            try:
                self._on_outcome(outcome)
            except Exception:
                log.exception("reporting the poll outcome failed")
        return outcome

    def _run(self) -> None:
        outcome = self.tick()
        scheduler = self._scheduler
        if scheduler is None or not scheduler.running:
            return
        next_at = datetime.now(UTC) + timedelta(seconds=outcome.delay)
        try:
            scheduler.modify_job(JOB_ID, next_run_time=next_at)
        except Exception:
            # Shutting down under us, or the job was removed: nothing left to schedule.
            log.debug("could not reschedule the poll job", exc_info=True)

    def start(self) -> None:
        """Start polling in a background thread; the first run is immediate."""
        if self._scheduler is not None:
            return
        self._stopped.clear()
        scheduler = BackgroundScheduler(
            executors={"default": {"type": "threadpool", "max_workers": 1}},
            timezone=UTC,
        )
        scheduler.add_job(
            self._run,
            IntervalTrigger(seconds=self.interval, jitter=self.jitter or None, timezone=UTC),
            id=JOB_ID,
            name="fleetlet agent poll",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, round(self.misfire_grace_time)),
            next_run_time=datetime.now(UTC),
        )
        self._scheduler = scheduler
        scheduler.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop scheduling; with ``wait``, return after the current run (if any) ended."""
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

    def __enter__(self) -> Poller:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class OnBranchChange:
    """A ``reconcile`` for :class:`Poller`: poll the branch, and ``apply(commit)`` only when the
    branch is at a commit not settled yet.

    A commit is settled once ``apply`` succeeded or raised a PermanentError for it: the same
    commit is not applied again (an idle poll costs one ref listing) until the branch moves.
    A TemporaryError leaves it unsettled, so the next run tries again. A missing branch raises
    BranchNotFoundError once (settled as ``None``) and then waits for the branch to appear.
    """

    def __init__(
        self,
        *,
        poll: Callable[[], str | None],
        apply: Callable[[str], Any],
        settled: str | None = None,
    ) -> None:
        """``settled`` seeds the last settled commit (e.g. from state kept in the cluster)."""
        self._poll = poll
        self._apply = apply
        self._settled: object = settled if settled is not None else _NOTHING
        self.applied = 0

    @property
    def settled(self) -> str | None:
        return self._settled if isinstance(self._settled, str) else None

    def __call__(self) -> None:
        """Raises what ``poll`` and ``apply`` raise; BranchNotFoundError for a missing branch."""
        commit = self._poll()
        if commit == self._settled:
            return
        if commit is None:
            self._settled = None
            raise BranchNotFoundError("this cluster's branch does not exist (yet) on the server")
        try:
            self.applied += 1
            self._apply(commit)
        except PermanentError:
            self._settled = commit
            raise
        self._settled = commit


_NOTHING = object()
