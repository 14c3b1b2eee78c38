"""The agent's one backoff policy: exponential, capped, with jitter.

Two users: the poll and drift jobs (:class:`Backoff`, one failure count per job, :mod:`agent.schedule`)
and the clients that retry one request a few times (registry, http: :func:`pause`). Both spread
their waits at random, so a fleet of agents that lost the same server does not come back to it in
lockstep when it returns.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def delay(attempt: int, *, initial: float, maximum: float) -> float:
    """The wait before retry number ``attempt`` (1-based): ``initial * 2**(attempt-1)``,
    capped at ``maximum`` (the exponent is bounded so a long outage cannot overflow)."""
    return min(initial * 2.0 ** min(max(attempt, 1) - 1, 60), maximum)


def pause(
    attempt: int,
    *,
    initial: float,
    maximum: float = 30.0,
    rng: Callable[[], float] = random.random,
) -> float:
    """The wait before retry ``attempt`` of one request: :func:`delay`, of which the second
    half is drawn at random ("equal jitter": never less than half, never more than the
    delay)."""
    base = delay(attempt, initial=initial, maximum=maximum)
    return base / 2 + base / 2 * rng()


class Backoff:
    """Exponential backoff with a cap: ``initial * 2**(n-1)`` after the n-th failure in a row.

    The scheduler adds its jitter (seconds, at random) on top of what :meth:`failure` returns.
    """

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


__all__ = ["Backoff", "delay", "pause"]
