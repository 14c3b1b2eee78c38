"""Helm charts as the resolver sees them: a repository's index, a version range, an archive.

Pure functions over bytes the resolver downloaded: :func:`parse_index` (a Helm repository's
``index.yaml``, bounded), :func:`pick_version` (the highest version in a SemVer range, Helm's
syntax, pre-releases only when the range names one), :func:`read_archive` (a chart archive's
top directory, ``Chart.yaml`` and which dependencies it vendors in ``charts/``, read from the
tar stream without unpacking it), :func:`chart_in_archive` (the same for an archive over http
or an OCI chart layer, where the chart may also sit at the top), :func:`chart_in_tree` (a
chart directory in git) and :func:`missing_dependencies`.

Each refusal is a :class:`ChartError` with a message naming what is wrong.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodesemver import max_satisfying

from agent.render.manifests import InvalidManifestError, ParseLimits, load_documents
from hub.fleet.load import version_range

# A large public index (thousands of versions) is tens of MB and millions of nodes.
INDEX_LIMITS = ParseLimits(
    max_file_bytes=64 * 1024 * 1024,
    max_document_chars=64 * 1024 * 1024,
    max_documents=1,
    max_nodes=20_000_000,
    max_aliases=1_000,
    max_depth=32,
)
_CHART_YAML_LIMITS = ParseLimits(max_file_bytes=1024 * 1024, max_documents=1)
_MAX_MEMBERS = 10_000
_ARCHIVE_NAME = re.compile(r"^(.+?)-v?\d")


class ChartError(Exception):
    """A repository index or chart archive is not usable (the message says why)."""


class NotAnArchiveError(ChartError):
    """The bytes are not a tar archive at all."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One version of one chart in a repository's index."""

    version: str
    urls: tuple[str, ...]
    digest: str | None


@dataclass(frozen=True, slots=True)
class ArchiveChart:
    """What a chart archive holds: its top directory, ``Chart.yaml`` (with a v1 chart's
    ``requirements.yaml`` dependencies) and the names of the subcharts in ``charts/``."""

    top: str
    metadata: Mapping[str, Any]
    vendored: frozenset[str]


def parse_index(data: bytes, *, where: str) -> dict[str, list[IndexEntry]]:
    """``index.yaml`` -> chart name -> its versions. Raises ChartError."""
    try:
        documents = load_documents(data, source=where, file="index.yaml", limits=INDEX_LIMITS)
    except InvalidManifestError as exc:
        raise ChartError(f"unreadable index.yaml: {exc.detail}") from exc
    index = documents[0] if documents else None
    entries = index.get("entries") if isinstance(index, dict) else None
    if not isinstance(entries, dict):
        raise ChartError("index.yaml has no entries (is this a Helm repository?)")
    out: dict[str, list[IndexEntry]] = {}
    for name, versions in entries.items():
        if not isinstance(versions, list):
            continue
        for item in versions:
            if not isinstance(item, dict) or not isinstance(item.get("version"), str):
                continue
            urls = item.get("urls")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls) or not urls:
                continue
            digest = item.get("digest")
            out.setdefault(str(name), []).append(
                IndexEntry(
                    version=item["version"],
                    urls=tuple(urls),
                    digest=digest if isinstance(digest, str) else None,
                )
            )
    return out


def pick_version(versions: Iterable[str], wanted: str) -> str | None:
    """The highest of ``versions`` in the range ``wanted`` (an exact version matches itself),
    or None."""
    normal = version_range(wanted)
    if normal is None:
        return None
    candidates = [v for v in versions if v]
    found = max_satisfying(candidates, normal, True)
    return str(found) if found is not None else None


def read_archive(path: Path) -> ArchiveChart:
    """Read a chart archive (``.tgz``, one top directory: the chart) without unpacking it.
    Raises ChartError."""
    tops, files = _scan(path)
    if len(tops) != 1:
        raise ChartError(
            f"a chart archive holds one directory, this one holds {len(tops)}: "
            f"{', '.join(sorted(tops)[:5])}"
        )
    return _archive_chart(files, tops.pop())


