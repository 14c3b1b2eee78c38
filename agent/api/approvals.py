"""The approval API: ``BundleDeploymentRequest`` and ``ApprovalPolicy`` (fleetlet.io/v1alpha1).

A **BundleDeploymentRequest** is the agent asking to move one lockstep group, in the manner of
cert-manager's CertificateRequest: its spec (immutable, written once by the agent) pins what
would be applied (the set digest, each bundle's spec and content digests) and carries the
preview of what that does to the live cluster; its status is the decision (``Approved`` or
``Denied``, final), written by a person or by the cluster's automatic approver, and
``Superseded`` when a newer publication replaced the request before anyone decided. Who may
decide is enforced by the API server (the ValidatingAdmissionPolicy in
``deploy/agent/approvals/``), not by these types: they only state the shape and what may never
change.

An **ApprovalPolicy** is the cluster admin's own rule book: whether every move needs an approval
on this cluster, and CEL rules over a request's preview that approve it automatically.

The types follow :mod:`agent.api.models` (one declaration per field drives validation, the CRD
schemas and ``docs/api.md``).
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from agent.api.models import (
    API_VERSION_PATTERN,
    DIGEST,
    DIGEST_TEXT,
    DNS_LABEL,
    DNS_LABEL_TEXT,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_TEXT,
    KIND,
    MAX_NAMES,
    OBJECT_NAME,
    Condition,
)
from agent.api.validation import ApiObject, Rule, api_field

ObjectAction = Literal["created", "changed", "deleted", "refused"]
"""What a move does to one object (``refused``: the server-side dry run refused it, so the move
would fail on it)."""
PreviewSource = Literal["live", "rendered"]
Decision = Literal["Approved", "Denied"]

MAX_DIFF = 4096
"""Characters of one object's diff kept in a request (the rest in the full-diff ConfigMap)."""
MAX_LISTED = 500
"""Objects listed in a preview (created, changed, deleted or refused; unchanged are counted)."""
MAX_FINDINGS = 100
MAX_PATHS = 32
DEFAULT_APPROVER = "fleetlet-auto-approver"

