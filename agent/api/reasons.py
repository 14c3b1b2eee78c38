"""The words fleetlet writes: condition reasons, run results and bundle phases, in one place.

A BundleDeployment's conditions (``Ready``, ``Progressing``, ``Degraded``, ``Paused``) and the
status document the agent pushes use these reasons; so do the CRD documentation
(``docs/api.md``) and the hub, which reads them back. A step that fails reports the ``reason``
of its error (:class:`agent.errors.FleetletError` subclasses declare their own: a refused
publication says ``SignatureInvalid``, an API server refusal ``Forbidden`` or ``Invalid``...);
the reasons below are the agent's own words for where a bundle stands.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class Reason(StrEnum):
    """Condition reasons of a BundleDeployment (CamelCase, as Kubernetes writes them)."""

    HEALTHY = "Healthy"
    PROGRESSING = "Progressing"
    WAITING_FOR_DEPENDENCY = "WaitingForDependency"
    AWAITING_APPROVAL = "AwaitingApproval"
    DENIED = "Denied"
    APPROVAL_FAILED = "ApprovalFailed"
    PAUSED = "Paused"
    FETCH_FAILED = "FetchFailed"
    RENDER_FAILED = "RenderFailed"
    SOURCE_SIGNATURE_REFUSED = "SourceSignatureRefused"
    APPLY_FAILED = "ApplyFailed"
    HEALTH_CHECK_FAILED = "HealthCheckFailed"
    HOOK_FAILED = "HookFailed"
    ROLLED_BACK = "RolledBack"
    ROLLBACK_FAILED = "RollbackFailed"
    INTERRUPTED = "Interrupted"
    OUTPUT_FAILED = "OutputFailed"
    DRIFT_CORRECTION_FAILED = "DriftCorrectionFailed"
    API_UNAVAILABLE = "ApiUnavailable"
    WORKER_FAILED = "WorkerFailed"
    EXPIRED = "Expired"


REASON_HELP: dict[Reason, str] = {
    Reason.HEALTHY: "The applied revision passed its health checks (Ready=True).",
    Reason.PROGRESSING: "The group is moving to a new revision: applying, health-checking or "
    "pruning (Ready=Unknown while it moves).",
    Reason.WAITING_FOR_DEPENDENCY: "A group listed in `dependsOn` is not healthy yet.",
    Reason.AWAITING_APPROVAL: "The group's move needs an approval (a bundle says "
    "`approval: manual`, or the cluster's ApprovalPolicy requires it): the agent made a "
    "BundleDeploymentRequest with a preview and waits for a decision; the group keeps running "
    "its current revision (see docs/approvals.md).",
    Reason.DENIED: "The BundleDeploymentRequest for this move was denied (the message says by "
    "whom and why): the group stays wholly on its current revision until a new publication.",
    Reason.APPROVAL_FAILED: "The approval step itself failed (the preview's dry run or the "
    "request could not be written); retried with backoff.",
    Reason.PAUSED: "The set or a cluster admin paused the bundle: nothing is applied, drift is "
    "only reported.",
    Reason.FETCH_FAILED: "The bundle's content could not be fetched yet (retried with backoff).",
    Reason.RENDER_FAILED: "The bundle's content could not be rendered (refused until the "
    "target changes).",
    Reason.SOURCE_SIGNATURE_REFUSED: "An image source's cosign signature does not satisfy "
    "the cluster's own source policy (`--verify-sources`), whatever the hub vouched for: the "
    "publication is refused whole, as for hostile content, until the branch moves or the "
    "cluster's policy changes (see docs/supply-chain.md).",
    Reason.APPLY_FAILED: "The API server refused an object of the group (the message names "
    "each one). When the dry run refused it, nothing was written.",
    Reason.HEALTH_CHECK_FAILED: "The group did not become healthy within its timeout.",
    Reason.HOOK_FAILED: "A hook of the group (Helm's pre/post install or upgrade, Argo CD's "
    "PreSync/Sync/PostSync) failed or did not complete in time.",
    Reason.ROLLED_BACK: "The move failed and the whole group went back to its previous healthy "
    "revision.",
    Reason.ROLLBACK_FAILED: "Returning the group to its previous revision failed; retried with "
    "backoff.",
    Reason.INTERRUPTED: "The agent stopped in the middle of a move; the group went back to its "
    "previous revision and the target is tried again.",
    Reason.OUTPUT_FAILED: "The revision is applied and healthy but a declared output could not "
    "be read.",
    Reason.DRIFT_CORRECTION_FAILED: "Putting drifted objects back failed.",
    Reason.API_UNAVAILABLE: "The API server (or an API it aggregates) did not answer; retried "
    "with backoff.",
    Reason.WORKER_FAILED: "The agent's worker process died (killed, out of memory) or hung "
    "past `--worker-timeout`; retried with backoff, and a move it interrupted is finished or "
    "rolled back (Progressing and Degraded; Ready keeps what it said).",
    Reason.EXPIRED: "The publication this cluster runs has expired and no newer one was "
    "accepted (the hub stopped publishing, or the git server is away): the agent keeps running "
    "and correcting what it has, and says so until a newer publication arrives.",
}
"""One line per reason, for the API reference."""


RunResult = Literal["Running", "Succeeded", "Failed", "RolledBack"]
"""How a run ended: the one vocabulary of BundleDeployment ``status.lastRun``, the run
history in the cluster and the status document."""

RUNNING: RunResult = "Running"
SUCCEEDED: RunResult = "Succeeded"
FAILED: RunResult = "Failed"
ROLLED_BACK: RunResult = "RolledBack"


class Phase(StrEnum):
    """What is happening to a bundle now (``status.phase``, the PHASE column of
    ``kubectl get bd``)."""

    PENDING = "Pending"
    WAITING = "Waiting"
    PAUSED = "Paused"
    AWAITING_APPROVAL = "AwaitingApproval"
    DENIED = "Denied"
    APPLYING = "Applying"
    HEALTH_CHECKING = "HealthChecking"
    ROLLING_BACK = "RollingBack"
    READY = "Ready"
    FAILED = "Failed"
    ROLLED_BACK = "RolledBack"


__all__ = [
    "FAILED",
    "REASON_HELP",
    "ROLLED_BACK",
    "RUNNING",
    "SUCCEEDED",
    "Phase",
    "Reason",
    "RunResult",
]
