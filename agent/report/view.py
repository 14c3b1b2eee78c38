"""What the agent knows of one bundle: written to its BundleDeployment's status and to the
status document it pushes to git."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent.api import Revision
from agent.api.status import HealthSummary, Run
from agent.bundles import ConditionSpec


def now() -> datetime:
    """The time as the API writes it: UTC, whole seconds (RFC 3339, as Kubernetes does)."""
    return datetime.now(UTC).replace(microsecond=0)


@dataclass(kw_only=True)
class BundleView:
    """What the agent knows of one bundle: written to its BundleDeployment's status and to
    the status document."""

    name: str
    group: str
    conditions: dict[str, ConditionSpec] = field(default_factory=dict)
    applied: Revision | None = None
    last_healthy: Revision | None = None
    health: HealthSummary | None = None
    resources: dict[str, int] = field(default_factory=dict)
    drift_count: int = 0
    runs: list[Run] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Optional objects left out because their API is not served."""
    since: dict[str, datetime] = field(default_factory=dict)
    """When each condition last changed status (its lastTransitionTime)."""

    def set(self, kind: str, status: str, reason: str, message: str = "") -> None:
        old = self.conditions.get(kind)
        if old is None or old.status != status or kind not in self.since:
            self.since[kind] = now()
        self.conditions[kind] = ConditionSpec(kind, status, reason, message)
