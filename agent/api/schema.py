"""OpenAPI v3 schemas and markdown reference, derived from the API type declarations.

The same :class:`~agent.api.validation.Meta` and :class:`~agent.api.validation.Rule` objects
that drive Python validation become ``properties``, ``pattern``, ``enum``, bounds, list
semantics and ``x-kubernetes-validations`` here, so the CRDs and the docs say what the code
checks. Schemas are structural (every node typed; free-form values marked
``x-kubernetes-preserve-unknown-fields``) and bounded (``maxItems``/``maxLength``) so that the
API server accepts the CEL rules' estimated cost.
"""

from __future__ import annotations

import inspect
from typing import Any

from agent.api.validation import (
    ApiObject,
    FieldSpec,
    Meta,
    Rule,
    TypeInfo,
    all_types,
    fields_of,
    iter_rules,
    thaw,
)

TIME_TEXT = "string (RFC 3339 UTC time, e.g. `2026-11-22T22:00:00Z`)"


def type_doc(cls: type[ApiObject]) -> str:
    """The class docstring, dedented, as one description."""
    text = inspect.cleandoc(cls.__doc__ or "").strip()
    paragraphs = [" ".join(p.split("\n")) for p in text.split("\n\n")]
    return "\n\n".join(paragraphs)


def _rule_schema(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": rule.cel, "message": rule.message}
    if rule.field is not None:
        out["fieldPath"] = "." + rule.field
    if rule.pin:
        out["reason"] = "FieldValueRequired"
    return out


def _scalar_schema(meta: Meta, t: TypeInfo, enum: tuple[str, ...] | None) -> dict[str, Any]:
    if t.kind == "string":
        out: dict[str, Any] = {"type": "string"}
        if enum:
            out["enum"] = list(enum)
        if meta.pattern:
            out["pattern"] = meta.pattern
        if meta.min_length is not None:
            out["minLength"] = meta.min_length
        if meta.max_length is not None:
            out["maxLength"] = meta.max_length
        elif enum:
            out["maxLength"] = max(len(e) for e in enum)
        return out
    if t.kind == "integer":
        out = {"type": "integer", "format": "int64"}
        if meta.minimum is not None:
            out["minimum"] = meta.minimum
        if meta.maximum is not None:
            out["maximum"] = meta.maximum
        return out
    if t.kind == "boolean":
        return {"type": "boolean"}
    if t.kind == "datetime":
        return {"type": "string", "format": "date-time"}
    raise ValueError(f"not a scalar: {t.kind}")


def _value_schema(spec: FieldSpec, t: TypeInfo) -> dict[str, Any]:
    if t.kind == "object":
        assert t.cls is not None
        return object_schema(t.cls)
    if t.kind == "free":
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    out = _scalar_schema(spec.meta, t, spec.enum)
    if spec.meta.rules:
        out["x-kubernetes-validations"] = [_rule_schema(r) for r in spec.meta.rules]
    return out


def field_schema(spec: FieldSpec) -> dict[str, Any]:
    """The OpenAPI schema of one field (with its description and default)."""
    t = spec.type
    meta = spec.meta
    if t.kind == "array":
        assert t.item is not None
        out: dict[str, Any] = {"type": "array", "items": _value_schema(spec, t.item)}
        if meta.min_items is not None:
            out["minItems"] = meta.min_items
        if meta.max_items is not None:
            out["maxItems"] = meta.max_items
        if meta.list_type:
            out["x-kubernetes-list-type"] = meta.list_type
        if meta.list_keys:
            out["x-kubernetes-list-map-keys"] = list(meta.list_keys)
    else:
        out = _value_schema(spec, t)
    out["description"] = meta.doc
    default = json_default(spec)
    if default is not None:
        out["default"] = default
    return out


def json_default(spec: FieldSpec) -> Any:
    """The default as JSON (``None`` when the field has none worth stating)."""
    if spec.required or spec.default is None or spec.default == ():
        return None
    return thaw(spec.default)


def object_schema(cls: type[ApiObject]) -> dict[str, Any]:
    """The OpenAPI v3 schema of an API type."""
    properties = {spec.name: field_schema(spec) for spec in fields_of(cls)}
    out: dict[str, Any] = {"type": "object", "description": type_doc(cls), "properties": properties}
    required = [spec.name for spec in fields_of(cls) if spec.required]
    if required:
        out["required"] = required
    if cls.RULES:
        out["x-kubernetes-validations"] = [_rule_schema(r) for r in cls.RULES]
    return out


# --- markdown -------------------------------------------------------------------------------


def anchor(cls: type[ApiObject]) -> str:
    """The markdown anchor of a type's section."""
    return cls.__name__.lower()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_text(t: TypeInfo) -> str:
    if t.kind == "array":
        assert t.item is not None
        return "list of " + _type_text(t.item)
    if t.kind == "object":
        assert t.cls is not None
        return f"[{t.cls.__name__}](#{anchor(t.cls)})"
    if t.kind == "free":
        return "object (free-form)"
    if t.kind == "datetime":
        return TIME_TEXT
    return t.kind


def _constraints(spec: FieldSpec) -> list[str]:
    meta = spec.meta
    notes: list[str] = []
    if spec.enum:
        notes.append("One of " + ", ".join(f"`{e}`" for e in spec.enum) + ".")
    if meta.pattern:
        notes.append(
            f"Pattern `{meta.pattern}`" + (f" ({meta.expected})." if meta.expected else ".")
        )
    if meta.min_length is not None:
        notes.append(f"At least {meta.min_length} characters.")
    if meta.max_length is not None:
        notes.append(f"At most {meta.max_length} characters.")
    if meta.minimum is not None:
        notes.append(f"Minimum {meta.minimum}.")
    if meta.maximum is not None:
        notes.append(f"Maximum {meta.maximum}.")
    if meta.min_items is not None:
        notes.append(f"At least {meta.min_items} item(s).")
    if meta.max_items is not None:
        notes.append(f"At most {meta.max_items} items.")
    if meta.list_type == "set":
        notes.append("No duplicates.")
    if meta.list_type == "map":
        notes.append("Unique by " + ", ".join(f"`{k}`" for k in meta.list_keys) + ".")
    if meta.pin:
        notes.append("A pin: a missing or malformed pin is a floating reference.")
    for rule in meta.rules:
        notes.append(f"Rule: {rule.message} (`{rule.cel}`).")
    return notes


def _default_text(spec: FieldSpec) -> str:
    if spec.required:
        return "required"
    default = json_default(spec)
    if default is None:
        return "optional"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, dict):
        return "`{}`" if not default else f"`{default}`"
    if isinstance(default, str):
        return f'`"{default}"`' if default == "" else f"`{default}`"
    return f"`{default}`"


