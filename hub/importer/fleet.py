"""``fleetlet import fleet DIR --out FLEET_DIR``: a Rancher Fleet GitRepo layout as a fleetlet
fleet repo, with a list of what could not be expressed.

Fleet's rules, as its ``fleet.yaml`` reference documents them, and what each becomes:

- **Bundles.** Every directory of the GitRepo's ``paths`` (default: the root) holding a
  ``fleet.yaml`` is a bundle; a path without any is one bundle of its own files. Its name is
  Fleet's (:func:`fleet_name`, Fleet's ``HelmReleaseName``): ``<gitrepo>-<path with / as ->``,
  cleaned into a DNS label, a name over 53 characters cut and given a hash of the whole, so two
  long paths never share a name (two that still would are refused). Its content is the directory in the same git repository: a ``git``
  source with ``directory`` (``--source-url``, and ``--commit`` or ``--branch``).
- **Format.** ``kustomize.dir`` or a kustomization file: ``kustomize`` (``path`` = the dir);
  ``helm.chart`` or a ``Chart.yaml``: ``helm`` (a local chart: ``path``; ``repo`` + ``chart``:
  a ``helm`` source; ``oci://``: an ``image`` source; an archive URL: an ``http`` source; a
  go-getter git address ``git::https://host/repo//dir?ref=v1``: a ``git`` source with that
  directory and ref); ``kustomize.dir`` given only by targetCustomizations: ``kustomize``, the
  first of them the default path (listed); else ``plain``. Fleet's ``overlays/`` of a plain
  bundle (``yaml.overlays``, the bundle's or a customization's) become ``patches``
  (:mod:`hub.importer.overlays`); one without a faithful patch leaves the bundle out
  (listed, not written).
- **Namespaces.** ``namespace`` (Fleet forces it) or ``defaultNamespace`` (Fleet's default:
  ``default``) becomes ``formatOptions.targetNamespace``, which is also helm's release
  namespace, as in Fleet. fleetlet only gives it to objects that name none: a forced
  ``namespace`` is listed as a difference.
- **Helm.** ``releaseName`` (Fleet's default, the bundle name, is fleetlet's too), ``values``
  (Fleet's ``${ .ClusterName }`` and ``${ .ClusterLabels.<key> }`` become
  ``${cluster.name}``/``${cluster.labels.<key>}``), ``valuesFiles`` (paths from the bundle
  directory, which is the tree's root), ``takeOwnership``.
- **targetCustomizations.** Fleet applies the **first** customization whose selector matches
  a cluster; fleetlet applies every matching override. With the cluster inventory
  (``--clusters``: fleetlet's inventory format or Fleet ``Cluster`` objects) the importer
  decides the first match per cluster and writes each override for exactly those clusters
  (``clusters: [...]``), which is Fleet's semantics for that inventory; ``doNotDeploy``
  clusters are left out of the targets. Without it, overrides keep their ``clusterSelector``
  in order and an overlap (several customizations) is listed. Each may set the namespace,
  ``kustomize.dir`` (the override's ``path``), ``helm.values`` and ``paused``; its
  ``helm.valuesFiles`` are read and inlined into its values (their precedence then is above
  the bundle's ``values``, listed).
- **Targets** come from the GitRepo (``--gitrepo FILE``: its ``spec.targets``, ``paths``,
  ``repo``, ``branch``/``revision``): ``clusterSelector`` and ``clusterName``; without a
  GitRepo, every cluster.
- **Labels** (the inventory's, and the values of cluster selectors) are strings, as Fleet reads
  them into Go strings: ``version: 1.28`` is ``"1.28"``.
- **Checked before success** (:mod:`hub.importer.check`): every bundle is rendered from the
  checkout (its ``path`` and each override's); one that does not render is not written and is
  listed as not converted; the written fleet repo is loaded as the hub loads it. Clusters a
  target names are written into an inventory given by no ``--clusters`` (without labels,
  listed).
- ``dependsOn`` (by bundle name) becomes ``dependsOn`` on the depended bundle's group;
  ``paused``; ``keepResources: true`` becomes ``deletionPolicy: Orphan``.

Everything else that changes what Fleet deploys (``helm.valuesFrom``,
``diff``, ``rolloutStrategy``, cluster groups, selectors in ``dependsOn``, a chart
post-rendered by kustomize, ``.fleetignore`` patterns...) is listed, per bundle and field, in
the result's ``notes``: nothing is dropped silently.
"""

