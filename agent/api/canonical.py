"""Canonical bytes and digests of API documents, and the ``set.yaml`` file format.

Two forms, each fully specified by fleetlet (not by a library version):

- **Canonical bytes** (what is hashed and signed): RFC 8785 JSON (JCS) of the document's JSON
  data (``to_dict``: camelCase keys, fields at their default left out, times as
  ``2026-11-22T22:00:00Z``). The same set always has the same bytes, whatever produced it:
  dicts in any key order, any YAML style, explicit defaults or not. When the data has no
  floating-point number and no key outside the Basic Multilingual Plane, ``json.dumps`` with
  sorted keys produces exactly the JCS bytes, about 7x faster than the general encoder (a test
  checks the two agree).
- **set.yaml** (what is written on the cluster's branch): canonical YAML from a small emitter of
  our own: block style, keys sorted, two-space indentation, lists not indented under their key,
  strings plain when unambiguous and double-quoted (JSON escapes) otherwise. It is readable in
  diffs and stable byte for byte; the agent does not hash these bytes but the set parsed from
  them, so formatting never matters to verification. What the agent then acts on is the set
  read back from the canonical bytes it hashed (:func:`set_from_canonical`): RFC 8785 writes
  ``3.0`` as ``3``, so a ``set.yaml`` that turned an integer into a float would otherwise
  change a value without changing the digest.

Loading is hostile-input safe: bounded size, UTF-8 only, one document, no aliases (no billion
laughs), no duplicate keys, bounded nesting and node count, only JSON types (timestamps stay
strings; ``!!binary``, ``!!set`` and other tags are refused).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import datetime
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, ClassVar

import rfc8785
import yaml

from agent.api.models import BundleDeploymentSet
from agent.api.validation import (
    MAX_SAFE_INTEGER,
    ROOT_PATH,
    ApiObject,
    error_for,
    format_time,
    from_dict,
    json_items,
    memo,
    thaw,
    to_dict,
)
from agent.api.yamlio import SAFE_LOADER
from agent.errors import FieldProblem, ValidationError

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
MAX_YAML_NODES = 2_000_000
MAX_YAML_DEPTH = 128

_BaseLoader = SAFE_LOADER
_REFUSED_TAGS = {
    f"tag:yaml.org,2002:{name}" for name in ("timestamp", "binary", "set", "omap", "pairs")
}


class _Loader(_BaseLoader):  # type: ignore[misc,valid-type]
    """SafeLoader producing JSON types only: timestamps stay strings, other tags are refused."""

    yaml_implicit_resolvers: ClassVar[dict[Any, Any]] = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in _REFUSED_TAGS]
        for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
    }
    yaml_constructors: ClassVar[dict[Any, Any]] = {
        tag: ctor for tag, ctor in _BaseLoader.yaml_constructors.items() if tag not in _REFUSED_TAGS
    }


def _yaml_problem(expected: str, found: str) -> ValidationError:
    return ValidationError([FieldProblem(path=ROOT_PATH, expected=expected, found=found)])


def load_yaml(data: bytes | str, *, origin: str = "", max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """Parse one bounded YAML (or JSON) document into JSON data.

    Raises ``ValidationError`` (with ``origin``) for oversize input, invalid UTF-8, YAML syntax
    errors, several documents, aliases, duplicate keys, excessive nesting and non-JSON tags.
    """
    try:
        if len(data) > max_bytes:
            raise _yaml_problem(f"at most {max_bytes} bytes", f"{len(data)} bytes")
        if isinstance(data, bytes):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _yaml_problem("UTF-8 text", f"invalid byte at offset {exc.start}") from exc
        else:
            text = data
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            problems = _check_nodes(node)
            if problems:
                raise ValidationError(problems)
            return loader.construct_document(node) if node is not None else None
        except yaml.YAMLError as exc:
            raise _yaml_problem("a YAML document", _yaml_error_text(exc)) from exc
        finally:
            loader.dispose()
    except ValidationError as exc:
        raise ValidationError(exc.problems, origin=origin) from None


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _check_nodes(root: yaml.Node | None) -> list[FieldProblem]:
    """Refuse aliases (a node reached twice), duplicate keys, deep nesting and huge documents."""
    problems: list[FieldProblem] = []
    if root is None:
        return problems
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            line = node.start_mark.line + 1
            return [
                FieldProblem(
                    path=ROOT_PATH,
                    expected="no YAML aliases",
                    found=f"an alias of the node at line {line}",
                )
            ]
        seen.add(id(node))
        if len(seen) > MAX_YAML_NODES:
            return [
                FieldProblem(
                    path=ROOT_PATH, expected=f"at most {MAX_YAML_NODES} nodes", found="more"
                )
            ]
        if depth > MAX_YAML_DEPTH:
            return [
                FieldProblem(
                    path=ROOT_PATH,
                    expected=f"at most {MAX_YAML_DEPTH} levels of nesting",
                    found=f"more at line {node.start_mark.line + 1}",
                )
            ]
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in keys:
                        problems.append(
                            FieldProblem(
                                path=ROOT_PATH,
                                expected="each key once per mapping",
                                found=f"{json.dumps(key.value)} again at line "
                                f"{key.start_mark.line + 1}",
                            )
                        )
                    keys.add(key.value)
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, depth + 1) for item in node.value)
    return problems


# --- canonical YAML -------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
_PLAIN_TEXT = re.compile(r"[A-Za-z_][A-Za-z0-9_./@+-]*(:[A-Za-z0-9_./@+-]+)*\Z")
# Words YAML 1.1 reads as booleans or null when plain: they are quoted.
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
# Characters a YAML reader accepts literally inside a double-quoted scalar, minus line breaks
# (NEL, LS, PS) and the BOM, which YAML would fold or drop: everything else is escaped.
_YAML_UNSAFE = re.compile(
    "[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def _quote(text: str) -> str:
    if text.isascii():
        return json.dumps(text)
    body = json.dumps(text, ensure_ascii=False)[1:-1]
    return '"' + _YAML_UNSAFE.sub(_escape_char, body) + '"'


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _key(key: str) -> str:
    if _PLAIN_KEY.match(key) and key.lower() not in _RESERVED:
        return key
    return _quote(key)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = json.dumps(value)  # finite: NaN and infinities are refused by validation
        mantissa, e, exponent = text.partition("e")
        # YAML 1.1 needs a '.' in a float ("1e+16" would read as a string).
        return text if "." in mantissa or not e else f"{mantissa}.0e{exponent}"
    if isinstance(value, str):
        if _PLAIN_TEXT.match(value) and value.lower() not in _RESERVED:
            return value
        return _quote(value)
    raise TypeError(f"not JSON data: {type(value).__name__}")


def _flat(value: Any) -> str:
    if isinstance(value, ApiObject):
        return "{}"  # only reached for an object whose fields are all at their defaults
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    if isinstance(value, datetime):
        return _quote(format_time(value))
    return _scalar(value)


def _object_lines(obj: ApiObject) -> list[str]:
    cache = memo(obj)
    lines: list[str] | None = cache.get("yaml")
    if lines is None:
        lines = []
        for name, value in json_items(obj):
            _entry(name, value, lines)
        cache["yaml"] = lines
    return lines


def _entry(key: str, value: Any, out: list[str]) -> None:
    block = _block(value)
    if block is None:
        out.append(f"{_key(key)}: {_flat(value)}")
        return
    out.append(f"{_key(key)}:")
    if isinstance(value, list | tuple):
        out.extend(block)  # lists sit at their key's indentation (the kubectl style)
    else:
        out.extend(["  " + line for line in block])


def _block(value: Any) -> list[str] | None:
    """The lines (at indentation 0) of a non-empty mapping or list; ``None`` for the rest."""
    if isinstance(value, ApiObject):
        return _object_lines(value) or None
    if isinstance(value, Mapping):
        if not value:
            return None
        lines: list[str] = []
        for key in sorted(value):
            _entry(key, value[key], lines)
        return lines
    if isinstance(value, list | tuple) and value:
        lines = []
        for item in value:
            block = _block(item)
            if block is None:
                lines.append("- " + _flat(item))
            else:
                lines.append("- " + block[0])
                lines.extend(["  " + line for line in block[1:]])
        return lines
    return None


def dump_yaml(data: Any) -> bytes:
    """Canonical YAML (UTF-8) of JSON data or an API object: sorted keys, block style."""
    block = _block(data)
    text = "\n".join(block) if block is not None else _flat(data)
    return (text + "\n").encode("utf-8")


# --- canonical JSON -------------------------------------------------------------------------


def _plain_json(value: Any) -> bool:
    """True when ``json.dumps(sort_keys)`` gives the RFC 8785 bytes for ``value``.

    The two differ only for floats (JCS uses the ECMAScript number form), keys outside the BMP
    (JCS sorts by UTF-16 code units) and integers beyond 2**53 (JCS refuses them).
    """
    if isinstance(value, Mapping):
        return all((k.isascii() or max(k) <= "\uffff") and _plain_json(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_plain_json(v) for v in value)
    if isinstance(value, float):
        return False
    if isinstance(value, int) and not isinstance(value, bool):
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    return True


def _jcs(value: Any) -> str:
    """JCS text of a typed value. JCS is defined recursively (members sorted by key, values
    canonical), so an object's text is composed of its members' texts, memoised per object."""
    if isinstance(value, ApiObject):
        cache = memo(value)
        text: str | None = cache.get("jcs")
        if text is None:
            # Field names are ASCII: code-point order is JCS's UTF-16 order.
            members = ['"' + name + '":' + _jcs(item) for name, item in json_items(value)]
            text = "{" + ",".join(members) + "}"
            cache["jcs"] = text
        return text
    if isinstance(value, str):
        return encode_basestring(value)  # json.dumps's own escaping, which is JCS's
    if isinstance(value, datetime):
        return '"' + format_time(value) + '"'
    if isinstance(value, tuple | list):
        return "[" + ",".join(_jcs(item) for item in value) + "]"
    data = thaw(value)
    if _plain_json(data):
        return json.dumps(
            data, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
        )
    return rfc8785.dumps(data).decode("utf-8")


def canonical_bytes(obj: ApiObject | Mapping[str, Any]) -> bytes:
    """RFC 8785 (JCS) bytes of an API object or of JSON data.

    Raises ``ValidationError`` when the data cannot be canonicalised (integers beyond 2**53,
    non-finite floats, lone surrogates).
    """
    try:
        return _jcs(obj).encode("utf-8")
    except (ValueError, UnicodeEncodeError, rfc8785.CanonicalizationError) as exc:
        raise ValidationError(
            [
                FieldProblem(
                    path=ROOT_PATH, expected="data RFC 8785 can canonicalise", found=str(exc)
                )
            ]
        ) from exc


def digest_of(data: bytes) -> str:
    """``sha256:<hex>`` of bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def set_digest(s: BundleDeploymentSet) -> str:
    """``sha256:<hex>`` of the set's canonical bytes (the Merkle leaf's set digest)."""
    return digest_of(canonical_bytes(s))


