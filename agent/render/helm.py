"""The ``helm`` format: a chart rendered by the real ``helm template``, hermetically.

The chart is the bundle tree's ``formatOptions.path``, else the tree's root when it holds a
``Chart.yaml``, else the one directory at the root that does (a chart archive, from an http,
helm or OCI source, unpacks to ``<chart>/``). What goes into the render, in helm's order of
precedence (later wins): the chart's ``values.yaml``, ``formatOptions.valuesFiles`` (paths from
the tree's root, in order), ``formatOptions.values`` (with the hub's per-cluster overrides and
``${cluster...}`` substitutions already applied: the signed set holds the final values), then
``formatOptions.setJson``, ``setString`` and ``setFile`` given to helm as its own flags (a
``setFile`` path must be a file inside the tree), so that helm types them itself.

``helm template`` runs as a bounded child process (:func:`agent.render._process.run_tool`)
with:

- the release name ``formatOptions.releaseName`` (default: the bundle's name), the target
  namespace as ``--namespace``;
- ``.Capabilities.KubeVersion`` / ``.APIVersions`` from the cluster's facts (``--kube-version``,
  ``--api-versions``), ``.Release.IsUpgrade`` from the request (``--is-upgrade``);
- ``--include-crds``: the chart's ``crds/`` come out first and, being CRDs, go to the CRD stage
  and are kept when the bundle is removed unless it sets ``keepCRDs: false``;
- confinement (:mod:`agent.render.confine`): helm reads the tree (and the scratch copy below)
  and nothing else, writes nothing, opens no socket;
- no network and no state: ``HOME`` and the ``HELM_*`` directories under ``/dev/null``, where
  nothing can exist (no repositories, no registry logins, no plugins, so no post-renderer), no
  kubeconfig, and proxies pointing at a closed local port, so any attempt to reach out fails
  at once. A chart whose dependencies are not in its ``charts/`` is refused before helm runs
  (the hub pins the non-vendored dependencies of a chart as extra sources, whatever source
  kind the chart comes from, when it publishes the chart as a ``helm`` bundle), except:
- dependencies with a ``file://`` repository (``file://../common``: a chart elsewhere in the
  bundle tree) are placed as ``helm dependency build`` would, into ``charts/`` of a copy of the
  chart in the scratch directory (the tree, signed and cached, is never changed); the path must
  stay inside the bundle tree, hold a chart of the dependency's name whose version satisfies
  the dependency's constraint, and its own ``file://`` dependencies are placed the same way;
  a link in the copy points at the same file of the tree (one leading outside is refused);
- dependencies whose repository is a local repository name (``@stable``, ``alias:stable``:
  a user's ``repositories.yaml``, which fleetlet never reads) are refused: use the full URL.

Helm hooks stay in the output with their annotations (``helm.sh/hook``, ``-weight``,
``-delete-policy``), test hooks included: the reconcile runs them as ordered stages of the
group and reports test hooks without running them. No release Secret is ever written (only
``helm template`` is used): fleetlet's own revision store is the record of what was applied.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.render import confine
from agent.render._process import run_tool
from agent.render.manifests import (
    InvalidManifestError,
    Manifest,
    ParseLimits,
    load_documents,
    parse_manifests,
)
from agent.render.plain import RenderRequest, refuse_duplicates
from agent.render.tools import HELM_MAX_MEMORY

DEFAULT_TIMEOUT = 60.0
"""Seconds one ``helm template`` may take."""
DEFAULT_MAX_MEMORY = HELM_MAX_MEMORY
"""Bytes of memory one ``helm template`` may write to (``RLIMIT_DATA``)."""

_CHART_FILE = "Chart.yaml"
_RELEASE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SOURCE_LINE = re.compile(r"^# Source: (.+)$", re.MULTILINE)
_DOCUMENT_START = re.compile(r"^---[ \t]*$", re.MULTILINE)
_CHART_YAML_LIMITS = ParseLimits(max_file_bytes=1024 * 1024, max_documents=1)
# Any HTTP(S) request helm might try goes to this closed port and fails at once.
_NOWHERE = "http://127.0.0.1:9"
_LOCAL_REPOSITORY = "file://"
_REPOSITORY_ALIASES = ("@", "alias:")
# file:// dependencies of file:// dependencies...: deeper than this is a loop or a mistake.
_MAX_LOCAL_DEPTH = 8


class HelmChartError(InvalidManifestError):
    """The chart cannot be rendered as given (no chart, missing dependency, bad values file);
    ``rule`` says which."""

    reason = "InvalidChart"


@dataclass(frozen=True, kw_only=True)
class LocalDependency:
    """A ``file://`` dependency: the chart directory in the bundle tree placed as
    ``charts/<name>``, with its own ``file://`` dependencies."""

    name: str
    path: Path
    dependencies: tuple[LocalDependency, ...] = ()