from __future__ import annotations

import copy
import hashlib
import os
import posixpath
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.api.yamlio import KUBE_DUMPER, go_text
from agent.errors import FieldProblem, PermanentError
from agent.render.detect import CHART_FILE, KUSTOMIZATION_FILES
from agent.render.manifests import InvalidManifestError, ParseLimits, load_documents
from agent.render.values import merge
from hub.fleet.selectors import parse_selector
from hub.importer.check import check_loads, keep_rendering
from hub.importer.overlays import OverlayError, overlay_patches

FLEET_FILE = "fleet.yaml"
_FLEET_LIMITS = ParseLimits(max_file_bytes=4 * 1024 * 1024)
_DISALLOWED = re.compile(r"[^a-zA-Z0-9-]+")
_HELM_RELEASE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_MAX_NAME = 53  # Helm's release names, so Fleet's bundle names
_FLEET_NAME = re.compile(r"\$\{\s*\.ClusterName\s*\}")
_FLEET_LABEL = re.compile(r"\$\{\s*\.ClusterLabels\.([A-Za-z0-9./_-]+)\s*\}")
_FLEET_TEMPLATE = re.compile(r"\$\{[^}]*\}")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# go-getter's forced getters (``git::``) and its detectors' forms (``github.com/...``, ``//``
# for a subdirectory, ``?ref=``).
_GO_GETTER = re.compile(r"^[a-z0-9]+::|^(github\.com|gitlab\.com|bitbucket\.org)/|\?ref=|[^:]//")
# fleet.yaml fields the importer expresses (others are listed as notes).
_HANDLED = {
    "namespace", "defaultNamespace", "kustomize", "helm", "targetCustomizations", "dependsOn",
    "paused", "keepResources", "labels", "name", "yaml",
}  # fmt: skip
_HELM_HANDLED = {"chart", "repo", "version", "releaseName", "values", "valuesFiles",
                 "takeOwnership"}  # fmt: skip
_CUSTOMIZATION_HANDLED = {
    "name", "clusterSelector", "clusterName", "namespace", "defaultNamespace", "kustomize",
    "helm", "doNotDeploy", "paused", "yaml",
}  # fmt: skip


class FleetImportError(PermanentError):
    """The directory cannot be imported (not readable, a fleet.yaml that does not parse, no
    source URL); the message names the file and what was wrong."""


@dataclass(frozen=True, slots=True)
class Note:
    """Something of the Fleet repo that fleetlet does not express (or expresses differently)."""

    bundle: str
    field: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"bundle": self.bundle, "field": self.field, "message": self.message}


@dataclass(frozen=True, kw_only=True)
class ImportSettings:
    """Where the content is and what the GitRepo says (see the module doc)."""

    name: str
    source_url: str | None = None
    branch: str | None = None
    commit: str | None = None
    gitrepo: Mapping[str, Any] | None = None
    clusters: Sequence[Mapping[str, Any]] | None = None


@dataclass
class ImportResult:
    """The fleetlet bundles and clusters, and the notes."""

    name: str
    bundles: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


# --- reading ---------------------------------------------------------------------------------


def _read_yaml(path: Path, root: Path) -> Any:
    relative = Path(os.path.relpath(path, root)).as_posix()
    try:
        documents = load_documents(
            path.read_bytes(), source=str(root), file=relative, limits=_FLEET_LIMITS
        )
    except InvalidManifestError as exc:
        raise FleetImportError(str(exc)) from None
    except OSError as exc:
        raise FleetImportError(f"{path}: cannot be read: {exc.strerror}") from exc
    return documents[0] if documents else {}


