"""The SOPS files of a composed bundle tree, opened in place before the format renders it.
Called by the render cache (:meth:`agent.render.cache.RenderCache.render`) between composing
the tree and rendering it, so every format reads plaintext the same way: a plain manifest (a
Secret encrypted as Flux users write them), a helm values file, a file a kustomize generator
reads.

A file is a SOPS file when it ends in ``.yaml``, ``.yml`` or ``.json`` and its one document is
a mapping with a ``sops`` block (:func:`agent.secrets.sops.is_sops_document`), or ends in
``.env`` and carries sops' flattened ``sops_...`` lines (:mod:`agent.secrets.dotenv`). With a
:class:`~agent.secrets.keys.Keyring` (the agent) each is decrypted, its MAC verified, and
written back over itself in the tree, which is the agent's private copy composed for this
render and deleted after it (``<cache-dir>/work/trees/<serial>/``): plaintext lives on the agent's
own disk for the length of a render, and goes nowhere else but the API server. Without one
(``hub diff``, ``fleetlet render``: no key opens them there) the files are left as they are
and only counted, so a preview shows the encrypted values as encrypted.

Any file that does not open fails the bundle's render (a ContentRefusedError raised after the
tree was composed: its group fails alone, RenderFailed, with the file named).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from agent.render.manifests import InvalidManifestError, ParseLimits, load_documents

if TYPE_CHECKING:
    from agent.secrets.keys import Keyring

# The SOPS code (cryptography, the age keys) is imported only when a file looks like one: most
# trees have none, and ``fleetlet render`` should not pay for it.

_SUFFIXES = (".yaml", ".yml", ".json", ".env")
# A cheap look before parsing: a top-level `sops:` key (YAML), `"sops":` (JSON), `sops_mac=`.
_HINT = re.compile(rb'(?m)^sops:|"sops"\s*:|^sops_mac=')


@dataclass
class Secrets:
    """What a pass over a tree found: the SOPS files (relative paths) and how many values
    they hold encrypted; ``opened``: whether they were decrypted in place."""

    files: dict[str, int] = field(default_factory=dict)
    opened: bool = False

    @property
    def values(self) -> int:
        return sum(self.files.values())


def open_tree(
    root: Path,
    keyring: Keyring | None,
    *,
    source: str,
    limits: ParseLimits | None = None,
) -> Secrets:
    """Find the SOPS files under ``root`` and, given ``keyring``, decrypt each in place.

    Raises SopsError (a file that does not open: not a recipient, wrong key, MAC mismatch)
    and InvalidManifestError (a file that claims to be SOPS and is not readable).
    """
    found = Secrets(opened=keyring is not None)
    for path in sorted(_candidates(root)):
        relative = path.relative_to(root).as_posix()
        data = path.read_bytes()
        if not _HINT.search(data):
            continue
        from agent.secrets.sops import SopsError, is_sops_document

        if path.name.endswith(".env"):
            _dotenv(path, relative, data, keyring, found, source=source)
            continue
        try:
            documents = load_documents(data, source=source, file=relative, limits=limits)
        except InvalidManifestError:
            continue  # not ours to judge: the format reads (and refuses) it as it would
        if not any(is_sops_document(d) for d in documents):
            continue
        if len(documents) != 1:
            raise SopsError(
                "a SOPS file must hold one document (sops writes one per file)",
                source=source,
                file=relative,
                rule="SopsFormat",
            )
        document = documents[0]
        assert isinstance(document, dict)
        opened = _open(document, relative, keyring, found, source=source)
        if opened is not None:
            _write_over(path, opened)
    return found


def _open(
    document: dict[str, Any], relative: str, keyring: Keyring | None, found: Secrets, *, source: str
) -> dict[str, Any] | None:
    """``document`` decrypted with ``keyring`` (None: no keyring, its values only counted into
    ``found``). Raises SopsError."""
    from agent.secrets.sops import SopsError, count_encrypted, open_document

    if keyring is None:
        found.files[relative] = count_encrypted(document)
        return None
    if not keyring.identities:
        raise SopsError(
            f"this cluster's age key could not be read: {keyring.problem}",
            source=source,
            file=relative,
            rule="NoClusterKey",
        )
    opened = open_document(
        document, keyring.identities, recipients=keyring.recipients, source=source, file=relative
    )
    found.files[relative] = opened.values
    result = opened.document
    assert isinstance(result, dict)
    return result


def _dotenv(
    path: Path, relative: str, data: bytes, keyring: Keyring | None, found: Secrets, *, source: str
) -> None:
    """One dotenv file (``KEY=value`` lines, what kustomize's ``envs:`` reads)."""
    from agent.secrets import dotenv
    from agent.secrets.sops import SopsError

    try:
        text = data.decode("utf-8")
        if not dotenv.is_sops_dotenv(text):
            return
        document = dotenv.parse(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise SopsError(f"a SOPS dotenv file that does not read: {exc}", source=source,
                        file=relative, rule="SopsFormat") from None  # fmt: skip
    opened = _open(document, relative, keyring, found, source=source)
    if opened is not None:
        _replace(path, dotenv.dump(opened))


def _candidates(root: Path) -> list[Path]:
    """Regular files (not links) of the tree with a YAML/JSON name, hidden ones included."""
    out = []
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            if name.endswith(_SUFFIXES) and path.is_file() and not path.is_symlink():
                out.append(path)
    return out


def _write_over(path: Path, document: object) -> None:
    """Replace the file (not write through it: a hard link elsewhere keeps its bytes)."""
    if path.name.endswith(".json"):
        text = json.dumps(document, indent=2) + "\n"
    else:
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    _replace(path, text)


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.opened")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


__all__ = ["Secrets", "open_tree"]
