"""The connection under :class:`~agent.kube.KubeClient`: the kubeconfig or in-cluster
configuration, connections with bounded timeouts and retries, impersonation, API discovery
(cached on disk and in memory) and raw reads (``/version``, the served API versions).

Part of :mod:`agent.kube`, below its client; knows nothing of objects. The ``kubernetes``
package is imported here and in the client, lazily, never elsewhere.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from agent.kube._errors import ApiNotServedError, KubeApiError, KubeconfigError, _converted
from agent.kube._refs import Object

# Connect quickly or not at all; a read may legitimately take a while (large lists, apply of a
# big object through admission), but never forever.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 30.0
# Every group, version and resource in one answer (Kubernetes 1.30+), else the legacy lists.
_AGGREGATED_DISCOVERY = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
)


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


# --- the client --------------------------------------------------------------------------------


class Transport:
    """The connection to one API server under :class:`KubeClient`: configuration, connections
    and timeouts, impersonation, discovery and raw reads (see :class:`KubeClient` for the
    arguments). Knows nothing of objects; :class:`KubeClient` adds their operations.
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
        # tempfile and hashlib are imported where used (about 4 ms): `fleetlet health
        # --offline` imports this package for ObjectRef alone.
        import tempfile

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
        self._impersonated: dict[str, Self] = {}

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

                from agent.kube._discovery import TargetedDiscoverer

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
                        dynamic = DynamicClient(  # type: ignore[no-untyped-call]
                            api, cache_file=str(self._cache_file()), discoverer=TargetedDiscoverer
                        )
                except BaseException:
                    api.close()  # type: ignore[no-untyped-call]
                    raise
                self._api_client, self._dynamic = api, dynamic
            return self._dynamic

    def _cache_file(self) -> Path:
        # Keyed by server and CA: test clusters reuse loopback ports, and a stale discovery of
        # another cluster would answer scope questions wrongly.
        import hashlib

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def impersonating(self, service_account: str, namespace: str) -> Self:
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

            from agent.kube._discovery import find

            dynamic = self._client()
            target = f"{kind} {api_version}"
            try:
                # A miss makes the dynamic client re-read that group version once (a CRD
                # created since the cache was written) before giving up (agent.kube._discovery).
                with _converted(target, self.server):
                    resource = find(dynamic.resources, api_version, kind)
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

    def _json(self, response: Any) -> Object:
        data = response.data if hasattr(response, "data") else response
        loaded = json.loads(data) if data else {}
        return loaded if isinstance(loaded, dict) else {}
