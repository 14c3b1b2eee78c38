"""YAML as fleetlet reads and writes it: one module, two readers.

- :data:`KUBE_LOADER` reads content the way Kubernetes, kubectl and helm read it
  (``sigs.k8s.io/yaml``: go-yaml v2's scalar rules, then JSON): manifests, helm values files,
  kustomizations, bundle metadata, kubeconfigs, fleet repo files. A plain scalar is resolved as
  go-yaml v2 resolves it, not as YAML 1.1 or PyYAML do:

  - ``y``/``n``/``yes``/``no``/``on``/``off`` (three casings) and ``true``/``false`` are
    booleans; ``~``, ``null``, ``Null``, ``NULL`` and nothing are null;
  - integers as Go's ``strconv.ParseInt(s, 0, 64)`` reads them once every ``_`` is dropped
    (``0x1F``, ``0o17``, ``017`` octal, ``0b101``, ``+5``), then unsigned 64-bit ones;
  - floats written ``[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?`` (so ``1e3`` is a
    number, ``08`` is 8.0), ``.inf``, ``-.inf``, ``.nan`` (which JSON then refuses);
  - everything else is a string: timestamps stay as written (no ``+00:00`` rewrite), ``=`` is
    a string (YAML 1.1's ``!!value`` does not exist there), ``1:30`` is a string (no base 60).

  Values then take the form JSON gives them on their way to the API server: an integral float
  below 1e21 is the integer Go's JSON writes (``1e3`` is ``1000``), an integer outside int64 is
  the float Kubernetes decodes it to. Map keys become strings as ``sigs.k8s.io/yaml`` makes
  them (``y:`` is ``"true"``, ``1.5:`` is ``"1.5"``); a null key is refused. Explicit tags:
  ``!!str``/``!!int``/``!!float``/``!!bool``/``!!null`` convert as go-yaml does, ``!!binary``
  decodes, ``!!timestamp`` stays text, and an application tag (``!Ref x``) is dropped, as
  go-yaml drops it (``!!python/...`` and other unknown ``!!`` tags are refused). A key written
  twice in one mapping is refused
  (:class:`DuplicateKeyError`); keys a merge (``<<``) brings in may be overridden.

  The C parser (libyaml, which go-yaml is a port of) is used when PyYAML has it. Bounds on
  what is read (sizes, aliases, depth) belong to the callers: see
  :mod:`agent.render.manifests`.
- :data:`KUBE_DUMPER` writes YAML that reads back the same that way: a string go-yaml would
  read as something else (``y``, ``1e3``, ``0o17``) is quoted.
- :data:`SAFE_LOADER` / :data:`SAFE_DUMPER`: PyYAML's safe loader and dumper (in C when libyaml
  is there), for fleetlet's own files whose format fleetlet defines (``set.yaml``: see
  :mod:`agent.api.canonical`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SAFE_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"
_BINARY = "tag:yaml.org,2002:binary"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"

# go-yaml v2's resolve table: the words it looks up before anything else.
_WORDS: dict[str, tuple[str, Any]] = {}
for _words, _tag, _value in (
    ("y Y yes Yes YES true True TRUE on On ON", _BOOL, True),
    ("n N no No NO false False FALSE off Off OFF", _BOOL, False),
    ("~ null Null NULL", _NULL, None),
    (".nan .NaN .NAN", _FLOAT, math.nan),
    (".inf .Inf .INF +.inf +.Inf +.INF", _FLOAT, math.inf),
    ("-.inf -.Inf -.INF", _FLOAT, -math.inf),
    ("<<", _MERGE, "<<"),
):
    for _word in _words.split():
        _WORDS[_word] = (_tag, _value)
_WORDS[""] = (_NULL, None)

# YAML tags go-yaml reads as the plain collection they are written as.
_DROPPED = {f"tag:yaml.org,2002:{name}" for name in ("omap", "pairs", "set", "value", "yaml")}

_INT64 = 1 << 63
_UINT64 = 1 << 64
# strconv.ParseInt(s, 0, 64): a sign, then 0x/0o/0b, a leading 0 (octal) or decimal digits.
_GO_INT = re.compile(
    r"([-+]?)(?:0[xX]([0-9a-fA-F]+)|0[oO]([0-7]+)|0[bB]([01]+)|(0[0-7]*)|([1-9][0-9]*))\Z",
    re.ASCII,
)
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?\Z", re.ASCII)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names one key twice (as JSON sees keys: ``1`` and ``"1"`` are one key)."""


