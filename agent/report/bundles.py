"""The ``BundleDeployment`` objects in the cluster: one per entry of the accepted set.

The spec comes from the set (server-side applied by the agent's field manager, with
``spec.group`` written explicitly so ``kubectl get bd`` shows it); the status says what the
agent is doing and why it stopped. A cluster admin reads everything here without the hub, and
talks back through two annotations: ``fleetlet.io/paused`` and ``fleetlet.io/retry``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from agent.api import (
    API_GROUP,
    API_VERSION,
    BundleDeploymentEntry,
    BundleDeploymentSet,
    format_time,
    to_dict,
)
from agent.fanout import each
from agent.kube import STATE_FIELD_MANAGER, KubeClient, NotFoundError
from agent.report.events import EventRecorder

MANAGED_LABEL = "fleetlet.io/managed-by"
SERIAL_ANNOTATION = "fleetlet.io/serial"
# Who signed the fleet commit the set comes from, as the hub verified it (a commit policy on).
SIGNED_BY_ANNOTATION = "fleetlet.io/source-signed-by"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "BundleDeployment"
MAX_MESSAGE = 32768


class ConditionSpec(NamedTuple):
    """A condition to write: type, status, reason, message."""

    type: str
    status: str
    reason: str
    message: str = ""


class BundleDeployments:
    """Writes BundleDeployment specs and status through ``kube``.

    ``owner`` (the agent's namespace) is the value of the ``fleetlet.io/managed-by`` label:
    an agent lists, and removes, only the BundleDeployments it made.
    """

    def __init__(
        self,
        *,
        kube: KubeClient,
        owner: str,
        clock: Callable[[], datetime] | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        """``events``: where Events about the BundleDeployments are recorded (None: none)."""
        self._kube = kube
        self.owner = owner
        self._clock = clock or (lambda: datetime.now(UTC))
        self._events = events
        self._uids: dict[str, str] = {}
        # The objects the last LIST showed, each replaced by what the server answered to this
        # agent's status write: read instead of a GET before reading a status or writing one.
        self._live: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _ref(self, name: str) -> dict[str, Any]:
        return {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": {"name": name}}

    def publish(self, deployment_set: BundleDeploymentSet) -> None:
        """Apply one BundleDeployment per entry of the set (spec only).

        Raises the KubeClient's errors (ApiNotServedError when the CRDs are not installed).
        """
        annotations = {SERIAL_ANNOTATION: str(deployment_set.serial)}
        signed = deployment_set.source.signed_by
        if signed is not None:
            annotations[SIGNED_BY_ANNOTATION] = (
                f"{signed.principal} {signed.key} commit {deployment_set.source.commit} "
                f"policy {signed.policy}"
            )

        def apply(entry: BundleDeploymentEntry) -> None:
            spec = dict(to_dict(entry.spec))
            spec["group"] = entry.group
            answered = self._kube.apply(
                {
                    "apiVersion": GROUP_VERSION,
                    "kind": KIND,
                    "metadata": {
                        "name": entry.name,
                        "labels": {MANAGED_LABEL: self.owner},
                        "annotations": annotations,
                    },
                    "spec": spec,
                },
                field_manager=STATE_FIELD_MANAGER,
                force=True,
            )
            with self._lock:  # its new generation
                self._live[entry.name] = dict(answered)

        each(apply, deployment_set.bundle_deployments)  # side by side: one object each

    def _managed(self) -> list[dict[str, Any]]:
        found = self._kube.list(GROUP_VERSION, KIND, label_selector=f"{MANAGED_LABEL}={self.owner}")
        # Events name their object by UID too (kubectl describe looks them up by it).
        self._uids = {o["metadata"]["name"]: str(o["metadata"].get("uid") or "") for o in found}
        with self._lock:
            self._live = {str(o["metadata"]["name"]): o for o in found}
        return found

    def _read(self, name: str) -> dict[str, Any] | None:
        """The object as the last LIST showed it (or as the server answered this agent's last
        status write to it, which is newer), else read by name: one the LIST did not show.
        Only this agent writes the status; the spec is written before the LIST of a pass."""
        with self._lock:
            live = self._live.get(name)
        return live if live is not None else self._kube.get(self._ref(name))

    def record(self, name: str, reason: str, message: str, *, warning: bool = False) -> None:
        """Record a Kubernetes Event about BundleDeployment ``name`` (rate-limited and
        aggregated by the recorder; never raises)."""
        if self._events is None:
            return
        obj: dict[str, Any] = {**self._ref(name)}
        uid = self._uids.get(name)
        if uid:
            obj["metadata"] = {"name": name, "uid": uid}
        if warning:
            self._events.warning(obj, reason, message)
        else:
            self._events.normal(obj, reason, message)

    def names(self) -> list[str]:
        """The BundleDeployments this agent manages. Raises the KubeClient's errors."""
        return sorted(o["metadata"]["name"] for o in self._managed())

    def annotations(self) -> dict[str, dict[str, str]]:
        """The annotations of every managed BundleDeployment, by name (one LIST)."""
        return {
            o["metadata"]["name"]: dict(o["metadata"].get("annotations") or {})
            for o in self._managed()
        }

    def status_of(self, name: str) -> dict[str, Any]:
        """The live status of one BundleDeployment (empty when it has none or is missing)."""
        live = self._read(name)
        return dict((live or {}).get("status") or {})

    def delete(self, name: str) -> bool:
        """Delete one BundleDeployment; False when it was already gone."""
        with self._lock:
            self._live.pop(name, None)
        return self._kube.delete(self._ref(name))

    def set_conditions(
        self, name: str, conditions: Iterable[ConditionSpec | Mapping[str, str]], **status: Any
    ) -> None:
        """Write a BundleDeployment's status: the conditions (keeping ``lastTransitionTime``
        of conditions whose status did not change, with the object's generation as
        ``observedGeneration``) and the other ``status`` fields given. What is not given is
        removed (server-side apply of the whole status by one manager). A BundleDeployment
        that does not exist is skipped.

        Raises the KubeClient's errors.
        """
        live = self._read(name)
        if live is None:
            return
        generation = live["metadata"].get("generation", 0)
        previous = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
        now = format_time(self._clock())
        written = []
        for given in conditions:
            c = ConditionSpec(**given) if isinstance(given, Mapping) else given
            old = previous.get(c.type)
            moved = old is None or old.get("status") != c.status
            written.append(
                {
                    "type": c.type,
                    "status": c.status,
                    "reason": c.reason,
                    "message": c.message[:MAX_MESSAGE],
                    "observedGeneration": generation,
                    "lastTransitionTime": now if moved else old["lastTransitionTime"],  # type: ignore[index]
                }
            )
        try:
            answered = self._kube.apply(
                {
                    **self._ref(name),
                    "status": {**status, "observedGeneration": generation, "conditions": written},
                },
                field_manager=STATE_FIELD_MANAGER,
                force=True,
                subresource="status",
            )
        except NotFoundError:
            # Deleted since it was listed: skipped, as one found missing is.
            with self._lock:
                self._live.pop(name, None)
            return
        with self._lock:
            self._live[name] = dict(answered)

    def report_refusal(self, *, reason: str, message: str, commit: str) -> list[str]:
        """Mark every managed BundleDeployment: the newest publication was refused (they keep
        running what they have). Returns the names marked. Raises the KubeClient's errors."""
        names = self.names()
        text = f"publication at commit {commit[:12]} refused: {message}"
        for name in names:
            self.record(name, reason, text, warning=True)
            status = self.status_of(name)
            kept = {
                k: v for k, v in status.items() if k not in ("conditions", "observedGeneration")
            }
            self.set_conditions(
                name,
                [
                    ConditionSpec("Ready", "False", reason, text),
                    ConditionSpec("Degraded", "True", reason, text),
                    ConditionSpec("Progressing", "False", reason, text),
                ],
                **kept,
            )
        return names
