"""The status document's types: :class:`ClusterStatus`, each bundle's report, runs, refusals and
approval requests, with the limits of the document.

Part of :mod:`agent.api.status`; the wire form (``_wire``) reads and writes them.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from agent.api.approvals import RequestPreview
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
from agent.api.signatures import SignedSource
from agent.api.validation import (
    ApiObject,
    Rule,
    api_field,
)

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
    signed_sources: tuple[SignedSource, ...] = api_field(
        "Its image sources whose signatures were verified (`sourceSigning`; docs/supply-chain.md).",
        default=(),
        max_items=16,
    )
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
