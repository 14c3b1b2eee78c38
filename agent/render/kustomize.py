"""The ``kustomize`` format: a hermetic ``kustomize build`` with the pinned kustomize.

The overlay to build is ``formatOptions.path`` (default: the tree's root); its bases may sit
anywhere in the same tree. Before kustomize runs, every kustomization reachable from it is read
(:func:`check_kustomization`) and every reference it makes is checked to be a file or directory
inside the bundle tree: kustomize fetches a reference it cannot find locally (a git URL, an
``https://`` file, ``github.com/org/repo//dir?ref=v1``), and a render must never reach the
network, so such references are refused with the advice to pin them as sources (and
always, for the forms kustomize fetches before it looks for a local path of the same name).
A chart kustomize inflates (``helmCharts``, the legacy ``helmChartInflationGenerator``, a
``HelmChartInflationGenerator`` config under ``generators``) works when it is in the tree
(kustomize's ``chartHome``, default ``charts/<name>``); it is inflated by the pinned helm
(``--enable-helm --helm-command``, passed only when every such chart passed the checks), never
pulled, and never with a ``configHome`` (helm's plugins). The deprecated ``bases:`` field is
read like ``resources:``, as kustomize does. kustomize's own restrictions stay on
(``LoadRestrictionsRootOnly``; no plugins, exec or container functions, which need flags
fleetlet never passes).

kustomize runs as a child process with a time and memory bound, confined with the helm it runs
(:mod:`agent.render.confine`: the tree to read, a scratch directory to write, no network); its
output is parsed with the same bounded parser as plain manifests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import PermanentError
from agent.render import confine
from agent.render._process import run_tool
from agent.render.detect import KUSTOMIZATION_FILES
from agent.render.manifests import (
    InvalidManifestError,
    Manifest,
    ParseLimits,
    load_documents,
    parse_manifests,
)
from agent.render.patches import explain_failure, kustomization_patches
from agent.render.plain import RenderRequest, render_root
from agent.render.tools import KUSTOMIZE_MAX_MEMORY, ToolSettings

# Fields whose entries are files or directories (directories hold a kustomization).
_TREE_FIELDS = ("resources", "bases", "components")
# Fields whose entries are files, or inline YAML (a string with a newline).
_FILE_OR_INLINE_FIELDS = ("patchesStrategicMerge", "generators", "transformers", "validators")
_FILE_FIELDS = ("crds", "configurations")
# Fields whose entries are plugin configs (files, inline YAML, or kustomizations making them).
_PLUGIN_FIELDS = ("generators", "transformers", "validators")
# Fields with which a kustomization changes what it outputs.
_RESHAPING_FIELDS = (
    "patches", "patchesJson6902", "patchesStrategicMerge", "replacements", "generators",
    "transformers", "helmCharts", "helmChartInflationGenerator", "configMapGenerator",
    "secretGenerator", "namePrefix", "nameSuffix", "labels", "commonLabels",
    "commonAnnotations", "images", "replicas", "namespace", "components",
)  # fmt: skip
_MAX_KUSTOMIZATIONS = 1_000
_HELM_DEFAULT_HOME = "charts"
_HELM_GENERATOR = "HelmChartInflationGenerator"
_REMOTE_PREFIXES = ("git@", "git::", "gh:", "ssh:", "file:")
_FETCHED_PREFIXES = ("http://", "https://", "ssh://", "file://", "github.com/", "github.com:")
_SCP_STYLE = re.compile(r"^[a-z][a-z0-9-]*@[^/:]*[/:].")


class KustomizeError(InvalidManifestError):
    """A kustomization was refused before the build (remote or missing reference, a path
    leaving the tree) or kustomize failed; ``rule`` says which."""

    reason = "RenderFailed"


@dataclass(frozen=True, kw_only=True)
class KustomizationPlan:
    """What checking the kustomizations found: whether any of them inflates helm charts (the
    build then needs the pinned helm)."""

    uses_helm: bool = False


@dataclass
class _Walk:
    tree: Path
    real_tree: str
    source: str
    seen: set[tuple[str, bool]] = field(default_factory=set)
    pending: deque[tuple[Path, bool]] = field(default_factory=deque)
    uses_helm: bool = False
    # Kustomizations whose output becomes generator/transformer configs and that change what
    # they output (patches, replacements...): a HelmChartInflationGenerator could be made
    # there that no file names, so helm is not enabled when there are any.
    reshaped_configs: list[str] = field(default_factory=list)

    def relative(self, path: Path | str) -> str:
        text = os.path.relpath(path, self.tree)
        return "." if text == "." else Path(text).as_posix()

    def refuse(self, where: str, message: str, rule: str) -> KustomizeError:
        return KustomizeError(message, source=self.source, file=where, rule=rule)


def check_kustomization(tree: Path, root: Path, *, source: str) -> KustomizationPlan:
    """Read the kustomization in ``root`` and every one it reaches; refuse any reference that
    is remote, missing or outside ``tree``.

    Every way the build could run helm is read too (``helmCharts``, the legacy
    ``helmChartInflationGenerator``, a ``HelmChartInflationGenerator`` config listed under
    ``generators``, inline or in a file, or made by a kustomization listed there): each chart
    must be in the tree, and ``repo`` (a pull) or ``configHome`` (helm's plugins and
    configuration) are refused; the plan says whether helm is needed.

    Raises KustomizeError (NoKustomization, RemoteReference, OutsideTree, MissingFile,
    InvalidKustomization, TooManyKustomizations, UnsafeHelm).
    """
    walk = _Walk(tree=tree, real_tree=os.path.realpath(tree), source=source)
    walk.pending.append((root, False))
    while walk.pending:  # breadth first, without recursion: a chain of bases may be long
        _visit(walk, *walk.pending.popleft())
    if walk.uses_helm and walk.reshaped_configs:
        raise walk.refuse(
            walk.reshaped_configs[0],
            "this kustomization makes generator or transformer configs and changes them "
            "(patches, replacements, generators): with helm charts in the build, fleetlet "
            "cannot check what it would make helm run; list the configs as files instead",
            "UnsafeHelm",
        )
    return KustomizationPlan(uses_helm=walk.uses_helm)


def _kustomization_file(walk: _Walk, directory: Path) -> Path:
    found = [directory / n for n in KUSTOMIZATION_FILES if (directory / n).is_file()]
    if not found:
        raise walk.refuse(
            walk.relative(directory),
            f"no kustomization file ({', '.join(KUSTOMIZATION_FILES)})",
            "NoKustomization",
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise walk.refuse(
            walk.relative(directory), f"several kustomization files ({names})", "NoKustomization"
        )
    return found[0]


def _visit(walk: _Walk, directory: Path, configs: bool) -> None:
    """Check one kustomization; ``configs``: its output is read as generator or transformer
    configs (it is listed under ``generators``/``transformers``/``validators``)."""
    real = os.path.realpath(directory)
    if (real, configs) in walk.seen:
        return
    walk.seen.add((real, configs))
    if len(walk.seen) > _MAX_KUSTOMIZATIONS:
        raise walk.refuse(
            walk.relative(directory),
            f"more than {_MAX_KUSTOMIZATIONS} kustomizations",
            "TooManyKustomizations",
        )
    path = _kustomization_file(walk, directory)
    where = walk.relative(path)
    documents = load_documents(
        path.read_bytes(), source=walk.source, file=where, limits=ParseLimits()
    )
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise walk.refuse(where, "a kustomization is one YAML object", "InvalidKustomization")
    kustomization: dict[str, Any] = documents[0]
    for name, reference in _references(kustomization):
        _check_reference(walk, directory, where, name, reference, configs)
    charts = kustomization.get("helmCharts")
    _check_helm(walk, directory, where, "helmCharts", charts, kustomization.get("helmGlobals"))
    legacy = kustomization.get("helmChartInflationGenerator")
    if legacy:
        charts, helm_globals = _legacy_charts(walk, where, legacy)
        _check_helm(walk, directory, where, "helmChartInflationGenerator", charts, helm_globals)
    for name in _PLUGIN_FIELDS:
        for i, entry in _strings(kustomization.get(name)):
            field_where = f"{where}: {name}[{i}]"
            if _is_inline(entry):
                text, config_where = entry.encode(), field_where
            elif (directory / entry).is_file():
                text, config_where = (
                    (directory / entry).read_bytes(),
                    walk.relative(directory / entry),
                )
            else:
                continue  # a kustomization: visited with configs=True
            _check_configs(walk, directory, config_where, name, text)
    if configs:
        for _, entry in _strings(kustomization.get("resources")):
            if not _is_inline(entry) and (directory / entry).is_file():
                _check_configs(walk, directory, walk.relative(directory / entry), "generators",
                               (directory / entry).read_bytes())  # fmt: skip
        if any(kustomization.get(n) for n in _RESHAPING_FIELDS):
            walk.reshaped_configs.append(where)


def _is_inline(entry: str) -> bool:
    return "\n" in entry or entry.lstrip().startswith("{")


def _check_configs(walk: _Walk, directory: Path, where: str, name: str, text: bytes) -> None:
    """The generator/transformer configs in ``text`` (a file, or an inline entry of the
    ``name`` field): a HelmChartInflationGenerator among them is checked like ``helmCharts``."""
    documents = load_documents(text, source=walk.source, file=where, limits=ParseLimits())
    for document in documents:
        if not isinstance(document, dict):
            continue
        for key, value in _config_paths(document):
            _check_reference(walk, directory, where, key, ("file", value), False)
        if document.get("kind") != _HELM_GENERATOR:
            continue
        if name != "generators":
            raise walk.refuse(where, f"a {_HELM_GENERATOR} listed under {name}", "UnsafeHelm")
        helm_globals = {k: document[k] for k in ("chartHome", "configHome") if k in document}
        _check_helm(walk, directory, where, _HELM_GENERATOR, [document], helm_globals)


_CONFIG_PATH_KEYS = ("path", "files", "envs", "env", "valuesFile", "additionalValuesFiles")


def _config_paths(value: Any, at: str = "") -> Iterator[tuple[str, str]]:
    """``(where, path)`` for every file a builtin plugin config names (``path`` of a patch or
    replacement, ``files``/``envs`` of a generator, a chart's values files), at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{at}.{key}" if at else str(key)
            if key in _CONFIG_PATH_KEYS and isinstance(item, str):
                yield here, item.split("=", 1)[-1] if key == "files" else item
            elif key in _CONFIG_PATH_KEYS and isinstance(item, list):
                for i, entry in _strings(item):
                    yield f"{here}[{i}]", entry.split("=", 1)[-1] if key == "files" else entry
            else:
                yield from _config_paths(item, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _config_paths(item, f"{at}[{i}]")


def _legacy_charts(walk: _Walk, where: str, legacy: Any) -> tuple[list[Any], dict[str, Any]]:
    """The legacy ``helmChartInflationGenerator`` entries as kustomize converts them
    (``types.SplitHelmParameters``): charts, and the globals (the last ones win)."""
    if not isinstance(legacy, list):
        raise walk.refuse(
            f"{where}: helmChartInflationGenerator", "expected a list", "InvalidKustomization"
        )
    charts: list[Any] = []
    helm_globals: dict[str, Any] = {}
    for old in legacy:
        if not isinstance(old, dict):
            charts.append(old)
            continue
        charts.append(
            {
                "name": old.get("chartName"),
                "version": old.get("chartVersion"),
                "repo": old.get("chartRepoUrl"),
                "valuesFile": old.get("values"),
            }
        )
        if old.get("helmHome"):
            helm_globals["configHome"] = old["helmHome"]
        if old.get("chartHome"):
            helm_globals["chartHome"] = old["chartHome"]
    return charts, helm_globals


def _strings(value: Any) -> Iterator[tuple[int, str]]:
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, str):
                yield i, item


def _references(k: dict[str, Any]) -> Iterator[tuple[str, tuple[str, str]]]:
    """``(field, (kind, entry))`` for every path the kustomization names; ``kind`` is ``tree``
    (a file or a directory with a kustomization) or ``file``."""
    for name in _TREE_FIELDS:
        for i, entry in _strings(k.get(name)):
            yield f"{name}[{i}]", ("tree", entry)
    for name in _FILE_OR_INLINE_FIELDS:
        for i, entry in _strings(k.get(name)):
            if "\n" not in entry and not entry.lstrip().startswith("{"):
                yield f"{name}[{i}]", ("tree", entry)
    for name in _FILE_FIELDS:
        for i, entry in _strings(k.get(name)):
            yield f"{name}[{i}]", ("file", entry)
    for name in ("patches", "patchesJson6902", "replacements"):
        items = k.get(name)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict) and isinstance(item.get("path"), str):
                yield f"{name}[{i}].path", ("file", item["path"])
    for name in ("configMapGenerator", "secretGenerator"):
        items = k.get(name)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict):
                continue
            for j, entry in _strings(item.get("files")):
                # "key=path" or "path"
                yield f"{name}[{i}].files[{j}]", ("file", entry.split("=", 1)[-1])
            for j, entry in _strings(item.get("envs")):
                yield f"{name}[{i}].envs[{j}]", ("file", entry)
            if isinstance(item.get("env"), str):
                yield f"{name}[{i}].env", ("file", item["env"])
    openapi = k.get("openapi")
    if isinstance(openapi, dict) and isinstance(openapi.get("path"), str):
        yield "openapi.path", ("file", openapi["path"])
    charts = k.get("helmCharts")
    for i, chart in enumerate(charts if isinstance(charts, list) else []):
        if not isinstance(chart, dict):
            continue
        if isinstance(chart.get("valuesFile"), str):
            yield f"helmCharts[{i}].valuesFile", ("file", chart["valuesFile"])
        for j, entry in _strings(chart.get("additionalValuesFiles")):
            yield f"helmCharts[{i}].additionalValuesFiles[{j}]", ("file", entry)