class HelmFormat:
    """The built-in ``helm`` format."""

    name = "helm"

    def __init__(
        self, *, timeout: float = DEFAULT_TIMEOUT, max_memory: int = DEFAULT_MAX_MEMORY
    ) -> None:
        self.timeout = timeout
        self.max_memory = max_memory

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]:
        """The chart's objects, hooks included, in helm's order.

        Raises HelmChartError, ToolNotFoundError, ToolError (helm failed, timed out, ran out of
        memory or printed too much: helm's own message is in it), InvalidManifestError (helm's
        output is not valid objects).
        """
        options = request.options
        source = request.source
        chart = locate_chart(tree, options.get("path"), source=source)
        metadata = read_chart_metadata(chart, tree=tree, source=source)
        local = check_dependencies(chart, metadata, tree=tree, source=source)
        helm = request.tools.find("helm")
        confinement = confine.for_tool(helm, tree=tree)
        with contextlib.ExitStack() as scratch:
            if local:
                # file:// dependencies go into a scratch copy: the signed, cached tree stays
                # as it is (and most charts need no scratch directory at all).
                where = Path(
                    scratch.enter_context(tempfile.TemporaryDirectory(prefix="fleetlet-helm-"))
                )
                chart = overlay_chart(chart, local, where / "overlay", tree=tree, source=source)
                confinement = confinement.plus(read=[where])
            argv: list[str] = [
                str(helm),
                "template",
                release_name(options, request, metadata),
                # Absolute: a relative path would read as <repository>/<chart> to helm.
                str(chart.resolve()),
                "--namespace",
                request.namespace or "default",
                "--include-crds",
            ]
            for values_file in values_files(tree, options.get("valuesFiles"), source=source):
                argv += ["--values", str(values_file)]
            values = options.get("values")
            inline = None
            if values:
                # On stdin (``--values -``): no file to write and clean up per render.
                inline = json.dumps(values).encode()
                argv += ["--values", "-"]
            # Already in ``values`` (for checking, and for plugin formats); helm applies them
            # again over them, typed as only helm types them (int64 against float64).
            argv += list(request.helm_set)
            argv += helm_set_flags(tree, options, source=source)
            facts = request.cluster
            if facts.kube_version:
                argv += ["--kube-version", facts.kube_version]
            argv += [f"--api-versions={version}" for version in facts.api_versions]
            if request.upgrade:
                argv.append("--is-upgrade")
            output = run_tool(
                argv,
                cwd=chart,
                timeout=self.timeout,
                max_memory=self.max_memory,
                input=inline,
                env=_HERMETIC_ENV,
                max_output=request.limits.max_total_bytes,
                confine=confinement,
            )
        return parse_output(output, source=source, limits=request.limits.parse)