def chart_in_archive(path: Path) -> ArchiveChart | None:
    """The chart of an archive as the helm format finds it once the archive is unpacked:
    ``Chart.yaml`` at the top (``top`` is then ``""``), else the one directory at the top that
    holds one; None when there is no single chart there, or no tar archive at all (an http
    source's bytes: the agent says what they are).

    Raises ChartError for an unreadable ``Chart.yaml`` or a damaged archive.
    """
    try:
        _tops, files = _scan(path)
    except NotAnArchiveError:
        return None
    if "Chart.yaml" in files:
        return _archive_chart(files, "")
    candidates = {
        p.split("/")[0]
        for p in files
        if p.count("/") == 1 and p.endswith("/Chart.yaml") and not p.startswith(".")
    }
    if len(candidates) != 1:
        return None
    return _archive_chart(files, candidates.pop())


def _scan(path: Path) -> tuple[set[str], dict[str, bytes | None]]:
    """The names at the top of an archive, and its regular files: the bytes of the chart
    metadata files a chart at the top or one level down can have (its own and its vendored
    subcharts' ``Chart.yaml`` and ``requirements.yaml``), None for the others."""
    tops: set[str] = set()
    files: dict[str, bytes | None] = {}
    try:
        with tarfile.open(path, "r:*") as archive:
            for count, member in enumerate(archive):
                if count >= _MAX_MEMBERS:
                    raise ChartError(f"more than {_MAX_MEMBERS} files in the chart archive")
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                if not parts or ".." in parts:
                    continue
                tops.add(parts[0])
                if not member.isfile():
                    continue
                name = "/".join(parts)
                files[name] = None
                if parts[-1] not in ("Chart.yaml", "requirements.yaml") or len(parts) > 4:
                    continue
                if member.size > _CHART_YAML_LIMITS.max_file_bytes:
                    raise ChartError(f"{member.name} is larger than 1 MiB")
                handle = archive.extractfile(member)
                if handle is not None:
                    files[name] = handle.read()
    except tarfile.ReadError as exc:
        if not tops:
            raise NotAnArchiveError(f"not a readable chart archive: {exc}") from exc
        raise ChartError(f"not a readable chart archive: {exc}") from exc
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ChartError(f"not a readable chart archive: {exc}") from exc
    return tops, files


def _archive_chart(files: Mapping[str, bytes | None], top: str) -> ArchiveChart:
    """The chart at ``top`` (``""``: the archive's root) of a scanned archive."""
    prefix = f"{top}/" if top else ""
    where = top or "."
    metadata = _yaml_mapping(files.get(f"{prefix}Chart.yaml"), f"{where}/Chart.yaml")
    if not isinstance(metadata.get("name"), str):
        raise ChartError(f"{where}/Chart.yaml has no chart name")
    requirements = files.get(f"{prefix}requirements.yaml")
    if metadata.get("apiVersion") == "v1" and requirements is not None:
        declared = _yaml_mapping(requirements, f"{where}/requirements.yaml")
        metadata = {**metadata, "dependencies": declared.get("dependencies")}
    subcharts: set[str] = set()
    for name, data in files.items():
        if not name.startswith(f"{prefix}charts/"):
            continue
        rest = name[len(prefix) + len("charts/") :].split("/")
        if len(rest) == 1 and rest[0].endswith((".tgz", ".tar.gz")):
            match = _ARCHIVE_NAME.match(rest[0])
            if match:
                subcharts.add(match.group(1))
        elif len(rest) == 2 and rest[1] == "Chart.yaml":
            subcharts.add(rest[0])
            nested = _yaml_mapping(data, f"{where}/charts/{rest[0]}/Chart.yaml").get("name")
            if isinstance(nested, str):
                subcharts.add(nested)
    return ArchiveChart(top=top, metadata=metadata, vendored=frozenset(subcharts))


