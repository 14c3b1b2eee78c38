"""What the agent reports of one bundle: conditions, revisions, resource counts and runs.

Part of :mod:`agent.api.models`; written by :mod:`agent.api.status` and the reconcile.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agent.api.models._patterns import (
    CONDITION_TYPE,
    DIGEST,
    DIGEST_TEXT,
    MAX_SOURCES,
    PIN,
    REASON,
    REASON_TEXT,
    RUN_ID,
    ConditionStatus,
)
from agent.api.reasons import Phase, RunResult
from agent.api.validation import ApiObject, api_field

# --- status ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition(ApiObject):
    """A condition in the manner of ``metav1.Condition``."""

    type: str = api_field(
        "Type: `Ready`, `Progressing`, `Degraded` or `Paused` (BundleDeployment); `Approved`, "
        "`Denied` or `Superseded` (BundleDeploymentRequest).",
        pattern=CONDITION_TYPE,
        max_length=316,
        expected="a condition type such as Ready",
    )
    status: ConditionStatus = api_field("Status of the condition.")
    reason: str = api_field(
        "Why, in one CamelCase word (e.g. `HealthCheckFailed`).",
        pattern=REASON,
        expected=REASON_TEXT,
        max_length=1024,
    )
    message: str = api_field("What happened, for a person.", default="", max_length=32768)
    last_transition_time: datetime = api_field("When the status last changed.")
    observed_generation: int | None = api_field(
        "The `metadata.generation` this condition was computed for.", default=None, minimum=0
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Revision(ApiObject):
    """A revision of a bundle: the set serial it came with and the pins of its sources."""

    serial: int = api_field(
        "Serial of the BundleDeploymentSet the revision came with.",
        minimum=1,
        maximum=2**53 - 1,
    )
    sources: tuple[str, ...] = api_field(
        "The pin of each source, in the order of `spec.sources`.",
        default=(),
        pattern=PIN,
        expected="a pin (sha256:<64 hex>, 40 hex or 64 hex)",
        max_length=71,
        max_items=MAX_SOURCES,
    )
    set_digest: str | None = api_field(
        "Digest of the set's canonical bytes.",
        default=None,
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        max_length=71,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ResourceCounts(ApiObject):
    """Counts of the bundle's objects."""

    total: int = api_field("Objects the bundle renders to.", default=0, minimum=0)
    ready: int = api_field("Objects assessed healthy.", default=0, minimum=0)
    not_ready: int = api_field("Objects not (yet) healthy.", default=0, minimum=0)
    skipped: int = api_field(
        "Optional objects skipped because their API is not served.", default=0, minimum=0
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary(ApiObject):
    """One run of the agent on this bundle (an apply, a rollback, a deletion)."""

    id: str = api_field(
        "Identifier of the run (unique per cluster).",
        pattern=RUN_ID,
        max_length=128,
        expected="a run id (letters, digits, '.', '_', '-')",
    )
    result: RunResult = api_field("How the run ended (or `Running`).")
    started_at: datetime = api_field("When the run started.")
    finished_at: datetime | None = api_field("When the run finished.", default=None)
    message: str = api_field("Summary for a person.", default="", max_length=32768)


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentStatus(ApiObject):
    """What the agent observed and did for this bundle."""

    observed_generation: int | None = api_field(
        "The `metadata.generation` last acted on.", default=None, minimum=0
    )
    conditions: tuple[Condition, ...] = api_field(
        "`Ready`, `Progressing`, `Degraded`, `Paused`.",
        default=(),
        max_items=16,
        list_type="map",
        list_keys=("type",),
    )
    phase: str | None = api_field(
        "What is happening now: " + ", ".join(f"`{p}`" for p in Phase) + ".",
        default=None,
        enum=tuple(str(p) for p in Phase),
    )
    applied_revision: Revision | None = api_field("The revision currently applied.", default=None)
    target_revision: Revision | None = api_field(
        "The revision the agent is moving to, or stopped short of (the applied revision "
        "once it is there).",
        default=None,
    )
    last_healthy_revision: Revision | None = api_field(
        "The last revision that passed its health checks (what a rollback returns to).",
        default=None,
    )
    resources: ResourceCounts | None = api_field("Counts of the bundle's objects.", default=None)
    last_run: RunSummary | None = api_field("The latest run.", default=None)
    drift_count: int = api_field(
        "How many times objects were found changed outside fleetlet and corrected.",
        default=0,
        minimum=0,
    )