def _fetched(entry: str) -> bool:
    """Whether kustomize fetches ``entry`` whatever the tree holds: it tries an
    ``http(s)://`` file, and a git repository (``git::``, ``ssh://``, ``https://``,
    ``file://``, ``github.com/...``, ``user@host:repo``; ``git.NewRepoSpecFromURL``), before a
    local path of the same name."""
    lowered = entry.strip().lower()
    lowered = lowered.removeprefix("git::")
    return lowered.startswith(_FETCHED_PREFIXES) or bool(_SCP_STYLE.match(lowered))


def _looks_remote(entry: str) -> bool:
    """Whether a missing ``entry`` was meant as a remote reference (the advice to pin it)."""
    lowered = entry.strip().lower()
    if _fetched(lowered) or "://" in lowered or lowered.startswith(_REMOTE_PREFIXES):
        return True
    if "?ref=" in lowered:
        return True
    # example.com/x, example.com/x//sub: a host name first, or a go-getter '//' subdir.
    first = lowered.split("/", 1)[0]
    return ("." in first.strip(".") and "/" in lowered) or "//" in lowered


def _check_reference(
    walk: _Walk,
    directory: Path,
    where: str,
    name: str,
    reference: tuple[str, str],
    configs: bool,
) -> None:
    kind, entry = reference
    field_where = f"{where}: {name}"
    if _fetched(entry) or (_looks_remote(entry) and not (directory / entry).exists()):
        raise walk.refuse(
            field_where,
            f"{entry!r} is remote: a render never fetches; add it to the bundle as a pinned "
            "source (with a destination) and refer to it by its path in the tree",
            "RemoteReference",
        )
    if os.path.isabs(entry):
        raise walk.refuse(
            field_where, f"{entry!r} is an absolute path, outside the bundle tree", "OutsideTree"
        )
    target = Path(os.path.normpath(directory / entry))  # lexically, as kustomize joins paths
    real = os.path.realpath(target)
    if real != walk.real_tree and not real.startswith(walk.real_tree + os.sep):
        raise walk.refuse(field_where, f"{entry!r} is outside the bundle tree", "OutsideTree")
    if not target.exists():
        raise walk.refuse(field_where, f"{entry!r}: no such file or directory", "MissingFile")
    if target.is_dir():
        if kind == "file":
            raise walk.refuse(field_where, f"{entry!r} is a directory, not a file", "MissingFile")
        # The output of a kustomization listed as a plugin config is plugin configs.
        walk.pending.append((target, configs or name.startswith(_PLUGIN_FIELDS)))


