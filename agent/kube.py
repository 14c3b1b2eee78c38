"""The agent's one door to a Kubernetes API server (the only module importing ``kubernetes``).

:class:`KubeClient` wraps the ``kubernetes`` package's ``ApiClient`` and dynamic client: API
discovery (cached on disk and in memory), get/list, server-side apply (with server-side dry
run), delete, and impersonation of a ServiceAccount. Objects go in and come out as plain dicts.

Every failure is converted once, here: the API server's refusals become :class:`KubeApiError`
subclasses (:class:`ConflictError`, :class:`ForbiddenError`, :class:`InvalidError`,
:class:`NotFoundError`, :class:`ApiNotServedError`) that keep the server's own message, and an
unreachable, overloaded or slow server becomes :class:`ApiUnavailableError`, a
:class:`~agent.errors.TemporaryError`. Every request has a bounded timeout.

``kubernetes`` is imported lazily, when a client is first built: importing it costs ~26 MB of
resident memory, which commands that never talk to a cluster should not pay.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from agent.errors import ConfigurationError, FleetletError, PermanentError, TemporaryError

Object = dict[str, Any]
Objects = list[Object]

CONTENT_FIELD_MANAGER = "fleetlet"
"""The field manager of bundle content: every object a bundle renders is applied as it."""
STATE_FIELD_MANAGER = "fleetlet-agent"
"""The field manager of the agent's own state (revision store, group records, runs, outputs,
BundleDeployments): another manager than bundle content's, so content can never take over,
or be mistaken for, the agent's bookkeeping."""

# Connect quickly or not at all; a read may legitimately take a while (large lists, apply of a
# big object through admission), but never forever.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0
_LIST_PAGE = 500
# From this many objects of one kind in one namespace, read_many LISTs them instead of a GET
# each (a LIST returns the whole kind in the namespace, so it pays only for many).
LIST_FROM = 16
_MANAGER_IN_CAUSE = re.compile(r'conflict with "([^"]+)"')
_WEBHOOK_NAME = re.compile(r'webhook "([^"]+)"')
_WEBHOOK_FAILURE = re.compile(r"calling webhook|webhook .* (failed|error)", re.IGNORECASE)
# Every group, version and resource in one answer (Kubernetes 1.30+), else the legacy lists.
_AGGREGATED_DISCOVERY = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
)


# --- errors ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """One cause in the API server's ``Status.details.causes`` (e.g. a field manager conflict)."""

    reason: str
    message: str
    field: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class KubeError(FleetletError):
    """Root of the errors of talking to a Kubernetes API server.

    ``reason`` is a CamelCase word for conditions; ``target`` names the object or request
    (e.g. ``Deployment apps/v1 shop/web``); ``status`` is the HTTP status (None: no answer).
    """

    reason: str = "KubeError"
    target: str = ""
    status: int | None = None


class ApiUnavailableError(KubeError, TemporaryError):
    """The API server did not answer in time, could not be reached, or asked us to come back
    later (429/5xx). ``delay`` carries the server's Retry-After when it sent one."""

    reason = "ApiUnavailable"

    def __init__(
        self,
        message: str,
        *,
        target: str = "",
        status: int | None = None,
        delay: float | None = None,
    ) -> None:
        TemporaryError.__init__(self, message, delay=delay)
        self.target = target
        self.status = status


class KubeconfigError(KubeError, ConfigurationError):
    """The kubeconfig (or in-cluster configuration) cannot be loaded."""

    reason = "KubeconfigInvalid"


class KubeApiError(KubeError, PermanentError):
    """The API server refused a request. ``server_message`` is its message, verbatim;
    ``causes`` its detailed causes; ``reason`` the server's CamelCase reason when the class has
    none of its own (BadRequest, Unauthorized, Gone, ...)."""

    reason = "ApiError"

    def __init__(
        self,
        server_message: str,
        *,
        target: str = "",
        status: int | None = None,
        reason: str | None = None,
        causes: tuple[Cause, ...] = (),
    ) -> None:
        super().__init__(f"{target}: {server_message}" if target else server_message)
        self.server_message = server_message
        self.target = target
        self.status = status
        self.causes = causes
        if reason and type(self) is KubeApiError:
            self.reason = reason


