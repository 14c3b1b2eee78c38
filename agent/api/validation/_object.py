""":class:`ApiObject`, the base of every API type, and what its constructor checks.

The resolved fields of a type (:func:`fields_of`), the checks shared by parsing and
construction, free-form JSON (:func:`freeze`, :func:`thaw`) and serialising (:func:`to_dict`,
:func:`json_items`). Part of :mod:`agent.api.validation`; parsing (``_parse``) builds on it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

from agent.api.validation._declare import (
    MAX_JSON_DEPTH,
    MAX_SAFE_INTEGER,
    ROOT_PATH,
    TIME_EXAMPLE,
    Meta,
    PinProblem,
    Rule,
    error_for,
    format_time,
    join,
    rebase,
)
from agent.errors import FieldProblem

_SURROGATE_RE = re.compile("[\ud800-\udfff]")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ApiObject:
    """Base of every API type: the constructor validates (raises ``ValidationError``)."""

    # CEL + Python rules over the whole object.
    RULES: ClassVar[tuple[Rule, ...]] = ()
    # For top-level documents: the ``apiVersion`` and ``kind`` they must carry.
    API_KIND: ClassVar[tuple[str, str] | None] = None
    # Serialised forms, computed once: instances are immutable, and the hub shares one spec
    # object among thousands of clusters' sets.
    _memo: dict[str, Any] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        _check_instance(self, problems)
        if problems:
            raise error_for(problems)

    def extra_problems(self) -> list[FieldProblem]:
        """Checks with no CEL equivalent (paths relative to this object); none by default."""
        return []


# --- type descriptions ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TypeInfo:
    """A field's JSON shape: ``string``, ``integer``, ``boolean``, ``datetime``, ``array``,
    ``object`` (an API type, in ``cls``) or ``free`` (a free-form JSON object)."""

    kind: str
    optional: bool = False
    enum: tuple[str, ...] | None = None
    item: TypeInfo | None = None
    cls: type[ApiObject] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of an API type, resolved: attribute and JSON names, type, meta, default."""

    attr: str
    name: str
    type: TypeInfo
    meta: Meta
    default: Any
    required: bool

    @property
    def enum(self) -> tuple[str, ...] | None:
        """Allowed values of the field (or of its items), from ``Literal`` or the meta."""
        inner = self.type.item if self.type.kind == "array" and self.type.item else self.type
        return self.meta.enum or inner.enum


R = TypeVar("R")


def _per_class(fn: Callable[[type[ApiObject]], R]) -> Callable[[type[ApiObject]], R]:
    """Cache ``fn`` per class (what ``functools.cache`` does, typed for classes)."""
    cache: dict[type[ApiObject], R] = {}

    @functools.wraps(fn)
    def cached(cls: type[ApiObject]) -> R:
        try:
            return cache[cls]
        except KeyError:
            result = cache[cls] = fn(cls)
            return result

    return cached


def camel(name: str) -> str:
    """``service_account_name`` -> ``serviceAccountName``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _type_info(hint: Any) -> TypeInfo:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"unsupported union {hint!r}")
        return dataclasses.replace(_type_info(rest[0]), optional=True)
    if origin is typing.Literal:
        return TypeInfo("string", enum=tuple(str(a) for a in args))
    if origin is tuple:
        return TypeInfo("array", item=_type_info(args[0]))
    if origin is Mapping or hint is Mapping:
        return TypeInfo("free")
    if hint is str:
        return TypeInfo("string")
    if hint is bool:
        return TypeInfo("boolean")
    if hint is int:
        return TypeInfo("integer")
    if hint is datetime:
        return TypeInfo("datetime")
    if isinstance(hint, type) and issubclass(hint, ApiObject):
        return TypeInfo("object", cls=hint)
    raise TypeError(f"unsupported field type {hint!r}")


@_per_class
def fields_of(cls: type[ApiObject]) -> tuple[FieldSpec, ...]:
    """The resolved fields of an API type, in declaration order."""
    hints = typing.get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        meta = f.metadata.get("api")
        if not isinstance(meta, Meta):
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with api_field()")
        specs.append(
            FieldSpec(
                attr=f.name,
                name=meta.name or camel(f.name),
                type=_type_info(hints[f.name]),
                meta=meta,
                default=f.default,
                required=f.default is dataclasses.MISSING,
            )
        )
    return tuple(specs)


@_per_class
def _by_name(cls: type[ApiObject]) -> dict[str, FieldSpec]:
    return {spec.name: spec for spec in fields_of(cls)}


@_per_class
def _has_checks(cls: type[ApiObject]) -> bool:
    """Whether the class has object-level checks (rules or ``extra_problems``)."""
    return bool(cls.RULES) or cls.extra_problems is not ApiObject.extra_problems


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    # The patterns are written for the API server (Go RE2, unanchored search). In Python `$` also
    # matches before a final newline, so it becomes `\Z` here to mean the same thing.
    return re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern)


def show(value: Any) -> str:
    """How a found value reads in a message: JSON, cut to 80 characters."""
    if value is _ABSENT:
        return "nothing"
    if isinstance(value, datetime):
        return format_time(value) if value.tzinfo else f"{value.isoformat()} (no time zone)"
    try:
        text = json.dumps(thaw(value), ensure_ascii=False, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


_ABSENT: Any = _Absent()
_BAD: Any = object()


def _problem(meta: Meta | None, path: str, expected: str, found: str) -> FieldProblem:
    cls = PinProblem if meta is not None and meta.pin else FieldProblem
    return cls(path=path, expected=expected, found=found)


# --- free-form JSON -------------------------------------------------------------------------


def freeze(value: Any) -> Any:
    """A deep read-only copy of JSON data: objects become mappingproxies, lists tuples."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain JSON data (dicts and lists) from frozen data or API objects."""
    if isinstance(value, ApiObject):
        return to_dict(value)
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    if isinstance(value, datetime):
        return format_time(value)
    return value