def locate_chart(tree: Path, path: object, *, source: str) -> Path:
    """The chart directory of the tree (see the module's docstring).

    Raises HelmChartError (NoChart, SeveralCharts).
    """
    if isinstance(path, str) and path:
        chart = tree / path
        if not (chart / _CHART_FILE).is_file():
            raise HelmChartError(
                f"no {_CHART_FILE} in formatOptions.path {path!r}",
                source=source,
                file=path,
                rule="NoChart",
            )
        return chart
    if (tree / _CHART_FILE).is_file():
        return tree
    charts = sorted(
        entry.name
        for entry in tree.iterdir()
        if entry.is_dir() and not entry.name.startswith(".") and (entry / _CHART_FILE).is_file()
    )
    if len(charts) == 1:
        return tree / charts[0]
    if not charts:
        raise HelmChartError(
            f"no {_CHART_FILE} at the root of the bundle tree nor in a directory under it "
            "(set formatOptions.path to the chart's directory)",
            source=source,
            rule="NoChart",
        )
    raise HelmChartError(
        f"several charts at the root of the bundle tree ({', '.join(charts)}): set "
        "formatOptions.path to the one to render",
        source=source,
        rule="SeveralCharts",
    )


def read_chart_metadata(chart: Path, *, tree: Path, source: str) -> dict[str, Any]:
    """``Chart.yaml`` as a mapping (with ``requirements.yaml``'s dependencies for a v1 chart).

    Raises HelmChartError (BadChart), InvalidManifestError (not YAML, too large).
    """
    where = _relative(chart / _CHART_FILE, tree)
    documents = load_documents(
        (chart / _CHART_FILE).read_bytes(), source=source, file=where, limits=_CHART_YAML_LIMITS
    )
    metadata = documents[0] if documents else None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        raise HelmChartError(
            "not a chart description (a mapping with a name)",
            source=source,
            file=where,
            rule="BadChart",
        )
    requirements = chart / "requirements.yaml"
    if metadata.get("apiVersion") == "v1" and requirements.is_file():
        extra = load_documents(
            requirements.read_bytes(),
            source=source,
            file=_relative(requirements, tree),
            limits=_CHART_YAML_LIMITS,
        )
        if extra and isinstance(extra[0], dict):
            metadata = {**metadata, "dependencies": extra[0].get("dependencies")}
    return metadata


def check_dependencies(
    chart: Path, metadata: Mapping[str, Any], *, tree: Path, source: str, depth: int = 0
) -> tuple[LocalDependency, ...]:
    """Every dependency in ``Chart.yaml`` is in ``charts/`` (a directory or an archive) or is
    a ``file://`` chart inside the bundle tree; the latter are returned, to be placed with
    :func:`overlay_chart`.

    Rendering never downloads anything: a missing one is refused with what to do about it.
    Raises HelmChartError (MissingDependency, RepositoryAlias, LocalDependencyEscapes,
    LocalDependencyMissing, LocalDependencyMismatch), InvalidManifestError (a local
    dependency's unreadable Chart.yaml).
    """
    declared = metadata.get("dependencies") or []
    if not isinstance(declared, list):
        return ()  # helm itself says what is wrong with the file
    present = _vendored(chart / "charts")
    missing = []
    local = []
    where = _relative(chart / _CHART_FILE, tree)
    for dependency in declared:
        if not isinstance(dependency, dict) or not isinstance(dependency.get("name"), str):
            continue
        name = dependency["name"]
        if name in present:
            continue
        repository = str(dependency.get("repository") or "")
        if repository.startswith(_REPOSITORY_ALIASES):
            raise HelmChartError(
                f"chart {metadata.get('name')}: dependency {name}: repository {repository!r} "
                "names a repository of a local helm repositories.yaml, which fleetlet never "
                "reads: use the repository's full URL (https://... or oci://...)",
                source=source,
                file=where,
                rule="RepositoryAlias",
            )
        if repository.startswith(_LOCAL_REPOSITORY):
            local.append(
                _local_dependency(
                    chart, metadata, dependency, tree=tree, source=source, depth=depth
                )
            )
            continue
        version = dependency.get("version") or "any version"
        missing.append(f"{name} ({version} from {repository or 'no repository'})")
    if missing:
        raise HelmChartError(
            f"dependencies not in {_relative(chart / 'charts', tree)}/: {', '.join(missing)}. "
            "Rendering never downloads: vendor them (helm dependency build) or publish the "
            "bundle through the hub (format: helm), which pins them as extra sources",
            source=source,
            file=where,
            rule="MissingDependency",
        )
    return tuple(local)


