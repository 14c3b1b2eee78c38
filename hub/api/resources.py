"""What the hub API answers, as typed resources: the one description of each answer's shape.

:mod:`hub.api.openapi` derives the OpenAPI document's schemas from these TypedDicts (see
:mod:`hub.api._schema` for the rules), :mod:`hub.api.endpoints` names which endpoint answers
which, and ``tests/test_hub_api.py`` checks every real answer against the document. A field
added to an answer goes here first, or that test fails.
"""

# No `from __future__ import annotations` here: TypedDict reads Required/NotRequired from the
# evaluated annotations (strings would leave every key required).
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from hub.api._schema import Doc, Extra

State = Literal[
    "Ready",
    "Progressing",
    "AwaitingApproval",
    "Denied",
    "Degraded",
    "RolledBack",
    "Paused",
    "Stale",
]
"""An installation's state (:data:`hub.status.document.STATES`; a test keeps them equal)."""

Check = Literal[
    "agent",
    "publication",
    "rollout",
    "stale",
    "approval",
    "dependency",
    "failure",
    "paused",
    "moving",
    "ok",
]


NotifyChannel = Annotated[
    Literal["up", "down"] | None,
    Doc(
        "the agent's notification channel to the hub: `up` (told of moves at once), `down` "
        "(polling while it reconnects); null: no channel configured, the agent only polls"
    ),
]


class Error(TypedDict):
    """Every answer that is not a success."""

    error: Annotated[str, Doc("what was wrong, in one line")]


class Cluster(TypedDict):
    """A cluster as its agent last reported it."""

    name: str
    heartbeat: Annotated[str | None, Extra(format="date-time")]
    heartbeatAgeSeconds: NotRequired[float | None]
    stale: bool
    agentVersion: NotRequired[str | None]
    sequence: NotRequired[int | None]
    lastAcceptedSerial: NotRequired[int | None]
    lastRefusal: NotRequired[dict[str, Any] | None]
    installations: NotRequired[int]
    labels: NotRequired[
        Annotated[
            dict[str, str], Doc("the cluster's labels in the fleet repo (`hub serve --fleet`)")
        ]
    ]
    error: Annotated[str | None, Doc("why the last document was unusable")]
    notifyChannel: NotRequired[NotifyChannel]


class RunBrief(TypedDict, total=False):
    id: str
    operation: str | None
    result: str | None
    finishedAt: str | None


class InstallationSummary(TypedDict):
    cluster: str
    bundle: str
    name: NotRequired[Annotated[str, Doc("CLUSTER/BUNDLE")]]
    group: NotRequired[str | None]
    state: State
    appliedSerial: NotRequired[int | None]
    lastRun: NotRequired[RunBrief | None]
    lastSuccessfulRun: NotRequired[str | None]
    driftCount: NotRequired[int]
    notifyChannel: NotRequired[NotifyChannel]


class Output(TypedDict):
    name: str
    value: Annotated[Any, Doc("the value; `<sensitive>` unless the token is admin")]
    sensitive: bool
    omitted: NotRequired[bool]


class Run(TypedDict):
    id: str
    operation: NotRequired[str]
    serial: NotRequired[int | None]
    sourceDigests: NotRequired[list[str]]
    startedAt: NotRequired[str | None]
    finishedAt: NotRequired[str | None]
    result: str
    failedObject: NotRequired[str | None]
    message: NotRequired[str | None]
    counts: NotRequired[dict[str, Any] | None]
    outputs: list[Output]


class Installation(InstallationSummary):
    conditions: list[dict[str, Any]]
    appliedRevision: NotRequired[dict[str, Any] | None]
    lastHealthyRevision: NotRequired[dict[str, Any] | None]
    health: NotRequired[dict[str, Any] | None]
    runs: list[Run]
    requests: NotRequired[
        Annotated[
            list[dict[str, Any]],
            Doc(
                "approval requests of the installation's group (pending and the newest decided "
                "ones): name, serial, state, decidedBy, decidedAt, reason, policy, rule, preview "
                "(docs/approvals.md)"
            ),
        ]
    ]


class Page(TypedDict):
    total: NotRequired[Annotated[int, Doc("every matching item")]]
    offset: NotRequired[int]
    limit: NotRequired[int]


class ClusterList(Page):
    items: list[Cluster]


class InstallationList(Page):
    items: list[InstallationSummary]


class RunList(TypedDict):
    installation: str
    items: list[Run]


class OutputList(TypedDict):
    installation: str
    run: str
    result: NotRequired[str | None]
    items: list[Output]


class MatrixRow(Cluster):
    cells: Annotated[
        dict[str, State], Doc("bundle -> state, for the shown bundles the cluster has")
    ]


class FleetCounts(TypedDict, total=False):
    """The whole fleet, unfiltered."""

    clusters: int
    stale: int
    errors: int


class Matrix(TypedDict):
    bundles: Annotated[list[str], Doc("the columns: every bundle, or the one filtered on")]
    allBundles: list[str]
    labels: Annotated[dict[str, list[str]], Doc("every label key with its values")]
    fleet: FleetCounts
    total: Annotated[int, Doc("clusters matching the filters")]
    offset: NotRequired[int]
    limit: NotRequired[int]
    states: Annotated[
        dict[str, int], Doc("shown cells of every matching cluster, by state (every state a key)")
    ]
    items: list[MatrixRow]


