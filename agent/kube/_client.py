""":class:`KubeClient`: the operations on objects (get, watch, list, read many, server-side
apply, create, patch, delete, whoami) over :class:`~agent.kube._transport.Transport`.

Part of :mod:`agent.kube`; used by the apply, the reconcile, the reports, the installer and the
approvals, always through :mod:`agent.kube`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from agent.kube._errors import InvalidError, KubeApiError, NotFoundError, _converted
from agent.kube._refs import Object, ObjectRef, Objects, RefLike
from agent.kube._transport import Transport

CONTENT_FIELD_MANAGER = "fleetlet"
"""The field manager of bundle content: every object a bundle renders is applied as it."""
STATE_FIELD_MANAGER = "fleetlet-agent"
"""The field manager of the agent's own state (revision store, group records, runs, outputs,
BundleDeployments): another manager than bundle content's, so content can never take over,
or be mistaken for, the agent's bookkeeping."""
_LIST_PAGE = 500
# From this many objects of one kind in one namespace, read_many LISTs them instead of a GET
# each (a LIST returns the whole kind in the namespace, so it pays only for many).
LIST_FROM = 16


class KubeClient(Transport):
    """A connection to one API server, as one user (optionally impersonating another).

    ``kubeconfig=None`` uses the in-cluster configuration (the pod's ServiceAccount);
    ``context`` picks a kubeconfig context; ``impersonate`` is a user name sent as
    ``Impersonate-User``. Discovery is cached in ``discovery_cache_dir`` (default: a directory
    under the system temp dir), keyed by server URL and CA so clusters never share a cache.
    Nothing touches the network before the first request. Thread-safe; use as a context
    manager or call :meth:`close`.

    The connection, discovery and raw reads are :class:`Transport`'s; this class adds the
    operations on objects (get, watch, list, apply, create, patch, delete).

    Raises KubeconfigError when the configuration cannot be loaded.
    """

    # -- requests -----------------------------------------------------------------------------

    def _locate(self, ref: ObjectRef) -> tuple[Any, str | None]:
        resource = self.resource_for(ref.api_version, ref.kind)
        if not resource.namespaced:
            return resource, None
        if not ref.namespace:
            raise InvalidError("a namespaced object needs metadata.namespace", target=str(ref))
        return resource, ref.namespace

    def get(self, obj: Mapping[str, Any] | RefLike) -> Object | None:
        """The live object, or None when it does not exist.

        Raises ApiNotServedError, ForbiddenError, KubeApiError, ApiUnavailableError.
        """
        ref = ObjectRef.of(obj)
        resource, namespace = self._locate(ref)
        try:
            with _converted(str(ref), self.server):
                response = self._client().get(
                    resource,
                    name=ref.name,
                    namespace=namespace,
                    serialize=False,
                    _request_timeout=self._timeout,
                )
        except NotFoundError:
            return None
        return self._json(response)

    def watch(
        self, obj: Mapping[str, Any] | RefLike, *, resource_version: str, timeout: float
    ) -> Iterator[tuple[str, Object]]:
        """The changes of one object after ``resource_version``, as the server sends them:
        (``ADDED`` | ``MODIFIED`` | ``DELETED``, the object), or (``ERROR``, a Status: e.g.
        410 when the version is too old to watch from), for at most ``timeout`` seconds (the
        server then ends the watch, and so does the iterator).

        Raises ApiNotServedError, ForbiddenError, KubeApiError, ApiUnavailableError.
        """
        ref = ObjectRef.of(obj)
        resource, namespace = self._locate(ref)
        seconds = max(1, int(timeout + 0.999))
        target = f"watch {ref}"
        with _converted(target, self.server):
            response = self._client().request(
                "GET",
                resource.path(namespace=namespace),
                watch="true",
                field_selector=f"metadata.name={ref.name}",
                resource_version=resource_version,
                timeout_seconds=seconds,
                serialize=False,
                # The server ends the watch after `seconds`; a read may wait that long.
                _request_timeout=(self._timeout[0], seconds + self._timeout[1]),
            )
        try:
            with _converted(target, self.server):
                for line in response:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    found = event.get("object") if isinstance(event, dict) else None
                    if isinstance(found, dict):
                        yield str(event.get("type")), found
        finally:
            with contextlib.suppress(Exception):
                response.release_conn()

    def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = _LIST_PAGE,
    ) -> Objects:
        """Every object of a kind (in ``namespace``, or in all namespaces), page by page; each
        item carries its apiVersion and kind. ``limit=None`` reads it in one request, which the
        API server answers from its watch cache only (429 while it builds that cache, where a
        page is read from etcd instead).

        Raises ApiNotServedError, ForbiddenError, KubeApiError, ApiUnavailableError.
        """
        resource = self.resource_for(api_version, kind)
        target = f"{kind} {api_version} list" + (f" in {namespace}" if namespace else "")
        items: Objects = []
        token: str | None = None
        while True:
            with _converted(target, self.server):
                response = self._client().get(
                    resource,
                    namespace=namespace if resource.namespaced else None,
                    label_selector=label_selector,
                    field_selector=field_selector,
                    limit=limit,
                    _continue=token,
                    serialize=False,
                    _request_timeout=self._timeout,
                )
            page = self._json(response)
            for item in page.get("items") or []:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    def read_many(
        self,
        refs: Iterable[ObjectRef],
        *,
        each: Callable[..., Iterable[Any]] = map,
    ) -> dict[ObjectRef, Object | None]:
        """The live objects (None: absent) of the refs that share a kind and namespace with
        ``LIST_FROM`` or more others, one LIST each (``each``: how the LISTs are mapped, e.g. a
        thread pool's ``map``). Refs not in the answer are for a GET each: too few of their
        kind, or their LIST refused (not allowed, kind not served, a namespaced kind without a
        namespace), where a GET says why per object.

        Raises ApiUnavailableError.
        """
        groups: dict[tuple[str, str, str | None], list[ObjectRef]] = {}
        for ref in refs:
            groups.setdefault((ref.api_version, ref.kind, ref.namespace), []).append(ref)

        def read(members: list[ObjectRef]) -> dict[ObjectRef, Object | None]:
            ref = members[0]
            try:
                if self.is_namespaced(ref.api_version, ref.kind) and not ref.namespace:
                    return {}
                items = self.list(ref.api_version, ref.kind, namespace=ref.namespace)
            except KubeApiError:
                return {}
            by_name = {str((item.get("metadata") or {}).get("name")): item for item in items}
            return {m: by_name.get(m.name) for m in members}

        found: dict[ObjectRef, Object | None] = {}
        for part in each(read, [g for g in groups.values() if len(g) >= LIST_FROM]):
            found.update(part)
        return found

    def apply(
        self,
        obj: Mapping[str, Any],
        *,
        field_manager: str,
        force: bool = False,
        dry_run: bool = False,
        subresource: str | None = None,
    ) -> Object:
        """Server-side apply ``obj`` as ``field_manager``; returns the object the server has (or,
        with ``dry_run``, would have: nothing is persisted). ``force`` takes over fields other
        managers own. ``subresource="status"`` applies to the status subresource.

        Raises ConflictError (naming the other managers), ForbiddenError, InvalidError,
        NotFoundError (e.g. its namespace is missing), ApiNotServedError, ApiUnavailableError.
        """
        ref = ObjectRef.of(obj)
        resource, namespace = self._locate(ref)
        if subresource is not None:
            resource = resource.subresources[subresource]
        with _converted(str(ref), self.server):
            response = self._client().server_side_apply(
                resource,
                body=dict(obj),
                name=ref.name,
                namespace=namespace,
                field_manager=field_manager,
                force_conflicts=True if force else None,
                dry_run="All" if dry_run else None,
                serialize=False,
                _request_timeout=self._timeout,
            )
        return self._json(response)

    def create(self, obj: Mapping[str, Any], *, field_manager: str = STATE_FIELD_MANAGER) -> Object:
        """Create ``obj`` (POST: ``metadata.generateName`` gives it a fresh name); returns the
        object the server made.

        Raises ConflictError (a named object that exists already), ForbiddenError,
        InvalidError, NotFoundError (its namespace is missing), ApiNotServedError,
        ApiUnavailableError.
        """
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
        shown = meta.get("name") or f"{meta.get('generateName') or '?'}*"
        namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else None
        target = f"{kind} {api_version} " + (f"{namespace}/{shown}" if namespace else shown)
        resource = self.resource_for(api_version, kind)
        if resource.namespaced and not namespace:
            raise InvalidError("a namespaced object needs metadata.namespace", target=target)
        with _converted(target):
            response = self._client().create(
                resource,
                body=dict(obj),
                namespace=namespace if resource.namespaced else None,
                field_manager=field_manager,
                serialize=False,
                _request_timeout=self._timeout,
            )
        return self._json(response)

    def patch(self, obj: Mapping[str, Any] | RefLike, patch: Mapping[str, Any]) -> Object:
        """Apply a JSON merge patch (RFC 7386) to the object; returns the patched object.

        Raises NotFoundError, ForbiddenError, InvalidError, ApiNotServedError,
        ApiUnavailableError.
        """
        ref = ObjectRef.of(obj)
        resource, namespace = self._locate(ref)
        with _converted(str(ref)):
            response = self._client().patch(
                resource,
                name=ref.name,
                namespace=namespace,
                body=dict(patch),
                content_type="application/merge-patch+json",
                serialize=False,
                _request_timeout=self._timeout,
            )
        return self._json(response)

    def whoami(self) -> str:
        """The user name the API server authenticates this client as (a SelfSubjectReview).

        Raises KubeApiError, ApiUnavailableError.
        """
        review = self.create(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "SelfSubjectReview",
                "metadata": {"name": "whoami"},
            },
            field_manager=STATE_FIELD_MANAGER,
        )
        name = ((review.get("status") or {}).get("userInfo") or {}).get("username")
        if not isinstance(name, str) or not name:
            raise KubeApiError("a SelfSubjectReview without a user name", target="whoami")
        return name

    def delete(
        self,
        obj: Mapping[str, Any] | RefLike,
        *,
        propagation: str = "Background",
        uid: str | None = None,
        dry_run: bool = False,
    ) -> bool:
        """Delete the object; True when the server accepted, False when it was already gone.
        ``uid`` makes the deletion conditional on the object still being that very object.

        Raises ConflictError (uid precondition failed), ForbiddenError, ApiNotServedError,
        ApiUnavailableError.
        """
        ref = ObjectRef.of(obj)
        resource, namespace = self._locate(ref)
        body: Object = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": propagation,
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        if dry_run:
            body["dryRun"] = ["All"]
        try:
            with _converted(str(ref), self.server):
                self._client().delete(
                    resource,
                    name=ref.name,
                    namespace=namespace,
                    body=body,
                    serialize=False,
                    _request_timeout=self._timeout,
                )
        except NotFoundError:
            return False
        return True
