"""What the agent is doing to a group, recorded in the cluster BEFORE it touches the group.

One ConfigMap per lockstep group in the agent's namespace, ``fleetlet-group-<group>``, holds

- the **intent** while a group is being moved: which bundles, from which stored revision (the
  last healthy one, kept by :class:`~agent.apply.store.RevisionStore`) to which target (serial
  and spec digest), and the target's inventory, so that a rollback after a crash knows what
  the interrupted revision may have created, even when the target can no longer be rendered
  (registry or git server down);
- the **failure** of the last target that had to be rolled back, so the agent does not retry
  the same target in a loop: it waits for a newer target or an explicit retry request (or,
  for a refusal the cluster caused, such as a missing namespace or a webhook that is down,
  retries it with backoff);
- the **leftovers**: what a failed first install wrote and left for inspection (there was no
  previous revision to return to), so that whatever the agent ever wrote stays known until
  it is deleted, pruned or handed over.

The intent is written (and read back from the server's answer) before the first write of a
group and deleted only once the group is wholly on one revision again; on start the agent
resumes any intent it finds. The ConfigMap is small: inventories are zlib-compressed JSON.
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.apply.inventory import Inventory
from agent.errors import PermanentError
from agent.kube import STATE_FIELD_MANAGER, KubeClient, ObjectRef

NAME_PREFIX = "fleetlet-group-"
GROUP_LABEL = "fleetlet.io/group-record"
_INTENT_KEY = "intent.json.z"
_FAILURE_KEY = "failure.json"
_LEFTOVERS_KEY = "leftovers.json.z"
_FORMAT = 1

Phase = Literal["applying", "rolling-back"]


class IntentStoreError(PermanentError):
    """A group record in the cluster cannot be read (damaged by hand?); the message names it."""

    reason = "IntentCorrupt"


@dataclass(frozen=True, kw_only=True)
class BundleMove:
    """One bundle of a group move: where it comes from and where it goes."""

    from_revision: int | None
    """Number of its last healthy revision in the store (None: the bundle had none)."""
    target_serial: int
    """Serial of the set the target came with."""
    target_digest: str
    """Digest of the target's spec (what makes a revision the same or another)."""
    target_inventory: Inventory = field(default_factory=Inventory)
    """What the target revision renders to: what it may have created."""


