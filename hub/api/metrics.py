"""The hub's Prometheus metrics: ``/metrics`` of ``hub serve``, and ``hub publish``'s own.

:class:`HubMetrics` holds every metric in its own registry. ``hub serve`` records each status
refresh (:meth:`HubMetrics.refreshed`) and, after it, the fleet's state counts
(:meth:`HubMetrics.observe_fleet`: one pass over the aggregated view, so a scrape costs
nothing). ``hub publish`` is a batch job: it records :meth:`HubMetrics.published` and writes
the registry to a file for node-exporter's textfile collector (``--metrics-file``), the usual
way to export a job's metrics without a server.

Names follow the Prometheus conventions: ``fleetlet_hub_`` prefix, ``_total`` counters, base
units, bounded label values (states and results, never cluster names).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from hub.status.aggregate import FleetStatus
from hub.status.document import STATES

PREFIX = "fleetlet_hub"
CLUSTER_STATES = (*STATES, "Unknown")
"""A cluster's state is the worst state of its installations (Stale first), ``Unknown`` while
it reported none."""
# Worst first: a cluster with one degraded installation is Degraded.
_SEVERITY = ("Stale", "Degraded", "RolledBack", "Progressing", "Paused", "Ready")
_REFRESH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60)
_PUBLISH_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class HubMetrics:
    """Every metric of one hub process, in ``registry`` (a new one by default)."""

    content_type = CONTENT_TYPE_LATEST
    """The ``Content-Type`` of :meth:`exposition`."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._clock = clock
        r = self.registry
        self.clusters = Gauge(
            f"{PREFIX}_clusters",
            "Clusters by state: the worst state of their installations (Stale first), "
            "Unknown while they reported none.",
            ["state"],
            registry=r,
        )
        self.installations = Gauge(
            f"{PREFIX}_installations",
            "Installations (cluster x bundle) by state.",
            ["state"],
            registry=r,
        )
        self.stale = Gauge(
            f"{PREFIX}_stale_clusters",
            "Clusters whose last status is older than --stale-after.",
            registry=r,
        )
        self.refreshes = Counter(
            f"{PREFIX}_status_refreshes_total",
            "Refreshes of the aggregated status from git, by result (success, failure).",
            ["result"],
            registry=r,
        )
        self.refresh_duration = Histogram(
            f"{PREFIX}_status_refresh_duration_seconds",
            "Time to aggregate the agents' status branches (one listing, fetch what moved).",
            buckets=_REFRESH_BUCKETS,
            registry=r,
        )
        self.last_refresh = Gauge(
            f"{PREFIX}_status_last_refresh_timestamp_seconds",
            "Unix time of the last successful status refresh.",
            registry=r,
        )
        self.publishes = Counter(
            f"{PREFIX}_publishes_total",
            "Publications, by result (success, failure).",
            ["result"],
            registry=r,
        )
        self.publish_duration = Histogram(
            f"{PREFIX}_publish_duration_seconds",
            "Time of a whole publication: resolve, render, sign, push.",
            buckets=_PUBLISH_BUCKETS,
            registry=r,
        )
        self.published_clusters = Gauge(
            f"{PREFIX}_published_clusters",
            "Clusters of the last publication, by what happened to their branch (added, "
            "changed, refreshed, unchanged, orphaned).",
            ["change"],
            registry=r,
        )
        self.last_publish = Gauge(
            f"{PREFIX}_publish_last_success_timestamp_seconds",
            "Unix time of the last successful publication.",
            registry=r,
        )
        for state in CLUSTER_STATES:
            self.clusters.labels(state=state)
        for state in STATES:
            self.installations.labels(state=state)
        for result in ("success", "failure"):
            self.refreshes.labels(result=result)
            self.publishes.labels(result=result)

    # --- hub serve ---------------------------------------------------------------------------

    def refreshed(self, seconds: float, *, ok: bool) -> None:
        """A status refresh took ``seconds`` and succeeded or failed."""
        self.refreshes.labels(result="success" if ok else "failure").inc()
        if ok:
            self.refresh_duration.observe(seconds)
            self.last_refresh.set(self._clock())

    def observe_fleet(self, status: FleetStatus, *, now: datetime | None = None) -> None:
        """Count clusters and installations by state in ``status`` (one pass over its view)."""
        now = now or datetime.now(UTC)
        summaries = status.clusters(now=now)
        by_cluster: dict[str, list[str]] = {}
        installations = dict.fromkeys(STATES, 0)
        for summary in summaries:
            # The view's compact states: no status document is read (100,000 of them would be).
            states = list((status.cells(summary["name"], now=now) or {}).values())
            by_cluster[summary["name"]] = states
            for state in states:
                installations[state] = installations.get(state, 0) + 1
        clusters = dict.fromkeys(CLUSTER_STATES, 0)
        stale = 0
        for summary in summaries:
            states = by_cluster.get(summary["name"], [])
            if summary["stale"]:
                stale += 1
                clusters["Stale"] += 1
            else:
                clusters[cluster_state(states)] += 1
        _set_all(self.clusters, clusters)
        _set_all(self.installations, installations)
        self.stale.set(stale)

    # --- hub publish -------------------------------------------------------------------------

    def published(
        self, seconds: float, *, ok: bool, clusters: Mapping[str, int] | None = None
    ) -> None:
        """A publication took ``seconds`` and succeeded or failed; ``clusters``: how many
        clusters were added, changed, refreshed, unchanged, orphaned."""
        self.publishes.labels(result="success" if ok else "failure").inc()
        self.publish_duration.observe(seconds)
        if ok:
            self.last_publish.set(self._clock())
            for change, count in (clusters or {}).items():
                self.published_clusters.labels(change=change).set(count)

    def write(self, path: Path) -> None:
        """Write the metrics to ``path`` atomically (node-exporter's textfile collector reads
        ``*.prom`` files and must never see half a file). Raises OSError."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(self.exposition())
        os.replace(tmp, path)

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format (:attr:`content_type`)."""
        return generate_latest(self.registry)


def cluster_state(installation_states: list[str]) -> str:
    """The worst of a cluster's installation states; ``Unknown`` for none."""
    for state in _SEVERITY:
        if state in installation_states:
            return state
    return "Unknown"


def _set_all(gauge: Any, values: Mapping[str, int]) -> None:
    for label, value in values.items():
        gauge.labels(state=label).set(value)
