"""JSON Schema (2020-12, as OpenAPI 3.1 uses it) from Python type hints.

Called by :mod:`hub.api.openapi` on the resources of :mod:`hub.api.resources` and the
parameters of :mod:`hub.api.endpoints`, so the document says what the types say. Understood:
``str``, ``int``, ``float``, ``bool``, ``Any``, ``X | None``, ``list[X]``, ``dict[str, X]``,
``Literal[...]``, TypedDicts (each a component, by its class name; required keys from
``Required``/``NotRequired`` and ``total``) and ``Annotated[X, Doc("...")]`` for a field's
description. Anything else is a programming error (TypeError) found by the document's test.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict


@dataclass(frozen=True, slots=True)
class Doc:
    """A field's description in the document: ``Annotated[str, Doc("one line")]``."""

    text: str


@dataclass(frozen=True, slots=True)
class Extra:
    """More JSON Schema keywords for a field: ``Annotated[int, Extra(minimum=0)]``."""

    keywords: dict[str, Any]

    def __init__(self, **keywords: Any) -> None:
        object.__setattr__(self, "keywords", keywords)


_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def ref(name: str) -> dict[str, str]:
    """A reference to the component ``name``."""
    return {"$ref": f"#/components/schemas/{name}"}


def schema_of(hint: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The schema of ``hint``; TypedDicts met on the way are added to ``components``.

    Raises TypeError for a hint this module does not understand.
    """
    origin = get_origin(hint)
    if origin is typing.Annotated:
        inner, *marks = get_args(hint)
        schema = dict(schema_of(inner, components))
        for mark in marks:
            if isinstance(mark, Doc):
                schema["description"] = mark.text
            elif isinstance(mark, Extra):
                schema.update(mark.keywords)
        return schema
    if hint is Any or hint is object:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is type(None):
        return {"type": "null"}
    if origin is Literal:
        values = list(get_args(hint))
        kinds = {_SCALARS[type(v)] for v in values}
        return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}
    if origin in (Union, types.UnionType):
        return _union([schema_of(arm, components) for arm in get_args(hint)])
    if origin is list:
        (item,) = get_args(hint) or (Any,)
        return {"type": "array", "items": schema_of(item, components)}
    if origin is dict:
        key, value_hint = get_args(hint) or (str, Any)
        if key is not str:
            raise TypeError(f"JSON object keys are strings, not {key!r}")
        inner = schema_of(value_hint, components)
        return {"type": "object", "additionalProperties": inner} if inner else {"type": "object"}
    if hint is dict:
        return {"type": "object"}
    if is_typeddict(hint):
        name = hint.__name__
        if name not in components:
            components[name] = {}  # placeholder first: a resource may refer to itself
            components[name] = _object(hint, components)
        return ref(name)
    raise TypeError(f"no JSON Schema for {hint!r}")


def _union(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """``X | None`` as ``{"type": [x, "null"]}`` where it can be; ``oneOf`` otherwise."""
    if all(set(arm) <= {"type"} and isinstance(arm.get("type"), str) for arm in arms):
        return {"type": [arm["type"] for arm in arms]}
    return {"oneOf": arms}


def _object(cls: Any, components: dict[str, Any]) -> dict[str, Any]:
    hints = get_type_hints(cls, include_extras=True)
    schema: dict[str, Any] = {"type": "object"}
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    required = [key for key in hints if key in cls.__required_keys__]
    if required:
        schema["required"] = required
    schema["properties"] = {key: schema_of(_strip(hint), components) for key, hint in hints.items()}
    return schema


def _strip(hint: Any) -> Any:
    """``Required[X]``/``NotRequired[X]`` (kept by include_extras) as ``X``."""
    while get_origin(hint) in (typing.Required, typing.NotRequired):
        (hint,) = get_args(hint)
    return hint


__all__ = ["Doc", "Extra", "ref", "schema_of"]
