"""The status document's wire form: canonical RFC 8785 bytes, ``bundles`` and ``outputs`` keyed by
name, problems reported with wire paths.

Part of :mod:`agent.api.status`; written by :mod:`agent.report.push`, read by the hub's status
readers through :func:`load_status`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from agent.api.canonical import canonical_bytes
from agent.api.status._document import (
    MAX_LOAD_BYTES,
    BundleStatusReport,
    ClusterStatus,
    OutputValue,
    Run,
)
from agent.api.validation import (
    ROOT_PATH,
    ApiObject,
    error_for,
    format_time,
    from_dict,
    json_items,
    memo,
    to_dict,
)
from agent.errors import FieldProblem, ValidationError

# --- wire form ------------------------------------------------------------------------------


def status_to_dict(s: ClusterStatus) -> dict[str, Any]:
    """The document as JSON data (wire form: ``bundles`` and ``outputs`` keyed by name)."""
    data = to_dict(s)
    bundles: dict[str, Any] = {}
    for raw in data.pop("bundles", []):
        name = raw.pop("name")
        for run in raw.get("runs", []):
            if "outputs" in run:
                run["outputs"] = {o.pop("name"): o for o in run["outputs"]}
        bundles[name] = raw
    # Always written (also when empty or false), as the schema shows them: readers index them.
    data["bundles"] = bundles
    data["truncated"] = s.truncated
    return data


def dump_status(s: ClusterStatus) -> bytes:
    """The canonical RFC 8785 bytes of ``status.json``."""
    return _wire(s).encode("utf-8")


def _wire(obj: ApiObject) -> str:
    """The JCS text of an object in wire form, composed of its members' texts and memoised
    per object (so bounding a large document re-serialises only what changed). Equal to
    ``canonical_bytes(status_to_dict(s))``: names are ASCII, so code-point order is JCS's."""
    cache = memo(obj)
    text: str | None = cache.get("wire")
    if text is not None:
        return text
    members = []
    keyed = isinstance(obj, BundleStatusReport | OutputValue)
    items = json_items(obj)
    if isinstance(obj, ClusterStatus):
        # Always written (also when empty or false), as the schema shows them.
        items = sorted(
            [(n, v) for n, v in items if n not in ("bundles", "truncated")]
            + [("bundles", obj.bundles), ("truncated", obj.truncated)],
            key=lambda item: item[0],
        )
    for name, value in items:
        if name == "name" and keyed:
            continue  # the key in the parent's map
        if (name == "bundles" and isinstance(obj, ClusterStatus)) or (
            name == "outputs" and isinstance(obj, Run)
        ):
            keyed_items = sorted(value, key=lambda item: item.name)
            inner = ",".join(f'"{item.name}":' + _wire(item) for item in keyed_items)
            members.append(f'"{name}":{{{inner}}}')
        elif name == "runs" and isinstance(obj, BundleStatusReport):
            members.append(f'"{name}":[' + ",".join(_wire(run) for run in value) + "]")
        elif isinstance(value, ApiObject):
            members.append(f'"{name}":' + canonical_bytes(value).decode("utf-8"))
        elif isinstance(value, tuple) and value and isinstance(value[0], ApiObject):
            members.append(
                f'"{name}":[' + ",".join(canonical_bytes(v).decode("utf-8") for v in value) + "]"
            )
        else:
            members.append(f'"{name}":' + _scalar(value))
    text = "{" + ",".join(members) + "}"
    cache["wire"] = text
    return text


def _scalar(value: Any) -> str:
    """JCS text of a field's plain value (validated: strings, safe integers, times, lists)."""
    if isinstance(value, str):
        return encode_basestring(value)  # json's own escaping, which is JCS's
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        return '"' + format_time(value) + '"'
    if isinstance(value, tuple):
        return "[" + ",".join(_scalar(item) for item in value) + "]"
    return canonical_bytes({"v": value}).decode("utf-8")[5:-1]


def _wire_size(obj: ApiObject) -> int:
    cache = memo(obj)
    size: int | None = cache.get("wire_size")
    if size is None:
        size = cache["wire_size"] = len(_wire(obj).encode("utf-8"))
    return size


