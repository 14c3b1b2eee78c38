"""Pin every source of a fleet to an immutable digest, once per reference per run.

- OCI tag -> the manifest (or index) digest: one HEAD on ``/v2/<repo>/manifests/<tag>`` through
  the registry client the agent uses too (:mod:`agent.source.registry`: bounded retries);
- git branch or tag -> commit SHA: one ref listing (``Remote.list_heads``) per repository, no
  clone; annotated tags are peeled to their commit;
- http URL -> sha256 of the content, downloaded once with a size cap;
- Helm repository chart + version range -> the highest matching version in the repository's
  ``index.yaml`` (read once per repository), its archive URL and the sha256 of the archive
  (downloaded, checked against the index's digest); dependencies the archive does not vendor
  are pinned the same way (Helm repositories) or as OCI charts, recursively;
- OCI repository + version range -> the highest tag in the range (tags listed once per
  repository; Helm writes ``+`` as ``_``), then its manifest digest;
- the chart of a ``helm`` bundle from git (the pinned commit's ``Chart.yaml``), from an http
  archive (downloaded once, hashed) or from an OCI chart (Helm's media types: the chart layer,
  checked against its descriptor): dependencies it does not vendor are pinned as above;
- already-pinned references are kept (their syntax was checked when the fleet was loaded).

Results are cached in the :class:`Resolver`, so a tag used by 10,000 clusters costs one request.
Failures are collected over all references and raised together, each naming the bundle and the
reference: :class:`~hub.errors.ResolveError` (the reference does not exist) or
:class:`~hub.errors.SourceUnavailableError` (the server did not answer; a retry may help).
"""

from __future__ import annotations

import dataclasses
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
from typing import IO, Any

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
from hub.errors import ResolveError, SourceUnavailableError
from hub.fleet.model import Bundle, ChartDependency, ChartPin, Pin, SourceRef
from hub.resolve.charts import (
    ArchiveChart,
    ChartError,
    IndexEntry,
    chart_in_archive,
    chart_in_tree,
    missing_dependencies,
    parse_index,
    pick_version,
    read_archive,
    tag_version,
)

_OCI_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
# Dependencies of dependencies...: deeper than this is a loop or a mistake.
_MAX_CHART_DEPTH = 5
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


