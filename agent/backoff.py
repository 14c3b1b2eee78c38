"""The one backoff policy of fleetlet: exponential, capped, with optional jitter.

Every retry of the agent and the hub waits by it: the registry, http and status clients retry
a request a few times (:func:`attempts`), the scheduler's jobs back off after a failed run
(:class:`Backoff`), the status pusher waits between failed pushes without blocking
(:func:`pause`), waits for a condition poll less and less often (:func:`delay`). A library
(tenacity, stamina) would bring its own decorator vocabulary for what is here a formula and a
loop; the edge agent's footprint is measured, so it stays a few lines of our own.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator


def delay(attempt: int, *, initial: float, maximum: float) -> float:
    """The wait before retry number ``attempt`` (1-based): ``initial * 2**(attempt-1)``,
    capped at ``maximum`` (the exponent is bounded so a long outage cannot overflow)."""
    return min(initial * 2.0 ** min(max(attempt, 1) - 1, 60), maximum)


def attempts(
    count: int,
    *,
    initial: float,
    maximum: float = 30.0,
    jitter: float = 0.1,
    sleep: Callable[[float], None] = time.sleep,
    rng: Callable[[], float] = random.random,
) -> Iterator[int]:
    """Attempt numbers ``0 .. count-1``, sleeping before each retry the :func:`delay` plus up
    to ``jitter`` of it at random (so clients that failed together do not retry together)::

        for attempt in attempts(3, initial=0.5):
            try:
                return request()
            except Unreachable:
                continue
    """
    for attempt in range(count):
        if attempt:
            wait = delay(attempt, initial=initial, maximum=maximum)
            sleep(wait * (1.0 + jitter * rng()))
        yield attempt


def pause(
    attempt: int,
    *,
    initial: float,
    maximum: float = 30.0,
    rng: Callable[[], float] = random.random,
) -> float:
    """The wait before retry ``attempt`` (1-based), for a caller that schedules rather than
    sleeps: :func:`delay`, of which the second half is drawn at random ("equal jitter": never
    less than half the delay, never more)."""
    base = delay(attempt, initial=initial, maximum=maximum)
    return base / 2 + base / 2 * rng()


class Backoff:
    """The backoff of a loop that keeps failing: :meth:`failure` counts one more failure in a
    row and gives the next wait, :meth:`reset` starts over after a success."""

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
        return delay(self.failures, initial=self.initial, maximum=self.maximum)

    def reset(self) -> None:
        self.failures = 0


__all__ = ["Backoff", "attempts", "delay", "pause"]
