"""Which agent acts in the cluster: the ``coordination.k8s.io`` Lease :data:`LEASE_NAME`.

The acting agent holds it (``spec.holderIdentity``) and renews it; a candidate agent never acts
before it holds it. The upgrade's handshake rides on the Lease's annotations, so both agents
read one object: the candidate says it checked itself (:data:`READY`) or why it could not
(:data:`FAILED`); the acting agent hands the Lease over; the candidate says it proved itself
with one sync (:data:`PROVEN`). Every write is a merge patch carrying the ``resourceVersion``
read: of two writers one wins and the other reads again.

The holder renews every third of the Lease's duration (:data:`DURATION`, 30 s), with one
request: a patch carrying the ``resourceVersion`` of its own last write (a conflict means
someone else wrote the Lease: it reads it and tries again). The client is the supervisor's
small door (:class:`agent.runner.objects.ObjectDoor`) or a :class:`agent.kube.KubeClient`.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from agent.kube import ConflictError, NotFoundError

LEASE_NAME = "fleetlet-agent"
ENV_DURATION = "FLEETLET_AGENT_LEASE_DURATION"
DURATION = 30
"""Seconds a holder that stopped renewing keeps the Lease (a crashed agent's is taken after);
``FLEETLET_AGENT_LEASE_DURATION`` sets another (the footprint bench scales it with its jobs)."""
READY = "fleetlet.io/candidate-ready"
FAILED = "fleetlet.io/candidate-failed"
PROVEN = "fleetlet.io/candidate-proven"
_HANDSHAKE = (READY, FAILED, PROVEN)


class ObjectClient(Protocol):
    """What the Lease and the upgrade's ConfigMap need of a client (plain-dict objects; the
    errors of :mod:`agent.kube`)."""

    def get(self, obj: Any) -> Any: ...
    def create(self, obj: Any) -> Any: ...
    def patch(self, obj: Any, patch: Any) -> Any: ...


def lease_duration() -> int:
    """:data:`DURATION`, or ``FLEETLET_AGENT_LEASE_DURATION`` (whole seconds, at least 1)."""
    try:
        return max(1, int(os.environ.get(ENV_DURATION) or DURATION))
    except ValueError:
        return DURATION


@dataclass(frozen=True, slots=True)
class LeaseView:
    holder: str
    renewed: float
    annotations: dict[str, str]
    version: str
    duration: float = DURATION
    """The holder's ``leaseDurationSeconds``: how long its renewal holds."""

    def expired(self, now: float) -> bool:
        return now - self.renewed > self.duration


def _micro(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: Any) -> float:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def _gone(holder: str) -> bool:
    """Whether ``holder`` was a process of this host that no longer runs (a restarted agent
    need not wait for its crashed predecessor's Lease to expire)."""
    host, _, pid = holder.rpartition("-")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


class AgentLease:
    """The Lease as one agent (``identity``) sees it."""

    def __init__(self, kube: ObjectClient, namespace: str, identity: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.identity = identity
        self.duration = lease_duration()
        self.renew_every = self.duration / 3
        """Seconds between renewals: a third of the duration (two may fail before it lapses)."""
        self._last: LeaseView | None = None
        """The Lease as this agent's last write or read left it."""

    def _ref(self) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE_NAME, "namespace": self.namespace},
        }

    def read(self) -> LeaseView | None:
        return self._seen(self.kube.get(self._ref()))

    def _seen(self, live: Any) -> LeaseView | None:
        if not live:
            self._last = None
            return None
        spec = live.get("spec") or {}
        meta = live.get("metadata") or {}
        try:
            duration = float(spec.get("leaseDurationSeconds") or DURATION)
        except (TypeError, ValueError):
            duration = DURATION
        self._last = LeaseView(
            holder=str(spec.get("holderIdentity") or ""),
            renewed=_parse(spec.get("renewTime")),
            annotations=dict(meta.get("annotations") or {}),
            version=str(meta.get("resourceVersion") or ""),
            duration=duration,
        )
        return self._last

    def acquire(self, *, wait: float, stopped: Any = None) -> bool:
        """Hold the Lease: at once when free, ours or expired; else wait up to ``wait`` seconds
        for it to expire. Returns whether it is held."""
        deadline = time.monotonic() + wait
        while True:
            view = self.read()
            now = time.time()
            if view is None:
                try:
                    created = self.kube.create(
                        {
                            **self._ref(),
                            "spec": {
                                "holderIdentity": self.identity,
                                "leaseDurationSeconds": self.duration,
                                "acquireTime": _micro(now),
                                "renewTime": _micro(now),
                            },
                        }
                    )
                    self._seen(created)
                    return True
                except ConflictError:
                    continue
            elif view.holder in (self.identity, "") or view.expired(now) or _gone(view.holder):
                if self.hand_to(self.identity, view=view):
                    return True
                continue
            if time.monotonic() > deadline or (stopped is not None and stopped.is_set()):
                return False
            time.sleep(1.0)

    def hand_to(self, holder: str, *, view: LeaseView | None = None) -> bool:
        """Give the Lease to ``holder``, the handshake annotations cleared (False: it moved
        meanwhile)."""
        view = view or self.read()
        now = time.time()
        patch = {
            "metadata": {
                "resourceVersion": view.version if view else None,
                "annotations": dict.fromkeys(_HANDSHAKE),
            },
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": self.duration,
                "acquireTime": _micro(now),
                "renewTime": _micro(now),
            },
        }
        try:
            self._seen(self.kube.patch(self._ref(), patch))
        except (ConflictError, NotFoundError):
            self._last = None
            return False
        return True

    def renew(self) -> bool:
        """Renew the Lease if this agent holds it; False when another does (or it is gone).

        One request while nobody else wrote the Lease since this agent's last write (the
        patch carries that write's ``resourceVersion``); after a conflict it reads the Lease
        and tries again."""
        for _ in range(5):
            view = self._last or self.read()
            if view is None or view.holder != self.identity:
                return False
            try:
                self._seen(
                    self.kube.patch(
                        self._ref(),
                        {
                            "metadata": {"resourceVersion": view.version},
                            "spec": {"renewTime": _micro(time.time())},
                        },
                    )
                )
                return True
            except ConflictError:
                self._last = None  # written by another (a candidate's word): read it again
            except NotFoundError:
                self._last = None
                return False
        return False

    def say(self, key: str, value: str) -> None:
        """Set one handshake annotation (the candidate's word)."""
        self._seen(self.kube.patch(self._ref(), {"metadata": {"annotations": {key: value[:1024]}}}))


__all__ = [
    "DURATION",
    "ENV_DURATION",
    "FAILED",
    "LEASE_NAME",
    "PROVEN",
    "READY",
    "AgentLease",
    "LeaseView",
    "ObjectClient",
    "lease_duration",
]
