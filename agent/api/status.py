"""The status document an agent pushes to ``fleetlet/status/<cluster>`` (``status.json``).

The document (``ClusterStatus``) is JSON in canonical RFC 8785 bytes. ``schemaVersion`` 2
added ``formats`` (what the agent can render); documents of version 1 are still read, and a
reader treats their missing ``formats`` as "not reported". On
the wire ``bundles`` and each run's ``outputs`` are JSON objects keyed by name; in Python they
are tuples of typed objects carrying their ``name`` (unique, as the wire keys are), because the
declaration machinery of :mod:`agent.api.validation` types lists of objects, not maps. So:

- use :func:`load_status` / :func:`dump_status` (or :func:`status_from_dict` /
  :func:`status_to_dict`) for the wire form, never the generic ``to_dict``/``canonical_bytes``;
- problems are reported with wire paths (``bundles.web.runs[0].outputs.ip.sealed``).

Fields at their default (``driftCount: 0``, a ``null``) are left out of the bytes, except
``bundles`` and ``truncated``, always written; a reader treats a missing field as its default. :func:`bound_status` keeps a
document under a size bound whatever the fleet does (history trimmed oldest-first, messages
cut with :data:`TRUNCATION_MARKER`, ``truncated`` set).

Each status commit also carries, in its message, the document's *summary*
(:func:`status_summary`, after :data:`SUMMARY_TRAILER`): the document cut down to what a
fleet-wide view reads (who, when, each bundle's conditions, newest run and applied serial), in
the same shape. A hub reading 100,000 clusters fetches the commits alone and reads their
summaries: a tenth of the bytes, and no tree or document to fetch.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any, ClassVar, Literal

from agent.api.approvals import RequestPreview
from agent.api.canonical import canonical_bytes
from agent.api.models import (
    COMMIT,
    COMMIT_TEXT,
    DNS_LABEL,
    DNS_LABEL_TEXT,
    FORMAT_NAME,
    GROUP_VERSION,
    OUTPUT_NAME,
    PIN,
    REASON,
    REASON_TEXT,
    RUN_ID,
    Condition,
    Revision,
)
from agent.api.reasons import SUCCEEDED, RunResult
from agent.api.validation import (
    ROOT_PATH,
    ApiObject,
    Rule,
    api_field,
    error_for,
    format_time,
    from_dict,
    json_items,
    memo,
    to_dict,
)
from agent.errors import FieldProblem, ValidationError

SCHEMA_VERSION = 2
"""The version agents write. 2: ``formats`` added."""
OLDEST_SCHEMA_VERSION = 1
"""The oldest version still read."""
STATUS_FILE = "status.json"
STATUS_BRANCH_PREFIX = "fleetlet/status/"
MAX_STATUS_BYTES = 256 * 1024
# What load_status accepts: generous (a document bound by another setting), yet bounded.
MAX_LOAD_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_RUNS = 10
DEFAULT_MAX_MESSAGE = 2000
TRUNCATION_MARKER = "…[truncated]"
MAX_MESSAGE = 32768
BASE64 = r"^[A-Za-z0-9+/]+={0,2}$"

RunOperation = Literal["install", "upgrade", "rollback", "driftCorrection", "uninstall"]


def status_branch(cluster: str) -> str:
    """``fleetlet/status/<cluster>`` (the branch name, without ``refs/heads/``)."""
    return STATUS_BRANCH_PREFIX + cluster


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputValue(ApiObject):
    """One output of a run: its value in clear, sealed to the hub's key, or omitted.

    Sensitive values are never in clear: ``sealed`` is a libsodium sealed box (X25519) to the
    hub's public key, base64; ``omitted`` when the agent has no hub key configured.
    """

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="(has(self.value) ? 1 : 0) + (has(self.sealed) ? 1 : 0) "
            "+ (has(self.omitted) && self.omitted ? 1 : 0) == 1",
            expected="exactly one of value, sealed or omitted: true",
            check=lambda o: [o.value is not None, o.sealed is not None, o.omitted].count(True) == 1,
        ),
    )

    name: str = api_field(
        "Name of the output (the key in the run's `outputs`).",
        pattern=OUTPUT_NAME,
        max_length=63,
        expected="an output name",
    )
    value: str | None = api_field("The value (non-sensitive).", default=None, max_length=32768)
    sealed: str | None = api_field(
        "The value sealed to the hub's X25519 public key (libsodium sealed box), base64.",
        default=None,
        pattern=BASE64,
        expected="base64",
        max_length=44000,
    )
    omitted: bool = api_field("A sensitive value left out (no hub key configured).", default=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCounts(ApiObject):
    """Objects a run created, configured (changed), left unchanged and pruned."""

    created: int = api_field("Objects created.", default=0, minimum=0)
    configured: int = api_field("Objects changed.", default=0, minimum=0)
    unchanged: int = api_field("Objects already as desired.", default=0, minimum=0)
    pruned: int = api_field("Objects deleted (no longer in the bundle).", default=0, minimum=0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Run(ApiObject):
    """One attempt to move a bundle: what it targeted, how it went, what it produced."""

    id: str = api_field(
        "Identifier of the run (unique per cluster).",
        pattern=RUN_ID,
        max_length=128,
        expected="a run id (letters, digits, '.', '_', '-')",
    )
    operation: RunOperation = api_field("What the run did.")
    serial: int = api_field(
        "Serial of the set the run targeted.", minimum=0, maximum=2**53 - 1, default=0
    )
    source_digests: tuple[str, ...] = api_field(
        "The pins of the sources the run targeted.",
        default=(),
        pattern=PIN,
        expected="a pin (sha256:<64 hex>, 40 hex or 64 hex)",
        max_length=71,
        max_items=16,
    )
    started_at: datetime = api_field("When the run started.")
    finished_at: datetime | None = api_field("When the run finished.", default=None)
    result: RunResult = api_field("How the run ended (or `Running`).")
    failed_object: str | None = api_field(
        "The object that failed, as `apiVersion Kind namespace/name`.",
        default=None,
        max_length=1024,
    )
    message: str = api_field("Summary for a person.", default="", max_length=MAX_MESSAGE)
    counts: RunCounts = api_field("Objects by what the run did to them.", default=RunCounts())
    outputs: tuple[OutputValue, ...] = api_field(
        "Outputs read after the run (successful runs), by name.",
        default=(),
        max_items=64,
        list_type="map",
        list_keys=("name",),
    )

    def output(self, name: str) -> OutputValue | None:
        """The output named ``name``, or ``None``."""
        return next((o for o in self.outputs if o.name == name), None)


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthSummary(ApiObject):
    """The bundle's health as assessed last (kstatus-style status and a message)."""

    status: str = api_field(
        "`Current`, `InProgress`, `Failed`, `NotFound`, `Terminating` or `Unknown`.",
        pattern=REASON,
        expected="a health status such as Current",
        max_length=64,
    )
    message: str = api_field("Why, for a person.", default="", max_length=MAX_MESSAGE)


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusal(ApiObject):
    """The last publication the agent refused, and why."""

    reason: str = api_field(
        "Why, in one CamelCase word (e.g. `SignatureInvalid`).",
        pattern=REASON,
        expected=REASON_TEXT,
        max_length=1024,
    )
    message: str = api_field("What happened, for a person.", default="", max_length=MAX_MESSAGE)
    commit: str | None = api_field(
        "The refused commit of the cluster's branch.",
        default=None,
        pattern=COMMIT,
        expected=COMMIT_TEXT,
        max_length=40,
    )
    at: datetime = api_field("When it was refused.")


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleStatusReport(ApiObject):
    """What the agent observed and did for one bundle, with its recent runs."""

    name: str = api_field(
        "Name of the bundle (the key in `bundles`).",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    group: str | None = api_field(
        "Lockstep group of the bundle.",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    conditions: tuple[Condition, ...] = api_field(
        "`Ready`, `Progressing`, `Degraded`, `Paused`.",
        default=(),
        max_items=16,
        list_type="map",
        list_keys=("type",),
    )
    applied_revision: Revision | None = api_field("The revision currently applied.", default=None)
    last_healthy_revision: Revision | None = api_field(
        "The last revision that passed its health checks.", default=None
    )
    health: HealthSummary | None = api_field("Health as assessed last.", default=None)
    drift_count: int = api_field("Drift corrections so far.", default=0, minimum=0)
    runs: tuple[Run, ...] = api_field(
        "The last runs, newest first.",
        default=(),
        max_items=1000,
        list_type="map",
        list_keys=("id",),
    )

    def latest_successful_run(self) -> Run | None:
        """The newest run whose result is ``Succeeded`` (the ``latest`` of the outputs API)."""
        return next((r for r in self.runs if r.result == SUCCEEDED), None)


RequestState = Literal["Pending", "Approved", "Denied", "Superseded"]
MAX_REQUESTS = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestReport(ApiObject):
    """An approval request of the cluster (a BundleDeploymentRequest), as the hub sees it: who
    decided what, when and why, and its preview (without diffs, bounded)."""

    name: str = api_field("Name of the BundleDeploymentRequest.", max_length=253, min_length=1)
    group: str = api_field(
        "The lockstep group it would move.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    serial: int = api_field("Serial it would move the group to.", minimum=1, maximum=2**53 - 1)
    bundles: tuple[str, ...] = api_field(
        "The bundles of the group.",
        default=(),
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
        max_items=256,
    )
    state: RequestState = api_field("`Pending`, `Approved`, `Denied` or `Superseded`.")
    created_at: datetime | None = api_field("When the agent made it.", default=None)
    decided_by: str | None = api_field("Who decided.", default=None, max_length=253)
    decided_at: datetime | None = api_field("When.", default=None)
    reason: str | None = api_field("Why (a denial's reason).", default=None, max_length=1024)
    policy: str | None = api_field(
        "The ApprovalPolicy that approved it automatically.", default=None, max_length=253
    )
    rule: str | None = api_field("Its rule that matched.", default=None, max_length=63)
    preview: RequestPreview = api_field(
        "What it does to the cluster (diffs left out, objects and findings bounded).",
        default=RequestPreview(),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterStatus(ApiObject):
    """The status document of one cluster, written by its agent. Newer ``sequence`` wins."""

    API_KIND: ClassVar[tuple[str, str] | None] = (GROUP_VERSION, "ClusterStatus")

    schema_version: int = api_field(
        "Version of this document's schema (1 or 2; 2 added `formats`).",
        minimum=OLDEST_SCHEMA_VERSION,
        maximum=SCHEMA_VERSION,
    )
    cluster: str = api_field(
        "The cluster.", pattern=DNS_LABEL, expected=DNS_LABEL_TEXT, max_length=63
    )
    agent_version: str = api_field("Version of the agent.", max_length=64, min_length=1)
    heartbeat: datetime = api_field("When this document was written.")
    sequence: int = api_field(
        "Grows by one per document the agent writes; a newer document always wins.",
        minimum=0,
        maximum=2**53 - 1,
    )
    last_accepted_serial: int = api_field(
        "Serial of the last publication accepted (0: none yet).",
        default=0,
        minimum=0,
        maximum=2**53 - 1,
    )
    last_refusal: Refusal | None = api_field("The last publication refused.", default=None)
    bundles: tuple[BundleStatusReport, ...] = api_field(
        "The bundles, by name.",
        default=(),
        max_items=10000,
        list_type="map",
        list_keys=("name",),
    )
    truncated: bool = api_field(
        "History or messages were cut to bound the document's size.", default=False
    )
    formats: tuple[str, ...] = api_field(
        "The formats this agent can render: built in and installed plugins (schema 2; "
        "absent: not reported). `hub publish` refuses bundles of other formats for this "
        "cluster.",
        default=(),
        pattern=FORMAT_NAME,
        expected="a format name",
        max_length=63,
        max_items=256,
    )
    notify_channel: str | None = api_field(
        "The hub's notification channel (`agent run --notify-url`): `up` (told of moves at "
        "once, polling every --notify-poll-interval) or `down` (polling every --interval, "
        "reconnecting); absent: no channel configured, the agent only polls.",
        default=None,
        enum=("up", "down"),
    )
    requests: tuple[RequestReport, ...] = api_field(
        "Approval requests: every pending one and the newest decided ones of each group.",
        default=(),
        max_items=MAX_REQUESTS,
    )

    def bundle(self, name: str) -> BundleStatusReport | None:
        """The bundle named ``name``, or ``None``."""
        return next((b for b in self.bundles if b.name == name), None)


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


SUMMARY_TRAILER = "Fleetlet-Summary"
_SUMMARY_KEYS = (
    "apiVersion",
    "kind",
    "schemaVersion",
    "cluster",
    "agentVersion",
    "heartbeat",
    "sequence",
    "lastAcceptedSerial",
    "lastRefusal",
    "notifyChannel",
)


def status_summary(document: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a document in wire form: its top-level identity and times, and per
    bundle its conditions (type, status, reason), its newest run (id, result, serial) and its
    applied revision's serial. A document itself, with only those fields."""
    bundles: dict[str, Any] = {}
    for name, bundle in (document.get("bundles") or {}).items():
        item: dict[str, Any] = {}
        conditions = [
            {k: c[k] for k in ("type", "status", "reason") if k in c}
            for c in bundle.get("conditions") or []
        ]
        if conditions:
            item["conditions"] = conditions
        runs = bundle.get("runs") or []
        if runs:
            item["runs"] = [{k: runs[0][k] for k in ("id", "result", "serial") if k in runs[0]}]
        applied = bundle.get("appliedRevision") or {}
        if "serial" in applied:
            item["appliedRevision"] = {"serial": applied["serial"]}
        bundles[name] = item
    summary = {k: document[k] for k in _SUMMARY_KEYS if k in document}
    summary["bundles"] = bundles
    return summary


def summary_message(document: Mapping[str, Any]) -> str:
    """A status commit's message: a subject line, then :data:`SUMMARY_TRAILER` and the
    canonical JSON of :func:`status_summary` on one line."""
    summary = canonical_bytes(status_summary(document)).decode("utf-8")
    return (
        f"status of {document.get('cluster')}: sequence {document.get('sequence')}\n\n"
        f"{SUMMARY_TRAILER}: {summary}\n"
    )


def message_summary(message: bytes) -> bytes | None:
    """The summary's JSON bytes in a status commit's message, or None when it has none."""
    marker = b"\n" + SUMMARY_TRAILER.encode() + b": "
    at = message.rfind(marker)
    if at < 0:
        return None
    end = message.find(b"\n", at + len(marker))
    return message[at + len(marker) : end if end >= 0 else len(message)]


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


# --- bounding the size ----------------------------------------------------------------------


def truncate_message(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, ending with the marker when cut."""
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - len(TRUNCATION_MARKER))
    return text[:keep] + TRUNCATION_MARKER


def _cut_messages(s: ClusterStatus, max_chars: int) -> ClusterStatus:
    """``s`` with every message cut to ``max_chars``; unchanged objects are kept as they are."""

    def cut(obj: Any) -> Any:
        text = getattr(obj, "message", "")
        if len(text) <= max_chars:
            return obj
        return dataclasses.replace(obj, message=truncate_message(text, max_chars))

    def cut_all(items: tuple[Any, ...]) -> tuple[Any, ...]:
        new = tuple(cut(item) for item in items)
        return items if all(a is b for a, b in zip(new, items, strict=True)) else new

    bundles = []
    for b in s.bundles:
        conditions = cut_all(b.conditions)
        runs = cut_all(b.runs)
        health = cut(b.health) if b.health is not None else None
        if conditions is b.conditions and runs is b.runs and health is b.health:
            bundles.append(b)
        else:
            bundles.append(dataclasses.replace(b, conditions=conditions, health=health, runs=runs))
    refusal = cut(s.last_refusal) if s.last_refusal is not None else None
    return dataclasses.replace(s, bundles=tuple(bundles), last_refusal=refusal)


def _size(s: ClusterStatus) -> int:
    return _wire_size(s)


def _drop_oldest_runs(s: ClusterStatus, max_bytes: int, *, keep_newest: bool) -> ClusterStatus:
    """Drop runs oldest first (by start time) until the document fits; with ``keep_newest``
    each bundle keeps its newest run."""
    over = _size(s) - max_bytes
    if over <= 0:
        return s
    candidates: list[tuple[datetime, int, int, int]] = []  # (startedAt, bundle, position, size)
    for b_index, b in enumerate(s.bundles):
        start = 1 if keep_newest else 0
        for position in range(start, len(b.runs)):
            run = b.runs[position]
            size = _wire_size(run) + 1
            candidates.append((run.started_at, b_index, position, size))
    candidates.sort(key=lambda c: (c[0], -c[2]))
    dropped: set[tuple[int, int]] = set()
    for _, b_index, position, size in candidates:
        if over <= 0:
            break
        dropped.add((b_index, position))
        over -= size
    touched = {b_index for b_index, _ in dropped}
    bundles = tuple(
        dataclasses.replace(b, runs=tuple(r for p, r in enumerate(b.runs) if (i, p) not in dropped))
        if i in touched
        else b
        for i, b in enumerate(s.bundles)
    )
    return dataclasses.replace(s, bundles=bundles)


def bound_status(
    s: ClusterStatus,
    *,
    max_bytes: int = MAX_STATUS_BYTES,
    max_runs: int = DEFAULT_MAX_RUNS,
    max_message: int = DEFAULT_MAX_MESSAGE,
) -> ClusterStatus:
    """``s`` cut to fit ``max_bytes`` of canonical bytes; ``truncated`` set when anything was cut.

    In order, until it fits: at most ``max_runs`` runs per bundle and messages of at most
    ``max_message`` characters (always); older runs dropped oldest first (each bundle keeping its
    newest); messages cut to 200 characters; every run dropped oldest first; finally bundles
    dropped from the end. Raises ValueError if ``max_bytes`` cannot hold even an empty document.
    """
    original = s
    bundles = tuple(
        dataclasses.replace(b, runs=b.runs[:max_runs]) if len(b.runs) > max_runs else b
        for b in s.bundles
    )
    s = _cut_messages(dataclasses.replace(s, bundles=bundles, truncated=True), max_message)
    for _ in range(3):
        s = _drop_oldest_runs(s, max_bytes, keep_newest=True)
    if _size(s) > max_bytes:
        s = _cut_messages(s, min(max_message, 200))
    for _ in range(3):
        s = _drop_oldest_runs(s, max_bytes, keep_newest=False)
    if _size(s) > max_bytes:
        # Bundles alone exceed the bound: keep as many as fit (sizes are additive).
        empty = dataclasses.replace(s, bundles=())
        budget = max_bytes - _size(empty) - len(',"bundles":{}')
        kept: list[BundleStatusReport] = []
        for b in s.bundles:
            cost = _wire_size(b) + len(b.name) + 4
            if cost > budget:
                break
            kept.append(b)
            budget -= cost
        s = dataclasses.replace(s, bundles=tuple(kept))
    if _size(s) > max_bytes:
        raise ValueError(f"a status document cannot fit in {max_bytes} bytes")
    # Every step keeps the objects it did not change: all the same objects means nothing cut.
    unchanged = (
        len(s.bundles) == len(original.bundles)
        and all(a is b for a, b in zip(s.bundles, original.bundles, strict=True))
        and s.last_refusal is original.last_refusal
    )
    return original if unchanged else s