def _go_int(text: str) -> int | None:
    """``strconv.ParseInt(text, 0, 64)``, else ``ParseUint``; None when neither reads it."""
    match = _GO_INT.match(text)
    if match is None:
        return None
    sign, hexa, octal, binary, zero, decimal = match.groups()
    if len(text) > 70:  # longer than any 64-bit integer, however written
        return None
    if hexa is not None:
        value = int(hexa, 16)
    elif octal is not None:
        value = int(octal, 8)
    elif binary is not None:
        value = int(binary, 2)
    elif zero is not None:
        value = int(zero, 8)
    else:
        value = int(decimal)
    if sign == "-":
        value = -value
        return value if value >= -_INT64 else None
    if value < _INT64 or (not sign and value < _UINT64):
        return value
    return None


def _go_float(text: str) -> float | None:
    if not _GO_FLOAT.match(text):
        return None
    value = float(text)
    return None if math.isinf(value) else value  # ParseFloat fails on overflow


def _number(text: str) -> tuple[str, Any]:
    """go-yaml v2's resolve() of a plain scalar starting with a digit, sign or '.'."""
    if text[0] == ".":
        number = _go_float(text)
        return (_FLOAT, number) if number is not None else (_STR, text)
    # go-yaml tries a timestamp first, but gives it back as text: nothing to do here.
    plain = text.replace("_", "")
    whole = _go_int(plain)
    if whole is not None:
        return _INT, whole
    number = _go_float(plain)
    if number is not None:
        return _FLOAT, number
    return _STR, text


def plain_scalar(text: str) -> tuple[str, Any]:
    """The tag and raw value go-yaml v2 gives the plain (unquoted, untagged) scalar ``text``."""
    found = _WORDS.get(text)
    if found is not None:
        return found
    if text[0] in "+-.0123456789":
        return _number(text)
    return _STR, text


def json_number(value: int | float) -> int | float:
    """The number as it reaches the API server through JSON: Go writes an integral float below
    1e21 as an integer and Kubernetes decodes an integer outside int64 as a float."""
    if isinstance(value, int):
        if -_INT64 <= value < _INT64:
            return value
        value = float(value)
    if value.is_integer() and abs(value) < 1e21:
        from decimal import Decimal  # here: few documents have such a float (2 ms to import)

        return int(Decimal(repr(value)))
    return value


def go_text(value: object) -> str:
    """The text sigs.k8s.io/yaml gives a scalar read into a Go ``string`` field (a label, a
    Fleet ``fleet.yaml`` field): ``version: 1.28`` is ``"1.28"``, ``on`` is ``"true"``."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float32_text(value)
    return str(value)


def _float32_text(value: float) -> str:
    """``strconv.FormatFloat(value, 'g', -1, 32)``: how sigs.k8s.io/yaml writes a float key."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    single = struct.unpack("f", struct.pack("f", value))[0]
    for digits in range(1, 10):
        text = f"{single:.{digits - 1}e}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == single:
            break
    mantissa, exponent_text = text.split("e")
    exponent = int(exponent_text)
    negative = mantissa.startswith("-")
    figures = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    sign = "-" if negative else ""
    if exponent < -4 or exponent >= 6:
        head = figures[0] + ("." + figures[1:] if len(figures) > 1 else "")
        return f"{sign}{head}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if exponent >= 0:
        whole = figures[: exponent + 1].ljust(exponent + 1, "0")
        rest = figures[exponent + 1 :]
        return sign + whole + ("." + rest if rest else "")
    return sign + "0." + "0" * (-exponent - 1) + figures