def _local_dependency(
    chart: Path,
    metadata: Mapping[str, Any],
    dependency: Mapping[str, Any],
    *,
    tree: Path,
    source: str,
    depth: int,
) -> LocalDependency:
    """The chart a ``file://`` dependency names, checked (see :func:`check_dependencies`)."""
    name = str(dependency["name"])
    repository = str(dependency["repository"])
    path = repository[len(_LOCAL_REPOSITORY) :]
    what = f"chart {metadata.get('name')}: dependency {name} at {repository!r}"
    where = _relative(chart / _CHART_FILE, tree)

    def refuse(message: str, rule: str) -> HelmChartError:
        return HelmChartError(f"{what}: {message}", source=source, file=where, rule=rule)

    root = os.path.realpath(tree)
    real = os.path.realpath(chart / path) if path and not os.path.isabs(path) else None
    if real is None or not real.startswith(root + os.sep):
        raise refuse(
            "the path leads outside the bundle tree (file:// dependencies are charts in the "
            "same tree, by a relative path)",
            "LocalDependencyEscapes",
        )
    if real == os.path.realpath(chart) or depth >= _MAX_LOCAL_DEPTH:
        raise refuse(
            f"file:// dependencies loop (or nest deeper than {_MAX_LOCAL_DEPTH})",
            "LocalDependencyMismatch",
        )
    found = Path(real)
    if not (found / _CHART_FILE).is_file():
        raise refuse(
            f"no {_CHART_FILE} in {_relative(found, Path(root))}", "LocalDependencyMissing"
        )
    theirs = read_chart_metadata(found, tree=tree, source=source)
    if theirs.get("name") != name:
        raise refuse(
            f"the chart there is named {theirs.get('name')!r}, not {name!r}",
            "LocalDependencyMismatch",
        )
    wanted = dependency.get("version")
    version = theirs.get("version")
    if wanted and not _satisfies(str(version), str(wanted)):
        raise refuse(
            f"its version {version!r} does not satisfy {str(wanted)!r}", "LocalDependencyMismatch"
        )
    return LocalDependency(
        name=name,
        path=found,
        dependencies=check_dependencies(found, theirs, tree=tree, source=source, depth=depth + 1),
    )


def _satisfies(version: str, constraint: str) -> bool:
    """Whether ``version`` is in Helm's SemVer range ``constraint`` (``^1.2``, ``~1.2.3``,
    ``>=1.0, <2.0``, ``1.2.x``, ``a || b``); False for a malformed range or version."""
    from nodesemver import satisfies  # only charts with file:// dependencies need it

    # Helm (Masterminds semver) joins comparisons with commas; node-semver with spaces.
    normal = " ".join(constraint.replace(",", " ").split())
    try:
        return bool(satisfies(version, normal, True))
    except (ValueError, TypeError):
        return False


def overlay_chart(
    chart: Path, local: Sequence[LocalDependency], dest: Path, *, tree: Path, source: str = ""
) -> Path:
    """A copy of ``chart`` at ``dest`` with each ``file://`` dependency copied in as
    ``charts/<name>`` (its own placed the same way), as ``helm dependency build`` would place
    them; ``dest``. The bundle tree is not changed.

    A link is judged where it lies, in the bundle tree: one that resolves inside ``tree``
    becomes a link to that same file of the tree (absolute), so moving it into the scratch
    copy cannot make it climb elsewhere; one that resolves outside (or nowhere) is refused.
    Raises HelmChartError (LinkEscapes), OSError when the scratch directory cannot be written.
    """
    _copy_without_escapes(chart, dest, tree=tree, source=source)
    for dependency in local:
        (dest / "charts").mkdir(exist_ok=True)
        overlay_chart(
            dependency.path,
            dependency.dependencies,
            dest / "charts" / dependency.name,
            tree=tree,
            source=source,
        )
    return dest