def load_clusters(path: Path) -> list[dict[str, Any]]:
    """A cluster inventory: fleetlet's (``clusters: [{name, labels}]`` or one cluster) or Fleet
    ``Cluster`` objects (``metadata.name``, ``metadata.labels``), several documents allowed.

    Raises FleetImportError.
    """
    try:
        documents = load_documents(path.read_bytes(), source=str(path), file=path.name)
    except InvalidManifestError as exc:
        raise FleetImportError(str(exc)) from None
    except OSError as exc:
        raise FleetImportError(f"--clusters {path}: {exc.strerror}") from exc
    found: list[dict[str, Any]] = []
    for doc in documents:
        if not isinstance(doc, dict):
            raise FleetImportError(f"--clusters {path}: a document is not a mapping")
        if isinstance(doc.get("clusters"), list):
            found += [
                {**c, "labels": _labels(c.get("labels"))} if "labels" in c else dict(c)
                for c in doc["clusters"]
                if isinstance(c, dict)
            ]
        elif doc.get("kind") == "Cluster" and isinstance(doc.get("metadata"), dict):
            meta = doc["metadata"]
            found.append({"name": meta.get("name"), "labels": _labels(meta.get("labels"))})
        elif "name" in doc:
            found.append({"name": doc["name"], "labels": _labels(doc.get("labels"))})
        else:
            raise FleetImportError(f"--clusters {path}: expected clusters, a cluster or Clusters")
    return found


def _labels(raw: object) -> dict[str, str]:
    """Labels as Kubernetes and Fleet hold them, strings: ``version: 1.28`` is ``"1.28"``."""
    return {str(k): go_text(v) for k, v in _dict(raw).items()}


def _selector(raw: object) -> dict[str, Any]:
    """A label selector with its values as strings (as Fleet reads it into Go strings)."""
    selector = dict(_dict(raw))
    if "matchLabels" in selector:
        selector["matchLabels"] = _labels(selector["matchLabels"])
    if isinstance(selector.get("matchExpressions"), list):
        selector["matchExpressions"] = [
            {**e, "values": [go_text(v) for v in e["values"]]}
            if isinstance(e, dict) and isinstance(e.get("values"), list)
            else e
            for e in selector["matchExpressions"]
        ]
    return selector


def bundle_directories(root: Path, paths: Iterable[str]) -> list[Path]:
    """The bundle directories of the GitRepo's ``paths`` (see the module doc), sorted."""
    found: set[Path] = set()
    for entry in paths:
        base = (root / entry).resolve()
        if not base.is_dir() or (base != root.resolve() and root.resolve() not in base.parents):
            raise FleetImportError(f"GitRepo path {entry!r}: no such directory in {root}")
        with_fleet = [
            Path(d)
            for d, dirs, files in os.walk(base)
            if FLEET_FILE in files and not _hidden(Path(d), base)
        ]
        found.update(with_fleet or [base])
    return sorted(found)


def _hidden(directory: Path, base: Path) -> bool:
    return any(part.startswith(".") for part in directory.relative_to(base).parts)


def fleet_name(prefix: str, relative: str) -> str:
    """Fleet's bundle name (``names.HelmReleaseName`` of ``<gitrepo>/<path>``): ``/`` as
    ``-``; an upper-case letter or another character than ``[a-zA-Z0-9-]`` adds 8 characters
    of the MD5 of the name before it is lower-cased and cleaned; longer than 53, it is cut to
    47 and given 5 characters of the MD5 of the whole (so long paths do not collide)."""
    joined = prefix if relative in ("", ".") else posixpath.join(prefix, relative)
    text = posixpath.normpath(joined).replace("/", "-")
    if text != text.lower() or _DISALLOWED.search(text):
        text = f"{text}-{_md5(text)[:8]}"
    text = _DISALLOWED.sub("-", text.lower())
    text = re.sub("-+", "-", text).strip("-")
    if not _HELM_RELEASE.match(text) or not _DNS_LABEL.match(text):
        return _md5(joined)[:24]
    if len(text) <= _MAX_NAME:
        return text
    keep = _MAX_NAME - 6
    separator = "" if text[keep - 1] == "-" else "-"
    return f"{text[:keep]}{separator}{_md5(text)[:5]}"


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


# --- converting ------------------------------------------------------------------------------


