"""Chart values given on the command line: ``--values FILE`` and ``--set`` as Helm reads them.

``--set`` follows Helm's syntax: ``a.b=c`` sets a nested key, ``a[0]=x`` a list item,
``a={x,y}`` a list (``a={}`` is a list of one empty string, as in Helm), several assignments
separated by commas, ``\\`` escapes ``.``, ``,``, ``=``, ``[``, ``{`` and ``}``. Values are
typed as Helm's ``strvals`` types them: ``true``/``false`` in any case become booleans,
``null`` in any case becomes null (which removes a chart default), a signed decimal integer
that fits 64 bits and does not start with ``0`` becomes a number (``+5`` is 5, ``007`` and
``99999999999999999999`` stay strings); anything else (``y``, ``1.5``, ``1e3``) is a string.
Files and assignments are merged in order: mappings key by key, anything else replaced.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.errors import PermanentError
from agent.render.manifests import InvalidManifestError, load_documents

_INT = re.compile(r"[-+]?[0-9]+\Z", re.ASCII)
_INT64 = 1 << 63
_MAX_INDEX = 65_536


class ValuesError(PermanentError):
    """A values file or a ``--set`` assignment is not usable (the message says where)."""


def merge(base: Any, override: Any) -> Any:
    """Deep merge: mappings merge key by key; anything else in ``override`` replaces."""
    if not isinstance(base, Mapping) or not isinstance(override, Mapping):
        return override
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if key in out else value
    return out


def load_values_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML values file (empty file: no values).

    Raises ValuesError (unreadable, not YAML, not a mapping).
    """
    try:
        data = path.read_bytes()
        documents = load_documents(data, source="--values", file=str(path))
    except OSError as exc:
        raise ValuesError(f"--values {path}: {exc.strerror or exc}") from exc
    except InvalidManifestError as exc:
        raise ValuesError(f"--values {path}: {exc.detail}") from exc
    if not documents:
        return {}
    if len(documents) > 1 or not isinstance(documents[0], dict):
        raise ValuesError(f"--values {path}: expected one YAML mapping of values")
    return documents[0]


def _typed(text: str, strings: bool = False) -> Any:
    """helm's strvals ``typedVal`` (``strings``: ``--set-string``, everything a string)."""
    if strings:
        return text
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    if text == "0":
        return 0
    # strconv.ParseInt(text, 10, 64), tried only when the text does not start with 0.
    if (
        text
        and text[0] != "0"
        and len(text) <= 20  # a sign and 19 digits at most fit 64 bits
        and _INT.match(text)
        and -_INT64 <= int(text) < _INT64
    ):
        return int(text)
    return text


def _split_value(text: str, start: int, strings: bool = False) -> tuple[Any, int]:
    """The value starting at ``start`` and the index after it (at a ',' or the end)."""
    if text.startswith("{", start):
        items: list[Any] = []
        i = start + 1
        while True:
            item, i = _runes_until(text, i, ",}")
            if i >= len(text):
                raise ValuesError(f"--set {text!r}: '{{' without '}}'")
            items.append(_typed(item, strings))
            if text[i] == "}":
                return items, i + 1
            i += 1
    value, i = _runes_until(text, start, ",")
    return _typed(value, strings), i


def _runes_until(text: str, start: int, stops: str) -> tuple[str, int]:
    """helm's ``runesUntil``: the text up to one of ``stops`` (``\\`` escapes the next
    character) and the index of that stop (or the end)."""
    out: list[str] = []
    i = start
    while i < len(text) and text[i] not in stops:
        if text[i] == "\\" and i + 1 < len(text):
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out), i


def _split_key(text: str, start: int) -> tuple[list[str | int], int]:
    """The key path starting at ``start`` (names and list indexes) and the index of '='."""
    path: list[str | int] = []
    name: list[str] = []
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            name.append(text[i + 1])
            i += 2
            continue
        if char in ".=[":
            if name:
                path.append("".join(name))
                name = []
            elif not (char in "=[" and path and isinstance(path[-1], int)):
                # Only an index may directly follow an index, or end the key.
                raise ValuesError(f"--set {text!r}: empty key at offset {i}")
            if char == "=":
                return path, i
            if char == "[":
                end = text.find("]", i)
                index = text[i + 1 : end] if end > 0 else ""
                if not index.isdigit() or int(index) > _MAX_INDEX:
                    raise ValuesError(f"--set {text!r}: bad list index [{index}]")
                path.append(int(index))
                i = end + 1
                if i < len(text) and text[i] == ".":
                    i += 1
                continue
            i += 1
            continue
        if char == ",":
            raise ValuesError(f"--set {text!r}: expected key=value")
        name.append(char)
        i += 1
    raise ValuesError(f"--set {text!r}: expected key=value")


