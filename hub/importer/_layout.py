"""Reading a Rancher Fleet GitRepo checkout: its YAML files within their limits, the cluster
inventory (fleetlet's format or Fleet ``Cluster`` objects), the bundle directories of the
GitRepo's ``paths`` and the names Fleet gives them. Called by :mod:`hub.importer.fleet`.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.api.yamlio import go_text
from agent.render.detect import KUSTOMIZATION_FILES
from agent.render.manifests import InvalidManifestError, ParseLimits, load_documents
from hub.importer._result import FleetImportError

FLEET_FILE = "fleet.yaml"
_FLEET_LIMITS = ParseLimits(max_file_bytes=4 * 1024 * 1024)
_DISALLOWED = re.compile(r"[^a-zA-Z0-9-]+")
_HELM_RELEASE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_MAX_NAME = 53  # Helm's release names, so Fleet's bundle names


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


def _kustomized(directory: Path) -> bool:
    return any((directory / f).is_file() for f in KUSTOMIZATION_FILES)


def _customized_dirs(fy: Mapping[str, Any]) -> list[str]:
    """The ``kustomize.dir`` of each targetCustomization that names one, in order."""
    return [
        str(_dict(c.get("kustomize")).get("dir"))
        for c in fy.get("targetCustomizations") or []
        if isinstance(c, dict) and _dict(c.get("kustomize")).get("dir")
    ]


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
