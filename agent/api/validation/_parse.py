""":func:`from_dict`: a JSON document checked as a whole and built without checking twice.

Every problem is reported with its path; the objects are built only when there is none. Part
of :mod:`agent.api.validation`; used by :mod:`agent.api` (``load_set``, ``set_from_dict``), the
hub's fleet loader and the agent's readers of published documents.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from agent.api.validation._declare import ROOT_PATH, error_for, join, parse_time
from agent.api.validation._object import (
    _ABSENT,
    _BAD,
    ApiObject,
    FieldSpec,
    TypeInfo,
    _by_name,
    _check_field_rules,
    _check_list,
    _check_rules,
    _check_scalar,
    _json_problems,
    _problem,
    describe,
    fields_of,
    freeze,
    show,
)
from agent.errors import FieldProblem

T = TypeVar("T", bound="ApiObject")

# --- parsing --------------------------------------------------------------------------------


def from_dict(cls: type[T], data: Any, *, origin: str = "", path: str = "") -> T:
    """Parse and validate JSON data (as loaded from YAML or JSON) into ``cls``.

    Raises ``ValidationError`` listing every problem (``FloatingReferenceError`` when every
    problem is an unpinned reference); ``origin`` names the document in the message.
    """
    problems: list[FieldProblem] = []
    result = _parse_object(cls, data, path, problems)
    if problems or result is _BAD:
        raise error_for(problems, origin=origin)
    return typing.cast(T, result)


def _parse_object(cls: type[ApiObject], data: Any, path: str, out: list[FieldProblem]) -> Any:
    if not isinstance(data, dict) and not isinstance(data, Mapping):
        out.append(
            FieldProblem(
                path=path or ROOT_PATH, expected=f"an object ({cls.__name__})", found=show(data)
            )
        )
        return _BAD
    known = _by_name(cls)
    before = len(out)
    header = cls.API_KIND
    extra = set() if header is None and known.keys() >= data.keys() else set(data) - set(known)
    if header is not None:
        for key, want in zip(("apiVersion", "kind"), header, strict=True):
            extra.discard(key)
            if data.get(key, _ABSENT) != want:
                out.append(
                    FieldProblem(
                        path=join(path, key),
                        expected=show(want),
                        found=show(data.get(key, _ABSENT)),
                    )
                )
    for key in sorted(extra, key=str):
        out.append(
            FieldProblem(
                path=join(path, str(key)),
                expected="one of the known fields (" + ", ".join(known) + ")",
                found="an unknown field",
            )
        )
    values: dict[str, Any] = {}
    for spec in fields_of(cls):
        raw = data.get(spec.name, _ABSENT)
        field_path = f"{path}.{spec.name}" if path else spec.name
        if raw is _ABSENT or (raw is None and spec.type.optional):
            # A YAML/JSON null on an optional field means the same as leaving it out.
            if spec.required:
                out.append(_problem(spec.meta, field_path, describe(spec), show(raw)))
                continue
            values[spec.attr] = spec.default
            continue
        values[spec.attr] = _parse_field(spec, raw, field_path, out)
    if len(out) > before:
        return _BAD
    obj = object.__new__(cls)
    object.__setattr__(obj, "_memo", None)
    for attr, value in values.items():
        object.__setattr__(obj, attr, value)
    _check_rules(obj, path, out)
    return obj if len(out) == before else _BAD


def _parse_field(spec: FieldSpec, raw: Any, path: str, out: list[FieldProblem]) -> Any:
    t = spec.type
    if t.kind == "array":
        if not isinstance(raw, list | tuple):
            out.append(_problem(None, path, "a list", show(raw)))
            return _BAD
        item_t = t.item
        assert item_t is not None
        before = len(out)
        items = []
        for index, item in enumerate(raw):
            items.append(_parse_one(spec, item_t, item, f"{path}[{index}]", out))
        if len(out) > before:
            return _BAD
        result = tuple(items)
        _check_list(spec, result, path, out)
        return result
    return _parse_one(spec, t, raw, path, out)


def _parse_one(spec: FieldSpec, t: TypeInfo, raw: Any, path: str, out: list[FieldProblem]) -> Any:
    if t.kind == "object":
        assert t.cls is not None
        return _parse_object(t.cls, raw, path, out)
    if t.kind == "free":
        if not isinstance(raw, Mapping):
            out.append(_problem(None, path, describe(spec, t), show(raw)))
            return _BAD
        before = len(out)
        _json_problems(raw, path, out)
        return freeze(raw) if len(out) == before else _BAD
    if t.kind == "datetime":
        value = parse_time(raw) if isinstance(raw, str) else None
        if value is None:
            out.append(_problem(spec.meta, path, describe(spec, t), show(raw)))
            return _BAD
        return value
    if not _check_scalar(spec, t, raw, path, out):
        return _BAD
    before = len(out)
    _check_field_rules(spec, raw, path, out)
    return raw if len(out) == before else _BAD
