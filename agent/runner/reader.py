"""A small door to the API server for the supervisor: metadata-only LISTs, and one request.

The supervisor must stay small, so it does not import the ``kubernetes`` package (the worker
does, through :mod:`agent.kube`). What it needs is narrow: GET a collection as
``PartialObjectMetadataList`` (names, uids and resourceVersions, no specs), as the agent or
impersonating a bundle's ServiceAccount; and, for the agent-upgrade loop, GET, POST and PATCH
of single objects (:mod:`agent.runner.objects`, over :meth:`ClusterReader.request`).
:class:`ClusterReader` does that over ``http.client`` with the credentials of the in-cluster
configuration, or of a kubeconfig whose user has a client certificate or a bearer token (data
or file). Other kubeconfig users (exec plugins, auth providers, basic auth) are not read here:
:func:`open_reader` says why and the supervisor then leaves drift checks to workers.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from agent.errors import TemporaryError

_IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
_PAGE = 500
_MAX_BODY = 64 * 1024 * 1024


class ReaderError(TemporaryError):
    """A LIST did not answer 200 (or not in time): what it would have said is unknown."""

    reason = "ApiUnavailable"


class ReaderUnsupported(Exception):
    """The configuration's credentials are of a kind this reader does not use."""


@dataclass(frozen=True, kw_only=True)
class ObjectVersion:
    """One listed object: its name, uid and resourceVersion."""

    name: str
    uid: str
    resource_version: str


