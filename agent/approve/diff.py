"""What changes in one object, for a person: the changed field paths and a unified diff.

Both sides are cleaned first (:func:`cleaned`): status, the server's bookkeeping
(managedFields, resourceVersion, generation, uid, creationTimestamp) and fleetlet's
``fleetlet.io/revision`` annotation (a new serial each time) are not what a move changes. Secret values never appear: :func:`redacted` replaces each ``data``/``stringData``
value with a marker that says only whether it changed. An object still SOPS-encrypted (the
hub's previews: it holds no key, :mod:`agent.secrets`) shows each encrypted value as
``<encrypted>`` or ``<encrypted: changed>`` (its ciphertext changed: sops keeps a value's
ciphertext while its plaintext stays) and no ``sops`` block.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Mapping
from typing import Any

import yaml

from agent.render.plain import REVISION_ANNOTATION
from agent.secrets.sops import is_sops_document

Object = dict[str, Any]

REDACTED = "<redacted>"
REDACTED_CHANGED = "<redacted: changed>"
ENCRYPTED = "<encrypted>"
ENCRYPTED_CHANGED = "<encrypted: changed>"
_BOOKKEEPING = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp")
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")

try:
    _Dumper: type[Any] = yaml.CSafeDumper
except AttributeError:  # PyYAML built without libyaml
    _Dumper = yaml.SafeDumper


def cleaned(obj: Mapping[str, Any] | None) -> Object | None:
    """A copy without status and server bookkeeping (None stays None)."""
    if obj is None:
        return None
    out = {k: copy.deepcopy(v) for k, v in obj.items() if k != "status"}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        meta = {k: v for k, v in meta.items() if k not in _BOOKKEEPING}
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and REVISION_ANNOTATION in annotations:
            rest = {k: v for k, v in annotations.items() if k != REVISION_ANNOTATION}
            if rest:
                meta["annotations"] = rest
            else:
                meta.pop("annotations")
        out["metadata"] = meta
    return out


def redacted(before: Object | None, after: Object | None) -> tuple[Object | None, Object | None]:
    """Both sides with Secret values replaced: equal values by :data:`REDACTED` on both sides,
    a value that changes or is new by :data:`REDACTED_CHANGED` on the new side; a SOPS
    object's encrypted values by :data:`ENCRYPTED` and :data:`ENCRYPTED_CHANGED` alike."""
    if is_sops_document(after) or is_sops_document(before):
        return _encrypted(before), _encrypted(after, before)
    kind = (after or before or {}).get("kind")
    if kind != "Secret":
        return before, after
    before, after = copy.deepcopy(before), copy.deepcopy(after)
    for field in ("data", "stringData"):
        old = (before or {}).get(field) if isinstance((before or {}).get(field), dict) else {}
        new = (after or {}).get(field) if isinstance((after or {}).get(field), dict) else {}
        if before is not None and isinstance(before.get(field), dict):
            before[field] = {k: REDACTED for k in before[field]}
        if after is not None and isinstance(after.get(field), dict):
            after[field] = {
                k: REDACTED if (old or {}).get(k) == v else REDACTED_CHANGED
                for k, v in (new or {}).items()
            }
    return before, after


def _encrypted(obj: Object | None, before: Any = None) -> Object | None:
    """``obj`` without its ``sops`` block, each encrypted value a marker (changed: not the
    same ciphertext as in ``before`` at the same place)."""
    if obj is None:
        return None

    def mask(value: Any, old: Any) -> Any:
        if isinstance(value, Mapping):
            olds = old if isinstance(old, Mapping) else {}
            return {k: mask(v, olds.get(k)) for k, v in value.items() if k != "sops"}
        if isinstance(value, list):
            items = old if isinstance(old, list) else []
            return [mask(v, items[i] if i < len(items) else None) for i, v in enumerate(value)]
        if isinstance(value, str) and value.startswith("ENC[AES256_GCM,"):
            return ENCRYPTED if before is None or value == old else ENCRYPTED_CHANGED
        return value

    masked: Object = mask(obj, before)
    return masked


def _key(path: str, key: str) -> str:
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def changed_paths(before: Any, after: Any, *, limit: int, path: str = "") -> list[str]:
    """The paths of the leaves that differ (``spec.template.spec.containers[0].image``,
    ``metadata.labels['app.kubernetes.io/name']``), in order; at most ``limit``, the last
    one ``...`` when there are more. A field added or removed whole is one path."""
    found: list[str] = []

    def walk(a: Any, b: Any, where: str) -> bool:
        """False once the limit is reached."""
        if a == b:
            return True
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b), key=str):
                if not walk(a.get(k), b.get(k), _key(where, str(k))):
                    return False
            return True
        if isinstance(a, list) and isinstance(b, list):
            for i in range(max(len(a), len(b))):
                x = a[i] if i < len(a) else None
                y = b[i] if i < len(b) else None
                if not walk(x, y, f"{where}[{i}]"):
                    return False
            return True
        if len(found) >= limit - 1:
            found.append("...")
            return False
        found.append(where or "(whole object)")
        return True

    walk(before, after, path)
    return found


def _yaml(obj: Object | None) -> list[str]:
    if obj is None:
        return []
    text: str = yaml.dump(obj, Dumper=_Dumper, sort_keys=True, default_flow_style=False)
    return text.splitlines(keepends=True)


def unified(before: Object | None, after: Object | None, *, old: str, new: str) -> str:
    """A unified diff of the two sides as YAML (keys sorted), three lines of context."""
    return "".join(difflib.unified_diff(_yaml(before), _yaml(after), fromfile=old, tofile=new))


__all__ = [
    "ENCRYPTED",
    "ENCRYPTED_CHANGED",
    "REDACTED",
    "REDACTED_CHANGED",
    "changed_paths",
    "cleaned",
    "redacted",
    "unified",
]
