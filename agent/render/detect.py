"""Which format a directory is written in, from the files that mark each format.

- ``helm``: a ``Chart.yaml``;
- ``kustomize``: a ``kustomization.yaml``, ``kustomization.yml`` or ``Kustomization``;
- ``registry+v1``: ``metadata/annotations.yaml`` whose ``annotations`` say
  ``operators.operatorframework.io.bundle.mediatype.v1: registry+v1`` (an OLM bundle);
- ``helm`` too for a directory holding one chart folder and no manifests beside it (a chart
  archive unpacked: the helm format renders the chart from there);
- ``plain`` otherwise.

Otherwise only the directory itself is looked at: it is the root a format renders from.
:func:`archive_hint` and :func:`kustomize_hint` say in one line what to pass when a guessed
plain render finds nothing or fails (a chart archive alone; kustomizations only below the root). The files that mark a format, and the other well-known files that are never
Kubernetes manifests (Rancher Fleet's ``fleet.yaml``, Helm's ``values*.yaml``), are listed in
:func:`is_known_non_manifest` so that the ``plain`` format skips them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agent.render.manifests import InvalidManifestError, ParseLimits, load_documents

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
CHART_FILE = "Chart.yaml"
OLM_ANNOTATIONS = "metadata/annotations.yaml"
OLM_MEDIATYPE = "operators.operatorframework.io.bundle.mediatype.v1"

# Files that configure a tool and are never objects to apply, wherever they are in a tree.
_NON_MANIFEST = re.compile(
    r"^(fleet\.ya?ml|Chart\.ya?ml|kustomization\.ya?ml|Kustomization|values([-_.].*)?\.ya?ml"
    r"|values\.schema\.json|\.fleetignore|\.helmignore)$"
)


@dataclass(frozen=True, slots=True)
class Detection:
    """The format chosen and the file that decided it (``None`` for plain)."""

    format: str
    evidence: str | None

    def describe(self) -> str:
        """``kustomize (kustomization.yaml)`` or ``plain (no format marker)``."""
        return f"{self.format} ({self.evidence or 'no format marker'})"


def is_known_non_manifest(name: str) -> bool:
    """Whether a file name is one of the well-known non-manifest files (see module doc)."""
    return bool(_NON_MANIFEST.match(name))


def detect_format(root: Path) -> Detection:
    """The format of the directory ``root`` (see the module doc). Never raises for content:
    an unreadable ``metadata/annotations.yaml`` does not make a registry+v1 bundle."""
    if (root / CHART_FILE).is_file():
        return Detection("helm", CHART_FILE)
    for name in KUSTOMIZATION_FILES:
        if (root / name).is_file():
            return Detection("kustomize", name)
    if _is_registry_v1(root / OLM_ANNOTATIONS):
        return Detection("registry+v1", f"{OLM_ANNOTATIONS} ({OLM_MEDIATYPE}: registry+v1)")
    charts = [d for d in _subdirectories(root) if (d / CHART_FILE).is_file()]
    if len(charts) == 1 and not _manifests_at(root, recursive=True, outside=charts[0]):
        # One chart folder (a chart archive unpacked), nothing else to apply: the helm format
        # renders it from there.
        return Detection("helm", f"{charts[0].name}/{CHART_FILE}")
    return Detection("plain", None)


def archive_hint(root: Path) -> str | None:
    """What to do with a directory that renders nothing as plain because it holds only a chart
    archive (what ``helm pull`` gives), in one line; None otherwise."""
    archives = sorted(p.name for p in root.glob("*.tgz")) if root.is_dir() else []
    if archives and not _manifests_at(root, recursive=True):
        return (
            f"{root} holds the chart archive {archives[0]} and no manifests: unpack it "
            f"(tar -xzf {root / archives[0]} -C {root}) and render {root} again"
        )
    return None


def kustomize_hint(root: Path) -> str | None:
    """What to pass for a directory that fails as plain because it is a kustomize tree with
    kustomizations below its root and none at it, in one line; None otherwise."""
    nested = sorted(
        p.parent.relative_to(root).as_posix()
        for name in KUSTOMIZATION_FILES
        for p in root.glob(f"*/**/{name}")
        if not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    if nested:
        shown = ", ".join(nested[:5]) + (", ..." if len(nested) > 5 else "")
        return (
            f"{root} has no kustomization at its root but has some below it ({shown}): pass "
            f"--path {nested[-1]} (or --format plain to read every file as manifests)"
        )
    return None


def _subdirectories(root: Path) -> list[Path]:
    try:
        return [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    except OSError:
        return []


def _manifests_at(root: Path, *, recursive: bool = False, outside: Path | None = None) -> bool:
    """Whether files the plain format would read lie in ``root`` (or under it, but for what is
    under ``outside``)."""
    pattern = "**/*" if recursive else "*"
    return any(
        p.suffix in (".yaml", ".yml", ".json")
        and p.is_file()
        and not is_known_non_manifest(p.name)
        and (outside is None or outside not in p.parents)
        for p in root.glob(pattern)
    )


def _is_registry_v1(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        documents = load_documents(
            path.read_bytes(),
            source="detect",
            file=OLM_ANNOTATIONS,
            limits=ParseLimits(max_file_bytes=1024 * 1024),
        )
    except (InvalidManifestError, OSError):
        return False
    first = documents[0] if documents else None
    annotations = first.get("annotations") if isinstance(first, dict) else None
    return isinstance(annotations, dict) and annotations.get(OLM_MEDIATYPE) == "registry+v1"