def _check_helm(
    walk: _Walk,
    directory: Path,
    where: str,
    what: str,
    charts: Any,
    helm_globals: Any,
) -> None:
    """Charts inflated by kustomize (``what``: the field or generator naming them) must be in
    the tree; no ``repo`` pull, no ``configHome`` (helm's plugins, from the tree)."""
    if isinstance(helm_globals, dict) and helm_globals.get("configHome"):
        raise walk.refuse(
            f"{where}: {what} configHome",
            f"configHome {helm_globals['configHome']!r} would give helm a configuration and "
            "plugins of the bundle's choosing (a plugin is a program): fleetlet runs helm "
            "with an empty home of its own; remove configHome",
            "UnsafeHelm",
        )
    if not charts:
        return
    if not isinstance(charts, list):
        raise walk.refuse(f"{where}: {what}", "expected a list of charts", "InvalidKustomization")
    home = _HELM_DEFAULT_HOME
    if isinstance(helm_globals, dict) and helm_globals.get("chartHome"):
        home = str(helm_globals["chartHome"])
    if os.path.isabs(home) or _looks_remote(home):
        raise walk.refuse(
            f"{where}: {what} chartHome", f"{home!r} is outside the bundle tree", "OutsideTree"
        )
    for i, chart in enumerate(charts):
        at = f"{where}: {what}[{i}]" if what != _HELM_GENERATOR else f"{where}: {what}"
        if not isinstance(chart, dict) or not isinstance(chart.get("name"), str):
            raise walk.refuse(at, "a chart needs a name", "InvalidKustomization")
        name = chart["name"]
        # Where kustomize looks (HelmChartInflationGenerator.absChartHome).
        chart_home = directory / home
        if chart.get("version") and chart.get("repo"):
            chart_home = chart_home / f"{name}-{chart['version']}"
        chart_dir = chart_home / name
        real = os.path.realpath(chart_dir)
        inside = real.startswith(walk.real_tree + os.sep)
        if not inside:
            raise walk.refuse(
                at, f"chart {name!r} would be read from outside the bundle tree", "OutsideTree"
            )
        for key in ("valuesFile",):
            value = chart.get(key)
            if isinstance(value, str) and value:
                _check_reference(walk, directory, where, f"{what}.{key}", ("file", value), False)
        if chart_dir.is_dir():
            walk.uses_helm = True
            continue  # kustomize renders it as found; a repo is then never contacted
        repo = chart.get("repo")
        found = walk.relative(chart_dir)
        if repo:
            raise walk.refuse(
                at,
                f"chart {name!r} is not in the tree ({found}) and would be pulled from "
                f"{repo}: a render never fetches; add the chart as a pinned source with "
                f"destination {found}",
                "RemoteReference",
            )
        raise walk.refuse(at, f"chart {name!r}: no chart directory at {found}", "MissingFile")