class Finding(TypedDict):
    check: Check
    blocking: bool
    summary: Annotated[str, Doc("one line")]
    bundle: NotRequired[str]
    details: NotRequired[list[str]]
    unblock: NotRequired[Annotated[str, Doc("the command that would unblock it")]]


class Explanation(TypedDict):
    """Why the cluster is not running the latest (docs/operations.md, "Why is this not running
    the latest"): the first blocking finding, and every finding in the order checked."""

    cluster: str
    bundle: NotRequired[str | None]
    blocked: bool
    reason: Finding | None
    findings: list[Finding]
    rolloutsRead: Annotated[bool, Doc("false: the hub runs no rollouts")]
    notes: NotRequired[list[str]]


# --- rollouts (hub serve --rollouts) --------------------------------------------------------


class RolloutWave(TypedDict):
    name: str
    pauseBefore: bool
    startedAt: NotRequired[str | None]
    settledAt: NotRequired[str | None]
    promotedBy: NotRequired[str | None]
    promotedAt: NotRequired[str | None]
    clusters: int
    counts: Annotated[dict[str, int], Doc("clusters by verdict")]


RolloutStatus = Literal[
    "Progressing",
    "WaitingForPromotion",
    "Paused",
    "Halted",
    "Completed",
    "Reverted",
    "Aborted",
    "Superseded",
]
"""A rollout's status (:data:`hub.rollout.state.STATUSES`; a test keeps them equal)."""


class RolloutSummary(TypedDict):
    id: str
    group: str
    status: RolloutStatus
    createdAt: NotRequired[str]
    createdBy: NotRequired[str]
    updatedAt: NotRequired[str]
    source: NotRequired[dict[str, Any]]
    strategy: NotRequired[dict[str, Any]]
    clusters: NotRequired[int]
    counts: Annotated[dict[str, int], Doc("clusters by verdict")]
    currentWave: NotRequired[str | None]
    waves: list[RolloutWave]
    failures: NotRequired[dict[str, Any]]
    halt: NotRequired[
        Annotated[
            dict[str, Any] | None,
            Doc("why it halted: at, reason, failures (cluster -> reason)"),
        ]
    ]
    lastEvent: NotRequired[dict[str, Any] | None]


class Rollout(RolloutSummary):
    events: list[dict[str, Any]]
    members: Annotated[
        dict[str, Any],
        Doc("a page of the member clusters: cluster, wave, phase, serial, verdict, reason"),
    ]
    controller: NotRequired[dict[str, Any]]


class RolloutList(TypedDict):
    items: list[RolloutSummary]
    controller: NotRequired[dict[str, Any]]


class RolloutAction(TypedDict):
    """Recorded; the controller carries it out."""

    rollout: RolloutSummary
    event: dict[str, Any]


class ActionBody(TypedDict, total=False):
    reason: Annotated[str, Extra(maxLength=1000)]


# --- enrollment (hub serve --enroll) ---------------------------------------------------------


class EnrollmentRequest(TypedDict):
    """An enrollment request as the hub holds it (hub.enroll.service)."""

    cluster: str
    token: Annotated[str, Doc("the enrollment token's id")]
    labels: Annotated[dict[str, str], Doc("what the cluster gets: its claim and the token's")]
    facts: Annotated[
        dict[str, Any], Doc("as reported: kubernetesVersion, apiGroupVersions, formats")
    ]
    state: Literal["pending", "accepted", "denied"]
    requestedAt: str
    decidedAt: NotRequired[str]
    decidedBy: NotRequired[
        Annotated[str, Doc("the API token's name; token:ID (policy) when accepted by the token")]
    ]
    reason: NotRequired[Annotated[str, Doc("given with a denial")]]
    waiting: NotRequired[
        Annotated[str, Doc("why the token's policy left a pending request waiting")]
    ]
    inventoryBranch: NotRequired[
        Annotated[
            str,
            Doc("the branch holding the inventory change (commit: branch), e.g. enroll/shop-1"),
        ]
    ]
    pendingMerge: NotRequired[
        Annotated[
            bool,
            Doc("true until the fleet branch's inventory names the cluster (the branch merged)"),
        ]
    ]


class EnrollmentAnswer(EnrollmentRequest):
    """An enrollment request; once accepted, with what the cluster needs to install."""

    config: NotRequired[
        Annotated[
            dict[str, Any],
            Doc("repo, statusRepo, identity, issuer, trustedRoot, hubPublicKey"),
        ]
    ]
    sealedCredentials: NotRequired[
        Annotated[
            str,
            Doc("the git credentials sealed to the cluster's key (libsodium sealed box, base64)"),
        ]
    ]


class EnrollmentSubmission(TypedDict):
    """The agent's request, signed with the key it carries (header Fleetlet-Signature)."""

    cluster: str
    labels: NotRequired[Annotated[dict[str, str], Doc("the labels it claims")]]
    facts: NotRequired[dict[str, Any]]
    publicKey: Annotated[str, Doc("the cluster's Ed25519 public key, base64")]
    nonce: Annotated[str, Doc("32 to 64 random lowercase hex digits, never sent twice")]
    issuedAt: Annotated[str, Doc("the time it was made, UTC; within 300 s of the hub's")]


class EnrollmentList(TypedDict):
    items: list[EnrollmentRequest]


class OpenAPIDocument(TypedDict, total=False):
    """This document."""

    openapi: str
