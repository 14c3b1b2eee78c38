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

What is asked of each server (a registry's manifests and tags, a Helm repository's index, a git
server's heads and trees, an http download) is in :mod:`hub.resolve._servers`; this module
decides what to pin and follows charts to their dependencies. Called by
:mod:`hub.publish.flow` (through :mod:`hub.resolve`).
"""

from __future__ import annotations

import dataclasses
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hub.errors import ResolveError, SourceUnavailableError
from hub.fleet.model import Bundle, ChartDependency, ChartPin, Pin, SourceRef
from hub.resolve._servers import (
    ResolveSettings,
    _NotFound,
    _Refused,
    _Servers,
    _Unavailable,
    split_oci_uri,
)
from hub.resolve.charts import (
    ArchiveChart,
    ChartError,
    chart_in_archive,
    chart_in_tree,
    missing_dependencies,
    pick_version,
    read_archive,
    tag_version,
)

# Dependencies of dependencies...: deeper than this is a loop or a mistake.
_MAX_CHART_DEPTH = 5


class Resolver(_Servers):
    """Resolves source references to pins, caching every answer for the life of the object.

    ``progress(done, total, what)`` is called as references are resolved.
    """

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


def _key(src: SourceRef) -> tuple[str, str, str, str, str]:
    return (src.kind, src.uri, src.ref_field, src.ref, src.chart)


__all__ = ["ResolveSettings", "Resolver", "split_oci_uri"]
