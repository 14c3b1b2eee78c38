"""A token's acceptance policy: a CEL expression over the request, evaluated as the cluster's
``ApprovalPolicy`` rules are (:func:`agent.approve.policy.evaluate`, cel-python).

True accepts the request at once; false, or an expression that fails on this request, leaves
it pending for ``fleetlet hub clusters accept|deny`` with the reason recorded (fail closed).
The expression sees:

- ``cluster``: the name asked for;
- ``labels``: the labels the cluster would get (its claim within scope, plus the token's);
- ``claimed``: the labels it claimed;
- ``facts``: what it reported (``kubernetesVersion``, ``apiGroupVersions``, ``formats``);
- ``token``: the token's scope (``id``, ``labels``, ``allowLabels``, ``maxClusters``, ``used``).

For example ``facts.kubernetesVersion.matches('^v1\\.(3[0-9])\\.') && 'apps/v1' in
facts.apiGroupVersions && 'helm' in facts.formats``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hub.api.tokens import HubConfigError

_SAMPLE = {
    "cluster": "c-0123456789ab",
    "labels": {},
    "claimed": {},
    "facts": {"kubernetesVersion": "v1.34.1", "apiGroupVersions": ["v1"], "formats": ["plain"]},
    "token": {"id": "sample", "labels": {}, "allowLabels": {}, "maxClusters": 1, "used": 0},
}


def variables(
    *,
    cluster: str,
    labels: Mapping[str, str],
    claimed: Mapping[str, str],
    facts: Mapping[str, Any],
    token: Mapping[str, Any],
) -> dict[str, Any]:
    """The activation of a policy for one request."""
    return {
        "cluster": cluster,
        "labels": dict(labels),
        "claimed": dict(claimed),
        "facts": dict(facts),
        "token": dict(token),
    }


def check_policy(expression: str) -> None:
    """Refuse an expression that cannot work: it does not compile, names a variable that does
    not exist, or is not a boolean (tried on a sample request; a key the sample lacks is the
    request's business, and fails closed then). Raises HubConfigError naming the problem."""
    from agent.approve.policy import evaluate

    if not expression.strip():
        raise HubConfigError("--policy: an empty expression")
    try:
        evaluate(expression, _SAMPLE)
    except ValueError as exc:
        text = str(exc)
        undeclared = re.search(r"undeclared reference to '([^']+)'", text)
        if undeclared:
            raise HubConfigError(
                f"--policy {expression!r}: no variable {undeclared[1]!r} (it sees cluster, "
                "labels, claimed, facts, token)"
            ) from None
        if not text.startswith("failed:"):
            raise HubConfigError(f"--policy {expression!r} {text}") from None


def admits(expression: str, activation: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the policy accepts the request, and why not (one line)."""
    from agent.approve.policy import evaluate

    try:
        if evaluate(expression, activation):
            return True, ""
    except ValueError as exc:
        return False, f"the token's policy {exc}: waiting for a decision"
    return False, "the token's policy is false for this request: waiting for a decision"
