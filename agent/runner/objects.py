"""Single objects through the supervisor's small door (:mod:`agent.runner.reader`): GET, POST
(create) and PATCH (JSON merge patch) of a namespaced object, and the server's version.

The agent-upgrade loop of ``agent run`` (:mod:`agent.upgrade.process`) renews its Lease and
reads and writes its ConfigMap through :class:`ObjectDoor`: the supervisor never imports the
``kubernetes`` package (about 28 MB of resident memory). The door has the same methods, the
same plain-dict objects and the same errors (:mod:`agent.kube`'s, which import nothing heavy)
as :class:`agent.kube.KubeClient` for what the upgrade needs, so
:class:`agent.upgrade.lease.AgentLease` and :class:`agent.upgrade.desired.UpgradeStore` work
on either. Only the kinds in :data:`RESOURCES` are known (no discovery).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from agent.kube import (
    ApiUnavailableError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    KubeApiError,
    NotFoundError,
)
from agent.runner.reader import ClusterReader

RESOURCES = {
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("v1", "ConfigMap"): "configmaps",
}
"""(apiVersion, kind) -> the resource's plural: what the door can name."""
_BY_STATUS: dict[int, type[KubeApiError]] = {
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidError,
}
_TEMPORARY = {429, 500, 502, 503, 504}


class ObjectDoor:
    """See the module docstring. Thread-safe (each request has its own connection)."""

    def __init__(self, reader: ClusterReader) -> None:
        self.reader = reader

    def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object (None: not found). Raises KubeApiError, ReaderError (no answer)."""
        try:
            return self._call("GET", _path(obj), obj)
        except NotFoundError:
            return None

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``obj``. Raises ConflictError (it exists), KubeApiError, ReaderError."""
        path = _path(obj).rpartition("/")[0]
        return self._call("POST", path, obj, body=dict(obj))

    def patch(self, obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386; a ``metadata.resourceVersion`` in it is a
        precondition: ConflictError when the object moved). Raises NotFoundError,
        KubeApiError, ReaderError."""
        return self._call(
            "PATCH",
            _path(obj),
            obj,
            body=dict(patch),
            content_type="application/merge-patch+json",
        )

    def server_version(self) -> str:
        """``/version``'s ``gitVersion``. Raises KubeApiError, ReaderError."""
        answer = self._call("GET", "/version", {"kind": "version"})
        version = answer.get("gitVersion")
        if not isinstance(version, str) or not version:
            raise KubeApiError("/version has no gitVersion", target="GET /version")
        return version

    def _call(
        self,
        method: str,
        path: str,
        obj: Mapping[str, Any],
        *,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        status, answer = self.reader.request(
            method,
            path,
            body=None if body is None else json.dumps(body).encode(),
            content_type=content_type,
        )
        try:
            document = json.loads(answer) if answer else {}
        except ValueError:
            document = {}
        if not isinstance(document, dict):
            document = {}
        if status in (200, 201):
            return document
        target = _target(obj)
        message = str(document.get("message") or answer[:300].decode("utf-8", "replace"))
        if status in _TEMPORARY:
            raise ApiUnavailableError(
                f"{target}: API server answered {status}: {message}", target=target, status=status
            )
        error = _BY_STATUS.get(status, KubeApiError)
        raise error(message, target=target, status=status, reason=str(document.get("reason") or ""))


def _path(obj: Mapping[str, Any]) -> str:
    """``/api/v1/namespaces/NS/configmaps/NAME`` or ``/apis/GROUP/VERSION/...``. Raises
    ValueError (a kind the door does not know, no name or namespace)."""
    api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
    plural = RESOURCES.get((api_version, kind))
    meta = obj.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    if plural is None or not name or not namespace:
        raise ValueError(f"the supervisor's door cannot name {kind} {api_version} {name!r}")
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{quote(namespace)}/{plural}/{quote(name)}"


def _target(obj: Mapping[str, Any]) -> str:
    """As :mod:`agent.kube` names an object: ``Lease coordination.k8s.io/v1 ns/name``."""
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        return str(obj.get("kind") or "")
    return f"{obj.get('kind')} {obj.get('apiVersion')} {meta.get('namespace')}/{meta.get('name')}"


__all__ = ["RESOURCES", "ObjectDoor"]