def chart_in_tree(tree: Any, directory: str) -> ArchiveChart | None:
    """The chart of a git tree (a ``pygit2.Tree``) as the helm format finds it in the source's
    content: ``directory`` itself when it holds a ``Chart.yaml`` (``top`` is then ``""``), else
    the one directory under it that does; None when there is no single chart there.

    Raises ChartError for an unreadable ``Chart.yaml``.
    """
    node = tree
    for part in [p for p in directory.split("/") if p]:
        if part not in node:
            return None
        node = node[part]
        if not hasattr(node, "__iter__") or getattr(node, "type_str", "") != "tree":
            return None
    top = ""
    if "Chart.yaml" not in node:
        candidates = [
            e.name
            for e in node
            if e.type_str == "tree" and not e.name.startswith(".") and "Chart.yaml" in e
        ]
        if len(candidates) != 1:
            return None
        top = candidates[0]
        node = node[top]
    where = f"{directory}/{top}".strip("/") or "."
    files = {"Chart.yaml": node["Chart.yaml"].data}
    if "requirements.yaml" in node:
        files["requirements.yaml"] = node["requirements.yaml"].data
    metadata = _yaml_mapping(files["Chart.yaml"], f"{where}/Chart.yaml")
    if not isinstance(metadata.get("name"), str):
        raise ChartError(f"{where}/Chart.yaml has no chart name")
    if metadata.get("apiVersion") == "v1" and "requirements.yaml" in files:
        requirements = _yaml_mapping(files["requirements.yaml"], f"{where}/requirements.yaml")
        metadata = {**metadata, "dependencies": requirements.get("dependencies")}
    vendored: set[str] = set()
    if "charts" in node and node["charts"].type_str == "tree":
        for entry in node["charts"]:
            if entry.type_str == "tree" and "Chart.yaml" in entry:
                vendored.add(entry.name)
                nested = _yaml_mapping(entry["Chart.yaml"].data, f"{where}/charts/{entry.name}")
                if isinstance(nested.get("name"), str):
                    vendored.add(nested["name"])
            elif entry.name.endswith((".tgz", ".tar.gz")):
                match = _ARCHIVE_NAME.match(entry.name)
                if match:
                    vendored.add(match.group(1))
    return ArchiveChart(top=top, metadata=metadata, vendored=frozenset(vendored))


def missing_dependencies(chart: ArchiveChart) -> list[Mapping[str, Any]]:
    """The ``dependencies`` of ``Chart.yaml`` that ``charts/`` does not vendor."""
    declared = chart.metadata.get("dependencies") or []
    if not isinstance(declared, list):
        return []
    return [
        d
        for d in declared
        if isinstance(d, dict)
        and isinstance(d.get("name"), str)
        and d["name"] not in chart.vendored
    ]


def tag_version(tag: str) -> str:
    """The chart version an OCI tag stands for (``helm push`` writes ``+`` as ``_``)."""
    return tag.replace("_", "+")


def _yaml_mapping(data: bytes | None, where: str) -> Mapping[str, Any]:
    if data is None:
        raise ChartError(f"{where} is missing")
    try:
        documents = load_documents(data, source="chart", file=where, limits=_CHART_YAML_LIMITS)
    except InvalidManifestError as exc:
        raise ChartError(f"{where}: {exc.detail}") from exc
    found = documents[0] if documents else None
    if not isinstance(found, dict):
        raise ChartError(f"{where} is not a mapping")
    return found


__all__ = [
    "ArchiveChart",
    "ChartError",
    "IndexEntry",
    "NotAnArchiveError",
    "chart_in_archive",
    "chart_in_tree",
    "missing_dependencies",
    "parse_index",
    "pick_version",
    "read_archive",
    "tag_version",
]