def _json_problems(value: Any, path: str, problems: list[FieldProblem], depth: int = 0) -> None:
    expected = "JSON data (objects with string keys, lists, strings, numbers, booleans, null)"
    if depth > MAX_JSON_DEPTH:
        problems.append(
            FieldProblem(
                path=path,
                expected=f"at most {MAX_JSON_DEPTH} levels of nesting",
                found="deeper nesting",
            )
        )
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(FieldProblem(path=path, expected="string keys", found=show(key)))
                continue
            _json_problems(item, join(path, _key_path(key)), problems, depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _json_problems(item, f"{path}[{index}]", problems, depth + 1)
    elif isinstance(value, str):
        if not value.isascii() and _SURROGATE_RE.search(value):
            problems.append(
                FieldProblem(path=path, expected="valid Unicode text", found="a lone surrogate")
            )
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            problems.append(
                FieldProblem(
                    path=path, expected=f"an integer within ±{MAX_SAFE_INTEGER}", found=str(value)
                )
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            problems.append(FieldProblem(path=path, expected="a finite number", found=repr(value)))
    else:
        problems.append(FieldProblem(path=path, expected=expected, found=show(value)))


def _key_path(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) else f"[{json.dumps(key)}]"


# --- checks shared by parsing and construction ----------------------------------------------


def describe(spec: FieldSpec, t: TypeInfo | None = None) -> str:
    """What a value of this field must be, for "expected ..." messages."""
    t = t or spec.type
    meta = spec.meta
    if t.kind == "string":
        enum = meta.enum or t.enum
        if enum:
            return "one of " + ", ".join(enum)
        return meta.expected or "a string"
    if t.kind == "integer":
        if meta.minimum is not None and meta.maximum is not None:
            return f"an integer from {meta.minimum} to {meta.maximum}"
        if meta.minimum is not None:
            return f"an integer >= {meta.minimum}"
        return "an integer"
    if t.kind == "boolean":
        return "true or false"
    if t.kind == "datetime":
        return f"an RFC 3339 UTC time such as {TIME_EXAMPLE}"
    if t.kind == "array":
        return "a list"
    if t.kind == "object" and t.cls is not None:
        return f"an object ({t.cls.__name__})"
    return "an object"


def _check_scalar(
    spec: FieldSpec, t: TypeInfo, value: Any, path: str, out: list[FieldProblem]
) -> bool:
    """Type and constraints of one scalar (a field, or an item of a list field)."""
    meta = spec.meta
    if t.kind == "string":
        if not isinstance(value, str):
            out.append(_problem(meta, path, describe(spec, t), show(value)))
            return False
        enum = meta.enum or t.enum
        if enum is not None and value not in enum:
            out.append(_problem(meta, path, describe(spec, t), show(value)))
            return False
        if meta.pattern is not None and not _regex(meta.pattern).match(value):
            out.append(
                _problem(meta, path, meta.expected or f"text matching {meta.pattern}", show(value))
            )
            return False
        if meta.max_length is not None and len(value) > meta.max_length:
            out.append(
                _problem(
                    meta, path, f"at most {meta.max_length} characters", f"{len(value)} characters"
                )
            )
            return False
        if meta.min_length is not None and len(value) < meta.min_length:
            out.append(_problem(meta, path, f"at least {meta.min_length} characters", show(value)))
            return False
        if not value.isascii() and _SURROGATE_RE.search(value):
            out.append(_problem(meta, path, "valid Unicode text", "a lone surrogate"))
            return False
    elif t.kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            out.append(_problem(meta, path, describe(spec, t), show(value)))
            return False
        low = meta.minimum if meta.minimum is not None else -MAX_SAFE_INTEGER
        high = meta.maximum if meta.maximum is not None else MAX_SAFE_INTEGER
        if not low <= value <= high:
            out.append(_problem(meta, path, f"an integer from {low} to {high}", str(value)))
            return False
    elif t.kind == "boolean":
        if not isinstance(value, bool):
            out.append(_problem(meta, path, describe(spec, t), show(value)))
            return False
    elif t.kind == "datetime" and (
        not isinstance(value, datetime)
        or value.tzinfo is None
        or value.utcoffset() != UTC.utcoffset(None)
        or value.microsecond
    ):
        out.append(_problem(meta, path, describe(spec, t) + " (whole seconds)", show(value)))
        return False
    return True


def _check_field_rules(spec: FieldSpec, value: Any, path: str, out: list[FieldProblem]) -> None:
    for rule in spec.meta.rules:
        if rule.check is not None and not rule.check(value):
            cls = PinProblem if rule.pin else FieldProblem
            out.append(cls(path=path, expected=rule.expected, found=show(value)))


def _check_list(
    spec: FieldSpec, items: tuple[Any, ...], path: str, out: list[FieldProblem]
) -> None:
    """Size and uniqueness of a list field (items are checked by the caller)."""
    meta = spec.meta
    if meta.max_items is not None and len(items) > meta.max_items:
        out.append(_problem(None, path, f"at most {meta.max_items} items", f"{len(items)} items"))
    if meta.min_items is not None and len(items) < meta.min_items:
        what = "item" if meta.min_items == 1 else "items"
        out.append(_problem(None, path, f"at least {meta.min_items} {what}", f"{len(items)} items"))
    if meta.list_type == "set":
        seen: set[Any] = set()
        for index, item in enumerate(items):
            if item in seen:
                out.append(
                    FieldProblem(
                        path=f"{path}[{index}]", expected="no duplicates", found=show(item)
                    )
                )
            seen.add(item)
    elif meta.list_type == "map" and meta.list_keys:
        key_specs = _by_name(spec.type.item.cls) if spec.type.item and spec.type.item.cls else {}
        keys_seen: set[tuple[Any, ...]] = set()
        for index, item in enumerate(items):
            key = tuple(getattr(item, key_specs[k].attr, None) for k in meta.list_keys)
            if key in keys_seen:
                name = meta.list_keys[0]
                out.append(
                    FieldProblem(
                        path=f"{path}[{index}].{name}",
                        expected=f"a {name} not used by another item",
                        found=show(key[0] if len(key) == 1 else list(key)),
                    )
                )
            keys_seen.add(key)


def _check_rules(obj: ApiObject, path: str, out: list[FieldProblem]) -> None:
    if not _has_checks(type(obj)):
        return
    for rule in type(obj).RULES:
        if rule.check is None or rule.check(obj):
            continue
        if rule.field is not None:
            found, where = show(_get_path(obj, rule.field)), join(path, rule.field)
        else:
            found, where = "a value breaking this rule", path or ROOT_PATH
        cls = PinProblem if rule.pin else FieldProblem
        out.append(cls(path=where, expected=rule.expected, found=found))
    out.extend(rebase(p, path) for p in obj.extra_problems())


def _get_path(obj: Any, dotted: str) -> Any:
    """The value at a dotted JSON path below an API object (``_ABSENT`` when unset)."""
    for part in dotted.split("."):
        if not isinstance(obj, ApiObject):
            return _ABSENT
        spec = _by_name(type(obj)).get(part)
        obj = getattr(obj, spec.attr) if spec else None
        if obj is None:
            return _ABSENT
    return obj


def _check_instance(obj: ApiObject, out: list[FieldProblem]) -> None:
    """Validate a constructed object's own fields and rules (children validated themselves)."""
    for spec in fields_of(type(obj)):
        value = getattr(obj, spec.attr)
        if value is spec.default:
            # Defaults are valid (a test checks every one), and most fields keep theirs.
            continue
        t = spec.type
        path = spec.name
        if value is None:
            if not t.optional:
                out.append(_problem(spec.meta, path, describe(spec), "nothing"))
            continue
        if t.kind == "array":
            if isinstance(value, list):
                # Lists are accepted and stored as tuples so that instances stay immutable.
                value = tuple(value)
                object.__setattr__(obj, spec.attr, value)
            if not isinstance(value, tuple):
                out.append(_problem(None, path, "a list", show(value)))
                continue
            item_t = t.item
            assert item_t is not None
            for index, item in enumerate(value):
                item_path = f"{path}[{index}]"
                if item_t.kind == "object":
                    if not isinstance(item, item_t.cls):  # type: ignore[arg-type]
                        out.append(_problem(None, item_path, describe(spec, item_t), show(item)))
                elif _check_scalar(spec, item_t, item, item_path, out):
                    _check_field_rules(spec, item, item_path, out)
            _check_list(spec, value, path, out)
        elif t.kind == "object":
            if not isinstance(value, t.cls):  # type: ignore[arg-type]
                out.append(_problem(None, path, describe(spec), show(value)))
        elif t.kind == "free":
            if not isinstance(value, Mapping):
                out.append(_problem(None, path, describe(spec), show(value)))
                continue
            before = len(out)
            _json_problems(value, path, out)
            if len(out) == before and not isinstance(value, types.MappingProxyType):
                object.__setattr__(obj, spec.attr, freeze(value))
        elif _check_scalar(spec, t, value, path, out):
            _check_field_rules(spec, value, path, out)
    if not out:
        _check_rules(obj, "", out)


# --- serialising ----------------------------------------------------------------------------


def memo(obj: ApiObject) -> dict[str, Any]:
    """The object's cache of serialised forms (safe: instances are immutable)."""
    cache = obj._memo
    if cache is None:
        cache = {}
        object.__setattr__(obj, "_memo", cache)
    return cache


def json_items(obj: ApiObject) -> list[tuple[str, Any]]:
    """``(JSON name, value)`` of the fields to serialise, sorted by name.

    Includes ``apiVersion``/``kind`` for documents; leaves out ``None`` and fields at their
    default (so an explicit default and an omitted field serialise the same). Values are
    typed (API objects, datetimes, tuples, frozen mappings).
    """
    cache = memo(obj)
    items: list[tuple[str, Any]] | None = cache.get("items")
    if items is None:
        items = []
        for name, attr, default, constant in _item_plan(type(obj)):
            if attr is None:
                items.append((name, constant))
                continue
            value = getattr(obj, attr)
            if value is None or value is default or value == default:
                continue
            items.append((name, value))
        cache["items"] = items
    return items


@_per_class
def _item_plan(cls: type[ApiObject]) -> tuple[tuple[str, str | None, Any, Any], ...]:
    """``(name, attribute, default, constant)`` per serialised key of ``cls``, sorted by name."""
    plan: list[tuple[str, str | None, Any, Any]] = []
    if cls.API_KIND is not None:
        plan += [("apiVersion", None, None, cls.API_KIND[0]), ("kind", None, None, cls.API_KIND[1])]
    for spec in fields_of(cls):
        # A required field has no default: _NEVER equals nothing, so it is always written.
        plan.append((spec.name, spec.attr, _NEVER if spec.required else spec.default, None))
    return tuple(sorted(plan, key=lambda entry: entry[0]))


class _Never:
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


_NEVER: Any = _Never()


def to_dict(obj: ApiObject) -> dict[str, Any]:
    """JSON data (camelCase keys, sorted) for an API object; defaults are left out."""
    return {name: _dump_value(value) for name, value in json_items(obj)}


def _dump_value(value: Any) -> Any:
    if isinstance(value, ApiObject):
        return to_dict(value)
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, tuple | list):
        return [_dump_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    return value


def all_types(root: type[ApiObject]) -> list[type[ApiObject]]:
    """``root`` and every API type reachable from it, depth first, each once."""
    seen: list[type[ApiObject]] = []

    def visit(cls: type[ApiObject]) -> None:
        if cls in seen:
            return
        seen.append(cls)
        for spec in fields_of(cls):
            t = spec.type.item if spec.type.kind == "array" else spec.type
            if t is not None and t.cls is not None:
                visit(t.cls)

    visit(root)
    return seen


def iter_rules(cls: type[ApiObject]) -> Iterable[tuple[str | None, Rule]]:
    """Every rule of a type: ``(None, rule)`` for class rules, ``(field, rule)`` for field ones."""
    for rule in cls.RULES:
        yield None, rule
    for spec in fields_of(cls):
        for rule in spec.meta.rules:
            yield spec.name, rule