def _copy_without_escapes(src: Path, dest: Path, *, tree: Path, source: str) -> None:
    root = os.path.realpath(tree)
    dest.mkdir(parents=True, exist_ok=True)
    for directory, dirs, files in os.walk(src, followlinks=False):
        here = Path(directory)
        target_dir = dest / here.relative_to(src)
        for name in [*dirs, *files]:
            path = here / name
            out = target_dir / name
            if path.is_symlink():
                real = os.path.realpath(path)
                if not (real == root or real.startswith(root + os.sep)) or not os.path.exists(real):
                    raise HelmChartError(
                        f"link {_relative(path, tree)} -> {os.readlink(path)} leads outside "
                        "the bundle tree (or nowhere); a chart with file:// dependencies may "
                        "only hold links to files of the same tree",
                        source=source,
                        file=_relative(path, tree),
                        rule="LinkEscapes",
                    )
                out.symlink_to(real)
            elif path.is_dir():
                out.mkdir(exist_ok=True)
            else:
                shutil.copy2(path, out)


def _vendored(charts: Path) -> set[str]:
    """Names of the subcharts in ``charts/``: directories by their Chart.yaml's name,
    archives by their ``<name>-<version>.tgz`` file name."""
    names: set[str] = set()
    if not charts.is_dir():
        return names
    for entry in charts.iterdir():
        if entry.is_dir() and (entry / _CHART_FILE).is_file():
            names.add(entry.name)
            try:
                documents = load_documents(
                    (entry / _CHART_FILE).read_bytes(),
                    source="",
                    file=entry.name,
                    limits=_CHART_YAML_LIMITS,
                )
            except InvalidManifestError:
                continue  # helm says what is wrong with it
            if documents and isinstance(documents[0], dict):
                names.add(str(documents[0].get("name")))
        elif entry.name.endswith((".tgz", ".tar.gz")):
            match = re.match(r"^(.+?)-v?\d", entry.name)
            if match:
                names.add(match.group(1))
    return names


def release_name(
    options: Mapping[str, Any], request: RenderRequest, metadata: Mapping[str, Any]
) -> str:
    """``releaseName``, else the bundle's name, else the chart's name.

    Raises HelmChartError (BadReleaseName) when it is not a valid Helm release name.
    """
    name = options.get("releaseName")
    if not name and request.ownership is not None:
        name = request.ownership.bundle
    if not name:
        name = metadata.get("name")
    if not isinstance(name, str) or len(name) > 53 or not _RELEASE_NAME.match(name):
        raise HelmChartError(
            f"release name {name!r} is not a valid Helm release name (lower case letters, "
            "digits, '-' and '.', at most 53; set formatOptions.releaseName)",
            source=request.source,
            rule="BadReleaseName",
        )
    return name


def values_files(tree: Path, listed: object, *, source: str) -> list[Path]:
    """The ``valuesFiles`` as absolute paths, each a file inside the tree.

    Raises HelmChartError (ValuesFileMissing, ValuesFileEscapes).
    """
    if not listed:
        return []
    if isinstance(listed, str) or not isinstance(listed, Sequence):
        raise HelmChartError(
            "formatOptions.valuesFiles must be a list of paths",
            source=source,
            rule="ValuesFileMissing",
        )
    root = os.path.realpath(tree)
    found = []
    for relative in listed:
        path = tree / str(relative)
        real = os.path.realpath(path)
        if not real.startswith(root + os.sep):
            raise HelmChartError(
                "values file is outside the bundle tree",
                source=source,
                file=str(relative),
                rule="ValuesFileEscapes",
            )
        if not os.path.isfile(real):
            raise HelmChartError(
                "values file not found in the bundle tree (paths are from the tree's root)",
                source=source,
                file=str(relative),
                rule="ValuesFileMissing",
            )
        found.append(Path(real))
    return found