class ClusterReader:
    """Metadata-only LISTs against one API server (see the module docstring). Thread-safe:
    each thread keeps its own connection open between its requests, LISTs and :meth:`request`
    alike (a drift check is a dozen LISTs: one TLS handshake, not a dozen); a kept connection
    the server closed meanwhile is replaced once."""

    def __init__(
        self,
        *,
        server: str,
        context: ssl.SSLContext | None,
        token: str | None = None,
        token_file: Path | None = None,
        timeout: float = 30.0,
        workdir: Path | None = None,
    ) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ReaderUnsupported(f"server URL {server!r}")
        self.server = server
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._context = context
        self._token = token
        self._token_file = token_file
        self._timeout = timeout
        self._workdir = workdir
        self._kept = threading.local()
        self.on_request: Callable[[str], None] | None = None
        """Called with the method of every request sent (the supervisor's metrics count them)."""

    def close(self) -> None:
        """Remove the credential files this reader wrote (kubeconfig ``*-data``); close the
        calling thread's kept connection."""
        kept = getattr(self._kept, "connection", None)
        if kept is not None:
            kept.close()
            self._kept.connection = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def _headers(self, user: str | None, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": "fleetlet-agent-supervisor"}
        token = self._token
        if self._token_file is not None:
            try:
                token = self._token_file.read_text().strip()  # rotated by the kubelet
            except OSError as exc:
                raise ReaderError(f"cannot read the token file {self._token_file}: {exc}") from exc
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if user:
            headers["Impersonate-User"] = user
        return headers

    def _connection(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, context=self._context, timeout=self._timeout
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def list_versions(self, path: str, *, user: str | None = None) -> dict[str, ObjectVersion]:
        """Every object of the collection at ``path`` (with its query, e.g. a label selector),
        by name, page by page.

        Raises ReaderError for any answer but 200 (403, 404, 5xx), a timeout or a broken
        connection.
        """
        found: dict[str, ObjectVersion] = {}
        token = ""
        while True:
            joiner = "&" if "?" in path else "?"
            query = f"{joiner}limit={_PAGE}" + (f"&continue={quote(token)}" if token else "")
            page = self._get(self._prefix + path + query, user)
            for item in page.get("items") or []:
                meta = item.get("metadata") or {}
                name = str(meta.get("name") or "")
                found[name] = ObjectVersion(
                    name=name,
                    uid=str(meta.get("uid") or ""),
                    resource_version=str(meta.get("resourceVersion") or ""),
                )
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return found

    def _get(self, url: str, user: str | None) -> Any:
        status, body = self._exchange("GET", url, self._headers(user, _METADATA_LIST))
        if status != 200:
            raise ReaderError(f"GET {url}: HTTP {status}")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise ReaderError(f"GET {url}: not JSON: {exc}") from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        """One request as the agent (``path`` below the server's; JSON accepted): the answer's
        status and body, whatever the status. The calling thread keeps its connection open for
        its next request (a renewal every few seconds then costs no TLS handshake); a kept
        connection the server closed meanwhile is replaced once. Raises ReaderError (no answer,
        a broken connection, a timeout, an answer too large)."""
        headers = self._headers(None, "application/json")
        if body is not None:
            headers["Content-Type"] = content_type
        return self._exchange(method, self._prefix + path, headers, body)

    def _exchange(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, bytes]:
        """One request on the calling thread's kept connection (replaced once when the server
        closed it meanwhile); the connection is kept for the thread's next request."""
        kept: http.client.HTTPConnection | None = getattr(self._kept, "connection", None)
        connection = kept or self._connection()
        self._kept.connection = None
        try:
            answer = self._send(connection, method, url, headers, body)
        except ReaderError as exc:
            connection.close()
            if kept is None or isinstance(exc.__cause__, TimeoutError):
                raise
            connection = self._connection()  # the server closed the idle one: once more
            try:
                answer = self._send(connection, method, url, headers, body)
            except ReaderError:
                connection.close()
                raise
        self._kept.connection = connection
        return answer

    def _send(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None = None,
    ) -> tuple[int, bytes]:
        if self.on_request is not None:
            self.on_request(method)
        try:
            connection.request(method, url, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read(_MAX_BODY + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise ReaderError(f"{method} {url}: {exc}") from exc
        if len(answer) > _MAX_BODY:
            raise ReaderError(f"{method} {url}: answer too large")
        return response.status, answer


def open_reader(kubeconfig: str | None, *, context: str | None = None) -> ClusterReader:
    """The reader of the in-cluster configuration (``kubeconfig`` None) or of a kubeconfig's
    context (default: its current context).

    Raises ReaderUnsupported (credentials of another kind, or a configuration this reader
    cannot use: the message says which), OSError, ValueError.
    """
    if kubeconfig is None:
        return _in_cluster()
    return _from_kubeconfig(Path(kubeconfig), context)


def _in_cluster() -> ClusterReader:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ReaderUnsupported("not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset)")
    if ":" in host:
        host = f"[{host}]"
    tls = ssl.create_default_context(cafile=str(_IN_CLUSTER / "ca.crt"))
    return ClusterReader(
        server=f"https://{host}:{port}", context=tls, token_file=_IN_CLUSTER / "token"
    )


def _from_kubeconfig(path: Path, context_name: str | None) -> ClusterReader:
    from agent.api.yamlio import load_kube

    doc = load_kube(path.read_text(encoding="utf-8"))
    if not isinstance(doc, Mapping):
        raise ReaderUnsupported(f"{path}: not a kubeconfig")

    def named(section: str, name: str) -> Mapping[str, Any]:
        for entry in doc.get(section) or []:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                value = entry.get(section[:-1])
                return value if isinstance(value, Mapping) else {}
        raise ReaderUnsupported(f"{path}: no {section[:-1]} {name!r}")

    context = named("contexts", str(context_name or doc.get("current-context") or ""))
    cluster = named("clusters", str(context.get("cluster") or ""))
    user = named("users", str(context.get("user") or ""))
    unsupported = sorted(set(user) & {"exec", "auth-provider", "username", "password"})
    if unsupported:
        raise ReaderUnsupported(f"{path}: the user authenticates with {', '.join(unsupported)}")
    base = path.parent
    workdir = Path(tempfile.mkdtemp(prefix="fleetlet-reader-"))

    def material(key: str) -> str | None:
        """The file of ``<key>`` or ``<key>-data`` (written to the reader's own directory)."""
        data = cluster.get(f"{key}-data") if key == "certificate-authority" else None
        data = data or user.get(f"{key}-data")
        if data:
            target = workdir / key
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(base64.b64decode(data))
            return str(target)
        file = cluster.get(key) if key == "certificate-authority" else user.get(key)
        return str(base / file) if file else None

    try:
        server = str(cluster.get("server") or "")
        tls: ssl.SSLContext | None = None
        if server.startswith("https"):
            tls = ssl.create_default_context(cafile=material("certificate-authority"))
            if cluster.get("insecure-skip-tls-verify"):
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            cert, key = material("client-certificate"), material("client-key")
            if cert and key:
                tls.load_cert_chain(cert, key)
        token_file = user.get("tokenFile")
        return ClusterReader(
            server=server,
            context=tls,
            token=str(user["token"]) if user.get("token") else None,
            token_file=base / str(token_file) if token_file else None,
            workdir=workdir,
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


__all__ = ["ClusterReader", "ObjectVersion", "ReaderError", "ReaderUnsupported", "open_reader"]
