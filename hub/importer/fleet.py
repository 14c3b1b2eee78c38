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
  bundle (``yaml.overlays``, the bundle's or a customization's) become ``patches``, and an
  overlay adding or swapping files one more source placing its directory in the tree
  (:mod:`hub.importer.overlays`); one without a faithful equivalent leaves the bundle out
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

The rooms: :mod:`hub.importer._layout` reads the checkout (fleet.yaml files, the cluster
inventory, bundle directories and their names), :mod:`hub.importer._translate` turns Fleet's
values, targets and chart addresses into fleetlet's, :mod:`hub.importer._result` holds what
the importer is given and gives back; this module walks the bundles and writes the fleet repo.
Called by ``fleetlet.cli`` (``fleetlet import fleet``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from agent.api.yamlio import KUBE_DUMPER
from agent.errors import PermanentError
from agent.render.detect import CHART_FILE, KUSTOMIZATION_FILES
from agent.render.values import merge
from hub.importer._layout import (
    FLEET_FILE,
    _customized_dirs,
    _dict,
    _origin,
    _read_yaml,
    _selector,
    bundle_directories,
    fleet_name,
    load_clusters,
)
from hub.importer._result import FleetImportError, ImportResult, ImportSettings, Note
from hub.importer._translate import (
    _COMMIT,
    _GO_GETTER,
    _fleet_target,
    _fleet_values,
    _go_getter_source,
    _selects,
)
from hub.importer.check import check_loads, keep_rendering
from hub.importer.overlays import MOUNTED, OVERLAYS, Converted, OverlayError, overlay_patches

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
        self.sources: list[dict[str, Any]] = []  # the bundle's sources, overlays placed
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
        converted = self._overlays(name, directory, fy, "yaml.overlays")
        if converted.patches:
            bundle["patches"] = converted.patches
        bundle["sources"] += self._placed(directory, converted.mounted)
        self.sources = bundle["sources"]  # what an override placing more overlays adds to
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
        converted = self._overlays(name, directory, c, f"{where}.yaml.overlays")
        if converted.patches:
            out["patches"] = converted.patches
        if converted.mounted:
            out["sources"] = [*self.sources, *self._placed(directory, converted.mounted)]
        return out

    def _placed(self, directory: Path, overlays: list[str]) -> list[dict[str, Any]]:
        """The sources placing Fleet overlay directories in the bundle's tree."""
        return [
            {**self._source(directory / OVERLAYS / o), "destination": f"{MOUNTED}/{o}"}
            for o in overlays
        ]

    def _overlays(self, name: str, directory: Path, fy: Mapping[str, Any], where: str) -> Converted:
        """Fleet's ``yaml.overlays`` as patches and placed directories
        (:mod:`hub.importer.overlays`)."""
        overlays = _dict(fy.get("yaml")).get("overlays")
        for key in sorted(set(_dict(fy.get("yaml"))) - {"overlays"}):
            self.note(name, f"{where.rsplit('.', 1)[0]}.{key}", "no fleetlet equivalent")
        if not overlays:
            return Converted()
        if not self.plain:
            self.note(name, where, "Fleet's overlays of a helm or kustomize bundle: not imported")
            return Converted()
        return overlay_patches(directory, [str(o) for o in overlays])


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