def _fleet_values(value: Any, notes: list[Note], bundle: str, where: str) -> Any:
    """Fleet's ``${ .ClusterName }``/``${ .ClusterLabels.x }`` as fleetlet's templating."""
    if isinstance(value, str):
        text = _FLEET_NAME.sub("${cluster.name}", value)
        text = _FLEET_LABEL.sub(lambda m: "${cluster.labels." + m.group(1) + "}", text)
        for other in _FLEET_TEMPLATE.findall(text):
            if not other.startswith("${cluster."):
                notes.append(Note(bundle, where, f"Fleet template {other} is not converted"))
        return text
    if isinstance(value, dict):
        return {k: _fleet_values(v, notes, bundle, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_fleet_values(v, notes, bundle, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


class _Importer:
    def __init__(self, root: Path, settings: ImportSettings) -> None:
        self.root = root
        self.settings = settings
        self.result = ImportResult(name=settings.name)
        spec = _dict(_dict(settings.gitrepo).get("spec"))
        self.source_url = settings.source_url or spec.get("repo") or _origin(root)
        self.commit = settings.commit or (
            spec.get("revision") if _COMMIT.match(str(spec.get("revision") or "")) else None
        )
        self.branch = settings.branch or spec.get("branch") or (None if self.commit else "main")
        self.paths = [str(p) for p in spec.get("paths") or ["."]]
        self.targets_spec = [t for t in spec.get("targets") or [] if isinstance(t, dict)]
        self.plain = False  # whether the bundle being converted is raw YAML (Fleet's overlays)
        if not self.source_url:
            raise FleetImportError(
                f"{root}: no git URL for the bundles' content: give --source-url (or --gitrepo "
                "with spec.repo, or import a checkout with an origin remote)"
            )

    def note(self, bundle: str, where: str, message: str) -> None:
        self.result.notes.append(Note(bundle, where, message))

    def run(self) -> ImportResult:
        directories = bundle_directories(self.root, self.paths)
        names = {d: fleet_name(self.settings.name, self._relative(d)) for d in directories}
        seen: dict[str, Path] = {}
        for directory, name in names.items():
            if name in seen:
                raise FleetImportError(
                    f"{self._relative(seen[name])} and {self._relative(directory)} are both "
                    f"bundle {name!r} in Fleet's naming: rename one of the directories"
                )
            seen[name] = directory
        for directory in directories:
            try:
                self.result.bundles.append(self._bundle(directory, names[directory], names))
            except OverlayError as exc:  # hub.importer.overlays says why
                self.note(names[directory], "overlays/", f"not converted, not written: {exc}")
        if self.settings.clusters is not None:
            self.result.clusters = [dict(c) for c in self.settings.clusters]
        else:
            # Clusters named by a target or customization must exist for the fleet to load.
            named = sorted(
                {
                    str(c)
                    for b in self.result.bundles
                    for entry in [*b["targets"], *b.get("overrides", [])]
                    for c in entry.get("clusters") or []
                }
            )
            self.result.clusters = [{"name": n} for n in named]
            for n in named:
                self.note("", "clusters", f"cluster {n!r} is named by a target: written into "
                          "the inventory without labels (give --clusters for the real ones)")  # fmt: skip
        return self.result

    def _inside(self, directory: Path, file: str, bundle: str, where: str) -> Path:
        """``file`` (named by fleet.yaml ``where``) resolved from ``directory``, links followed;
        refused unless it lies in the imported tree: an absolute or ``..`` path, or a link out,
        would inline a file of the operator's machine (a kubeconfig) into the bundle."""
        path = (directory / file).resolve()
        if path != self.root and self.root not in path.parents:
            raise FleetImportError(
                f"bundle {bundle}: fleet.yaml {where} {file!r} lies outside the imported "
                f"repository {self.root}; only files of its tree are read"
            )
        return path

    def _relative(self, directory: Path) -> str:
        return directory.resolve().relative_to(self.root.resolve()).as_posix()

    def _source(self, directory: Path) -> dict[str, Any]:
        source: dict[str, Any] = {"kind": "git", "uri": self.source_url}
        if self.commit:
            source["commit"] = self.commit
        else:
            source["branch"] = self.branch
        relative = self._relative(directory)
        if relative != ".":
            source["directory"] = relative
        return source

    def _bundle(self, directory: Path, name: str, names: Mapping[Path, str]) -> dict[str, Any]:
        fleet_file = directory / FLEET_FILE
        fy = _dict(_read_yaml(fleet_file, self.root)) if fleet_file.is_file() else {}
        for key in sorted(set(fy) - _HANDLED):
            self.note(name, key, f"fleet.yaml {key!r} has no fleetlet equivalent; not imported")
        bundle: dict[str, Any] = {"name": name, "sources": [self._source(directory)]}
        options: dict[str, Any] = {}
        helm = _dict(fy.get("helm"))
        kustomize_dir = _dict(fy.get("kustomize")).get("dir")
        has_kustomization = any((directory / f).is_file() for f in KUSTOMIZATION_FILES)
        is_helm = bool(helm.get("chart")) or (directory / CHART_FILE).is_file()
        if is_helm:
            bundle["format"] = "helm"
            self._helm(name, directory, helm, bundle, options)
            if kustomize_dir or has_kustomization:
                self.note(name, "kustomize", "Fleet post-renders the chart with kustomize; "
                          "fleetlet renders the chart only")  # fmt: skip
        elif kustomize_dir or has_kustomization or _customized_dirs(fy):
            bundle["format"] = "kustomize"
            if kustomize_dir and kustomize_dir != ".":
                options["path"] = str(kustomize_dir)
            elif not has_kustomization:
                # Only targetCustomizations name kustomize dirs: the first is the default.
                first = _customized_dirs(fy)[0]
                options["path"] = first
                self.note(name, "kustomize.dir", f"none for clusters no customization matches "
                          f"(Fleet deploys the directory's files as they are there); fleetlet "
                          f"renders {first!r} for them")  # fmt: skip
        else:
            bundle["format"] = "plain"
            nested = [d for d in names if d != directory and directory in d.parents]
            if nested:
                self.note(name, "directory", "holds other bundles' directories, whose files "
                          "fleetlet's plain format would also read; move them apart")  # fmt: skip
        for key in sorted(set(helm) - _HELM_HANDLED):
            self.note(name, f"helm.{key}", "no fleetlet equivalent; not imported")
        namespace = fy.get("namespace") or fy.get("defaultNamespace") or "default"
        options["targetNamespace"] = str(namespace)
        if fy.get("namespace"):
            self.note(name, "namespace", f"Fleet forces every namespaced object into "
                      f"{fy['namespace']!r}; fleetlet gives it to objects that name none")  # fmt: skip
        bundle["formatOptions"] = options
        if fy.get("paused") is True:
            bundle["paused"] = True
        if fy.get("keepResources") is True:
            bundle["deletionPolicy"] = "Orphan"
        if helm.get("takeOwnership") is True:
            bundle["takeOwnership"] = True
        depends = self._depends(name, fy.get("dependsOn"), names)
        if depends:
            bundle["dependsOn"] = depends
        if (directory / ".fleetignore").is_file():
            self.note(name, ".fleetignore", "fleetlet does not read .fleetignore patterns; "
                      "remove the ignored files from the directory")  # fmt: skip
        self.plain = bundle["format"] == "plain"
        patches = self._overlays(name, directory, fy, "yaml.overlays")
        if patches:
            bundle["patches"] = patches
        customizations = [c for c in fy.get("targetCustomizations") or [] if isinstance(c, dict)]
        bundle["targets"], bundle["overrides"] = self._targets(
            name, directory, customizations, helm
        )
        if not bundle["overrides"]:
            del bundle["overrides"]
        return bundle

    def _helm(
        self,
        name: str,
        directory: Path,
        helm: Mapping[str, Any],
        bundle: dict[str, Any],
        options: dict[str, Any],
    ) -> None:
        chart = str(helm.get("chart") or "")
        repo, version = helm.get("repo"), helm.get("version")
        values_files = [str(f) for f in helm.get("valuesFiles") or []]
        for file in values_files:
            self._inside(directory, file, name, "helm.valuesFiles")
        remote: dict[str, Any] | None = None
        if chart and repo:
            remote = {
                "kind": "helm",
                "uri": str(repo),
                "chart": chart,
                "version": str(version or "*"),
            }
            chart_dir = chart
        elif chart.startswith("oci://"):
            remote = {"kind": "image", "uri": chart.removeprefix("oci://")}
            remote["version" if version else "tag"] = str(version or "latest")
            if not version:
                self.note(name, "helm.version", "no version for an OCI chart: tag 'latest'")
            chart_dir = chart.rstrip("/").rsplit("/", 1)[-1]
        elif _GO_GETTER.search(chart):
            remote = _go_getter_source(chart)
            if remote is None:
                self.note(name, "helm.chart", f"{chart!r}: a go-getter address fleetlet cannot "
                          "pin; give the chart as a git source")  # fmt: skip
                remote = {"kind": "git", "uri": chart}
            chart_dir = ""
        elif chart.startswith(("http://", "https://")):
            remote = {"kind": "http", "uri": chart}
            chart_dir = ""
        elif chart:
            options["path"] = chart.removeprefix("./")
        if remote is not None:
            local = bundle["sources"][0]
            bundle["sources"] = [remote]
            if values_files:
                # The values files stay in git: placed beside the chart.
                bundle["sources"].append({**local, "destination": "fleet"})
                values_files = [f"fleet/{f}" for f in values_files]
                if chart_dir:
                    options["path"] = chart_dir
                else:
                    self.note(name, "helm.chart", "a chart archive URL with valuesFiles: set "
                              "formatOptions.path to the chart's directory")  # fmt: skip
        if helm.get("releaseName"):
            options["releaseName"] = str(helm["releaseName"])
        if values_files:
            options["valuesFiles"] = values_files
        if helm.get("values"):
            options["values"] = _fleet_values(helm["values"], self.result.notes, name, "values")

    def _depends(self, name: str, depends: object, names: Mapping[Path, str]) -> list[str]:
        ours = set(names.values())
        out: list[str] = []
        for i, item in enumerate(depends if isinstance(depends, list) else []):
            wanted = _dict(item).get("name")
            if not wanted:
                self.note(name, f"dependsOn[{i}]", "a selector: fleetlet depends on named groups")
                continue
            candidates = [str(wanted), fleet_name(self.settings.name, str(wanted))]
            found = next((c for c in candidates if c in ours), None)
            if found is None:
                self.note(name, f"dependsOn[{i}]", f"{wanted!r} is not a bundle of this import")
            elif found not in out:
                out.append(found)
        return out

    # --- targets and customizations -----------------------------------------------------

    def _gitrepo_targets(self, name: str) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = []
        for i, t in enumerate(self.targets_spec):
            entry: dict[str, Any] = {}
            if isinstance(t.get("clusterSelector"), dict):
                entry["clusterSelector"] = _selector(t["clusterSelector"])
            if t.get("clusterName"):
                entry["clusters"] = [t["clusterName"]]
            for key in ("clusterGroup", "clusterGroupSelector"):
                if t.get(key):
                    self.note(name, f"targets[{i}].{key}", "cluster groups are not fleetlet "
                              "objects: select the clusters by label instead")  # fmt: skip
            if entry:
                targets.append(entry)
        if not targets:
            if not self.targets_spec:
                self.note(name, "targets", "no GitRepo targets given (--gitrepo): every cluster")
            targets = [{"clusterSelector": {}}]
        return targets

    def _targets(
        self,
        name: str,
        directory: Path,
        customizations: Sequence[Mapping[str, Any]],
        helm: Mapping[str, Any],
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        targets = self._gitrepo_targets(name)
        changes = [self._customization(name, directory, i, c) for i, c in enumerate(customizations)]
        inventory = self.settings.clusters
        if inventory is None:
            return targets, self._selector_overrides(name, customizations, changes)
        # The inventory is known: Fleet's first-match rule, decided per cluster.
        chosen: dict[int, list[str]] = {}
        excluded: list[str] = []
        targeted = [c for c in inventory if any(_selects(t, c) for t in targets)]
        for cluster in targeted:
            index = next(
                (i for i, c in enumerate(customizations) if _selects(_fleet_target(c), cluster)),
                None,
            )
            if index is None:
                continue
            if customizations[index].get("doNotDeploy") is True:
                excluded.append(str(cluster["name"]))
            else:
                chosen.setdefault(index, []).append(str(cluster["name"]))
        if excluded:
            targets = [{"clusters": sorted(
                str(c["name"]) for c in targeted if str(c["name"]) not in excluded)}]  # fmt: skip
        overrides = [
            {"clusters": sorted(chosen[i]), **changes[i]} for i in sorted(chosen) if changes[i]
        ]
        return targets, overrides

    def _selector_overrides(
        self,
        name: str,
        customizations: Sequence[Mapping[str, Any]],
        changes: Sequence[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        overrides = []
        for i, c in enumerate(customizations):
            if c.get("doNotDeploy") is True:
                self.note(name, f"targetCustomizations[{i}].doNotDeploy", "needs the cluster "
                          "inventory (--clusters) to leave those clusters out")  # fmt: skip
                continue
            if changes[i]:
                overrides.append({**_fleet_target(c), **changes[i]})
        if len(overrides) > 1:
            self.note(name, "targetCustomizations", "Fleet applies only the first matching "
                      "customization, fleetlet every matching override: give --clusters to "
                      "decide the first match per cluster")  # fmt: skip
        return overrides

    def _customization(
        self, name: str, directory: Path, index: int, c: Mapping[str, Any]
    ) -> dict[str, Any]:
        where = f"targetCustomizations[{index}]"
        for key in sorted(set(c) - _CUSTOMIZATION_HANDLED):
            self.note(name, f"{where}.{key}", "no fleetlet equivalent; not imported")
        for key in ("clusterGroup", "clusterGroupSelector"):
            if c.get(key):
                self.note(name, f"{where}.{key}", "cluster groups are not fleetlet objects")
        out: dict[str, Any] = {}
        namespace = c.get("namespace") or c.get("defaultNamespace")
        if namespace:
            out["namespace"] = str(namespace)
        kustomize_dir = _dict(c.get("kustomize")).get("dir")
        if kustomize_dir:
            out["path"] = str(kustomize_dir)
        helm = _dict(c.get("helm"))
        values: dict[str, Any] = {}
        for file in helm.get("valuesFiles") or []:
            path = self._inside(directory, str(file), name, f"{where}.helm.valuesFiles")
            values = merge(values, _dict(_read_yaml(path, self.root)))
            self.note(name, f"{where}.helm.valuesFiles", f"{file} inlined into the override's "
                      "values (which take precedence over the bundle's values)")  # fmt: skip
        if helm.get("values"):
            values = merge(values, _dict(helm["values"]))
        if values:
            out["values"] = _fleet_values(values, self.result.notes, name, f"{where}.values")
        for key in sorted(set(helm) - {"values", "valuesFiles"}):
            self.note(name, f"{where}.helm.{key}", "not imported (overrides change values only)")
        if c.get("paused") is True:
            out["paused"] = True
        patches = self._overlays(name, directory, c, f"{where}.yaml.overlays")
        if patches:
            out["patches"] = patches
        return out

    def _overlays(
        self, name: str, directory: Path, fy: Mapping[str, Any], where: str
    ) -> list[dict[str, Any]]:
        """Fleet's ``yaml.overlays`` as patches (:mod:`hub.importer.overlays`)."""
        overlays = _dict(fy.get("yaml")).get("overlays")
        for key in sorted(set(_dict(fy.get("yaml"))) - {"overlays"}):
            self.note(name, f"{where.rsplit('.', 1)[0]}.{key}", "no fleetlet equivalent")
        if not overlays:
            return []
        if not self.plain:
            self.note(name, where, "Fleet's overlays of a helm or kustomize bundle: not imported")
            return []
        return overlay_patches(directory, [str(o) for o in overlays])


def _fleet_target(c: Mapping[str, Any]) -> dict[str, Any]:
    target: dict[str, Any] = {}
    if isinstance(c.get("clusterSelector"), dict):
        target["clusterSelector"] = _selector(c["clusterSelector"])
    if c.get("clusterName"):
        target["clusters"] = [c["clusterName"]]
    return target


def _selects(target: Mapping[str, Any], cluster: Mapping[str, Any]) -> bool:
    """A Fleet/fleetlet target (clusters and/or clusterSelector) against one cluster; a target
    with neither selects nothing (as Fleet's empty customization)."""
    if not target:
        return False
    names = target.get("clusters")
    if names is not None and cluster.get("name") not in names:
        return False
    raw = target.get("clusterSelector")
    if raw is not None:
        problems: list[FieldProblem] = []
        selector = parse_selector(raw, "clusterSelector", problems)
        if selector is None or problems:
            raise FleetImportError(f"clusterSelector {raw!r}: {'; '.join(map(str, problems))}")
        return selector.matches(_dict(cluster.get("labels")))
    return True


def _kustomized(directory: Path) -> bool:
    return any((directory / f).is_file() for f in KUSTOMIZATION_FILES)


def _customized_dirs(fy: Mapping[str, Any]) -> list[str]:
    """The ``kustomize.dir`` of each targetCustomization that names one, in order."""
    return [
        str(_dict(c.get("kustomize")).get("dir"))
        for c in fy.get("targetCustomizations") or []
        if isinstance(c, dict) and _dict(c.get("kustomize")).get("dir")
    ]


def _go_getter_source(chart: str) -> dict[str, Any] | None:
    """A go-getter git address (``git::https://host/repo//sub/dir?ref=v1``,
    ``github.com/org/repo//dir?ref=v1``) as a git source with its directory; None when it
    names no ref (fleetlet pins every source) or another getter."""
    text = chart.removeprefix("git::")
    if "::" in text:
        return None
    url, _, query = text.partition("?")
    ref = next((v for k, _, v in (p.partition("=") for p in query.split("&")) if k == "ref"), "")
    if not ref:
        return None
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "https", url
    repo, _, directory = rest.partition("//")
    source: dict[str, Any] = {"kind": "git", "uri": f"{scheme}://{repo}"}
    if _COMMIT.match(ref):
        source["commit"] = ref
    else:  # go-getter does not say which: a version is a tag, anything else a branch
        source["tag" if re.match(r"v?[0-9]", ref) else "branch"] = ref
    if directory:
        source["directory"] = directory.strip("/")
    return source


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _origin(root: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "remote", "get-url", "origin"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def import_fleet(root: Path, settings: ImportSettings, *, check: bool = True) -> ImportResult:
    """Convert the Fleet GitRepo content at ``root`` (see the module doc); with ``check``,
    only bundles that render are kept (:func:`hub.importer.check.keep_rendering`).

    Raises FleetImportError.
    """
    if not root.is_dir():
        raise FleetImportError(f"{root}: not a directory")
    importer = _Importer(root.resolve(), settings)
    result = importer.run()
    if check:
        result.bundles = keep_rendering(
            result.bundles, importer.root, str(importer.source_url), importer.note
        )
    return result


def write_fleet_repo(result: ImportResult, out: Path) -> list[Path]:
    """Write ``fleet.yaml``, ``clusters/inventory.yaml`` and ``bundles/<name>.yaml`` into
    ``out`` (which must not hold a fleet repo already), then load it as the hub does.
    Raises FleetImportError."""
    if (out / "fleet.yaml").exists() or (out / "bundles").exists():
        raise FleetImportError(f"--out {out}: already holds a fleet repo; choose a new directory")
    written: list[Path] = []

    def write(relative: str, data: Any) -> None:
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            yaml.dump(data, Dumper=KUBE_DUMPER, sort_keys=False, default_flow_style=False)
        )
        written.append(path)

    try:
        write("fleet.yaml", {"apiVersion": "fleetlet.io/v1alpha1", "kind": "Fleet",
                             "name": result.name})  # fmt: skip
        write("clusters/inventory.yaml", {"clusters": copy.deepcopy(result.clusters)})
        for bundle in result.bundles:
            write(f"bundles/{bundle['name']}.yaml", bundle)
    except OSError as exc:
        raise FleetImportError(f"--out {out}: cannot write: {exc}") from exc
    try:
        check_loads(out)
    except PermanentError as exc:
        raise FleetImportError(str(exc)) from exc
    return written


__all__ = [
    "FleetImportError",
    "ImportResult",
    "ImportSettings",
    "Note",
    "bundle_directories",
    "fleet_name",
    "import_fleet",
    "load_clusters",
    "write_fleet_repo",
]
