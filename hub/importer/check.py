"""The importer's own checks, so that ``fleetlet import fleet`` never writes a fleet that does
not work: called by :func:`hub.importer.fleet.import_fleet` (every bundle renders) and
:func:`hub.importer.fleet.write_fleet_repo` (the written fleet loads).

- Every bundle whose content is the imported checkout is rendered from it, with the format,
  options, target namespace and patches it was given, and once for each override that changes
  its ``path`` (a Fleet ``targetCustomizations[].kustomize.dir``), adds ``patches`` or sources
  (Fleet's ``overlays/``; several sources are laid out at their destinations, as the agent
  composes the tree). A bundle that does not
  render is not written: it is listed as not converted, with the renderer's reason, and
  ``dependsOn`` entries naming it are dropped (and listed). A bundle whose chart lives
  elsewhere (a helm repository, an OCI registry, an archive URL) cannot be rendered offline:
  it is listed as not checked.
- The written fleet repo is loaded as the hub loads it; a problem there is an error.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.errors import PermanentError


def render_problem(bundle: Mapping[str, Any], root: Path, source_url: str) -> str | None:
    """Why the bundle does not render from the checkout at ``root`` (None: it renders, or
    cannot be checked offline: see :func:`checkable`)."""
    from agent.render.formats import render_bundle
    from agent.render.plain import RenderRequest

    options = dict(bundle.get("formatOptions") or {})
    own = list(bundle.get("patches") or [])
    # The bundle as it is, then as each override makes it (its path, its patches after the
    # bundle's, its sources: Fleet's overlays).
    sources = list(bundle["sources"])
    variants: list[tuple[str, list[Any], dict[str, Any], list[Any]]] = [("", sources, options, own)]
    for i, override in enumerate(bundle.get("overrides") or []):
        if override.get("path") or override.get("patches") or override.get("sources"):
            path = override.get("path") or options.get("path")
            checked = {**options, "path": path} if path else options
            where = f" (overrides[{i}]" + (f", path {path})" if override.get("path") else ")")
            variants.append((where, list(override.get("sources") or sources), checked,
                             [*own, *(override.get("patches") or [])]))  # fmt: skip
    seen: list[tuple[list[Any], dict[str, Any], list[Any]]] = []
    for where, tree_sources, checked, patches in variants:
        if (tree_sources, checked, patches) in seen:
            continue
        seen.append((tree_sources, checked, patches))
        with tempfile.TemporaryDirectory(prefix="fleetlet-import-") as work:
            try:
                render_bundle(
                    _tree(root, tree_sources, Path(work)),
                    format=str(bundle["format"]),
                    request=RenderRequest(
                        source=str(bundle["name"]),
                        namespace=options.get("targetNamespace"),
                        options=checked,
                        patches=patches,
                    ),
                )
            except PermanentError as exc:
                return f"does not render{where}: {' '.join(str(exc).split())}"
    return None


def _tree(root: Path, sources: list[Any], work: Path) -> Path:
    """The bundle's tree from the checkout: one source's directory as it is, several laid out
    at their destinations (as the agent composes them)."""
    if len(sources) == 1 and not sources[0].get("destination"):
        return root / str(sources[0].get("directory") or ".")
    tree = work / "tree"
    for source in sources:
        shutil.copytree(
            root / str(source.get("directory") or "."),
            tree / str(source.get("destination") or ""),
            symlinks=True,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(".git"),
        )
    return tree


def checkable(bundle: Mapping[str, Any], source_url: str) -> bool:
    """Whether the bundle's only content is the imported checkout."""
    sources = [*bundle["sources"]]
    for override in bundle.get("overrides") or []:
        sources += override.get("sources") or []
    return all(s.get("uri") == source_url for s in sources)


def keep_rendering(
    bundles: list[dict[str, Any]],
    root: Path,
    source_url: str,
    note: Callable[[str, str, str], None],
) -> list[dict[str, Any]]:
    """The bundles that render (see the module's docstring); ``note(bundle, field, message)``
    hears about the others."""
    kept: list[dict[str, Any]] = []
    dropped: set[str] = set()
    for bundle in bundles:
        if not checkable(bundle, source_url):
            note(bundle["name"], "sources", "its chart is not in the repository: not rendered "
                 "by the import (run `fleetlet hub render` with access to it)")  # fmt: skip
            kept.append(bundle)
            continue
        problem = render_problem(bundle, root, source_url)
        if problem is None:
            kept.append(bundle)
        else:
            note(bundle["name"], "bundle", f"not converted, not written: {problem}")
            dropped.add(bundle["name"])
    for bundle in kept:
        depends = bundle.get("dependsOn") or []
        for name in [d for d in depends if d in dropped]:
            note(bundle["name"], "dependsOn", f"{name!r} was not written: dependency dropped")
        if depends:
            bundle["dependsOn"] = [d for d in depends if d not in dropped]
            if not bundle["dependsOn"]:
                del bundle["dependsOn"]
    return kept


def check_loads(out: Path) -> None:
    """Load the written fleet repo as the hub does. Raises PermanentError naming the problem."""
    from hub.fleet.load import load_fleet

    try:
        load_fleet(out)
    except PermanentError as exc:
        raise PermanentError(f"the written fleet in {out} does not load: {exc}") from exc
