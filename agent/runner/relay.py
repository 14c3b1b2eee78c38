"""Metrics recorded in a worker, replayed in the supervisor that serves ``/metrics``.

A worker records into a :class:`RecordingMetrics` (the real :class:`~agent.report.metrics.Metrics`
that also keeps each call of a recording method); its result carries the calls, and
:func:`replay` makes the same calls on the supervisor's metrics. Counters and histograms then
add up across workers as they would in one long-lived process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent.report.metrics import Metrics

RELAYED = frozenset(
    {
        "poll_finished",
        "sync_finished",
        "serial_accepted",
        "group_moved",
        "rolled_back",
        "health_waited",
        "refused",
        "drift_corrected",
        "cache_lookup",
    }
)
"""The recording methods a worker's calls of are replayed (the status pushes are the
supervisor's own)."""

Call = tuple[str, tuple[Any, ...], Mapping[str, Any]]


class RecordingMetrics(Metrics):
    """:class:`Metrics` that also keeps every call of a :data:`RELAYED` method in ``calls``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[Call] = []

    def _keep(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def poll_finished(self, outcome: str, seconds: float | None = None) -> None:
        self._keep("poll_finished", outcome, seconds)
        super().poll_finished(outcome, seconds)

    def sync_finished(self, result: str, seconds: float) -> None:
        self._keep("sync_finished", result, seconds)
        super().sync_finished(result, seconds)

    def serial_accepted(self, serial: int) -> None:
        self._keep("serial_accepted", serial)
        super().serial_accepted(serial)

    def group_moved(self, group: str) -> None:
        self._keep("group_moved", group)
        super().group_moved(group)

    def rolled_back(self, group: str) -> None:
        self._keep("rolled_back", group)
        super().rolled_back(group)

    def health_waited(self, seconds: float, *, healthy: bool) -> None:
        self._keep("health_waited", seconds, healthy=healthy)
        super().health_waited(seconds, healthy=healthy)

    def refused(self, reason: str) -> None:
        self._keep("refused", reason)
        super().refused(reason)

    def drift_corrected(self, objects: int) -> None:
        self._keep("drift_corrected", objects)
        super().drift_corrected(objects)

    def cache_lookup(self, *, hit: bool) -> None:
        self._keep("cache_lookup", hit=hit)
        super().cache_lookup(hit=hit)


def replay(metrics: Metrics, calls: Iterable[Call]) -> None:
    """Make each relayed call on ``metrics``; others (an older or newer worker's) are
    skipped, as are calls whose arguments the method refuses."""
    for name, args, kwargs in calls:
        if name not in RELAYED:
            continue
        try:
            getattr(metrics, name)(*args, **kwargs)
        except (TypeError, ValueError):
            continue


__all__ = ["RELAYED", "RecordingMetrics", "replay"]