class ConflictError(KubeApiError):
    """409: fields owned by other field managers (``managers`` names them), or a stale write."""

    reason = "Conflict"

    @property
    def managers(self) -> list[str]:
        """The other field managers named by the conflict, in the server's order."""
        found: list[str] = []
        for cause in self.causes:
            for name in _MANAGER_IN_CAUSE.findall(cause.message):
                if name not in found:
                    found.append(name)
        if not found:
            found = list(dict.fromkeys(_MANAGER_IN_CAUSE.findall(self.server_message)))
        return found


class ForbiddenError(KubeApiError):
    """403: RBAC (or an admission policy) does not allow this user the request."""

    reason = "Forbidden"


class InvalidError(KubeApiError):
    """422: the object does not validate; ``causes`` lists each invalid field."""

    reason = "Invalid"


class NotFoundError(KubeApiError):
    """404: the object (or its namespace) does not exist."""

    reason = "NotFound"


class ApiNotServedError(KubeApiError):
    """The API server does not serve this apiVersion/kind (no CRD installed, API disabled)."""

    reason = "ApiNotServed"


class WebhookError(KubeApiError):
    """An admission webhook could not be called or failed (the API server answers 500 and
    names it): the object is refused, the API server itself is fine. ``webhook`` is its name
    when the message gives it."""

    reason = "WebhookFailed"

    @property
    def webhook(self) -> str | None:
        found = _WEBHOOK_NAME.search(self.server_message)
        return found.group(1) if found else None


_BY_STATUS: dict[int, type[KubeApiError]] = {
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidError,
}
# Worth a retry: throttled, server errors, gateway problems. 0: the client library's code for
# a failure below HTTP (TLS handshake interrupted, request not sendable).
_TEMPORARY = {0, 429, 500, 502, 503, 504}


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def _from_api_exception(exc: Any, target: str) -> KubeError:
    """Convert a ``kubernetes`` ApiException (or dynamic-client subclass) to our errors."""
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    document: dict[str, Any] = {}
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and body.strip():
        with contextlib.suppress(ValueError):
            loaded = json.loads(body)
            if isinstance(loaded, dict):
                document = loaded
    message = str(document.get("message") or body or getattr(exc, "reason", "") or "no message")
    if status == 500 and _WEBHOOK_FAILURE.search(message):
        # One object's admission webhook is down: a refusal of that object, not an outage.
        return WebhookError(message, target=target, status=status, reason="WebhookFailed")
    if status in _TEMPORARY:
        return ApiUnavailableError(
            f"{target}: API server answered {status or 'nothing usable'}: {message}",
            target=target,
            status=status or None,
            delay=_retry_after(getattr(exc, "headers", None)),
        )
    details = document.get("details")
    raw_causes = details.get("causes") if isinstance(details, dict) else None
    causes = tuple(
        Cause(
            reason=str(c.get("reason") or ""),
            message=str(c.get("message") or ""),
            field=str(c.get("field") or ""),
        )
        for c in (raw_causes if isinstance(raw_causes, list) else [])
        if isinstance(c, dict)
    )
    cls = _BY_STATUS.get(status, KubeApiError)
    return cls(
        message,
        target=target,
        status=status,
        reason=str(document.get("reason") or "") or None,
        causes=causes,
    )


_POOL_PREFIX = re.compile(r"^HTTPS?Connection(?:Pool)?\([^)]*\): ")


def _cause(exc: BaseException) -> str:
    """What went wrong below HTTP, in a few words: urllib3's innermost reason without its
    connection-pool preamble (``Read timed out. (read timeout=2.0)``, ``Failed to establish
    a new connection: [Errno 111] Connection refused``)."""
    inner = getattr(exc, "reason", None)
    seen = exc if not isinstance(inner, BaseException) else inner
    return _POOL_PREFIX.sub("", str(seen)) or type(seen).__name__


