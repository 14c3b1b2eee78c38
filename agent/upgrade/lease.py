"""Which agent acts in the cluster: the ``coordination.k8s.io`` Lease :data:`LEASE_NAME`.

The acting agent holds it (``spec.holderIdentity``) and renews it; a candidate agent never acts
before it holds it. The upgrade's handshake rides on the Lease's annotations, so both agents
read one object: the candidate says it checked itself (:data:`READY`) or why it could not
(:data:`FAILED`); the acting agent hands the Lease over; the candidate says it proved itself
with one sync (:data:`PROVEN`). Every write is a merge patch carrying the ``resourceVersion``
read: of two writers one wins and the other reads again.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.kube import ConflictError, KubeClient, NotFoundError

LEASE_NAME = "fleetlet-agent"
DURATION = 15
"""Seconds a holder that stopped renewing keeps the Lease (a crashed agent's is taken after)."""
READY = "fleetlet.io/candidate-ready"
FAILED = "fleetlet.io/candidate-failed"
PROVEN = "fleetlet.io/candidate-proven"
IDENTITY = "fleetlet.io/candidate-identity"
"""Who the candidate is (its holder identity): where the acting agent cannot tell (a pod)."""
_HANDSHAKE = (READY, FAILED, PROVEN, IDENTITY)


@dataclass(frozen=True, slots=True)
class LeaseView:
    holder: str
    renewed: float
    annotations: dict[str, str]
    version: str

    def expired(self, now: float) -> bool:
        return now - self.renewed > DURATION


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

    def __init__(self, kube: KubeClient, namespace: str, identity: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.identity = identity

    def _ref(self) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE_NAME, "namespace": self.namespace},
        }

    def read(self) -> LeaseView | None:
        live = self.kube.get(self._ref())
        if live is None:
            return None
        spec = live.get("spec") or {}
        meta = live.get("metadata") or {}
        return LeaseView(
            holder=str(spec.get("holderIdentity") or ""),
            renewed=_parse(spec.get("renewTime")),
            annotations=dict(meta.get("annotations") or {}),
            version=str(meta.get("resourceVersion") or ""),
        )

    def acquire(self, *, wait: float, stopped: Any = None) -> bool:
        """Hold the Lease: at once when free, ours or expired; else wait up to ``wait`` seconds
        for it to expire. Returns whether it is held."""
        deadline = time.monotonic() + wait
        while True:
            view = self.read()
            now = time.time()
            if view is None:
                try:
                    self.kube.create(
                        {
                            **self._ref(),
                            "spec": {
                                "holderIdentity": self.identity,
                                "leaseDurationSeconds": DURATION,
                                "acquireTime": _micro(now),
                                "renewTime": _micro(now),
                            },
                        }
                    )
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
                "leaseDurationSeconds": DURATION,
                "acquireTime": _micro(now),
                "renewTime": _micro(now),
            },
        }
        try:
            self.kube.patch(self._ref(), patch)
        except (ConflictError, NotFoundError):
            return False
        return True

    def renew(self) -> bool:
        """Renew the Lease if this agent holds it; False when another does."""
        view = self.read()
        if view is None or view.holder != self.identity:
            return False
        try:
            self.kube.patch(
                self._ref(),
                {
                    "metadata": {"resourceVersion": view.version},
                    "spec": {"renewTime": _micro(time.time())},
                },
            )
        except ConflictError:
            return self.renew()
        return True

    def say(self, key: str, value: str) -> None:
        """Set one handshake annotation (the candidate's word)."""
        self.kube.patch(self._ref(), {"metadata": {"annotations": {key: value[:1024]}}})


__all__ = [
    "DURATION",
    "FAILED",
    "IDENTITY",
    "LEASE_NAME",
    "PROVEN",
    "READY",
    "AgentLease",
    "LeaseView",
]