class _KubeConstructor:
    """Mixed into the C or pure-Python safe loader: go-yaml v2 resolution, JSON values."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 (resolve() below does it)

    def resolve(self, kind: type, value: str, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode:
            return plain_scalar(value)[0] if implicit[0] else _STR
        return _SEQ if kind is SequenceNode else _MAP

    def construct_go_scalar(self, node: ScalarNode) -> Any:
        wanted = node.tag
        if wanted in (_STR, _TIMESTAMP):
            return node.value
        tag, value = plain_scalar(node.value)
        if wanted == _BINARY:
            try:
                data = base64.b64decode(node.value.encode("ascii"), validate=False)
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise ConstructorError(
                    None, None, f"!!binary value is not base64: {exc}", node.start_mark
                ) from None
            return data.decode("utf-8", "replace")
        if wanted == _FLOAT and tag == _INT:
            tag, value = _FLOAT, float(value)
        if tag != wanted:
            raise ConstructorError(
                None,
                None,
                f"cannot decode {node.value!r} as a {wanted.rsplit(':', 1)[-1]}",
                node.start_mark,
            )
        if tag in (_INT, _FLOAT):
            return json_number(value)
        return value

    def construct_untagged(self, node: yaml.Node) -> Any:
        """An application tag (``!Ref``): dropped, as go-yaml drops it. A tag of YAML's own
        namespace that JSON has no use for (``!!python/object``) is refused."""
        if node.tag.startswith("tag:yaml.org,2002:") and node.tag not in _DROPPED:
            raise ConstructorError(None, None, f"unsupported tag {node.tag!r}", node.start_mark)
        if isinstance(node, ScalarNode):
            return node.value
        if isinstance(node, SequenceNode):
            return self.construct_sequence(node, deep=True)  # type: ignore[attr-defined]
        return self.construct_mapping(node, deep=True)

    def go_key(self, node: yaml.Node) -> str:
        """The key as sigs.k8s.io/yaml turns it into a JSON object's key."""
        if not isinstance(node, ScalarNode):
            raise ConstructorError(
                "while constructing a mapping",
                None,
                "a key that is a list or a mapping is not supported",
                node.start_mark,
            )
        if node.tag == _NULL or (node.tag == _INT and not (-_INT64 <= self._raw(node) < _INT64)):
            raise ConstructorError(
                "while constructing a mapping",
                None,
                f"unsupported map key {node.value!r}",
                node.start_mark,
            )
        if node.tag == _BOOL:
            return "true" if self._raw(node) else "false"
        if node.tag == _INT:
            return str(self._raw(node))
        if node.tag == _FLOAT:
            return _float32_text(float(self._raw(node)))
        return str(self.construct_object(node))  # type: ignore[attr-defined]

    def _raw(self, node: ScalarNode) -> Any:
        tag, value = plain_scalar(node.value)
        if node.tag == _FLOAT and tag == _INT:
            return float(value)
        if tag != node.tag:
            return self.construct_object(node)  # type: ignore[attr-defined]
        return value

    def flatten_mapping(self, node: MappingNode) -> None:
        # Remember how many pairs the mapping wrote itself: merged pairs go before them.
        own: dict[int, int] = self.__dict__.setdefault("_own", {})
        if id(node) not in own:
            own[id(node)] = sum(1 for key, _ in node.value if key.tag != _MERGE)
        super().flatten_mapping(node)  # type: ignore[misc]

    def construct_document(self, node: yaml.Node) -> Any:
        self.__dict__["_own"] = {}  # node ids are per document
        return super().construct_document(node)  # type: ignore[misc]

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[str, Any]:
        if not isinstance(node, MappingNode):
            raise ConstructorError(
                None,
                None,
                f"expected a mapping node, but found {type(node).__name__}",
                node.start_mark,
            )
        construct = self.construct_object  # type: ignore[attr-defined]
        pairs = node.value
        if id(node) not in self.__dict__["_own"]:
            # The common case, in one pass: string keys, no merge, each key once.
            mapping: dict[str, Any] = {}
            for key_node, value_node in pairs:
                tag = key_node.tag
                if tag == _MERGE:
                    break
                key = key_node.value if tag == _STR else self.go_key(key_node)
                mapping[key] = construct(value_node, deep=deep)
            else:
                if len(mapping) != len(pairs):
                    self._refuse_duplicate(pairs)
                return mapping
        self.flatten_mapping(node)
        pairs = node.value
        merged = len(pairs) - self.__dict__["_own"][id(node)]
        mapping = {}
        for key_node, value_node in pairs[:merged]:
            key = key_node.value if key_node.tag == _STR else self.go_key(key_node)
            mapping[key] = construct(value_node, deep=deep)
        self._refuse_duplicate(pairs[merged:])
        for key_node, value_node in pairs[merged:]:
            key = key_node.value if key_node.tag == _STR else self.go_key(key_node)
            mapping[key] = construct(value_node, deep=deep)
        return mapping

    def _refuse_duplicate(self, pairs: list[tuple[yaml.Node, yaml.Node]]) -> None:
        seen: dict[str, yaml.Node] = {}
        for key_node, _value in pairs:
            key = key_node.value if key_node.tag == _STR else self.go_key(key_node)
            if key in seen:
                raise DuplicateKeyError(
                    f"key {json.dumps(key)} appears twice in one mapping (lines "
                    f"{seen[key].start_mark.line + 1} and {key_node.start_mark.line + 1})"
                )
            seen[key] = key_node