class KustomizeFormat:
    """The built-in ``kustomize`` format (see the module doc).

    ``kustomize``/``helm``: the tools to run (default: the request's
    :class:`~agent.render.tools.ToolSettings`, looked up when first needed).
    """

    name = "kustomize"
    applies_patches = True

    def __init__(
        self,
        *,
        kustomize: Path | None = None,
        helm: Path | None = None,
        timeout: float = 120.0,
        max_memory: int = KUSTOMIZE_MAX_MEMORY,
    ) -> None:
        self._kustomize = kustomize
        self._helm = helm
        self.timeout = timeout
        self.max_memory = max_memory

    def kustomize(self, tools: ToolSettings) -> Path:
        """The kustomize binary. Raises the tool lookup's error when there is none."""
        return self._kustomize or tools.find("kustomize")

    def cache_identity(self, tools: ToolSettings) -> str:
        """What shapes the output besides the input: the kustomize and helm binaries (path,
        size, modification time). Raises the tool lookup's error when there is no kustomize."""
        found = [self.kustomize(tools)]
        # No helm: a kustomization with helmCharts fails to render, and is not cached.
        with contextlib.suppress(PermanentError):
            found.append(self._helm or tools.find("helm"))
        parts = []
        for tool in found:
            stat = tool.stat()
            parts.append(f"{tool}:{stat.st_size}:{stat.st_mtime_ns}")
        return " ".join(parts)

    def _build(
        self,
        tree: Path,
        target: str,
        plan: KustomizationPlan,
        request: RenderRequest,
        *,
        where: str,
        work: Path,
    ) -> bytes:
        kustomize = self.kustomize(request.tools)
        argv: list[str | Path] = [kustomize, "build", target]
        confinement = confine.for_tool(kustomize, tree=tree, scratch=work)
        if plan.uses_helm:
            helm = self._helm or request.tools.find("helm")
            confinement = confinement.plus(execute=[helm])
            argv += ["--enable-helm", "--helm-command", helm]
            facts = request.cluster
            if facts.kube_version:
                argv += ["--helm-kube-version", facts.kube_version]
            for api_version in facts.api_versions:
                argv += ["--helm-api-versions", api_version]
        try:
            return run_tool(
                argv,
                cwd=tree,
                timeout=self.timeout,
                max_memory=self.max_memory,
                env=confine.environment(scratch=work),
                confine=confinement,
                scratch=work,
            )
        except PermanentError as exc:
            raise KustomizeError(
                explain_failure(str(exc)), source=request.source, file=where, rule="KustomizeFailed"
            ) from exc

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]:
        """``kustomize build`` of ``formatOptions.path`` (default: the tree's root), with the
        bundle's ``patches`` (this format applies them itself: :attr:`applies_patches`).

        Raises KustomizeError, InvalidManifestError (path, output), the tool lookup's errors.
        """
        root = render_root(tree, request)
        plan = check_kustomization(tree, root, source=request.source)
        relative = os.path.relpath(root, tree)
        with tempfile.TemporaryDirectory(prefix="fleetlet-kustomize-") as work:
            target = relative
            if request.patches:
                # One build, as Flux does it: a kustomization around the overlay carries the
                # patches (the same result as patching the overlay's output afterwards).
                target = work
                wrapper = {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    # kustomize takes no absolute directory; a relative one may go up.
                    "resources": [os.path.relpath(os.path.realpath(root), os.path.realpath(work))],
                    "patches": kustomization_patches(request.patches, source=request.source),
                }
                Path(work, "kustomization.yaml").write_text(json.dumps(wrapper))
            where = Path(relative).as_posix()
            if request.patches:
                where += " (with the bundle's patches)"
            output = self._build(tree, target, plan, request, where=where, work=Path(work))
        limits = request.limits
        return parse_manifests(
            output,
            source=request.source,
            file="kustomize build output",
            limits=ParseLimits(
                max_file_bytes=limits.max_total_bytes,
                max_documents=limits.max_objects,
                max_document_chars=limits.parse.max_document_chars,
                max_nodes=limits.parse.max_nodes,
                max_aliases=limits.parse.max_aliases,
                max_depth=limits.parse.max_depth,
            ),
        )
