"""How a bundle's health is checked: conditions, field expressions and the per-bundle checks.

Part of :mod:`agent.api.models`; used by :class:`BundleDeploymentSpec` and by
:mod:`agent.health`.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agent.api.models._patterns import (
    CONDITION_TYPE,
    FIELD_PATH,
    FIELD_PATH_TEXT,
    ApiServiceHealth,
    ConditionStatus,
)
from agent.api.models._references import ObjectReference
from agent.api.validation import ApiObject, Rule, api_field


@dataclass(frozen=True, kw_only=True, slots=True)
class ConditionCheck(ApiObject):
    """Healthy when the object has a status condition of this type with this status."""

    type: str = api_field(
        "Condition type, e.g. `Available`.",
        pattern=CONDITION_TYPE,
        max_length=316,
        expected="a condition type such as Available",
    )
    status: ConditionStatus = api_field("Status the condition must have.", default="True")


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldExpression(ApiObject):
    """Healthy when the field at ``fieldPath`` equals ``equals``.

    The field's value is compared as text: strings as they are, numbers in decimal, booleans
    as ``true``/``false``. A missing field is not healthy.
    """

    field_path: str = api_field(
        "Path of the field inside the object: `.`-separated names, `[N]` list indexes and "
        "`['key']` for names with dots, e.g. `.status.phase`.",
        pattern=FIELD_PATH,
        expected=FIELD_PATH_TEXT,
        max_length=512,
    )
    equals: str = api_field("The value the field must have, as text.", max_length=1024)


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthCheck(ApiObject):
    """An extra health check on one named object: a condition or a field expression."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="has(self.condition) != has(self.expression)",
            expected="exactly one of condition or expression",
            check=lambda c: (c.condition is None) != (c.expression is None),
        ),
    )

    object: ObjectReference = api_field("The object to check.")
    condition: ConditionCheck | None = api_field("Check a status condition.", default=None)
    expression: FieldExpression | None = api_field("Check a field's value.", default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthChecks(ApiObject):
    """How the agent decides that the bundle is healthy after an apply."""

    builtin: bool = api_field(
        "Assess every applied object with the built-in (kstatus-style) rules.", default=True
    )
    timeout_seconds: int = api_field(
        "How long the group may take to become healthy before it is rolled back.",
        default=300,
        minimum=1,
        maximum=86400,
    )
    checks: tuple[HealthCheck, ...] = api_field(
        "Extra checks on named objects; all must pass.", default=(), max_items=64
    )
    wait_for_load_balancer: bool = api_field(
        "Also wait until each LoadBalancer Service has an ingress address (by default it is "
        "healthy once it has a cluster IP, as in kstatus: most edge clusters have no "
        "load-balancer controller).",
        default=False,
    )
    api_services: ApiServiceHealth = api_field(
        "When an APIService is healthy: `Available`, once the API server reached the server "
        "behind it and its discovery answered (as Argo CD judges it); `Endpoints`, once its "
        "Service has ready endpoints, without the API server's discovery request through them "
        "(control planes outside the pod network). Never while the Service is missing or no "
        "pod behind it is ready, which helm --wait and kstatus accept.",
        default="Available",
    )
