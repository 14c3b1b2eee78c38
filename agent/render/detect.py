"""Which format a directory is written in, from the files that mark each format.

- ``helm``: a ``Chart.yaml``;
- ``kustomize``: a ``kustomization.yaml``, ``kustomization.yml`` or ``Kustomization``;
- ``registry+v1``: ``metadata/annotations.yaml`` whose ``annotations`` say
  ``operators.operatorframework.io.bundle.mediatype.v1: registry+v1`` (an OLM bundle);
- ``plain`` otherwise.

Only the directory itself is looked at (not its subdirectories): it is the root a format
renders from. The files that mark a format, and the other well-known files that are never
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
    return Detection("plain", None)


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
