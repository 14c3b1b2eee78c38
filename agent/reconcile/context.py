"""What the steps of the outbound reconcile work with: settings, identities, the group at hand.

:class:`GroupContext` is the one object a step receives: the group (its bundles as the set
wants them, its place in the set) and the collaborators a step may use, each named (the revision
store, the group records, the run log, the status views, the outputs step, the identities).
:class:`MoveFailed` is how a step says the move cannot go on; the pipeline turns it into a
rollback (or a refusal when nothing was written).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from agent.api import BundleDeploymentEntry, BundleDeploymentSet, BundleDeploymentSpec, Revision
from agent.apply import ApplyError, Key
from agent.apply.intent import GroupRecords
from agent.apply.store import RevisionStore
from agent.apply.verified import VerifiedObjects
from agent.approve.approvals import Approvals, WaitingOn
from agent.errors import PermanentError, TemporaryError
from agent.kube import KubeClient
from agent.report.metrics import Metrics
from agent.report.outputs import OutputsStage
from agent.report.runs import RunLog
from agent.report.view import BundleView, BundleViews
from agent.settings import ReconcileSettings

Manifest = dict[str, Any]
RenderFn = Callable[
    [BundleDeploymentSet, Sequence[BundleDeploymentEntry]], Mapping[str, list[Manifest]]
]
"""Renders some entries of a set: bundle name -> finished objects. Raises the inbound
pipeline's errors (FetchError: temporary; ContentRefusedError, InvalidManifestError: not)."""


class Identities:
    """Who a bundle acts as: its ServiceAccount (impersonated) when its spec names one, for
    applying, health-checking, pruning and reading outputs alike; else the agent itself."""

    def __init__(self, *, kube: KubeClient, agent_namespace: str) -> None:
        self.kube = kube
        self.agent_namespace = agent_namespace

    def __call__(self, spec: BundleDeploymentSpec | None) -> KubeClient:
        account = spec.service_account_name if spec is not None else None
        if account:
            return self.kube.impersonating(account, self.agent_namespace)
        return self.kube


class MoveFailed(PermanentError):
    """A move cannot go on: ``reason`` (ApplyFailed, HealthCheckFailed, ...), the bundle and
    object that failed when known, whether anything may have been written (``written`` False:
    the whole group's dry run refused it, there is nothing to undo), and ``causes``: the
    reasons behind it (the API server's, per refused object: NotFound, WebhookFailed...)."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        bundle: str | None = None,
        target: str | None = None,
        written: bool = True,
        causes: Iterable[str] = (),
        described: str | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.bundle = bundle
        self.target = target
        self.written = written
        self.causes = frozenset(causes) or frozenset({reason})
        self._described = described

    @classmethod
    def recorded(cls, reason: str, described: str) -> MoveFailed:
        """A failure recorded earlier (in an intent), said exactly as it was said then."""
        return cls(reason, described, described=described)

    @classmethod
    def of_apply(cls, exc: ApplyError, *, reason: str, written: bool) -> MoveFailed:
        """The move's failure for an apply error: its first object named, the API server's
        reason of every refused object as the causes."""
        return cls(
            reason,
            str(exc),
            bundle=exc.bundle,
            target=exc.target,
            written=written,
            causes=(f.reason for f in exc.failures),
        )

    @property
    def culprit(self) -> tuple[str, str] | None:
        """(bundle, object) that made the group fail, when the failure names one."""
        if self.bundle and self.target:
            return self.bundle, self.target
        return None

    def describe(self) -> str:
        """``reason (bundle: object): message``, each object named once (an apply error's
        message names its objects already)."""
        if self._described is not None:
            return self._described
        named = self.culprit is not None and str(self.target) in self.message
        where = f" ({self.bundle}: {self.target})" if self.culprit and not named else ""
        return f"{self.reason}{where}: {self.message}"


class GroupState(StrEnum):
    """Where a group stands after its part of a pass."""

    MOVED = "moved"
    STEADY = "steady"
    ROLLED_BACK = "rolledBack"
    FAILED = "failed"
    WAITING = "waiting"
    AWAITING_APPROVAL = "awaitingApproval"
    """Its move waits for a decision on its BundleDeploymentRequest (``waiting_on``)."""
    HELD = "held"


@dataclass(frozen=True, kw_only=True)
class GroupOutcome:
    """What a group's part of a pass did."""

    group: str
    state: GroupState
    healthy: bool = False
    """Dependents may move (paused-only groups count as healthy: they hold nobody back)."""
    failed_now: bool = False
    """It failed in this pass (not a failure kept from an earlier one)."""
    drift: int = 0
    """Objects put back by drift correction."""
    error: TemporaryError | None = None
    """A temporary failure: the poll loop backs off on it."""
    waiting_on: WaitingOn | None = None
    """Awaiting approval: the request and policies whose change may end the wait."""


@dataclass(frozen=True, kw_only=True)
class GroupContext:
    """One group's part of a pass: the group and the collaborators its steps use."""

    group: str
    position: str
    """Where the group is in the set, for messages (``2 of 4``)."""
    deployment_set: BundleDeploymentSet
    set_digest: str | None
    members: tuple[BundleDeploymentEntry, ...]
    annotations: Mapping[str, Mapping[str, str]]
    """The BundleDeployments' annotations (paused, retry), by bundle."""
    claims: Mapping[Key, str]
    """Which bundle owns (or will own) each object: pruning hands those over."""
    rendered: Mapping[str, list[Manifest]]
    """Bundles the inbound pipeline rendered for this set already."""
    render: RenderFn
    kube: KubeClient
    identities: Identities
    settings: ReconcileSettings
    store: RevisionStore
    records: GroupRecords
    runs: RunLog
    views: BundleViews
    outputs: OutputsStage | None
    clock: Callable[[], datetime]
    metrics: Metrics | None = None
    verified: VerifiedObjects | None = None
    """Objects verified before: their dry run is skipped while nothing changed."""
    approvals: Approvals | None = None
    """Approval requests and the cluster's ApprovalPolicies (None: moves are never held for
    an approval)."""
    owners: dict[Any, str] = field(default_factory=dict)
    """Which bundle of the group each object (and checked object) belongs to (per-bundle
    health counts); filled by the step that applies."""

    @property
    def serial(self) -> int:
        return self.deployment_set.serial

    def view(self, name: str) -> BundleView:
        return self.views.view(name, self.group)

    def event(self, name: str, reason: str, message: str, *, warning: bool = False) -> None:
        """A Kubernetes Event about bundle ``name`` (see :mod:`agent.report.events`)."""
        self.views.bundles.record(name, reason, message, warning=warning)

    def failpoint(self, name: str) -> None:
        if self.settings.failpoint is not None:
            self.settings.failpoint(name)

    def revision(self, entry: BundleDeploymentEntry, serial: int | None = None) -> Revision:
        """The revision a bundle's target is: the serial it came with and its pins."""
        return Revision(
            serial=serial if serial is not None else self.serial,
            sources=tuple(s.pin for s in entry.spec.sources if s.pin),
            set_digest=self.set_digest,
        )


__all__ = [
    "GroupContext",
    "GroupOutcome",
    "GroupState",
    "Identities",
    "Manifest",
    "MoveFailed",
    "ReconcileSettings",
    "RenderFn",
]