def type_markdown(cls: type[ApiObject]) -> str:
    """The markdown section documenting one type: every field, its constraints and rules."""
    lines = [f"### {cls.__name__}", "", type_doc(cls), ""]
    if cls.API_KIND is not None:
        lines += [f"Carries `apiVersion: {cls.API_KIND[0]}` and `kind: {cls.API_KIND[1]}`.", ""]
    lines += ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for spec in fields_of(cls):
        description = " ".join([spec.meta.doc, *_constraints(spec)])
        lines.append(
            f"| `{spec.name}` | {_cell(_type_text(spec.type))} | {_cell(_default_text(spec))} "
            f"| {_cell(description)} |"
        )
    rules = [(field, rule) for field, rule in iter_rules(cls) if field is None]
    if rules:
        lines += ["", "Rules (checked by fleetlet and, in the CRDs, by the API server):", ""]
        for _, rule in rules:
            where = f" (reported on `{rule.field}`)" if rule.field else ""
            when = " On update only." if rule.transition else ""
            lines.append(f"- {rule.message}{where}: `{rule.cel}`.{when}")
    lines.append("")
    return "\n".join(lines)


def types_markdown(roots: list[type[ApiObject]]) -> str:
    """Sections for every type reachable from ``roots``, each once, in discovery order."""
    seen: list[type[ApiObject]] = []
    for root in roots:
        for cls in all_types(root):
            if cls not in seen:
                seen.append(cls)
    return "\n".join(type_markdown(cls) for cls in seen)