class _Keys:
    """Maps the list indexes of the Python form back to the wire form's keys, for messages."""

    def __init__(self) -> None:
        self.bundles: list[str] = []
        self.outputs: dict[tuple[int, int], list[str]] = {}

    def wire_path(self, path: str) -> str:
        def bundle(m: re.Match[str]) -> str:
            index = int(m.group(1))
            rest = m.group(2) or ""
            key = _key(self.bundles[index]) if index < len(self.bundles) else f"[{index}]"
            out = re.match(r"\.runs\[(\d+)\]\.outputs\[(\d+)\](.*)", rest)
            if out:
                names = self.outputs.get((index, int(out.group(1))), [])
                o = int(out.group(2))
                okey = _key(names[o]) if o < len(names) else f"[{o}]"
                rest = f".runs[{out.group(1)}].outputs.{okey}{_unname(out.group(3))}"
                return f"bundles.{key}{rest}"
            return f"bundles.{key}{_unname(rest)}"

        return re.sub(r"\Abundles\[(\d+)\](.*)\Z", bundle, path, flags=re.S)


def _unname(rest: str) -> str:
    # The injected ``name`` field is the key itself on the wire.
    return "" if rest == ".name" else rest


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name) else f"[{json.dumps(name)}]"


def _listify(data: Any, keys: _Keys, problems: list[FieldProblem]) -> Any:
    """The wire data with ``bundles``/``outputs`` maps turned into name-carrying lists."""
    if not isinstance(data, Mapping) or "bundles" not in data:
        return data
    bundles = data["bundles"]
    if not isinstance(bundles, Mapping):
        problems.append(
            FieldProblem(path="bundles", expected="an object of bundles by name", found="not one")
        )
        return data
    out_bundles = []
    for b_index, (name, raw) in enumerate(bundles.items()):
        keys.bundles.append(str(name))
        if isinstance(raw, Mapping):
            if "name" in raw:
                problems.append(
                    FieldProblem(
                        path=f"bundles.{_key(str(name))}.name",
                        expected="no name field (the key is the name)",
                        found="an unknown field",
                    )
                )
            raw = {**raw, "name": name}
            runs = raw.get("runs")
            if isinstance(runs, list):
                new_runs = []
                for r_index, run in enumerate(runs):
                    outputs = run.get("outputs") if isinstance(run, Mapping) else None
                    if isinstance(outputs, Mapping):
                        names = [str(k) for k in outputs]
                        keys.outputs[(b_index, r_index)] = names
                        listed = []
                        for oname, value in outputs.items():
                            if isinstance(value, Mapping) and "name" in value:
                                problems.append(
                                    FieldProblem(
                                        path=f"bundles.{_key(str(name))}.runs[{r_index}]"
                                        f".outputs.{_key(str(oname))}.name",
                                        expected="no name field (the key is the name)",
                                        found="an unknown field",
                                    )
                                )
                            listed.append(
                                {**value, "name": oname} if isinstance(value, Mapping) else value
                            )
                        run = {**run, "outputs": listed}
                    elif outputs is not None:
                        problems.append(
                            FieldProblem(
                                path=f"bundles.{_key(str(name))}.runs[{r_index}].outputs",
                                expected="an object of outputs by name",
                                found="not one",
                            )
                        )
                    new_runs.append(run)
                raw = {**raw, "runs": new_runs}
        out_bundles.append(raw)
    return {**data, "bundles": out_bundles}


def status_from_dict(data: Any, *, origin: str = "") -> ClusterStatus:
    """Validate wire JSON data as a status document.

    Raises ``ValidationError`` listing every problem, with wire paths.
    """
    keys = _Keys()
    problems: list[FieldProblem] = []
    listed = _listify(data, keys, problems)
    try:
        result = from_dict(ClusterStatus, listed, origin=origin)
    except ValidationError as exc:
        problems += [
            type(p)(path=keys.wire_path(p.path), expected=p.expected, found=p.found)
            for p in exc.problems
        ]
        raise error_for(problems, origin=origin) from None
    if problems:
        raise error_for(problems, origin=origin)
    return result


def load_status(data: bytes, *, origin: str, max_bytes: int = MAX_LOAD_BYTES) -> ClusterStatus:
    """Parse ``status.json`` bytes (at most ``max_bytes``) and validate everything.

    Raises ``ValidationError`` (every problem, with wire paths) for a document too large, not
    UTF-8 JSON, with duplicate keys or not following the schema.
    """
    if len(data) > max_bytes:
        raise ValidationError(
            [
                FieldProblem(
                    path=ROOT_PATH,
                    expected=f"at most {max_bytes} bytes",
                    found=f"{len(data)} bytes",
                )
            ],
            origin=origin,
        )

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    try:
        raw = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=no_duplicates,
            parse_constant=_refuse_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValidationError(
            [FieldProblem(path=ROOT_PATH, expected="UTF-8 JSON (each key once)", found=str(exc))],
            origin=origin,
        ) from exc
    return status_from_dict(raw, origin=origin)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
