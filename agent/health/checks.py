"""A bundle's own health checks (``healthChecks.checks``) evaluated on one live object.

A check names an object and asks for either a status condition with a given status, or a field
(``.status.phase``, ``.items[0]``, ``.data['a.b']``) whose value, as text, equals a given text.
Evaluation is pure: the caller fetches the object. A check that does not hold yet is
InProgress (the group's timeout turns "never" into a failure); a missing object is NotFound.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.health.kstatus import NOT_FOUND, Assessment, Status

if TYPE_CHECKING:
    from agent.api.models import HealthCheck

_SEGMENT = re.compile(r"\.([A-Za-z0-9_-]+)|\[([0-9]+)\]|\['([^']+)'\]")


class _Missing:
    """A field that is not there (distinct from a field that is null)."""


MISSING = _Missing()


def field_value(obj: Any, path: str) -> Any:
    """The value at ``path`` inside ``obj``, or :data:`MISSING` when any step is absent.

    ``path`` is a sequence of ``.name``, ``[N]`` and ``['name.with.dots']`` steps (the
    ``fieldPath`` syntax of the API); ValueError when it is not.
    """
    position = 0
    value = obj
    while position < len(path):
        match = _SEGMENT.match(path, position)
        if match is None:
            raise ValueError(f"bad field path {path!r} at character {position + 1}")
        position = match.end()
        name, index, quoted = match.groups()
        if index is not None:
            if not isinstance(value, list) or int(index) >= len(value):
                return MISSING
            value = value[int(index)]
            continue
        key = name if name is not None else quoted
        if not isinstance(value, Mapping) or key not in value:
            return MISSING
        value = value[key]
    return value


def as_text(value: Any) -> str:
    """A field's value as the API compares it: strings as they are, numbers in decimal,
    booleans ``true``/``false``, null ``null``, lists and objects as compact JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def check_condition(obj: Mapping[str, Any], type_: str, status: str = "True") -> Assessment:
    """Current when ``obj`` has condition ``type_`` with ``status``; else InProgress, saying
    what the condition is (with its reason and message) or that it is absent."""
    conditions = field_value(obj, ".status.conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == type_:
            actual = str(cond.get("status") or "")
            if actual == status:
                return Assessment(Status.CURRENT, "CheckPassed", f"{type_} is {status}")
            why = ": ".join(str(p) for p in (cond.get("reason"), cond.get("message")) if p)
            return Assessment(
                Status.IN_PROGRESS,
                "ConditionNotMet",
                f"{type_} is {actual or 'unset'}, want {status}" + (f" ({why})" if why else ""),
            )
    return Assessment(
        Status.IN_PROGRESS, "ConditionNotMet", f"no {type_} condition yet, want {status}"
    )


def check_field(obj: Mapping[str, Any], field_path: str, equals: str) -> Assessment:
    """Current when the field at ``field_path`` equals ``equals`` (compared as text)."""
    value = field_value(obj, field_path)
    if value is MISSING:
        return Assessment(
            Status.IN_PROGRESS, "FieldNotMet", f"{field_path} is missing, want {equals!r}"
        )
    text = as_text(value)
    if text == equals:
        return Assessment(Status.CURRENT, "CheckPassed", f"{field_path} is {equals!r}")
    shown = text if len(text) <= 80 else text[:77] + "..."
    return Assessment(
        Status.IN_PROGRESS, "FieldNotMet", f"{field_path} is {shown!r}, want {equals!r}"
    )


def evaluate(check: HealthCheck, obj: Mapping[str, Any] | None) -> Assessment:
    """The result of ``check`` on ``obj`` (None: the object does not exist → NotFound)."""
    if obj is None:
        return NOT_FOUND
    if check.condition is not None:
        return check_condition(obj, check.condition.type, check.condition.status)
    if check.expression is not None:
        return check_field(obj, check.expression.field_path, check.expression.equals)
    return Assessment(
        Status.UNKNOWN, "EmptyCheck", "the check has neither condition nor expression"
    )