def helm_set_flags(tree: Path, options: Mapping[str, Any], *, source: str) -> list[str]:
    """``formatOptions.setJson``, ``setString`` and ``setFile`` as helm's flags (helm applies
    them in that order over the values, whatever their order here); a ``setFile`` path is
    given absolute, after checking that it is a file inside the tree.

    Raises HelmChartError (SetFileMissing, SetFileEscapes).
    """
    flags = [f"--set-json={item}" for item in options.get("setJson") or ()]
    flags += [f"--set-string={item}" for item in options.get("setString") or ()]
    root = os.path.realpath(tree)
    for item in options.get("setFile") or ():
        key, _, relative = str(item).rpartition("=")
        real = os.path.realpath(tree / relative)
        if not real.startswith(root + os.sep):
            raise HelmChartError(
                f"formatOptions.setFile {item!r}: the file is outside the bundle tree",
                source=source,
                file=relative,
                rule="SetFileEscapes",
            )
        if not os.path.isfile(real):
            raise HelmChartError(
                f"formatOptions.setFile {item!r}: no such file in the bundle tree (paths are "
                "from the tree's root)",
                source=source,
                file=relative,
                rule="SetFileMissing",
            )
        # helm reads the path up to a ',' with '\\' escaping the next character.
        escaped = real.replace("\\", "\\\\").replace(",", "\\,")
        flags.append(f"--set-file={key}={escaped}")
    return flags


def parse_output(output: bytes, *, source: str, limits: ParseLimits) -> list[Manifest]:
    """The objects ``helm template`` printed, in order.

    Parsed in one pass; when that fails, again template by template (helm's ``# Source:``
    lines), so that the refusal names the chart's file instead of a position in the stream.
    Raises InvalidManifestError.
    """
    whole = ParseLimits(
        max_file_bytes=max(limits.max_file_bytes, len(output)),
        max_document_chars=limits.max_document_chars,
        max_documents=max(limits.max_documents, 100_000),
        max_nodes=limits.max_nodes,
        max_aliases=limits.max_aliases,
        max_depth=limits.max_depth,
    )
    try:
        objects = parse_manifests(output, source=source, file="helm template output", limits=whole)
    except InvalidManifestError:
        _by_template(output, source=source, limits=limits)
        raise
    try:
        refuse_duplicates(objects, ["helm template output"] * len(objects), source=source)
    except InvalidManifestError:
        # Again with each object's template, to say where each copy came from.
        found, origins = _by_template(output, source=source, limits=limits)
        refuse_duplicates(found, origins, source=source)
        raise
    return objects


def _by_template(
    output: bytes, *, source: str, limits: ParseLimits
) -> tuple[list[Manifest], list[str]]:
    """The objects of helm's output and the template each came from (its ``# Source:``)."""
    text = output.decode("utf-8", "replace")
    objects: list[Manifest] = []
    origins: list[str] = []
    name = "helm template output"
    for chunk in _DOCUMENT_START.split(text):
        match = _SOURCE_LINE.search(chunk)
        name = match.group(1).strip() if match else name
        found = parse_manifests(chunk.encode(), source=source, file=name, limits=limits)
        objects += found
        origins += [name] * len(found)
    return objects, origins


_HERMETIC_ENV = confine.HELM_ENVIRONMENT


def _relative(path: Path, tree: Path) -> str:
    try:
        return path.relative_to(tree).as_posix()
    except ValueError:
        return str(path)


__all__ = [
    "DEFAULT_MAX_MEMORY",
    "DEFAULT_TIMEOUT",
    "HelmChartError",
    "HelmFormat",
    "LocalDependency",
    "check_dependencies",
    "locate_chart",
    "overlay_chart",
    "parse_output",
    "read_chart_metadata",
    "release_name",
    "values_files",
]