@contextlib.contextmanager
def _converted(target: str, server: str = "") -> Iterator[None]:
    """Turn the ``kubernetes``/urllib3/socket exceptions raised inside into KubeErrors;
    ``server`` (its URL) is named when it cannot be reached."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except KubeError:
        raise
    except ApiException as exc:
        raise _from_api_exception(exc, target) from exc
    except (HTTPError, OSError) as exc:
        where = f" {server}" if server else ""
        raise ApiUnavailableError(
            f"{target}: API server{where} unreachable: {_cause(exc)}", target=target
        ) from exc


def _bound_requests(api: Any, timeout: tuple[float, float]) -> None:
    """Give every request of ``api`` a timeout unless it brings its own.

    The dynamic client's discovery requests take no timeout argument, and the REST layer then
    passes ``timeout=None`` (wait forever) to urllib3: a server that accepts the connection
    and never answers would hang the agent.
    """
    rest = api.rest_client
    unbounded = rest.request

    def request(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return unbounded(*args, _request_timeout=_request_timeout or timeout, **kwargs)

    rest.request = request


# --- object references -------------------------------------------------------------------------


class RefLike(Protocol):
    """Anything naming one object (e.g. :class:`agent.api.models.ObjectReference`)."""

    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One object: apiVersion, kind, name and (namespaced kinds) namespace."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any] | RefLike) -> ObjectRef:
        """The reference of a manifest (a dict) or of any reference-like object.

        Raises InvalidError when a manifest lacks apiVersion, kind or metadata.name.
        """
        if not isinstance(obj, Mapping):
            return cls(obj.api_version, obj.kind, obj.name, obj.namespace or None)
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        api_version, kind, name = obj.get("apiVersion"), obj.get("kind"), meta.get("name")
        if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
            raise InvalidError(
                "an object needs apiVersion, kind and metadata.name",
                target=f"{kind or '?'} {name or '?'}",
            )
        namespace = meta.get("namespace")
        return cls(api_version, kind, name, namespace if isinstance(namespace, str) else None)

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {self.api_version} {where}"


# --- the client --------------------------------------------------------------------------------


class KubeClient:
    """A connection to one API server, as one user (optionally impersonating another).

    ``kubeconfig=None`` uses the in-cluster configuration (the pod's ServiceAccount);
    ``context`` picks a kubeconfig context; ``impersonate`` is a user name sent as
    ``Impersonate-User``. Discovery is cached in ``discovery_cache_dir`` (default: a directory
    under the system temp dir), keyed by server URL and CA so clusters never share a cache.
    Nothing touches the network before the first request. Thread-safe; use as a context
    manager or call :meth:`close`.

    Raises KubeconfigError when the configuration cannot be loaded.
    """

    def __init__(
        self,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        impersonate: str | None = None,
        discovery_cache_dir: str | Path | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_connections: int = 16,
    ) -> None:
        self.kubeconfig = str(kubeconfig) if kubeconfig is not None else None
        self.context = context
        self.impersonate = impersonate
        self._cache_dir = Path(
            discovery_cache_dir or Path(tempfile.gettempdir()) / "fleetlet-discovery"
        )
        self._timeout = (connect_timeout, read_timeout)
        self._max_connections = max_connections
        self._configuration = self._load_configuration()
        self._api_client: Any = None
        self._dynamic: Any = None
        self._resources: dict[tuple[str, str], Any] = {}
        self._lock = threading.RLock()
        self._impersonated: dict[str, KubeClient] = {}

    # -- set-up -------------------------------------------------------------------------------

    def _load_configuration(self) -> Any:
        from kubernetes.client.configuration import Configuration
        from kubernetes.config.config_exception import ConfigException

        configuration = Configuration()
        if self.kubeconfig is not None and not Path(self.kubeconfig).is_file():
            raise KubeconfigError(f"kubeconfig {self.kubeconfig}: no such file")
        try:
            if self.kubeconfig is None:
                from kubernetes.config.incluster_config import load_incluster_config

                load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                from kubernetes.config.kube_config import load_kube_config

                load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=self.kubeconfig,
                    context=self.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (ConfigException, OSError, ValueError, TypeError) as exc:
            if self.kubeconfig is None:
                raise KubeconfigError(
                    "no kubeconfig given and not running in a pod (the in-cluster "
                    f"configuration is missing: {str(exc).rstrip('.')})"
                ) from exc
            raise KubeconfigError(f"cannot load kubeconfig {self.kubeconfig}: {exc}") from exc
        self._tune(configuration)
        return configuration

    def _tune(self, configuration: Any) -> None:
        from urllib3.util.retry import Retry

        # Retry connection set-up once (a dropped keep-alive connection), never a read: a
        # read retry would double the wait on a hung server, and writes are not idempotent.
        # A 429 is different: the server did not process the request (priority and fairness,
        # or a new CRD's storage still initializing), so any method is retried a few times,
        # after the Retry-After it asks for; then the 429 itself is answered.
        configuration.retries = Retry(
            total=6,
            connect=1,
            read=0,
            status=5,
            other=0,
            redirect=0,
            backoff_factor=0.2,
            status_forcelist=(429,),
            allowed_methods=None,
            respect_retry_after_header=True,
            raise_on_status=False,
        )
        configuration.connection_pool_maxsize = self._max_connections

    def _client(self) -> Any:
        with self._lock:
            if self._dynamic is None:
                from kubernetes.client.api_client import ApiClient
                from kubernetes.dynamic import DynamicClient

                api = ApiClient(self._configuration)
                api.user_agent = "fleetlet-agent"
                if self.impersonate:
                    api.set_default_header("Impersonate-User", self.impersonate)  # type: ignore[no-untyped-call]
                _bound_requests(api, self._timeout)
                # Without a writable cache directory discovery still works, uncached.
                with contextlib.suppress(OSError):
                    self._cache_dir.mkdir(parents=True, exist_ok=True)
                try:
                    with _converted("API discovery", self.server):
                        dynamic = DynamicClient(api, cache_file=str(self._cache_file()))  # type: ignore[no-untyped-call]
                except BaseException:
                    api.close()  # type: ignore[no-untyped-call]
                    raise
                self._api_client, self._dynamic = api, dynamic
            return self._dynamic

    def _cache_file(self) -> Path:
        # Keyed by server and CA: test clusters reuse loopback ports, and a stale discovery of
        # another cluster would answer scope questions wrongly.
        digest = hashlib.sha256(str(self._configuration.host).encode())
        ca = self._configuration.ssl_ca_cert
        if ca:
            with contextlib.suppress(OSError):
                digest.update(Path(ca).read_bytes())
        return self._cache_dir / f"discovery-{digest.hexdigest()[:24]}.json"

    @property
    def server(self) -> str:
        """The API server's URL."""
        return str(self._configuration.host)

    def close(self) -> None:
        """Close connections (and those of impersonating clients made from this one)."""
        with self._lock:
            clients, self._impersonated = list(self._impersonated.values()), {}
            api, self._api_client, self._dynamic = self._api_client, None, None
            self._resources.clear()
        for client in clients:
            client.close()
        if api is not None:
            with contextlib.suppress(Exception):
                api.close()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def impersonating(self, service_account: str, namespace: str) -> KubeClient:
        """A client with the same connection settings acting as ServiceAccount
        ``namespace/service_account`` (``system:serviceaccount:<ns>:<name>``); cached, closed
        with this one. Requests it makes raise ForbiddenError when this client's user may not
        impersonate that ServiceAccount, or the ServiceAccount may not do the request."""
        user = f"system:serviceaccount:{namespace}:{service_account}"
        with self._lock:
            client = self._impersonated.get(user)
            if client is None:
                # Same configuration (credentials, timeouts, cache dir), own connections.
                client = copy.copy(self)
                client.impersonate = user
                client._api_client = client._dynamic = None
                client._resources = {}
                client._lock = threading.RLock()
                client._impersonated = {}
                self._impersonated[user] = client
            return client

    # -- discovery ----------------------------------------------------------------------------

    def resource_for(self, api_version: str, kind: str) -> Any:
        """The dynamic client's ``Resource`` for apiVersion/kind (memoized).

        Raises ApiNotServedError when the server does not serve it, ApiUnavailableError.
        """
        key = (api_version, kind)
        with self._lock:
            found = self._resources.get(key)
            if found is not None:
                return found
            from kubernetes.dynamic.exceptions import (
                ResourceNotFoundError,
                ResourceNotUniqueError,
            )

            dynamic = self._client()
            target = f"{kind} {api_version}"
            try:
                # A miss makes the dynamic client re-discover once (a CRD created since the
                # cache was written) before giving up.
                with _converted(target, self.server):
                    resource = dynamic.resources.get(api_version=api_version, kind=kind)
            except (ResourceNotFoundError, ResourceNotUniqueError) as exc:
                raise ApiNotServedError(
                    f"the API server does not serve kind {kind} in {api_version}",
                    target=target,
                ) from exc
            self._resources[key] = resource
            return resource

    def collection_path(self, api_version: str, kind: str, namespace: str | None = None) -> str:
        """The URL path of the collection of a kind (in ``namespace`` for a namespaced kind
        given one), e.g. ``/apis/apps/v1/namespaces/shop/deployments``: what a LIST reads.

        Raises ApiNotServedError, ApiUnavailableError.
        """
        resource = self.resource_for(api_version, kind)
        base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        if resource.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{resource.name}"
        return f"{base}/{resource.name}"

    def is_namespaced(self, api_version: str, kind: str) -> bool:
        """Whether the kind is namespaced. Raises ApiNotServedError, ApiUnavailableError."""
        return bool(self.resource_for(api_version, kind).namespaced)

    def scope(self, api_version: str, kind: str) -> bool | None:
        """:data:`agent.render.scope.ScopeLookup` of this server: like :meth:`is_namespaced`,
        but None for a kind not served (the renderer then leaves the object as written).
        Raises ApiUnavailableError."""
        try:
            return self.is_namespaced(api_version, kind)
        except ApiNotServedError:
            return None

    def reachable(self) -> bool:
        """Whether the API server answers at all (``/readyz``, which every user may read):
        tells an API server that is down from one request that failed (an aggregated API
        away, a slow webhook). Never raises."""
        try:
            self._client()
            api = self._api_client
            request = api.param_serialize(
                method="GET", resource_path="/readyz", auth_settings=["BearerToken"]
            )
            response = api.call_api(*request, _request_timeout=self._timeout)
            return 0 < int(getattr(response, "status", 0) or 0) < 500
        except Exception:
            return False

    def forget_discovery(self) -> None:
        """Drop memoized resources (e.g. after installing CRDs); the next lookups re-discover."""
        with self._lock:
            self._resources.clear()

    def _raw_get(self, path: str, *, accept: str = "application/json") -> Object:
        with _converted(f"GET {path}", self.server):
            response = self._client().request(
                "GET",
                path,
                header_params={"Accept": accept},
                serialize=False,
                _request_timeout=self._timeout,
            )
        return self._json(response)

    def server_version(self) -> str:
        """The API server's version as it reports it (``/version``'s ``gitVersion``, e.g.
        ``v1.37.2``): what helm's ``.Capabilities.KubeVersion`` is.

        Raises KubeApiError (no version in the answer), ApiUnavailableError.
        """
        version = self._raw_get("/version").get("gitVersion")
        if not isinstance(version, str) or not version:
            raise KubeApiError("/version has no gitVersion", target="GET /version")
        return version

    def api_versions(self) -> list[str]:
        """Every served ``group/version`` and ``group/version/Kind`` (``v1`` and ``v1/Pod`` for
        the core group), sorted: what helm's ``.Capabilities.APIVersions`` holds on a real
        install. Two requests with aggregated discovery (Kubernetes 1.30+); one per group
        version on older servers.

        Raises KubeApiError, ApiUnavailableError.
        """
        found: set[str] = set()
        for root in ("/api", "/apis"):
            answer = self._raw_get(root, accept=_AGGREGATED_DISCOVERY)
            if answer.get("kind") == "APIGroupDiscoveryList":
                for group in answer.get("items") or []:
                    name = (group.get("metadata") or {}).get("name") or ""
                    for version in group.get("versions") or []:
                        gv = f"{name}/{version.get('version')}" if name else version.get("version")
                        found.add(str(gv))
                        for resource in version.get("resources") or []:
                            kind = (resource.get("responseKind") or {}).get("kind")
                            if kind:
                                found.add(f"{gv}/{kind}")
                continue
            # Legacy discovery: the group versions, then each one's resource list.
            if root == "/api":
                versions = [str(v) for v in answer.get("versions") or []]
            else:
                versions = [
                    str(v.get("groupVersion"))
                    for g in answer.get("groups") or []
                    for v in g.get("versions") or []
                ]
            for gv in versions:
                found.add(gv)
                listing = self._raw_get(f"{root}/{gv}")
                for resource in listing.get("resources") or []:
                    if "/" not in str(resource.get("name", "")) and resource.get("kind"):
                        found.add(f"{gv}/{resource['kind']}")
        return sorted(found)

    # -- requests -----------------------------------------------------------------------------

    def _locate(self, ref: ObjectRef) -> tuple[Any, str | None]:
        resource = self.resource_for(ref.api_version, ref.kind)
        if not resource.namespaced:
            return resource, None
        if not ref.namespace:
            raise InvalidError("a namespaced object needs metadata.namespace", target=str(ref))
        return resource, ref.namespace

    def _json(self, response: Any) -> Object:
        data = response.data if hasattr(response, "data") else response
        loaded = json.loads(data) if data else {}
        return loaded if isinstance(loaded, dict) else {}

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
    ) -> Objects:
        """Every object of a kind (in ``namespace``, or in all namespaces), page by page; each
        item carries its apiVersion and kind.

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
                    limit=_LIST_PAGE,
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
