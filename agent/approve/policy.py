"""The cluster admin's ApprovalPolicies: which moves need an approval, which are approved
automatically.

Every ``ApprovalPolicy`` of the cluster counts (they are few, cluster-scoped, and read once per
pass). A policy with ``requireApproval`` makes every move need an approved request. A pending
request is approved automatically when a rule's CEL expression is true: policies by name, rules
in their order, the first that matches wins, and the agent approves as that policy's approver
ServiceAccount (impersonated; the cluster admin grants it the verb ``approve``), recording the
policy and the rule. An expression that does not compile, fails or is not a boolean matches
nothing and is reported.

CEL is evaluated with ``cel-python`` (``celpy``), imported only when a rule is evaluated. An
expression sees ``preview`` (the request's preview as JSON, every field present, fields at
their default included) and ``request`` (``cluster``, ``group``, ``serial``, ``setDigest``,
``bundles``: the bundle names, ``reasons``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent.api import API_GROUP, API_VERSION, format_time, from_dict
from agent.api.approvals import ApprovalPolicySpec
from agent.api.validation import ApiObject, fields_of
from agent.approve.request import Request
from agent.errors import FleetletError
from agent.kube import ApiNotServedError, KubeClient

log = logging.getLogger(__name__)

GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "ApprovalPolicy"


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One ApprovalPolicy as read from the cluster."""

    name: str
    spec: ApprovalPolicySpec
    resource_version: str = ""
    """As read: ``agent run``'s supervisor compares it to tell a changed policy (which may
    approve, or stop requiring approval of, a waiting move)."""


@dataclass(frozen=True, kw_only=True)
class Match:
    """The rule that approves a request: its policy, its name, who approves."""

    policy: str
    rule: str
    approver: str


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the policies say of a request: the first rule that matched (or None), and every
    rule that could not be evaluated (``policy/rule: why``)."""

    match: Match | None
    problems: tuple[str, ...] = ()


def load(kube: KubeClient) -> list[Policy]:
    """The cluster's ApprovalPolicies, by name (none when the CRD is not installed; a
    malformed one is skipped and logged). Raises the KubeClient's errors."""
    try:
        items = kube.list(GROUP_VERSION, KIND)
    except ApiNotServedError:
        return []
    found = []
    for obj in items:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        try:
            spec = from_dict(ApprovalPolicySpec, obj.get("spec") or {}, origin=f"{KIND} {name}")
        except FleetletError as exc:
            log.warning("ignoring malformed ApprovalPolicy %s: %s", name, exc)
            continue
        version = str(meta.get("resourceVersion") or "")
        found.append(Policy(name=name, spec=spec, resource_version=version))
    return sorted(found, key=lambda p: p.name)


def required_by(policies: Iterable[Policy]) -> list[str]:
    """Why every move needs an approval here, one reason per policy that says so."""
    return [
        f"ApprovalPolicy {p.name} requires an approval of every move (requireApproval)"
        for p in policies
        if p.spec.require_approval
    ]


def as_json(value: Any) -> Any:
    """An API object as JSON with every field present (defaults included, None left out):
    what a CEL expression may index without ``has()``."""
    if isinstance(value, ApiObject):
        out = {}
        for spec in fields_of(type(value)):
            item = getattr(value, spec.attr)
            if item is not None:
                out[spec.name] = as_json(item)
        return out
    if isinstance(value, tuple | list):
        return [as_json(v) for v in value]
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    return value


def activation(request: Request) -> dict[str, Any]:
    """The variables a rule sees for ``request``."""
    spec = request.spec
    return {
        "preview": as_json(spec.preview),
        "request": {
            "cluster": spec.cluster,
            "group": spec.group,
            "serial": spec.serial,
            "setDigest": spec.set_digest,
            "bundles": [p.name for p in spec.bundles],
            "reasons": list(spec.reasons),
        },
    }


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> Any:
    import celpy

    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def evaluate(expression: str, variables: Mapping[str, Any]) -> bool:
    """The boolean value of a CEL expression. Raises ValueError (does not compile, fails
    on these variables, or is not a boolean: the message says which)."""
    import celpy
    from celpy.adapter import json_to_cel

    try:
        program = _program(expression)
    except Exception as exc:  # celpy's parse errors: converted once, here
        raise ValueError(f"does not compile: {_one_line(exc)}") from exc
    try:
        result = program.evaluate({k: json_to_cel(v) for k, v in variables.items()})
    except Exception as exc:  # celpy's evaluation errors
        raise ValueError(f"failed: {_one_line(exc)}") from exc
    if isinstance(result, Exception):
        raise ValueError(f"failed: {_one_line(result)}")
    if not isinstance(result, celpy.celtypes.BoolType):
        raise ValueError(f"is not a boolean: {type(result).__name__} {result!r:.80}")
    return bool(result)


def judge(policies: Sequence[Policy], request: Request) -> Verdict:
    """The first rule of the policies (by name, rules in order) true for ``request``."""
    variables = activation(request)
    problems = []
    for policy in policies:
        for rule in policy.spec.rules:
            try:
                matched = evaluate(rule.expression, variables)
            except ValueError as exc:
                problems.append(f"ApprovalPolicy {policy.name} rule {rule.name} {exc}")
                continue
            if matched:
                return Verdict(
                    match=Match(policy=policy.name, rule=rule.name, approver=policy.spec.approver),
                    problems=tuple(problems),
                )
    return Verdict(match=None, problems=tuple(problems))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def has_rules(policies: Iterable[Policy]) -> bool:
    return any(p.spec.rules for p in policies)


__all__ = [
    "Match",
    "Policy",
    "Verdict",
    "activation",
    "as_json",
    "evaluate",
    "has_rules",
    "judge",
    "load",
    "required_by",
]