@dataclass(frozen=True, kw_only=True)
class Intent:
    """A group being moved (``applying``) or being returned (``rolling-back``)."""

    group: str
    phase: Phase
    run_ids: Mapping[str, str]
    """The run id of each bundle's move (so a resumed move finishes the same run)."""
    started_at: str
    bundles: Mapping[str, BundleMove]
    failure: str = ""
    """Why a rollback started (``rolling-back`` only)."""
    failure_reason: str = ""
    """The reason of that failure (``HealthCheckFailed``, ``ApplyFailed``...)."""

    def to_json(self) -> dict[str, Any]:
        """As JSON data."""
        return {
            "format": _FORMAT,
            "group": self.group,
            "phase": self.phase,
            "runIds": dict(self.run_ids),
            "startedAt": self.started_at,
            "failure": self.failure,
            "failureReason": self.failure_reason,
            "bundles": {
                name: {
                    "from": move.from_revision,
                    "targetSerial": move.target_serial,
                    "targetDigest": move.target_digest,
                    "targetInventory": move.target_inventory.to_json(),
                }
                for name, move in sorted(self.bundles.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Intent:
        """Parse :meth:`to_json`'s output. Raises KeyError, TypeError, ValueError."""
        phase = str(data["phase"])
        if phase not in ("applying", "rolling-back"):
            raise ValueError(f"unknown phase {phase!r}")
        return cls(
            group=str(data["group"]),
            phase=phase,  # type: ignore[arg-type]
            run_ids={str(k): str(v) for k, v in dict(data.get("runIds") or {}).items()},
            started_at=str(data["startedAt"]),
            failure=str(data.get("failure") or ""),
            failure_reason=str(data.get("failureReason") or ""),
            bundles={
                str(name): BundleMove(
                    from_revision=None if move["from"] is None else int(move["from"]),
                    target_serial=int(move["targetSerial"]),
                    target_digest=str(move["targetDigest"]),
                    target_inventory=Inventory.from_json(move["targetInventory"]),
                )
                for name, move in dict(data["bundles"]).items()
            },
        )


@dataclass(frozen=True, kw_only=True)
class FailedTarget:
    """A target that failed and was rolled back (or could not be applied): not retried until
    the target changes or a BundleDeployment of the group asks for a retry, except a failure
    the cluster caused (``retry_at``), which is retried by itself with backoff."""

    target: str
    """Digest over the group's bundle targets."""
    serial: int
    reason: str
    message: str
    retry_tokens: Mapping[str, str] = field(default_factory=dict)
    """The ``fleetlet.io/retry`` annotation of each bundle when the failure was recorded: a
    changed value asks for another attempt."""
    attempts: int = 1
    """How many times this target failed in a row."""
    retry_at: str | None = None
    """When (RFC 3339) the agent tries the same target again by itself; None: only a new
    target or a retry annotation moves it."""

    def to_json(self) -> dict[str, Any]:
        """As JSON data."""
        data: dict[str, Any] = {
            "target": self.target,
            "serial": self.serial,
            "reason": self.reason,
            "message": self.message,
            "retryTokens": dict(self.retry_tokens),
            "attempts": self.attempts,
        }
        if self.retry_at:
            data["retryAt"] = self.retry_at
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailedTarget:
        """Parse :meth:`to_json`'s output. Raises KeyError, TypeError, ValueError."""
        return cls(
            target=str(data["target"]),
            serial=int(data["serial"]),
            reason=str(data["reason"]),
            message=str(data.get("message") or ""),
            retry_tokens={str(k): str(v) for k, v in dict(data.get("retryTokens") or {}).items()},
            attempts=int(data.get("attempts") or 1),
            retry_at=str(data["retryAt"]) if data.get("retryAt") else None,
        )


@dataclass(frozen=True, kw_only=True)
class GroupRecord:
    """What the cluster remembers of one group."""

    intent: Intent | None = None
    failure: FailedTarget | None = None
    leftovers: Mapping[str, Inventory] = field(default_factory=dict)
    """Per bundle, objects a failed move wrote and left (a first install has nothing to return
    to): pruned by the next successful move, deleted when the bundle is removed."""

    @property
    def empty(self) -> bool:
        return self.intent is None and self.failure is None and not self.leftovers


class GroupRecords:
    """Group records as ConfigMaps in ``namespace``, written through ``kube``."""

    def __init__(self, kube: KubeClient, *, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self._lock = threading.Lock()
        self._listed: dict[str, Mapping[str, Any]] = {}

    def _ref(self, group: str) -> ObjectRef:
        return ObjectRef("v1", "ConfigMap", NAME_PREFIX + group, self.namespace)

    def load(self, group: str) -> GroupRecord:
        """The record of ``group`` (empty when there is none): the one :meth:`prefetch` listed,
        the first time after it, else read by name.

        Raises IntentStoreError, ApiUnavailableError, KubeApiError.
        """
        with self._lock:
            live = self._listed.pop(group, None)
        if live is None:
            live = self.kube.get(self._ref(group))
        return self._parse(group, live) if live is not None else GroupRecord()

    def _list(self) -> dict[str, Mapping[str, Any]]:
        """Every group record ConfigMap, by name (one LIST)."""
        found = self.kube.list(
            "v1", "ConfigMap", namespace=self.namespace, label_selector=GROUP_LABEL
        )
        return {str(o["metadata"]["name"]): o for o in found}

    def prefetch(self, groups: Iterable[str]) -> None:
        """List the records of ``groups`` at once (one LIST instead of a GET each): the next
        :meth:`load` of each takes the listed one, once; later loads read by name again. A
        record the LIST does not show (say, its label edited away) is read by name. Every
        record is parsed and checked as a read by name is. Only this process writes the
        records (the worker holds the lease), and :meth:`save` and :meth:`delete` drop what
        was listed for their group. Raises ApiUnavailableError, KubeApiError."""
        listed = self._list()
        with self._lock:
            self._listed = {g: listed[NAME_PREFIX + g] for g in groups if NAME_PREFIX + g in listed}

    def forget_listed(self) -> None:
        """Drop what :meth:`prefetch` listed and no load took (the end of a pass)."""
        with self._lock:
            self._listed = {}

    def load_all(self, groups: Iterable[str]) -> list[GroupRecord]:
        """The records of ``groups``, in order, read with one LIST (one the LIST does not show
        is read by name). Raises IntentStoreError, ApiUnavailableError, KubeApiError."""
        listed = self._list()
        return [
            self._parse(g, listed[NAME_PREFIX + g]) if NAME_PREFIX + g in listed else self.load(g)
            for g in groups
        ]

    def _parse(self, group: str, live: Mapping[str, Any]) -> GroupRecord:
        where = f"ConfigMap {self.namespace}/{NAME_PREFIX}{group}"
        try:
            packed = (live.get("binaryData") or {}).get(_INTENT_KEY)
            intent = (
                Intent.from_json(json.loads(zlib.decompress(base64.b64decode(packed))))
                if packed
                else None
            )
            raw = (live.get("data") or {}).get(_FAILURE_KEY)
            failure = FailedTarget.from_json(json.loads(raw)) if raw else None
            packed = (live.get("binaryData") or {}).get(_LEFTOVERS_KEY)
            leftovers = (
                {
                    str(bundle): Inventory.from_json(entries)
                    for bundle, entries in json.loads(
                        zlib.decompress(base64.b64decode(packed))
                    ).items()
                }
                if packed
                else {}
            )
        except (KeyError, TypeError, ValueError, AttributeError, zlib.error) as exc:
            raise IntentStoreError(f"{where}: unreadable group record ({exc})") from exc
        return GroupRecord(intent=intent, failure=failure, leftovers=leftovers)

    def delete(self, group: str) -> None:
        """Forget a group (removed from the set). Raises ApiUnavailableError, KubeApiError."""
        with self._lock:
            self._listed.pop(group, None)
        self.kube.delete(self._ref(group))

    def groups(self) -> list[str]:
        """Groups that have a record. Raises ApiUnavailableError, KubeApiError."""
        found = self.kube.list(
            "v1", "ConfigMap", namespace=self.namespace, label_selector=GROUP_LABEL
        )
        return sorted(str(o["metadata"]["labels"][GROUP_LABEL]) for o in found)

    def save(self, group: str, record: GroupRecord) -> None:
        """Store ``record`` (the whole record: what it leaves out is removed); an empty record
        deletes the ConfigMap. Raises ApiUnavailableError, KubeApiError."""
        with self._lock:
            self._listed.pop(group, None)
        if record.empty:
            self.kube.delete(self._ref(group))
            return
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": NAME_PREFIX + group,
                "namespace": self.namespace,
                "labels": {GROUP_LABEL: group, "app.kubernetes.io/name": "fleetlet"},
            },
            "data": {},
            "binaryData": {},
        }
        if record.intent is not None:
            text = json.dumps(record.intent.to_json(), sort_keys=True, separators=(",", ":"))
            body["binaryData"][_INTENT_KEY] = base64.b64encode(
                zlib.compress(text.encode(), 6)
            ).decode("ascii")
        if record.failure is not None:
            body["data"][_FAILURE_KEY] = json.dumps(record.failure.to_json(), sort_keys=True)
        if record.leftovers:
            text = json.dumps(
                {b: inv.to_json() for b, inv in sorted(record.leftovers.items()) if len(inv)},
                sort_keys=True,
                separators=(",", ":"),
            )
            body["binaryData"][_LEFTOVERS_KEY] = base64.b64encode(
                zlib.compress(text.encode(), 6)
            ).decode("ascii")
        # Ours alone; a full apply with force also drops keys we no longer send.
        self.kube.apply(body, field_manager=STATE_FIELD_MANAGER, force=True)
