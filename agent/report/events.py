"""Kubernetes Events about the agent's work, recorded the way client-go's recorder does.

``kubectl describe bd web`` then shows, under *Events*, the group moves, rollbacks, refused
publications, drift corrections and approvals of that bundle. As client-go's
``EventCorrelator`` (``tools/record/events_cache.go``):

- **deduplication**: the same event (object, type, reason, message) again is one Event whose
  ``count`` grows (a merge patch of ``count``, ``lastTimestamp`` and ``message``), not a new one;
- **aggregation**: more than :data:`SIMILAR_LIMIT` events of the same object, type and reason
  but different messages within :data:`SIMILAR_WINDOW` seconds become one Event with the
  message ``(combined from similar events): <latest message>``, counted the same way;
- **rate limit**: a token bucket per object (:data:`BURST` events, then one more every
  :data:`REFILL_SECONDS`); events beyond it are dropped, never queued.

Events about a cluster-scoped object (BundleDeployments are) go to the recorder's
``namespace`` (``default``, as client-go does for cluster-scoped objects); the agent's Role there
allows exactly ``create`` and ``patch`` of Events. Recording never raises: an Event that cannot
be written is logged at debug level and forgotten (the work it describes already happened).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from agent.errors import FleetletError
from agent.kube import KubeClient, NotFoundError, ObjectRef

log = logging.getLogger(__name__)

NORMAL: Final = "Normal"
WARNING: Final = "Warning"
SIMILAR_LIMIT: Final = 10
SIMILAR_WINDOW: Final = 600.0
BURST: Final = 25
REFILL_SECONDS: Final = 300.0
MAX_MESSAGE: Final = 1024
COMBINED_PREFIX: Final = "(combined from similar events): "
_CACHE_SIZE = 4096

# The reasons the agent uses (CamelCase, as Kubernetes' own).
MOVED: Final = "Moved"
ROLLED_BACK: Final = "RolledBack"
DRIFT_CORRECTED: Final = "DriftCorrected"
APPROVAL_REQUESTED: Final = "ApprovalRequested"
APPROVED: Final = "Approved"
DENIED: Final = "Denied"
# A refusal's reason is the verification check's (SignatureInvalid, SerialNotNewer...).


@dataclass
class _Recorded:
    name: str
    namespace: str
    count: int
    first: str


@dataclass
class _Similar:
    messages: set[str]
    last: float


class _Bucket:
    def __init__(self, *, burst: int, refill: float, now: float) -> None:
        self.tokens = float(burst)
        self.burst = burst
        self.refill = refill
        self.at = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) / self.refill)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _Lru(OrderedDict[Any, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class EventRecorder:
    """Writes Events as ``component`` (``source.component`` and ``reportingComponent``);
    ``instance`` is ``reportingInstance`` (the pod's name, say). Thread-safe."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        namespace: str = "default",
        component: str = "fleetlet-agent",
        instance: str | None = None,
        clock: Callable[[], float] = time.time,
        burst: int = BURST,
        refill_seconds: float = REFILL_SECONDS,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._component = component
        self._instance = instance
        self._clock = clock
        self._burst = burst
        self._refill = refill_seconds
        self._lock = threading.Lock()
        self._recorded: _Lru = _Lru(_CACHE_SIZE)
        self._similar: _Lru = _Lru(_CACHE_SIZE)
        self._buckets: _Lru = _Lru(_CACHE_SIZE)
        self._stamp = 0
        self.written = 0  # Events created or patched (tests, metrics)
        self.dropped = 0  # refused by the rate limit

    # --- what the agent records ------------------------------------------------------------

    def normal(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """Record a ``Normal`` event about ``obj`` (a live object: apiVersion, kind,
        metadata.name, and uid when known)."""
        self.event(obj, NORMAL, reason, message)

    def warning(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """Record a ``Warning`` event about ``obj``."""
        self.event(obj, WARNING, reason, message)

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an event of ``type_`` (Normal or Warning); see the module docstring. Never
        raises."""
        try:
            self._event(obj, type_, reason, message[:MAX_MESSAGE])
        except FleetletError as exc:
            log.debug("event %s about %s not recorded: %s", reason, _describe(obj), exc)

    # --- the correlator --------------------------------------------------------------------

    def _event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        involved = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta.get("name"),
            **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
            **({"uid": meta["uid"]} if meta.get("uid") else {}),
            **({"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") else {}),
        }
        namespace = str(meta.get("namespace") or self._namespace)
        source = (
            involved["kind"],
            involved.get("namespace"),
            involved["name"],
            involved.get("uid"),
        )
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(source)
            if bucket is None:
                bucket = _Bucket(burst=self._burst, refill=self._refill, now=now)
                self._buckets.put(source, bucket)
            if not bucket.take(now):
                self.dropped += 1
                return
            similar_key = (*source, type_, reason)
            similar = self._similar.get(similar_key)
            if similar is None or now - similar.last > SIMILAR_WINDOW:
                similar = _Similar(messages=set(), last=now)
            similar.messages.add(message)
            similar.last = now
            self._similar.put(similar_key, similar)
            if len(similar.messages) > SIMILAR_LIMIT:
                key: tuple[Any, ...] = similar_key
                message = COMBINED_PREFIX + message
            else:
                key = (*similar_key, message)
            previous = self._recorded.get(key)
            stamp = _time(now)
            if previous is not None:
                previous.count += 1
                count, name, first = previous.count, previous.name, previous.first
            else:
                count, first = 1, stamp
                # client-go's name: object name and creation time in nanoseconds (kept
                # distinct within this process even when two events share a clock tick).
                self._stamp = max(self._stamp + 1, int(now * 1e9))
                name = f"{involved['name']}.{self._stamp:x}"
            # Reserved before the write: a concurrent same event counts on, never re-creates.
            self._recorded.put(
                key, _Recorded(name=name, namespace=namespace, count=count, first=first)
            )
        if count > 1:
            try:
                self._kube.patch(
                    ObjectRef("v1", "Event", name, namespace),
                    {"count": count, "lastTimestamp": stamp, "message": message},
                )
                self.written += 1
                return
            except NotFoundError:
                pass  # expired (Events live an hour): write it anew, as client-go does
        self._kube.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": involved,
                "type": type_,
                "reason": reason,
                "message": message,
                "count": count,
                "firstTimestamp": first,
                "lastTimestamp": stamp,
                "source": {"component": self._component},
                "reportingComponent": self._component,
                "reportingInstance": self._instance or self._component,
            }
        )
        self.written += 1


def _time(now: float) -> str:
    return datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe(obj: Mapping[str, Any]) -> str:
    return f"{obj.get('kind')} {(obj.get('metadata') or {}).get('name')}"
