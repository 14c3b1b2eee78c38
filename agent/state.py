"""What the agent remembers in its cluster between runs: its anti-rollback memory and the set
it accepted last.

:class:`ClusterState` keeps :class:`AgentState` (the last accepted serial, the accepted commit,
a refused commit and why) in a ConfigMap of the agent's namespace, and the accepted set beside
it, so a restarted or re-scheduled agent refuses replays and keeps running what it accepted,
even with the git server away.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agent.api import BundleDeploymentSet, canonical_bytes, set_from_dict, set_to_dict
from agent.errors import PermanentError, ValidationError
from agent.kube import STATE_FIELD_MANAGER, KubeClient

STATE_NAME = "fleetlet-agent-state"


@dataclass(frozen=True, kw_only=True)
class AgentState:
    """What the agent remembers between runs (persisted by :class:`ClusterState`)."""

    last_serial: int | None = None
    """The highest serial accepted; anything not greater is refused as a replay."""
    commit: str | None = None
    """The branch commit whose publication was accepted last."""
    content_digest: str | None = None
    """Digest of the accepted set's bundles and groups (serial and times left out), so a
    refresh with identical content only advances the serial."""
    refused_commit: str | None = None
    """A commit whose publication was refused: not retried until the branch moves."""
    refusal_reason: str | None = None
    refusal_message: str | None = None
    refused_under: str | None = None
    """The trust policy the refusal was made under: a changed policy (the operator fixed the
    agent's configuration) retries the same commit."""
    refused_at: str | None = None
    """When the refusal was made (RFC 3339)."""
    last_poll: str | None = None


class ClusterState:
    """The agent's state in a ConfigMap of its own namespace, written with server-side apply."""

    def __init__(self, *, kube: KubeClient, namespace: str, name: str = STATE_NAME) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name

    def load(self) -> AgentState:
        """The stored state (empty on first start). Raises the KubeClient's errors."""
        live = self._kube.get(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self._metadata()}
        )
        if live is None:
            return AgentState()
        raw = (live.get("data") or {}).get("state")
        try:
            data = json.loads(raw) if raw else {}
            return AgentState(**{k: v for k, v in data.items() if k in _STATE_FIELDS})
        except (ValueError, TypeError) as exc:
            # A state we cannot read must not silently reset anti-rollback memory.
            raise PermanentError(
                f"ConfigMap {self._namespace}/{self._name}: unreadable agent state ({exc})"
            ) from exc

    def save(self, state: AgentState) -> None:
        """Store ``state``. Raises the KubeClient's errors."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {**self._metadata(), "labels": {"app.kubernetes.io/name": "fleetlet"}},
            "data": {"state": json.dumps(state.__dict__, sort_keys=True)},
        }
        self._kube.apply(body, field_manager=STATE_FIELD_MANAGER, force=True)

    def _metadata(self) -> dict[str, str]:
        return {"name": self._name, "namespace": self._namespace}

    def _set_ref(self) -> dict[str, Any]:
        meta = {"name": f"{self._name}-set", "namespace": self._namespace}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}

    def load_set(self) -> BundleDeploymentSet | None:
        """The last accepted set (None before the first): what the agent keeps running,
        known after a restart without the git server. Raises PermanentError (unreadable),
        the KubeClient's errors."""
        live = self._kube.get(self._set_ref())
        raw = ((live or {}).get("data") or {}).get("set.json")
        if not raw:
            return None
        try:
            return set_from_dict(json.loads(raw), origin=f"ConfigMap {self._name}-set")
        except (ValueError, ValidationError) as exc:
            raise PermanentError(
                f"ConfigMap {self._namespace}/{self._name}-set: unreadable accepted set ({exc})"
            ) from exc

    def save_set(self, deployment_set: BundleDeploymentSet) -> None:
        """Keep the accepted set (verified before, so it is trusted as the cluster is).
        Raises the KubeClient's errors."""
        body = self._set_ref()
        body["metadata"]["labels"] = {"app.kubernetes.io/name": "fleetlet"}
        body["data"] = {"set.json": canonical_bytes(set_to_dict(deployment_set)).decode()}
        self._kube.apply(body, field_manager=STATE_FIELD_MANAGER, force=True)


_STATE_FIELDS = frozenset(AgentState.__dataclass_fields__)


__all__ = ["STATE_NAME", "AgentState", "ClusterState"]
