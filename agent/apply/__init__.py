"""Outbound to the cluster: plan, dry-run and apply a lockstep group's rendered objects in
stages (:mod:`agent.apply.group`), keep each bundle's inventory and prune what a new revision
dropped (:mod:`agent.apply.inventory`), and keep the last healthy revisions in the cluster
(:mod:`agent.apply.store`) so that a rollback needs nothing else.
"""

from __future__ import annotations

from agent.apply.group import (
    FIELD_MANAGER,
    ApplyResult,
    CrdNotEstablishedError,
    DryRunResult,
    ObjectResult,
    apply_group,
    dry_run_group,
)
from agent.apply.inventory import (
    Entry,
    Inventory,
    Key,
    PruneItem,
    PruneOutcome,
    PrunePlan,
    plan_prune,
    prune,
)
from agent.apply.plan import (
    ApplyError,
    ApplySettings,
    BundleInput,
    Plan,
    PlanError,
    PlannedObject,
    Skipped,
    plan_group,
)
from agent.apply.store import HealthyRevision, IndexEntry, RevisionStore, RevisionStoreError

__all__ = [
    "FIELD_MANAGER",
    "ApplyError",
    "ApplyResult",
    "ApplySettings",
    "BundleInput",
    "CrdNotEstablishedError",
    "DryRunResult",
    "Entry",
    "HealthyRevision",
    "IndexEntry",
    "Inventory",
    "Key",
    "ObjectResult",
    "Plan",
    "PlanError",
    "PlannedObject",
    "PruneItem",
    "PruneOutcome",
    "PrunePlan",
    "RevisionStore",
    "RevisionStoreError",
    "Skipped",
    "apply_group",
    "dry_run_group",
    "plan_group",
    "plan_prune",
    "prune",
]
