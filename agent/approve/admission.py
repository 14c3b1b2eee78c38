"""What the API server enforces about approvals, as the objects that make it do so.

- :func:`policy_objects`: the ValidatingAdmissionPolicy ``fleetlet-approvals`` (CEL, evaluated
  by kube-apiserver itself, no webhook) and its binding. On BundleDeploymentRequests:

  - ``spec.requestedBy`` must be the user creating the request (the agent trusts only its own);
  - any change to the status needs the custom verb ``approve`` (people, the auto-approver) or
    ``supersede`` (the agent) on that request: plain RBAC on the status is not enough;
  - a decision needs ``approve`` on that very request (named-resource RBAC works), and
    ``status.decidedBy`` must be the user making it (it cannot be forged);
  - marking a request ``Superseded`` needs ``supersede``.

  That a decision is final, that a superseded request takes no decision and that the spec never
  changes are rules of the CRD itself (:mod:`agent.api.approvals`).
- :func:`approver_objects`: the ClusterRole ``fleetlet-approver`` for the people who decide,
  and the Role ``fleetlet-preview-reader`` of the agent's namespace (whole diffs).
- :func:`auto_approver_objects`: opt-in, the ServiceAccount the agent approves as when a rule
  of the cluster's ApprovalPolicy matches, holding ``fleetlet-approver``.

``fleetlet agent install`` applies the first two (:mod:`agent.install.manifests`), which also
writes them to ``deploy/agent/approvals/`` and ``deploy/agent/auto-approver/``.
"""

from __future__ import annotations

from typing import Any

from agent.api.approvals import DEFAULT_APPROVER

Object = dict[str, Any]

POLICY = "fleetlet-approvals"
APPROVER_ROLE = "fleetlet-approver"
PREVIEW_READER = "fleetlet-preview-reader"
_LABELS = {"app.kubernetes.io/part-of": "fleetlet"}

_SUPERSEDED_NOW = (
    "has(object.status) && has(object.status.conditions) && "
    "object.status.conditions.exists(c, c.type == 'Superseded' && c.status == 'True')"
)
_SUPERSEDED_BEFORE = (
    "has(oldObject.status) && has(oldObject.status.conditions) && "
    "oldObject.status.conditions.exists(c, c.type == 'Superseded' && c.status == 'True')"
)
_USER = "request.userInfo.username"
_NAME = "object.metadata.name"


def _meta(name: str, namespace: str | None = None, **extra: Any) -> Object:
    meta: Object = {"name": name, "labels": dict(_LABELS), **extra}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _rule(expression: str, message: str) -> Object:
    return {"expression": expression, "messageExpression": message, "reason": "Forbidden"}


def policy_objects() -> list[Object]:
    """The ValidatingAdmissionPolicy ``fleetlet-approvals`` and its binding (Deny)."""
    variables = [
        ("updating", "request.operation == 'UPDATE'"),
        ("decided", "has(object.status) && has(object.status.decision)"),
        (
            "wasDecided",
            "variables.updating && has(oldObject.status) && has(oldObject.status.decision)",
        ),
        ("deciding", "variables.updating && variables.decided && !variables.wasDecided"),
        (
            "superseding",
            f"variables.updating && {_SUPERSEDED_NOW} && !({_SUPERSEDED_BEFORE})",
        ),
        (
            "request",
            f"authorizer.group('fleetlet.io').resource('bundledeploymentrequests').name({_NAME})",
        ),
        ("mayApprove", "variables.request.check('approve').allowed()"),
        ("maySupersede", "variables.request.check('supersede').allowed()"),
    ]
    validations = [
        _rule(
            f"variables.updating || object.spec.requestedBy == {_USER}",
            f"'spec.requestedBy must name the user creating the request (' + {_USER} + ')'",
        ),
        _rule(
            "!variables.updating || variables.mayApprove || variables.maySupersede",
            f"'user ' + {_USER} + ' may not change the status of BundleDeploymentRequest ' + "
            f"{_NAME} + ': that needs the verb approve on it (ClusterRole {APPROVER_ROLE})'",
        ),
        _rule(
            "!variables.deciding || variables.mayApprove",
            f"'user ' + {_USER} + ' may not decide BundleDeploymentRequest ' + {_NAME} + "
            f"': approving or denying needs the verb approve on it (ClusterRole "
            f"{APPROVER_ROLE})'",
        ),
        _rule(
            f"!variables.deciding || object.status.decidedBy == {_USER}",
            f"'status.decidedBy must be the user deciding (' + {_USER} + '), not ' + "
            "object.status.decidedBy",
        ),
        _rule(
            "!variables.superseding || variables.maySupersede",
            f"'user ' + {_USER} + ' may not mark BundleDeploymentRequest ' + {_NAME} + "
            "' Superseded: that needs the verb supersede (the agent)'",
        ),
    ]
    policy: Object = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta(POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["fleetlet.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE"],
                        "resources": ["bundledeploymentrequests"],
                    },
                    {
                        "apiGroups": ["fleetlet.io"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["bundledeploymentrequests/status"],
                    },
                ]
            },
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "validations": validations,
        },
    }
    binding: Object = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _meta(POLICY),
        "spec": {"policyName": POLICY, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def approver_objects(namespace: str) -> list[Object]:
    """ClusterRole ``fleetlet-approver`` (read requests, update their status, the verb
    ``approve``) and Role ``fleetlet-preview-reader`` (get ConfigMaps of the agent's
    namespace, where whole diffs are kept)."""
    approver: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(APPROVER_ROLE),
        "rules": [
            {
                "apiGroups": ["fleetlet.io"],
                "resources": ["bundledeploymentrequests"],
                "verbs": ["get", "list", "watch", "approve"],
            },
            {
                "apiGroups": ["fleetlet.io"],
                "resources": ["bundledeploymentrequests/status"],
                "verbs": ["get", "update", "patch"],
            },
        ],
    }
    reader: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(PREVIEW_READER, namespace),
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    }
    return [approver, reader]


def auto_approver_objects(namespace: str, name: str = DEFAULT_APPROVER) -> list[Object]:
    """Opt-in: the ServiceAccount the agent approves as (an ApprovalPolicy's ``approver``)
    and its binding to ``fleetlet-approver``."""
    account: Object = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(name, namespace),
    }
    binding: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _meta(
            name,
            annotations={
                "fleetlet.io/opt-in": "requests an ApprovalPolicy rule matches are approved "
                "without a person"
            },
        ),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": APPROVER_ROLE,
        },
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    return [account, binding]


__all__ = [
    "APPROVER_ROLE",
    "POLICY",
    "PREVIEW_READER",
    "approver_objects",
    "auto_approver_objects",
    "policy_objects",
]
