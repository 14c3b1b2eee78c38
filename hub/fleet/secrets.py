"""Encrypted values in the fleet repo: a bundle's (or an override's) ``encryptedValues``
names a SOPS file of the fleet repo, encrypted to the recipients of the clusters that should
read it (``fleetlet hub recipients``). Called by :mod:`hub.fleet.load` for each bundle file.

The hub cannot open it and does not try: it checks that the file is a SOPS document and
carries it whole, as sops wrote it, in ``formatOptions.encryptedValues`` of the BundleDeployment
spec of each cluster it targets (the file's MAC covers every value of it, so it travels
unchanged). The cluster's agent decrypts it at render and merges the values over the bundle's
``values`` (:mod:`agent.secrets.values`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from agent.render.manifests import InvalidManifestError, load_documents
from agent.secrets.sops import is_sops_document

MAX_BYTES = 1024 * 1024


def load_encrypted_values(
    root: Path, ref: object, *, add: Callable[[str, object], None]
) -> Mapping[str, Any] | None:
    """The SOPS document of the fleet-repo file ``ref`` names (a relative path), or None after
    ``add(expected, found)`` said what is wrong."""
    if not isinstance(ref, str) or not ref:
        add("a path of the fleet repo to a SOPS file (secrets/web.yaml)", ref)
        return None
    relative = PurePosixPath(ref)
    if relative.is_absolute() or ".." in relative.parts:
        add("a path inside the fleet repo", ref)
        return None
    path = root / relative
    try:
        resolved = path.resolve(strict=True)
        if not resolved.is_relative_to(root.resolve()) or not resolved.is_file():
            add("a file inside the fleet repo", ref)
            return None
        data = resolved.read_bytes()[: MAX_BYTES + 1]
    except OSError as exc:
        add("a readable file of the fleet repo", f"{ref}: {exc.strerror or exc}")
        return None
    if len(data) > MAX_BYTES:
        add(f"a SOPS file of at most {MAX_BYTES} bytes", ref)
        return None
    try:
        documents = load_documents(data, source="fleet repo", file=ref)
    except InvalidManifestError as exc:
        add("a SOPS file (YAML or JSON)", f"{ref}: {exc.detail}")
        return None
    if len(documents) != 1 or not is_sops_document(documents[0]):
        add(
            "a file encrypted with sops (a mapping with a sops block): the hub never carries "
            "values in clear here",
            ref,
        )
        return None
    document = documents[0]
    assert isinstance(document, dict)
    return document


__all__ = ["load_encrypted_values"]
