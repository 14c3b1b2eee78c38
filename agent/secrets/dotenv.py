"""SOPS files in dotenv form (``KEY=value`` lines, what a kustomize ``secretGenerator`` reads
with ``envs:``), as sops writes them: each value encrypted with its key as its path, and the
``sops`` block flattened into ``sops_...`` lines (``sops_age__list_0__map_recipient=age1...``).
Called by :mod:`agent.secrets.tree`; the values open with :func:`agent.secrets.sops.open_document`.
"""

from __future__ import annotations

import re
from typing import Any

_PREFIX = "sops_"
_TOKEN = re.compile(r"__(map|list)_")


def is_sops_dotenv(text: str) -> bool:
    """Whether ``text`` carries a flattened sops block (a ``sops_mac`` and a ``sops_version``)."""
    keys = {line.split("=", 1)[0] for line in text.splitlines() if "=" in line}
    return "sops_mac" in keys and "sops_version" in keys


def parse(text: str) -> dict[str, Any]:
    """The document sops reads: the values in order (comments dropped: sops keeps them out of
    the MAC) and the ``sops`` block unflattened. Raises ValueError naming a bad line."""
    values: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for number, line in enumerate(text.split("\n"), 1):
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line {number} is not KEY=value")
        value = value.replace("\\n", "\n")
        if key.startswith(_PREFIX):
            _place(meta, key[len(_PREFIX) :], value)
        else:
            values[key] = value
    for flag in ("mac_only_encrypted",):
        if isinstance(meta.get(flag), str):
            meta[flag] = meta[flag].lower() == "true"
    return {**values, "sops": meta}


def dump(document: dict[str, Any]) -> str:
    """The opened values as dotenv lines (newlines written ``\\n``, as sops does)."""
    lines = []
    for key, value in document.items():
        text = str(value) if not isinstance(value, bool) else ("true" if value else "false")
        lines.append(f"{key}={text.replace(chr(10), chr(92) + 'n')}\n")
    return "".join(lines)


def _place(root: dict[str, Any], path: str, value: str) -> None:
    """Put ``value`` at the flattened ``path`` (sops' ``tokenize``: ``a__list_0__map_b``)."""
    parts = _TOKEN.split(path)
    tokens: list[str | int] = [parts[0]]
    for kind, name in zip(parts[1::2], parts[2::2], strict=True):
        tokens.append(int(name) if kind == "list" else name)
    node: Any = root
    for token, following in zip(tokens, [*tokens[1:], None], strict=True):
        last = following is None
        empty: Any = [] if isinstance(following, int) else {}
        if isinstance(token, int):
            while len(node) <= token:
                node.append(None)
            if last:
                node[token] = value
            elif node[token] is None:
                node[token] = empty
            node = node[token]
        else:
            if last:
                node[token] = value
            else:
                node = node.setdefault(token, empty)


__all__ = ["dump", "is_sops_dotenv", "parse"]
