"""What the resolver asks of each server, with bounded retries and size caps: a registry's
manifests, tags and chart layers (through the agent's registry client), a Helm repository's
``index.yaml``, a git server's heads and trees (no clone), an http download hashed as it
streams. Its answers are kept for the life of the :class:`~hub.resolve.resolver.Resolver`,
which builds on :class:`_Servers`; failures are :class:`_NotFound` (the server answered) or
:class:`_Unavailable` (a retry may help).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pygit2
import requests

from agent.api.pins import is_digest
from agent.backoff import attempts
from agent.source.content import AuthenticationError, Credentials
from agent.source.oci import HELM_CHART_LAYER_MEDIA_TYPE
from agent.source.registry import (
    RegistryClient,
    RegistryProtocolError,
    RegistrySettings,
    RegistryUnavailableError,
)
from hub.fleet.model import ChartDependency, ChartPin, Pin, SourceRef
from hub.resolve.charts import ChartError, IndexEntry, parse_index

_OCI_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


_TAGS_PAGE = 1000
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024


class _NotFound(Exception):
    """The server answered: this reference does not exist."""


class _Refused(_NotFound):
    """The server answered with an error status or refused access (no content to judge)."""


class _Unavailable(Exception):
    """The server did not answer usefully; a retry may help."""


@dataclass(frozen=True, kw_only=True)
class ResolveSettings:
    """Bounds of the resolver. ``insecure_registries`` are spoken to over plain HTTP (loopback
    registries always are); ``registry_credentials`` maps a registry host to (user, password)."""

    timeout: float = 10.0
    attempts: int = 3
    backoff: float = 0.5
    max_download_bytes: int = 256 * 1024 * 1024
    insecure_registries: tuple[str, ...] = ()
    registry_credentials: Mapping[str, tuple[str, str]] | None = None
    user_agent: str = "fleetlet-hub"


def _ask(
    client: RegistryClient,
    url: str,
    method: str,
    headers: dict[str, str] | None = None,
    *,
    stream: bool = False,
) -> requests.Response:
    """One request through the shared registry client, its errors as the resolver's: refused
    access or a request that cannot be made is _NotFound, an unreachable registry
    _Unavailable."""
    try:
        response: requests.Response = client.do_request(url, method, headers=headers, stream=stream)
    except (AuthenticationError, RegistryProtocolError) as exc:
        raise _Refused(f"registry refused access: {exc}") from exc
    except RegistryUnavailableError as exc:
        raise _Unavailable(str(exc)) from exc
    return response


def split_oci_uri(uri: str, insecure_hosts: Iterable[str] = ()) -> tuple[str, str, bool]:
    """``[oci://|http://|https://]host/repo`` -> (host, repository, plain_http).

    ``http://`` forces plain HTTP, ``https://`` TLS; otherwise loopback hosts and
    ``insecure_hosts`` use plain HTTP. Raises ValueError if host or repository is missing.
    """
    rest, plain = uri, None
    for prefix, is_plain in (("oci://", None), ("http://", True), ("https://", False)):
        if rest.startswith(prefix):
            rest, plain = rest[len(prefix) :], is_plain
            break
    host, _, repo = rest.partition("/")
    if not host or not repo or "@" in repo or ":" in repo.rsplit("/", 1)[-1]:
        raise ValueError("expected [oci://]REGISTRY/REPOSITORY (tag and digest go in their field)")
    if plain is None:
        plain = host.split(":")[0] in ("127.0.0.1", "localhost") or host in set(insecure_hosts)
    return host, repo, plain


class _Servers:
    """The servers the :class:`~hub.resolve.resolver.Resolver` asks (registries, Helm
    repositories, git and http servers), and every answer and pin it keeps for the life of the
    object (set up here, filled by the resolver)."""

    def __init__(
        self,
        *,
        settings: ResolveSettings | None = None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> None:
        self.settings = settings or ResolveSettings()
        self.progress = progress
        self._cache: dict[tuple[str, str, str, str, str], Pin] = {}
        self._heads: dict[str, dict[str, str]] = {}
        self._indexes: dict[str, dict[str, list[IndexEntry]]] = {}
        self._charts: dict[tuple[str, str, str], ChartPin] = {}
        self._tags: dict[str, list[str]] = {}
        self._git_charts: dict[tuple[str, str, str], Pin] = {}
        self._http_charts: dict[tuple[str, str, str], Pin] = {}
        self._oci_charts: dict[tuple[str, str], tuple[ChartDependency, ...]] = {}
        self._registries: dict[tuple[str, bool, int], RegistryClient] = {}
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._scratch_repo: pygit2.Repository | None = None
        self.requests = {"image": 0, "git": 0, "http": 0, "helm": 0}

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
            self._scratch_repo = None

    def _registry(
        self, uri: str, *, tries: int | None = None
    ) -> tuple[RegistryClient, str, str, bool]:
        """The registry client for ``uri`` (``tries`` attempts per request, default the
        settings'), its host, repository and whether it speaks plain HTTP."""
        try:
            host, repo, plain = split_oci_uri(uri, self.settings.insecure_registries)
        except ValueError as exc:
            raise _NotFound(str(exc)) from exc
        tries = tries or self.settings.attempts
        client = self._registries.get((host, plain, tries))
        if client is None:
            user, password = (self.settings.registry_credentials or {}).get(host, (None, None))
            client = RegistryClient(
                host=host,
                settings=RegistrySettings(
                    plain_http=plain,
                    timeout=self.settings.timeout,
                    attempts=tries,
                    backoff=self.settings.backoff,
                    user_agent=self.settings.user_agent,
                ),
                credentials=Credentials(username=user, password=password) if user else None,
                source=f"registry {host}",
            )
            self._registries[(host, plain, tries)] = client
        return client, host, repo, plain

    def _oci_tag(self, uri: str, tag: str) -> str:
        client, host, repo, plain = self._registry(uri)
        url = f"{'http' if plain else 'https'}://{host}/v2/{repo}/manifests/{tag}"
        self.requests["image"] += 1
        response = _ask(client, url, "HEAD", headers={"Accept": _OCI_ACCEPT})
        if response.status_code == 404:
            raise _NotFound(f"tag not found in {host}/{repo}")
        if response.status_code in (401, 403):
            raise _NotFound(f"registry refused access (HTTP {response.status_code})")
        if response.status_code != 200:
            raise _NotFound(f"HEAD {url}: HTTP {response.status_code}")
        digest = response.headers.get("Docker-Content-Digest", "")
        if not is_digest(digest):
            raise _NotFound(f"registry gave no sha256 Docker-Content-Digest (got {digest!r})")
        return digest

    def _list_tags(self, uri: str) -> list[str]:
        cached = self._tags.get(uri)
        if cached is not None:
            return cached
        client, host, repo, plain = self._registry(uri)
        base = f"{'http' if plain else 'https'}://{host}"
        url: str | None = f"{base}/v2/{repo}/tags/list?n={_TAGS_PAGE}"
        tags: list[str] = []
        while url is not None:
            self.requests["image"] += 1
            response = _ask(client, url, "GET")
            if response.status_code == 404:
                raise _NotFound(f"no repository {host}/{repo}")
            if response.status_code != 200:
                raise _NotFound(f"GET {url}: HTTP {response.status_code}")
            try:
                page = response.json()
            except ValueError as exc:
                raise _NotFound(f"GET {url}: not a tag list") from exc
            tags.extend(t for t in (page.get("tags") or []) if isinstance(t, str))
            # Pagination (distribution spec): Link: </v2/...?last=x&n=y>; rel="next"
            link = response.headers.get("Link", "")
            match = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', link)
            url = urllib.parse.urljoin(base, match.group(1)) if match else None
        self._tags[uri] = tags
        return tags

    def _oci_chart_layer(
        self, uri: str, digest: str, out: Path, *, tries: int | None = None
    ) -> bool:
        """Download the Helm chart layer of the manifest ``digest`` into ``out``, checked
        against the manifest's descriptor; False when the manifest has no single chart layer."""
        client, host, repo, plain = self._registry(uri, tries=tries)
        base = f"{'http' if plain else 'https'}://{host}/v2/{repo}"
        self.requests["image"] += 1
        response = _ask(
            client, f"{base}/manifests/{digest}", "GET", {"Accept": _OCI_ACCEPT}, stream=True
        )
        with response:
            if response.status_code != 200:
                raise _Refused(f"GET manifest {digest}: HTTP {response.status_code}")
            body = b""
            try:
                for chunk in response.iter_content(1 << 16):
                    body += chunk
                    if len(body) > _MAX_MANIFEST_BYTES:
                        raise _NotFound(
                            f"manifest {digest} is larger than {_MAX_MANIFEST_BYTES} bytes"
                        )
            except requests.RequestException as exc:
                raise _Unavailable(f"download of manifest {digest} failed: {exc}") from exc
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        if actual != digest:
            raise _NotFound(f"manifest bytes hash to {actual}, the pin is {digest}")
        try:
            manifest = json.loads(body)
        except ValueError as exc:
            raise _NotFound(f"manifest {digest} is not JSON: {exc}") from exc
        layers = manifest.get("layers") if isinstance(manifest, dict) else None
        charts = [
            layer
            for layer in (layers if isinstance(layers, list) else [])
            if isinstance(layer, dict) and layer.get("mediaType") == HELM_CHART_LAYER_MEDIA_TYPE
        ]
        if len(charts) != 1:
            return False
        blob, size = charts[0].get("digest"), charts[0].get("size")
        if not isinstance(blob, str) or not is_digest(blob) or not isinstance(size, int):
            raise _NotFound(f"manifest {digest}: the chart layer's descriptor is malformed")
        if size > self.settings.max_download_bytes:
            raise _NotFound(
                f"chart layer is {size} bytes, more than the {self.settings.max_download_bytes} "
                "allowed"
            )
        self.requests["image"] += 1
        response = _ask(client, f"{base}/blobs/{blob}", "GET", stream=True)
        if response.status_code != 200:
            response.close()
            raise _Refused(f"GET chart layer {blob}: HTTP {response.status_code}")
        hasher = hashlib.sha256()
        got = 0
        try:
            with response, open(out, "wb") as sink:
                for chunk in response.iter_content(1 << 16):
                    got += len(chunk)
                    if got > size:
                        break
                    hasher.update(chunk)
                    sink.write(chunk)
        except requests.RequestException as exc:
            raise _Unavailable(f"download of chart layer {blob} failed: {exc}") from exc
        if got != size or "sha256:" + hasher.hexdigest() != blob:
            raise _NotFound(f"chart layer {blob} does not match its descriptor")
        return True

    def _index(self, repo: str) -> dict[str, list[IndexEntry]]:
        cached = self._indexes.get(repo)
        if cached is not None:
            return cached
        with tempfile.TemporaryFile() as sink:
            self._http_download(repo.rstrip("/") + "/index.yaml", sink)
            sink.seek(0)
            data = sink.read()
        self.requests["helm"] += 1
        try:
            index = parse_index(data, where=repo)
        except ChartError as exc:
            raise _NotFound(f"{repo}: {exc}") from exc
        self._indexes[repo] = index
        return index

    def _git_tree(self, src: SourceRef, commit: str) -> pygit2.Tree | None:
        if self._scratch_repo is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="fleetlet-resolve-")
            self._scratch_repo = pygit2.init_repository(self._scratch.name, bare=True)
        repo = self._scratch_repo
        if commit not in repo:
            remote = repo.remotes.create_anonymous(src.uri)
            wanted = {
                "branch": f"refs/heads/{src.ref}",
                "tag": f"refs/tags/{src.ref}",
            }.get(src.ref_field, commit)
            self.requests["git"] += 1
            try:
                remote.fetch([f"+{wanted}:refs/fleetlet/resolve/{commit}"], depth=1)
            except (pygit2.GitError, OSError):
                return None  # e.g. a server that does not serve unadvertised commits
            if commit not in repo:
                return None
        found = repo.get(commit)
        return found.tree if isinstance(found, pygit2.Commit) else None

    def _list_heads(self, uri: str) -> dict[str, str]:
        if self._scratch_repo is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="fleetlet-resolve-")
            self._scratch_repo = pygit2.init_repository(self._scratch.name, bare=True)
        remote = self._scratch_repo.remotes.create_anonymous(uri)
        self.requests["git"] += 1
        failure = ""
        for _attempt in attempts(self.settings.attempts, initial=self.settings.backoff):
            try:
                listing = remote.list_heads()
            except (pygit2.GitError, OSError) as exc:
                failure = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                if _git_not_found(failure):
                    raise _NotFound(f"git repository refused or not found: {failure}") from exc
                continue
            out: dict[str, str] = {}
            for head in listing:
                oid = getattr(head, "oid", None)
                if oid is not None:
                    out[str(head.name)] = str(oid)
            return out
        raise _Unavailable(
            f"git server unreachable after {self.settings.attempts} attempts: {failure}"
        )

    def _http_download(self, url: str, sink: IO[bytes] | None, *, tries: int | None = None) -> str:
        """GET ``url`` (bounded, retried ``tries`` times, default the settings') into ``sink``
        if given; returns the sha256 hex."""
        failure = ""
        limit = self.settings.max_download_bytes
        tries = tries or self.settings.attempts
        for _attempt in attempts(tries, initial=self.settings.backoff):
            self.requests["http"] += 1
            request = urllib.request.Request(url, headers={"User-Agent": self.settings.user_agent})
            try:
                with urllib.request.urlopen(request, timeout=self.settings.timeout) as response:
                    length = response.headers.get("Content-Length")
                    if length is not None and length.isdigit() and int(length) > limit:
                        raise _NotFound(f"content is {length} bytes, more than the {limit} allowed")
                    digest = hashlib.sha256()
                    size = 0
                    if sink is not None:
                        sink.seek(0)
                        sink.truncate()
                    while chunk := response.read(1 << 16):
                        size += len(chunk)
                        if size > limit:
                            raise _NotFound(f"content exceeds the {limit} bytes allowed")
                        digest.update(chunk)
                        if sink is not None:
                            sink.write(chunk)
                    return digest.hexdigest()
            except urllib.error.HTTPError as exc:
                if exc.code >= 500:
                    failure = f"HTTP {exc.code}"
                    continue
                raise _NotFound(f"HTTP {exc.code} {exc.reason}") from exc
            except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as exc:
                reason = getattr(exc, "reason", exc)
                failure = str(reason) or type(exc).__name__
                continue
            except ValueError as exc:  # http.client.InvalidURL and other malformed URLs
                raise _NotFound(f"invalid URL: {exc}") from exc
        raise _Unavailable(f"unreachable after {tries} attempts ({failure})")


def _git_not_found(message: str) -> bool:
    lowered = message.lower()
    return any(
        word in lowered
        for word in (
            "not found",
            "does not exist",
            "not exported",
            "access denied",
            "no such",
            "status code: 404",
            "status code: 401",
            "status code: 403",
            "authentication",
        )
    )
