"""The BundleDeploymentRequests of this agent: found, created, superseded, pruned.

A request is one lockstep group's next move, pinned (:func:`pins_of`: each bundle's spec
digest and the digest of its rendered objects) to one set (its digest). The agent finds its
request for a move by those pins among the requests labelled with its namespace and the
group, and trusts only those whose ``spec.requestedBy`` is its own user name (the API server
checks that field on creation, so nobody can make a request look like the agent's). Names
are ``<group>-s<serial>-<random>``; a crash after the creation finds the request again by its
pins.

When a request's diffs are cut (:class:`agent.approve.preview.Preview`), the whole diffs go to
a ConfigMap ``fleetlet-preview-<request>`` in the agent's namespace (gzip-compressed JSON),
created before the request that names it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import logging
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from agent.api import API_GROUP, API_VERSION, format_time, from_dict, parse_time, to_dict
from agent.api.approvals import (
    BundleDeploymentRequestSpec,
    BundleDeploymentRequestStatus,
    BundlePin,
)
from agent.approve.preview import Preview
from agent.errors import FleetletError, PermanentError
from agent.kube import STATE_FIELD_MANAGER, ConflictError, KubeClient, NotFoundError

log = logging.getLogger(__name__)

GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "BundleDeploymentRequest"
MANAGED_LABEL = "fleetlet.io/managed-by"
GROUP_LABEL = "fleetlet.io/group"
REQUEST_LABEL = "fleetlet.io/request"
FULL_DIFF_KEY = "diffs.json.gz"
MAX_FULL_DIFF = 900 * 1024
"""Bytes of compressed full diffs one ConfigMap holds (under the 1 MiB object limit)."""
KEEP_DECIDED = 5
"""Decided or superseded requests kept per group (the newest); older ones are deleted."""

State = Literal["Pending", "Approved", "Denied", "Superseded"]
Pins = Mapping[str, BundlePin]


class RequestError(PermanentError):
    """A request cannot be read or written as needed (named, with why)."""

    reason = "ApprovalFailed"


def content_digest(objects: Sequence[Mapping[str, Any]]) -> str:
    """``sha256:<hex>`` of a bundle's rendered objects, in their order: what is applied."""
    data = json.dumps(list(objects), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(data.encode("utf-8")).hexdigest()


def pins_of(
    spec_digests: Mapping[str, str], objects: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, BundlePin]:
    """Each bundle's pin: its spec digest (the gate's target) and its content digest."""
    return {
        name: BundlePin(name=name, spec_digest=digest, content_digest=content_digest(objects[name]))
        for name, digest in sorted(spec_digests.items())
    }


@dataclass(frozen=True, kw_only=True)
class Request:
    """A BundleDeploymentRequest as read from the cluster."""

    name: str
    spec: BundleDeploymentRequestSpec
    status: BundleDeploymentRequestStatus
    created: datetime | None
    resource_version: str

    @property
    def state(self) -> State:
        if self.status.decision is not None:
            return self.status.decision
        if any(c.type == "Superseded" and c.status == "True" for c in self.status.conditions):
            return "Superseded"
        return "Pending"

    def pins(self) -> dict[str, BundlePin]:
        return {p.name: p for p in self.spec.bundles}

    def covers(self, *, set_digest: str, pins: Pins) -> bool:
        """Whether the request is for exactly this set and these pins."""
        return self.spec.set_digest == set_digest and self.pins() == dict(pins)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Request:
        """Parse a live object. Raises ValidationError (a malformed request)."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        return cls(
            name=name,
            spec=from_dict(
                BundleDeploymentRequestSpec, obj.get("spec") or {}, origin=f"{KIND} {name}"
            ),
            status=from_dict(
                BundleDeploymentRequestStatus, obj.get("status") or {}, origin=f"{KIND} {name}"
            ),
            created=parse_time(str(meta.get("creationTimestamp") or "")),
            resource_version=str(meta.get("resourceVersion") or ""),
        )


def ref(name: str) -> dict[str, Any]:
    """The object reference of a request."""
    return {"apiVersion": GROUP_VERSION, "kind": KIND, "metadata": {"name": name}}


def read(kube: KubeClient, name: str) -> Request:
    """One request by name. Raises RequestError (none, or malformed), the KubeClient's
    errors."""
    live = kube.get(ref(name))
    if live is None:
        raise RequestError(f"BundleDeploymentRequest {name} not found")
    try:
        return Request.of(live)
    except FleetletError as exc:
        raise RequestError(f"BundleDeploymentRequest {name} is malformed: {exc}") from exc


def full_diff_name(request: str) -> str:
    return f"fleetlet-preview-{request}"


def read_full_diffs(kube: KubeClient, namespace: str, configmap: str) -> dict[str, str]:
    """The whole diffs a request's ConfigMap keeps (``bundle: Kind ns/name`` -> diff).

    Raises RequestError (missing or unreadable), the KubeClient's errors (ForbiddenError).
    """
    live = kube.get(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": configmap, "namespace": namespace},
        }
    )
    if live is None:
        raise RequestError(f"ConfigMap {namespace}/{configmap} (the full diffs) not found")
    try:
        blob = base64.b64decode((live.get("binaryData") or {})[FULL_DIFF_KEY])
        data = json.loads(gzip.decompress(blob))
    except (KeyError, ValueError, OSError) as exc:
        raise RequestError(f"ConfigMap {namespace}/{configmap}: unreadable diffs ({exc})") from exc
    return {str(k): str(v) for k, v in data.items()}


class Requests:
    """This agent's requests (``owner``: its namespace, the value of their managed-by label).

    Thread-safe: independent groups use it concurrently.
    """

    def __init__(
        self,
        *,
        kube: KubeClient,
        owner: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC).replace(microsecond=0),
    ) -> None:
        self.kube = kube
        self.owner = owner
        self.clock = clock
        self._me: str | None = None
        self._lock = threading.Lock()

    def requested_by(self) -> str:
        """The agent's own user name (asked once). Raises the KubeClient's errors."""
        with self._lock:
            if self._me is None:
                self._me = self.kube.whoami()
            return self._me

    def of_group(self, group: str) -> list[Request]:
        """The group's requests this agent made, newest first (others are ignored, logged).

        Raises the KubeClient's errors.
        """
        return self._mine(f"{MANAGED_LABEL}={self.owner},{GROUP_LABEL}={group}")

    def all(self) -> list[Request]:
        """Every request this agent made, newest first. Raises the KubeClient's errors."""
        return self._mine(f"{MANAGED_LABEL}={self.owner}")

    def _mine(self, selector: str) -> list[Request]:
        me = self.requested_by()
        found = []
        for obj in self.kube.list(GROUP_VERSION, KIND, label_selector=selector):
            name = (obj.get("metadata") or {}).get("name")
            try:
                request = Request.of(obj)
            except FleetletError as exc:
                log.warning("ignoring malformed BundleDeploymentRequest %s: %s", name, exc)
                continue
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if request.spec.requested_by != me or request.spec.group != labels.get(GROUP_LABEL):
                log.warning(
                    "ignoring BundleDeploymentRequest %s: made by %s, not this agent (%s)",
                    name,
                    request.spec.requested_by,
                    me,
                )
                continue
            found.append(request)
        epoch = datetime.min.replace(tzinfo=UTC)
        return sorted(found, key=lambda r: (r.created or epoch, r.name), reverse=True)

    def create(
        self,
        *,
        cluster: str,
        group: str,
        serial: int,
        set_digest: str,
        pins: Pins,
        reasons: Sequence[str],
        preview: Preview,
    ) -> Request:
        """Make a request (and its full-diff ConfigMap when diffs were cut).

        Raises the KubeClient's errors.
        """
        for _ in range(5):
            name = f"{group}-s{serial}-{secrets.token_hex(3)}"
            if self.kube.get(ref(name)) is None:
                break
        labels = {MANAGED_LABEL: self.owner, GROUP_LABEL: group}
        shown = preview.preview
        if preview.full_diffs:
            configmap = full_diff_name(name)
            self._write_full_diffs(configmap, name, preview.full_diffs, labels)
            shown = replace(shown, full_diff=configmap)
        spec = BundleDeploymentRequestSpec(
            cluster=cluster,
            group=group,
            serial=serial,
            set_digest=set_digest,
            requested_by=self.requested_by(),
            bundles=tuple(pins[n] for n in sorted(pins)),
            reasons=tuple(r[:1024] for r in reasons[:64]),
            preview=shown,
        )
        created = self.kube.create(
            {**ref(name), "metadata": {"name": name, "labels": labels}, "spec": to_dict(spec)},
            field_manager=STATE_FIELD_MANAGER,
        )
        return Request.of(created)

    def _write_full_diffs(
        self, name: str, request: str, diffs: Mapping[str, str], labels: Mapping[str, str]
    ) -> None:
        kept = dict(diffs)
        blob = gzip.compress(json.dumps(kept, sort_keys=True).encode("utf-8"))
        while len(blob) > MAX_FULL_DIFF and kept:
            # Too large for one object: keep the first ones, say what was left out.
            drop = list(kept)[len(kept) // 2 :]
            for key in drop:
                kept.pop(key)
            kept["(left out)"] = f"{len(drop)} more diffs were too large to keep"
            blob = gzip.compress(json.dumps(kept, sort_keys=True).encode("utf-8"))
        self.kube.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": self.owner,
                    "labels": {**labels, REQUEST_LABEL: request},
                },
                "binaryData": {FULL_DIFF_KEY: base64.b64encode(blob).decode("ascii")},
            },
            field_manager=STATE_FIELD_MANAGER,
            force=True,
        )

    def supersede(self, request: Request, *, serial: int) -> None:
        """Mark a pending request ``Superseded`` (a newer publication replaced it). A request
        decided meanwhile is left as it is (its decision is final).

        Raises the KubeClient's errors (but not a Conflict: the next pass looks again).
        """
        now = format_time(self.clock())
        body = {
            **ref(request.name),
            "metadata": {"name": request.name, "resourceVersion": request.resource_version},
            "status": {
                "conditions": [
                    {
                        "type": "Superseded",
                        "status": "True",
                        "reason": "NewerPublication",
                        "message": f"serial {serial} replaced it before a decision",
                        "lastTransitionTime": now,
                    }
                ]
            },
        }
        try:
            self.kube.apply(
                body, field_manager=STATE_FIELD_MANAGER, force=True, subresource="status"
            )
        except (ConflictError, NotFoundError) as exc:
            log.info("request %s changed meanwhile, not superseded now: %s", request.name, exc)

    def prune(self, group: str, requests: Sequence[Request], *, keep: int = KEEP_DECIDED) -> None:
        """Delete the group's oldest decided or superseded requests beyond ``keep`` (and
        their full-diff ConfigMaps). Raises the KubeClient's errors."""
        done = [r for r in requests if r.state != "Pending"]
        for request in done[keep:]:
            self.kube.delete(ref(request.name))
            if request.spec.preview.full_diff:
                self.kube.delete(
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {
                            "name": request.spec.preview.full_diff,
                            "namespace": self.owner,
                        },
                    }
                )


__all__ = [
    "GROUP_LABEL",
    "KIND",
    "MANAGED_LABEL",
    "Request",
    "RequestError",
    "Requests",
    "State",
    "content_digest",
    "full_diff_name",
    "pins_of",
    "read",
    "read_full_diffs",
]
