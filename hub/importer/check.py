"""The importer's own checks, so that ``fleetlet import fleet`` never writes a fleet that does
not work: called by :func:`hub.importer.fleet.import_fleet` (every bundle renders) and
:func:`hub.importer.fleet.write_fleet_repo` (the written fleet loads).

- Every bundle whose content is the imported checkout is rendered from it, with the format,
  options, target namespace and patches it was given, and once for each override that changes
  its ``path`` (a Fleet ``targetCustomizations[].kustomize.dir``) or adds ``patches`` (Fleet's
  ``overlays/``). A bundle that does not
  render is not written: it is listed as not converted, with the renderer's reason, and
  ``dependsOn`` entries naming it are dropped (and listed). A bundle whose chart lives
  elsewhere (a helm repository, an OCI registry, an archive URL) cannot be rendered offline:
  it is listed as not checked.
- The written fleet repo is loaded as the hub loads it; a problem there is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.errors import PermanentError


def render_problem(bundle: Mapping[str, Any], root: Path, source_url: str) -> str | None:
    """Why the bundle does not render from the checkout at ``root`` (None: it renders, or
    cannot be checked offline: see :func:`checkable`)."""
    from agent.render.formats import render_bundle
    from agent.render.plain import RenderRequest

    (source,) = bundle["sources"]
    tree = root / str(source.get("directory") or ".")
    options = dict(bundle.get("formatOptions") or {})
    own = list(bundle.get("patches") or [])
    # The bundle as it is, then as each override makes it (its path, its patches after the
    # bundle's: Fleet's overlays).
    variants: list[tuple[str, dict[str, Any], list[Any]]] = [("", options, own)]
    for i, override in enumerate(bundle.get("overrides") or []):
        if override.get("path") or override.get("patches"):
            path = override.get("path") or options.get("path")
            checked = {**options, "path": path} if path else options
            where = f" (overrides[{i}]" + (f", path {path})" if override.get("path") else ")")
            variants.append((where, checked, [*own, *(override.get("patches") or [])]))
    seen: list[tuple[dict[str, Any], list[Any]]] = []
    for where, checked, patches in variants:
        if (checked, patches) in seen:
            continue
        seen.append((checked, patches))
        try:
            render_bundle(
                tree,
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


def checkable(bundle: Mapping[str, Any], source_url: str) -> bool:
    """Whether the bundle's only content is the imported checkout."""
    sources = bundle["sources"]
    return len(sources) == 1 and sources[0].get("uri") == source_url


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
