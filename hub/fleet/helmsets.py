"""helm's ``--set-string``, ``--set-json`` and ``--set-file`` in the fleet repo.

A helm bundle carries them in ``formatOptions.setString``, ``setJson`` and ``setFile`` (lists
of the flags' arguments, as on helm's command line); an override carries the same three keys
at its top level, appended after the bundle's (a later assignment wins, as a later flag does
for helm). The agent gives them to helm as they are (:mod:`agent.render.helm`), so helm's
typing and precedence hold: values files, ``values``, then ``setJson``, ``setString``,
``setFile``, whatever the order of the keys. A ``setFile`` path is a file of the bundle tree.

:func:`check_sets` parses every item when the fleet repo is loaded, so a mistake is reported
with its file and field before anything is published (the API checks only the shape).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent.api.helmsets import HELM_SET_FIELDS
from agent.render.values import ValuesError, parse_set, parse_set_json

Report = Callable[[str, str, object], None]
"""``report(field, expected, found)``: one problem."""

FIELDS = tuple(field for field, _ in HELM_SET_FIELDS)

_EXPECTED = {
    "setString": "a list of helm --set-string arguments (key=value[,key=value...])",
    "setJson": "a list of helm --set-json arguments (key=<JSON>[,key=<JSON>...])",
    "setFile": "a list of helm --set-file arguments (key=path of a file in the bundle tree)",
}


def check_sets(raw: Mapping[str, Any], where: str, report: Report) -> dict[str, tuple[str, ...]]:
    """The set fields present in ``raw`` (a bundle's ``formatOptions`` or an override), each
    item parsed as helm parses it; problems go to ``report`` (fields prefixed by ``where``)."""
    found: dict[str, tuple[str, ...]] = {}
    for field in FIELDS:
        if field not in raw:
            continue
        items = raw[field]
        path = f"{where}.{field}" if where else field
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            report(path, _EXPECTED[field], items)
            continue
        ok = True
        for index, item in enumerate(items):
            problem = _problem(field, item)
            if problem:
                report(f"{path}[{index}]", problem, item)
                ok = False
        if ok:
            found[field] = tuple(items)
    return found


def _problem(field: str, item: str) -> str | None:
    """What is wrong with one item (None: helm reads it)."""
    try:
        if field == "setJson":
            parse_set_json([item])
        elif field == "setString":
            parse_set([item], strings=True)
        else:
            key, equals, relative = item.rpartition("=")
            if not equals or not key:
                return "key=path (a file of the bundle tree)"
            parse_set([f"{key}="], strings=True)
            if not relative or relative.startswith("/") or ".." in relative.split("/"):
                return "key=path with a relative path inside the bundle tree (no '..')"
    except ValuesError as exc:
        # "--set-json 'a=x': not JSON: ...": what follows the flag and the item.
        detail = str(exc).split(": ", 1)[-1]
        return f"helm's {_FLAG[field]} syntax ({detail})"
    return None


_FLAG = {"setString": "--set-string", "setJson": "--set-json", "setFile": "--set-file"}


def apply_sets(spec: dict[str, Any], sets: Mapping[str, tuple[str, ...]]) -> None:
    """Append an override's ``sets`` to ``spec``'s ``formatOptions`` lists."""
    if not sets:
        return
    options = spec.setdefault("formatOptions", {})
    if not isinstance(options, dict):
        return  # reported by the API's validation of the bundle
    for field, items in sets.items():
        own = options.get(field)
        options[field] = [*(own if isinstance(own, list) else []), *items]


__all__ = ["FIELDS", "apply_sets", "check_sets"]