# --- the preview ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectChange(ApiObject):
    """One object a move creates, changes, deletes, or that the dry run refused."""

    bundle: str = api_field(
        "The bundle the object belongs to.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    api_version: str = api_field(
        "apiVersion of the object.",
        pattern=API_VERSION_PATTERN,
        max_length=253,
        expected="an apiVersion such as apps/v1",
    )
    kind: str = api_field("Kind of the object.", pattern=KIND, max_length=63, expected="a Kind")
    namespace: str | None = api_field(
        "Namespace (namespaced kinds).",
        default=None,
        pattern=DNS_LABEL,
        max_length=63,
        expected=DNS_LABEL_TEXT,
    )
    name: str = api_field(
        "Name of the object.", pattern=OBJECT_NAME, max_length=253, expected="an object name"
    )
    action: ObjectAction = api_field("What the move does to it.")
    paths: tuple[str, ...] = api_field(
        f"The fields that change (`spec.template.spec.containers[0].image`); at most "
        f"{MAX_PATHS}, the last one `...` when there are more.",
        default=(),
        max_length=512,
        max_items=MAX_PATHS,
    )
    diff: str = api_field(
        f"A unified diff of the object (live or previous, against the server-side dry run's "
        f"answer; Secret values redacted), at most {MAX_DIFF} characters.",
        default="",
        max_length=MAX_DIFF + 64,
    )
    truncated: bool = api_field(
        "The diff was cut here: the whole one is in the preview's `fullDiff` ConfigMap.",
        default=False,
    )

    @property
    def target(self) -> str:
        """``Kind namespace/name``."""
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding(ApiObject):
    """Something a cluster admin should know before approving (an RBAC grant, a CRD, ...)."""

    bundle: str = api_field(
        "The bundle the object belongs to.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    object: str = api_field("The object: `Kind namespace/name`.", max_length=512)
    action: ObjectAction = api_field("What the move does to it.")
    details: tuple[str, ...] = api_field(
        "What it grants or changes, one fact each (`cluster-wide`, `verbs: *`, `escalate`, "
        "`secrets: get`, `privileged container web`, `hostPath /var/run`...).",
        default=(),
        max_length=256,
        max_items=16,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SecuritySummary(ApiObject):
    """What a move grants or changes that matters to the cluster's security."""

    rbac: tuple[Finding, ...] = api_field(
        "Roles and ClusterRoles added or widened (with the wildcards, `escalate`, `bind`, "
        "`impersonate` and secrets access they grant), bindings added or changed, and what "
        "grants without a binding: ServiceAccount token Secrets, hostPath PersistentVolumes.",
        default=(),
        max_items=MAX_FINDINGS,
    )
    crds: tuple[Finding, ...] = api_field(
        "CustomResourceDefinitions added or changed.", default=(), max_items=MAX_FINDINGS
    )
    webhooks: tuple[Finding, ...] = api_field(
        "Admission webhooks and admission policies added or changed, APIServices served by a "
        "Service, Namespaces whose Pod Security `enforce` level is relaxed.",
        default=(),
        max_items=MAX_FINDINGS,
    )
    privileged: tuple[Finding, ...] = api_field(
        "Pod specs that gain privileges: privileged or privilege-escalating containers, added "
        "capabilities, hostPath volumes, host network, PID or IPC.",
        default=(),
        max_items=MAX_FINDINGS,
    )
    namespaces: tuple[Finding, ...] = api_field(
        "Namespaces created.", default=(), max_items=MAX_FINDINGS
    )

    @property
    def total(self) -> int:
        """How many findings in all."""
        return sum(
            len(f) for f in (self.rbac, self.crds, self.webhooks, self.privileged, self.namespaces)
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestPreview(ApiObject):
    """What approving the request does to the cluster: per object, and for its security."""

    source: PreviewSource = api_field(
        "`live`: a server-side dry run against the live cluster (the agent); `rendered`: the "
        "rendered sets compared with each other (`fleetlet hub diff`).",
        default="live",
    )
    created: int = api_field("Objects created.", default=0, minimum=0)
    changed: int = api_field("Objects changed.", default=0, minimum=0)
    deleted: int = api_field("Objects deleted (no longer in the bundle).", default=0, minimum=0)
    unchanged: int = api_field("Objects already as they would be.", default=0, minimum=0)
    refused: int = api_field(
        "Objects the server-side dry run refused: the move would fail on them.",
        default=0,
        minimum=0,
    )
    findings: int = api_field("Findings of the security summary, in all.", default=0, minimum=0)
    security: SecuritySummary = api_field(
        "What matters to the cluster's security.", default=SecuritySummary()
    )
    objects: tuple[ObjectChange, ...] = api_field(
        f"Each object created, changed, deleted or refused (at most {MAX_LISTED}; unchanged "
        "objects are only counted).",
        default=(),
        max_items=MAX_LISTED,
    )
    omitted: int = api_field(
        "Objects created, changed, deleted or refused that are not listed (over the bound).",
        default=0,
        minimum=0,
    )
    full_diff: str | None = api_field(
        "ConfigMap in the agent's namespace holding every object's whole diff, when one was "
        "cut here (`fleetlet preview --full`).",
        default=None,
        pattern=DNS_SUBDOMAIN,
        expected=DNS_SUBDOMAIN_TEXT,
        max_length=253,
    )


# --- the request ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class BundlePin(ApiObject):
    """What exactly one bundle of the group would become."""

    name: str = api_field(
        "The bundle (its BundleDeployment's name).",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    spec_digest: str = api_field(
        "Digest of the bundle's spec and group as the set gives them.",
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        max_length=71,
    )
    content_digest: str = api_field(
        "Digest of the bundle's rendered objects: what would be applied, byte for byte.",
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        max_length=71,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentRequestSpec(ApiObject):
    """A request to move one lockstep group to exactly these pins. Written once by the agent;
    immutable."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self == oldSelf",
            expected="an unchanged spec (a request pins what is approved; the agent makes a "
            "new one)",
            check=None,
            transition=True,
        ),
    )

    cluster: str = api_field(
        "The cluster (the agent's own).",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    group: str = api_field(
        "The lockstep group that would move.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    serial: int = api_field(
        "Serial of the set the group would move to.", minimum=1, maximum=2**53 - 1
    )
    set_digest: str = api_field(
        "Digest of that set's canonical bytes: an approval holds for this set only.",
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        max_length=71,
    )
    requested_by: str = api_field(
        "The user who created the request (the API server checks it is the requesting user): "
        "the agent trusts only requests it made itself.",
        max_length=253,
        min_length=1,
    )
    bundles: tuple[BundlePin, ...] = api_field(
        "Every bundle of the group, pinned.",
        min_items=1,
        max_items=MAX_NAMES,
        list_type="map",
        list_keys=("name",),
    )
    reasons: tuple[str, ...] = api_field(
        "Why the move needs an approval (`approval: manual` on a bundle, an ApprovalPolicy).",
        default=(),
        max_length=1024,
        max_items=64,
    )
    preview: RequestPreview = api_field(
        "What the move does to the cluster.", default=RequestPreview()
    )


def _true(kind: str) -> str:
    return (
        f"(has(self.conditions) && self.conditions.exists(c, c.type == '{kind}' "
        f"&& c.status == 'True'))"
    )


def _was(kind: str) -> str:
    return (
        f"(has(oldSelf.conditions) && oldSelf.conditions.exists(c, c.type == '{kind}' "
        f"&& c.status == 'True'))"
    )


def _has(status: BundleDeploymentRequestStatus, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in status.conditions)


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentRequestStatus(ApiObject):
    """The decision on a request: final once made. ``Superseded``: a newer publication
    replaced the request before a decision.

    Who may decide is enforced by the API server: the ValidatingAdmissionPolicy
    ``fleetlet-approvals`` lets only a user holding the custom verb ``approve`` on the request
    set a decision, and only with ``decidedBy`` naming that very user.
    """

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=f"!({_true('Approved')} && {_true('Denied')})",
            expected="not both Approved and Denied",
            check=lambda s: not (_has(s, "Approved") and _has(s, "Denied")),
            field="conditions",
        ),
        Rule(
            cel=f"has(self.decision) == ({_true('Approved')} || {_true('Denied')})",
            expected="a decision exactly when the Approved or Denied condition is True",
            check=lambda s: (s.decision is not None) == (_has(s, "Approved") or _has(s, "Denied")),
            field="decision",
        ),
        Rule(
            cel=f"!has(self.decision) || (self.decision == 'Approved') == {_true('Approved')}",
            expected="decision Approved with the Approved condition, Denied with Denied",
            check=lambda s: s.decision is None or (s.decision == "Approved") == _has(s, "Approved"),
            field="decision",
        ),
        Rule(
            cel="has(self.decidedBy) == has(self.decision)",
            expected="decidedBy set exactly with a decision",
            check=lambda s: (s.decided_by is not None) == (s.decision is not None),
            field="decidedBy",
        ),
        Rule(
            cel="!has(self.decision) || self.decision != 'Denied' || "
            "(has(self.reason) && self.reason.size() > 0)",
            expected="a reason with a denial",
            check=lambda s: s.decision != "Denied" or bool(s.reason),
            field="reason",
        ),
        Rule(
            cel="has(self.rule) == has(self.policy) && "
            "(!has(self.policy) || (has(self.decision) && self.decision == 'Approved'))",
            expected="policy and rule together, and only on an approval",
            check=lambda s: (
                (s.rule is None) == (s.policy is None)
                and (s.policy is None or s.decision == "Approved")
            ),
            field="policy",
        ),
        Rule(
            cel="!has(oldSelf.decision) || (has(self.decision) && self.decision == "
            "oldSelf.decision && self.decidedBy == oldSelf.decidedBy)",
            expected="a decision to stay as it is (it is final)",
            check=None,
            field="decision",
            transition=True,
        ),
        Rule(
            cel=f"!{_was('Superseded')} || has(oldSelf.decision) || !has(self.decision)",
            expected="no decision on a superseded request (the agent made a newer one)",
            check=None,
            field="decision",
            transition=True,
        ),
        Rule(
            cel=f"!{_was('Superseded')} || {_true('Superseded')}",
            expected="a superseded request to stay superseded",
            check=None,
            field="conditions",
            transition=True,
        ),
    )

    conditions: tuple[Condition, ...] = api_field(
        "`Approved`, `Denied` (True once decided), `Superseded` (True when a newer "
        "publication replaced the request).",
        default=(),
        max_items=8,
        list_type="map",
        list_keys=("type",),
    )
    decision: Decision | None = api_field("`Approved` or `Denied`; final.", default=None)
    decided_by: str | None = api_field(
        "The user who decided, as the API server authenticated them.",
        default=None,
        max_length=253,
        min_length=1,
    )
    decided_at: datetime | None = api_field("When the decision was made.", default=None)
    reason: str | None = api_field("Why (required with a denial).", default=None, max_length=1024)
    policy: str | None = api_field(
        "The ApprovalPolicy that approved the request automatically.",
        default=None,
        pattern=DNS_SUBDOMAIN,
        expected=DNS_SUBDOMAIN_TEXT,
        max_length=253,
    )
    rule: str | None = api_field(
        "The rule of that policy that matched.",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )


# --- the cluster's automatic approvals ------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalRule(ApiObject):
    """One automatic approval: a CEL expression over the request; true approves it."""

    name: str = api_field(
        "Name of the rule (recorded on the requests it approves).",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    expression: str = api_field(
        "CEL over `preview` (the request's preview: counts, `security.rbac`, `security.crds`, "
        "..., `objects` with `action` and `paths`) and `request` (`group`, `serial`, "
        "`bundles`, `reasons`); true approves, e.g. `preview.findings == 0`.",
        min_length=1,
        max_length=4096,
    )
    description: str = api_field(
        "What the rule lets through, for a person.", default="", max_length=1024
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalPolicySpec(ApiObject):
    """How this cluster approves moves: required or not, and which ones automatically."""

    require_approval: bool = api_field(
        "Every move of every group on this cluster needs an approved request, not only the "
        "bundles with `approval: manual`.",
        default=False,
    )
    rules: tuple[ApprovalRule, ...] = api_field(
        "Automatic approvals, tried in order; the first rule that is true approves a pending "
        "request (nothing matches: a person decides).",
        default=(),
        max_items=32,
        list_type="map",
        list_keys=("name",),
    )
    approver: str = api_field(
        "ServiceAccount of the agent's namespace the agent acts as to approve; the cluster "
        "admin grants it the verb `approve` (ClusterRole fleetlet-approver).",
        default=DEFAULT_APPROVER,
        pattern=DNS_SUBDOMAIN,
        expected=DNS_SUBDOMAIN_TEXT,
        max_length=253,
    )


__all__ = [
    "DEFAULT_APPROVER",
    "MAX_DIFF",
    "MAX_FINDINGS",
    "MAX_LISTED",
    "MAX_PATHS",
    "ApprovalPolicySpec",
    "ApprovalRule",
    "BundleDeploymentRequestSpec",
    "BundleDeploymentRequestStatus",
    "BundlePin",
    "Decision",
    "Finding",
    "ObjectAction",
    "ObjectChange",
    "RequestPreview",
    "SecuritySummary",
]