# --- sets -----------------------------------------------------------------------------------


def set_to_dict(s: BundleDeploymentSet) -> dict[str, Any]:
    """The set as JSON data, with ``apiVersion`` and ``kind``."""
    return to_dict(s)


def set_from_dict(d: Any, *, origin: str = "") -> BundleDeploymentSet:
    """Validate JSON data as a set.

    Raises ``ValidationError`` listing every problem, or ``FloatingReferenceError`` when the
    only problems are unpinned sources.
    """
    return from_dict(BundleDeploymentSet, d, origin=origin)


def _signed_int(text: str) -> int | float:
    # RFC 8785 refuses integers beyond 2**53, and writes an integral float below 1e21 with
    # digits only: such a literal can only be a float.
    value = int(text)
    return value if abs(value) <= MAX_SAFE_INTEGER else float(text)


def set_from_canonical(data: bytes, *, origin: str = "") -> BundleDeploymentSet:
    """The set its canonical bytes (:func:`canonical_bytes`, what the digest covers) say, read
    from exactly those bytes. Numbers are typed as RFC 8785 wrote them: ``3.0`` and ``-0.0``
    come back as the integers ``3`` and ``0`` that were hashed, so nothing the set carries
    (helm values...) can differ from what was signed by a type the digest does not see.

    Raises ``ValidationError``.
    """
    try:
        raw = json.loads(data, parse_int=_signed_int)
    except (ValueError, RecursionError) as exc:
        raise ValidationError(
            [FieldProblem(path=ROOT_PATH, expected="canonical JSON", found=str(exc))],
            origin=origin,
        ) from exc
    return set_from_dict(raw, origin=origin)


def dump_set(s: BundleDeploymentSet) -> bytes:
    """The ``set.yaml`` bytes of a set (canonical YAML)."""
    return dump_yaml(s)


def load_set(data: bytes, *, origin: str) -> BundleDeploymentSet:
    """Parse ``set.yaml`` bytes safely and validate everything.

    Raises ``ValidationError`` (every problem, with paths), or ``FloatingReferenceError`` when
    the only problems are unpinned references. Duplicate keys are reported together with the
    schema's problems.
    """
    try:
        raw = load_yaml(data, origin=origin)
    except ValidationError as exc:
        duplicates = [p for p in exc.problems if p.expected == "each key once per mapping"]
        if not duplicates or len(duplicates) != len(exc.problems):
            raise
        # Duplicate keys do not stop parsing: report them along with everything else.
        loader = _Loader(data.decode("utf-8"))
        try:
            raw = loader.get_single_data()
        finally:
            loader.dispose()
        try:
            set_from_dict(raw, origin=origin)
        except ValidationError as inner:
            raise error_for(duplicates + inner.problems, origin=origin) from None
        raise
    return set_from_dict(raw, origin=origin)