def _kube_loader(base: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    loader: Any = type("KubeLoader", (_KubeConstructor, base), {})
    loader.yaml_constructors = {
        tag: ctor for tag, ctor in base.yaml_constructors.items() if tag in (_SEQ, _MAP)
    }
    for tag in (_STR, _INT, _FLOAT, _BOOL, _NULL, _BINARY, _TIMESTAMP, _MERGE):
        loader.add_constructor(tag, _KubeConstructor.construct_go_scalar)
    loader.add_constructor("tag:yaml.org,2002:omap", _KubeConstructor.construct_untagged)
    loader.add_constructor("tag:yaml.org,2002:pairs", _KubeConstructor.construct_untagged)
    loader.add_constructor("tag:yaml.org,2002:set", _KubeConstructor.construct_untagged)
    loader.add_constructor(None, _KubeConstructor.construct_untagged)
    loader.yaml_path_resolvers = {}
    return loader  # type: ignore[no-any-return]


class _KubeResolver:
    """The dumper's side: a string go-yaml would read as something else (``y``, ``1e3``,
    ``0o17``) is quoted, so what fleetlet writes Kubernetes reads back the same."""

    def resolve(self, kind: type, value: str, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode:
            return plain_scalar(value)[0] if implicit[0] else _STR
        return _SEQ if kind is SequenceNode else _MAP


KUBE_DUMPER: type[yaml.SafeDumper] = type("KubeDumper", (_KubeResolver, SAFE_DUMPER), {})
"""PyYAML's safe dumper (C when libyaml is there), quoting what Kubernetes would misread."""

KUBE_LOADER: type[yaml.SafeLoader] = _kube_loader(SAFE_LOADER)
"""Reads YAML as Kubernetes does (see the module's docstring); C when libyaml is there."""
PURE_KUBE_LOADER: type[yaml.SafeLoader] = _kube_loader(yaml.SafeLoader)
"""The same rules on PyYAML's pure-Python parser (a test checks the two agree)."""


def load_kube(text: str | bytes) -> Any:
    """One YAML document read as Kubernetes reads it (no bounds: for small local files such as
    a kubeconfig; content goes through :func:`agent.render.manifests.load_documents`)."""
    return yaml.load(text, Loader=KUBE_LOADER)


def load_kube_all(text: str | bytes) -> list[Any]:
    """Every document of a YAML stream, read as Kubernetes reads it (no bounds)."""
    return list(yaml.load_all(text, Loader=KUBE_LOADER))


__all__ = [
    "KUBE_DUMPER",
    "KUBE_LOADER",
    "PURE_KUBE_LOADER",
    "SAFE_DUMPER",
    "SAFE_LOADER",
    "DuplicateKeyError",
    "go_text",
    "json_number",
    "load_kube",
    "load_kube_all",
    "plain_scalar",
]