def _assign(root: dict[str, Any], path: list[str | int], value: Any) -> None:
    node: Any = root
    for here, after in itertools.pairwise(path):
        empty: Any = [] if isinstance(after, int) else {}
        node = _child(node, here, empty)
    _put(node, path[-1], value)


def _child(node: Any, key: str | int, empty: Any) -> Any:
    if isinstance(key, int):
        while len(node) <= key:
            node.append(None)
        if not isinstance(node[key], type(empty)):
            node[key] = empty
        return node[key]
    if not isinstance(node.get(key), type(empty)):
        node[key] = empty
    return node[key]


def _put(node: Any, key: str | int, value: Any) -> None:
    if isinstance(key, int):
        while len(node) <= key:
            node.append(None)
    node[key] = value


def parse_set(assignments: Iterable[str], *, strings: bool = False) -> dict[str, Any]:
    """The values of ``--set`` assignments (``strings``: ``--set-string``), in order (later
    ones win).

    Raises ValuesError naming the assignment.
    """
    values: dict[str, Any] = {}
    for text in assignments:
        i = 0
        while i < len(text):
            path, equals = _split_key(text, i)
            if isinstance(path[0], int):
                raise ValuesError(f"--set {text!r}: a key starts with a name")
            value, i = _split_value(text, equals + 1, strings)
            _assign(values, path, value)
            i += 1  # the ',' between assignments
    return values


def _one_assignment(text: str, flag: str) -> tuple[list[str | int], str]:
    """The key path and the raw rest of ``key=rest`` (one assignment: the rest is not split)."""
    path, equals = _split_key(text, 0)
    if isinstance(path[0], int):
        raise ValuesError(f"{flag} {text!r}: a key starts with a name")
    return path, text[equals + 1 :]


def parse_set_json(assignments: Iterable[str]) -> dict[str, Any]:
    """The values of ``--set-json`` assignments, in order: ``key=<JSON>``, several separated
    by commas as helm reads them (``a=1,b={"c":[2]}``: each JSON value read whole, then a
    comma); ``key=`` alone is null.

    Raises ValuesError naming the assignment.
    """
    values: dict[str, Any] = {}
    decoder = json.JSONDecoder()
    for text in assignments:
        i = 0
        while i < len(text):
            path, equals = _split_key(text, i)
            if isinstance(path[0], int):
                raise ValuesError(f"--set-json {text!r}: a key starts with a name")
            start = _skip_blanks(text, equals + 1)
            if start >= len(text) or text[start] == ",":
                value, end = None, start
            else:
                try:
                    value, end = decoder.raw_decode(text, start)
                except ValueError as exc:
                    raise ValuesError(f"--set-json {text!r}: not JSON: {exc}") from None
            _assign(values, path, value)
            i = _skip_blanks(text, end)
            if i < len(text) and text[i] == ",":
                i += 1
    return values


def _skip_blanks(text: str, start: int) -> int:
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    return start


def file_assignments(assignments: Iterable[str]) -> list[tuple[str, str]]:
    """``--set-file`` assignments (``key=FILE``) as (the key as written, the file's text).

    Raises ValuesError (a bad key, an unreadable file, not UTF-8).
    """
    out: list[tuple[str, str]] = []
    for text in assignments:
        _path, equals = _split_key(text, 0)
        name = text[equals + 1 :]
        try:
            out.append((text[:equals], Path(name).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise ValuesError(f"--set-file {text!r}: cannot read {name}: {exc}") from None
    return out


def parse_set_file(assignments: Iterable[str]) -> dict[str, Any]:
    """The values of ``--set-file`` assignments: each file's text, a string.

    Raises ValuesError.
    """
    values: dict[str, Any] = {}
    for key, content in file_assignments(assignments):
        path, _ = _one_assignment(f"{key}=", "--set-file")
        _assign(values, path, content)
    return values