class Resolver:
    """Resolves source references to pins, caching every answer for the life of the object.

    ``progress(done, total, what)`` is called as references are resolved.
    """

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

    def __enter__(self) -> Resolver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def resolve_bundles(self, bundles: Iterable[Bundle]) -> dict[SourceRef, Pin]:
        """Pin every source of ``bundles``: SourceRef -> pin (digest, commit or sha256 hex; a
        :class:`~hub.fleet.model.ChartPin` for a version range).

        Raises ResolveError if any reference does not exist (all failures listed), otherwise
        SourceUnavailableError if any server did not answer.
        """
        users: dict[SourceRef, list[str]] = {}
        formats: dict[SourceRef, set[str]] = {}
        for b in bundles:
            for s in b.all_sources:
                users.setdefault(s, []).append(b.name)
                formats.setdefault(s, set()).add(str(b.spec.get("format") or "plain"))
        pins: dict[SourceRef, Pin] = {}
        missing: list[tuple[str, str, str]] = []
        down: list[tuple[str, str, str]] = []
        total = len(users)
        for done, (src, names) in enumerate(sorted(users.items(), key=lambda kv: _key(kv[0]))):
            try:
                chart = formats[src] == {"helm"}
                # The chart of a helm bundle may list dependencies it does not vendor.
                if chart and src.kind == "http":
                    pins[src] = self._http_chart(src)  # one download hashes it and reads it
                else:
                    pins[src] = self.resolve(src)
                if chart and src.kind == "git":
                    pins[src] = self._git_chart(src, str(pins[src]))
                elif chart and src.kind == "image":
                    pins[src] = self._oci_chart(src, pins[src])
            except _NotFound as exc:
                missing.extend((n, src.describe(), str(exc)) for n in sorted(set(names)))
            except _Unavailable as exc:
                down.extend((n, src.describe(), str(exc)) for n in sorted(set(names)))
            if self.progress is not None:
                self.progress(done + 1, total, src.describe())
        if missing:
            raise ResolveError(missing + down)
        if down:
            raise SourceUnavailableError(down)
        return pins

    def resolve(self, src: SourceRef) -> Pin:
        """The pin of one reference (cached). Raises _NotFound or _Unavailable (internal)."""
        key = _key(src)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        pin: Pin
        if src.pinned:
            pin = src.ref
        elif src.kind == "helm":
            pin = self._helm_chart(src.uri, src.chart, src.ref, depth=0)
        elif src.kind == "image" and src.ref_field == "version":
            pin = self._oci_version(src.uri, src.ref)
        elif src.kind == "image":
            pin = self._oci_tag(src.uri, src.ref)
        elif src.kind == "git":
            pin = self._git_ref(src.uri, src.ref_field, src.ref)
        else:
            pin = self._http_sha256(src.uri)
        self._cache[key] = pin
        return pin

    # --- OCI ------------------------------------------------------------------------------

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

    def _oci_version(self, uri: str, wanted: str) -> ChartPin:
        """The highest tag of ``uri`` whose version is in ``wanted``, and its digest."""
        tags = self._list_tags(uri)
        by_version = {tag_version(t): t for t in tags}
        version = pick_version(by_version, wanted)
        if version is None:
            shown = ", ".join(sorted(by_version)[-5:]) or "none"
            raise _NotFound(f"no tag in the range {wanted!r} (tags: {shown})")
        tag = by_version[version]
        return ChartPin(version=version, pin=self._oci_tag(uri, tag), tag=tag)

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

    def _oci_chart(self, src: SourceRef, pin: Pin) -> Pin:
        """The pin of a helm bundle's OCI chart with the dependencies it does not vendor.

        A digest written in the fleet whose chart cannot be fetched (the registry unreachable
        at one attempt, or answering with an error: the pin is valid without this read) is kept
        as is, as before: publishing a pinned fleet needs no network (the agent names any
        dependency then missing, and the next resolve pins it). Content that contradicts the
        digest is refused.
        """
        digest = pin.pin if isinstance(pin, ChartPin) else pin
        dependencies = self._oci_dependencies(src.uri, digest, depth=0, offline_ok=src.pinned)
        return _with_dependencies(pin, dependencies)

    def _oci_dependencies(
        self, uri: str, digest: str, *, depth: int, offline_ok: bool = False
    ) -> tuple[ChartDependency, ...]:
        """The dependencies the chart at ``uri@digest`` lists and does not vendor, pinned
        (none for an artifact that is not a Helm chart: the agent says what it is; none when
        ``offline_ok`` and the registry does not give the chart at the first attempt)."""
        key = (uri, digest)
        cached = self._oci_charts.get(key)
        if cached is not None:
            return cached
        with tempfile.TemporaryDirectory(prefix="fleetlet-chart-") as scratch:
            path = Path(scratch) / "chart.tgz"
            try:
                found = self._oci_chart_layer(uri, digest, path, tries=1 if offline_ok else None)
            except (_Unavailable, _Refused):
                if offline_ok:
                    return ()
                raise
            chart = _read_chart(path, where=f"{uri}@{digest}") if found else None
        dependencies = self._chart_dependencies(chart, depth=depth) if chart else ()
        self._oci_charts[key] = dependencies
        return dependencies

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

    # --- helm -----------------------------------------------------------------------------

    def _helm_chart(self, repo: str, chart: str, wanted: str, *, depth: int) -> ChartPin:
        """Resolve ``chart`` in the Helm repository ``repo`` to one version and its archive,
        and pin the dependencies that archive does not vendor."""
        key = (repo, chart, wanted)
        cached = self._charts.get(key)
        if cached is not None:
            return cached
        entries = self._index(repo).get(chart)
        if not entries:
            raise _NotFound(f"no chart {chart!r} in {repo}/index.yaml")
        version = pick_version((e.version for e in entries), wanted)
        if version is None:
            shown = ", ".join(e.version for e in entries[:5])
            raise _NotFound(f"no version of {chart} in the range {wanted!r} (newest: {shown})")
        entry = next(e for e in entries if e.version == version)
        archive_url = urllib.parse.urljoin(repo.rstrip("/") + "/", entry.urls[0])
        with tempfile.TemporaryDirectory(prefix="fleetlet-chart-") as scratch:
            path = Path(scratch) / "chart.tgz"
            with open(path, "wb") as sink:
                sha256 = self._http_download(archive_url, sink)
            expected = (entry.digest or "").removeprefix("sha256:")
            if expected and expected != sha256:
                raise _NotFound(
                    f"{archive_url} hashes to sha256 {sha256}, the index says {expected}"
                )
            try:
                archive = read_archive(path)
            except ChartError as exc:
                raise _NotFound(f"{archive_url}: {exc}") from exc
        pin = ChartPin(
            version=version,
            pin=sha256,
            archive_url=archive_url,
            dependencies=self._chart_dependencies(archive, depth=depth),
        )
        self._charts[key] = pin
        return pin

    def _chart_dependencies(
        self, chart: ArchiveChart, *, depth: int
    ) -> tuple[ChartDependency, ...]:
        """The dependencies ``chart`` lists and does not vendor, pinned (theirs too), placed
        under its ``charts/``."""
        out: list[ChartDependency] = []
        for dependency in missing_dependencies(chart):
            out.extend(
                self._dependency(
                    dependency, parent=str(chart.metadata["name"]), top=chart.top, depth=depth
                )
            )
        return tuple(out)

    def _dependency(
        self, dependency: Mapping[str, Any], *, parent: str, top: str, depth: int
    ) -> list[ChartDependency]:
        """One missing dependency of a chart (and its own missing ones), placed under
        ``<top>/charts``. Its failures name the chart, the dependency and its range."""
        name = str(dependency["name"])
        repository = str(dependency.get("repository") or "")
        wanted = str(dependency.get("version") or "*")
        what = f"chart {parent}: dependency {name} version {wanted!r} from {repository or '-'!r}"
        if depth >= _MAX_CHART_DEPTH:
            raise _NotFound(f"chart {parent}: dependencies nested deeper than {_MAX_CHART_DEPTH}")
        try:
            return self._pin_dependency(name, repository, wanted, top=top, depth=depth)
        except _NotFound as exc:
            raise _NotFound(f"{what}: {exc}") from exc
        except _Unavailable as exc:
            raise _Unavailable(f"{what}: {exc}") from exc

    def _pin_dependency(
        self, name: str, repository: str, wanted: str, *, top: str, depth: int
    ) -> list[ChartDependency]:
        where = f"{top}/charts" if top else "charts"
        if repository.startswith("file://"):
            # A chart in the same tree: signed with it, placed and checked by the agent.
            return []
        if repository.startswith(("@", "alias:")):
            raise _NotFound(
                "the repository names one of a local helm repositories.yaml, which fleetlet "
                "never reads: use the repository's full URL (https://... or oci://...)"
            )
        if repository.startswith(("http://", "https://")):
            pin = self._helm_chart(repository, name, wanted, depth=depth + 1)
            placed = ChartDependency(
                kind="helm",
                uri=repository,
                chart=name,
                version=pin.version,
                pin=pin.pin,
                archive_url=pin.archive_url,
                tag=None,
                destination=where,
            )
        elif repository.startswith("oci://"):
            uri = f"{repository.removeprefix('oci://').rstrip('/')}/{name}"
            pin = self._oci_version(uri, wanted)
            pin = dataclasses.replace(
                pin, dependencies=self._oci_dependencies(uri, pin.pin, depth=depth + 1)
            )
            placed = ChartDependency(
                kind="image",
                uri=uri,
                chart=name,
                version=pin.version,
                pin=pin.pin,
                archive_url=None,
                tag=pin.tag,
                destination=where,
            )
        else:
            raise _NotFound(
                "not vendored in charts/, and only http(s):// and oci:// repositories can be "
                "pinned (file:// ones are charts in the same tree)"
            )
        # Its own dependencies go under its directory (the archive's top is its name).
        return [placed] + [
            dataclasses.replace(nested, destination=f"{where}/{nested.destination}")
            for nested in pin.dependencies
        ]

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

    def _git_chart(self, src: SourceRef, commit: str) -> Pin:
        """The commit of a helm bundle's git source, with the dependencies its chart lists
        and does not vendor pinned (a shallow fetch of the commit to read ``Chart.yaml``).

        A commit the server will not send by itself (fetch by id refused), or a tree without
        a chart where it is looked for, is returned as is: the agent then says what is missing.
        """
        key = (src.uri, commit, dict(src.extra).get("directory") or "")
        cached = self._git_charts.get(key)
        if cached is not None:
            return cached
        tree = self._git_tree(src, commit)
        directory = str(dict(src.extra).get("directory") or "").strip("/")
        chart = None
        if tree is not None:
            try:
                chart = chart_in_tree(tree, directory)
            except ChartError as exc:
                raise _NotFound(f"commit {commit}: {exc}") from exc
        pin: Pin = commit
        if chart is not None:
            pin = _with_dependencies(commit, self._chart_dependencies(chart, depth=0))
        self._git_charts[key] = pin
        return pin

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

    # --- git ------------------------------------------------------------------------------

    def _git_ref(self, uri: str, ref_field: str, ref: str) -> str:
        heads = self._heads.get(uri)
        if heads is None:
            heads = self._list_heads(uri)
            self._heads[uri] = heads
        if ref_field == "branch":
            candidates = [f"refs/heads/{ref}"]
        else:
            # An annotated tag's listing has a peeled "^{}" entry: the commit it points to.
            candidates = [f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"]
        for name in candidates:
            if name in heads:
                return heads[name]
        raise _NotFound(f"no {ref_field} {ref!r} in {uri}")

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

    # --- http -----------------------------------------------------------------------------

    def _http_sha256(self, url: str) -> str:
        return self._http_download(url, None)

    def _http_chart(self, src: SourceRef) -> Pin:
        """The sha256 of a helm bundle's chart archive over http (checked against the one the
        bundle writes, if any), with the dependencies its chart lists and does not vendor.

        An archive without a chart where the helm format looks for one is returned as is:
        the agent then says what is missing. So is a sha256 written in the fleet whose archive
        cannot be downloaded (one attempt: the pin is valid without this read): publishing a
        pinned fleet needs no network. An archive that contradicts the sha256 is refused.
        """
        key = (src.uri, src.ref_field, src.ref)
        cached = self._http_charts.get(key)
        if cached is not None:
            return cached
        with tempfile.TemporaryDirectory(prefix="fleetlet-chart-") as scratch:
            path = Path(scratch) / "chart.tgz"
            try:
                with open(path, "wb") as sink:
                    sha256 = self._http_download(src.uri, sink, tries=1 if src.pinned else None)
            except (_Unavailable, _NotFound):
                if src.pinned:
                    return src.ref
                raise
            if src.pinned and sha256 != src.ref:
                raise _NotFound(f"content hashes to sha256 {sha256}, the bundle pins {src.ref}")
            chart = _read_chart(path, where=src.uri)
        pin: Pin = sha256
        if chart is not None:
            pin = _with_dependencies(sha256, self._chart_dependencies(chart, depth=0))
        self._http_charts[key] = pin
        return pin

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


def _read_chart(path: Path, *, where: str) -> ArchiveChart | None:
    try:
        return chart_in_archive(path)
    except ChartError as exc:
        raise _NotFound(f"{where}: {exc}") from exc


def _with_dependencies(pin: Pin, dependencies: tuple[ChartDependency, ...]) -> Pin:
    """``pin`` carrying ``dependencies`` (as is when there are none)."""
    if not dependencies:
        return pin
    if isinstance(pin, ChartPin):
        return dataclasses.replace(pin, dependencies=dependencies)
    return ChartPin(version="", pin=pin, dependencies=dependencies)


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


def _key(src: SourceRef) -> tuple[str, str, str, str, str]:
    return (src.kind, src.uri, src.ref_field, src.ref, src.chart)
