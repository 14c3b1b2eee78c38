"""What the agent may do to upgrade itself: ``agent install --self-upgrade=on|no-new-rules|off``.

One setting, read at two edges: ``agent install`` grants the rights it names (the rules below,
in the agent's ClusterRole and Role, and the candidate Deployment) and writes it into the
agent's pod (``FLEETLET_SELF_UPGRADE``); ``agent run`` reads it there (its ``--self-upgrade``
flag) and hands it to its upgrade loop (:mod:`agent.upgrade.process`,
:mod:`agent.upgrade.incluster`), which then never tries what it was not given.

- ``on`` (the default): the agent upgrades itself to the release a signed set declares,
  including the rules that release adds to its own roles (``escalate`` on them: whoever holds
  the agent's token can grant the agent any right);
- ``no-new-rules``: the same upgrade without ``escalate``. A release whose rules are the
  installed ones goes through; one that adds a rule is refused by the API server at that step
  and rolled back (an operator's ``agent install`` of the new version grants it);
- ``off``: no candidate Deployment and none of these rights. An agent release in a set is not
  tried: the agent entry reports ``UpgradeDisabled`` (the hub's rollout counts that cluster as
  failed), until ``agent install`` runs again with another setting, or with the image the
  release names (the agent then runs that release: :mod:`agent.upgrade.incluster`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from agent.errors import ConfigurationError, PermanentError

ENV_SELF_UPGRADE = "FLEETLET_SELF_UPGRADE"
"""Set in the agent's pod by ``agent install``: the :class:`SelfUpgrade` it was given."""
FLAG = "--self-upgrade"


class SelfUpgrade(StrEnum):
    """How far an agent may upgrade itself (see the module docstring)."""

    ON = "on"
    NO_NEW_RULES = "no-new-rules"
    OFF = "off"


HELP: dict[SelfUpgrade, str] = {
    SelfUpgrade.ON: "the agent upgrades itself to the release a signed set declares: get and "
    "patch on its Deployments fleetlet-agent and fleetlet-agent-candidate, on fleetlet's CRDs, "
    "and get, patch and escalate on its own ClusterRole and Role (a release's new rules)",
    SelfUpgrade.NO_NEW_RULES: "the same without escalate: a release that adds a rule to the "
    "agent's roles is refused and rolled back",
    SelfUpgrade.OFF: "no candidate Deployment and none of these rights; a declared release is "
    "reported UpgradeDisabled",
}


def parse(text: str | None, where: str = FLAG) -> SelfUpgrade:
    """The setting ``text`` says (None or "": ``on``). Raises SelfUpgradeError naming
    ``where`` and the values allowed."""
    try:
        return SelfUpgrade((text or SelfUpgrade.ON.value).strip())
    except ValueError:
        allowed = ", ".join(m.value for m in SelfUpgrade)
        raise SelfUpgradeError(f"{where} {text!r}: expected one of {allowed}") from None


class SelfUpgradeError(ConfigurationError):
    """A self-upgrade setting that is none of :class:`SelfUpgrade`."""


class UpgradeDisabledError(PermanentError):
    """The set declares an agent release, and this cluster's agent was installed without the
    rights to upgrade itself."""

    reason = "UpgradeDisabled"


def disabled_message(digest: str) -> str:
    """The one line the agent entry reports when a release is declared on an ``off`` cluster."""
    return (
        f"agent install {FLAG}={SelfUpgrade.OFF} on this cluster: the agent does not upgrade "
        f"itself to {digest}; run `fleetlet agent install {FLAG}={SelfUpgrade.ON}` (or "
        f"{SelfUpgrade.NO_NEW_RULES}) again to allow it, or `agent install --image` the image "
        "that release names"
    )


# --- the rules agent install grants for it ------------------------------------------------------

_RBAC = "rbac.authorization.k8s.io"


def cluster_rules(mode: SelfUpgrade) -> list[dict[str, Any]]:
    """The ClusterRole rules of self-upgrade: its own ClusterRole's rules (``escalate``: rules
    it does not hold yet) and fleetlet's existing CRDs updated, each by name only."""
    # Here, not at the top: the flags of agent install (its --help) name the settings only.
    from agent.upgrade.deployment import CRD_NAMES, NAME

    if mode is SelfUpgrade.OFF:
        return []
    return [
        {"apiGroups": [_RBAC], "resources": ["clusterroles"], "resourceNames": [NAME], "verbs": _role_verbs(mode)},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "resourceNames": list(CRD_NAMES), "verbs": ["get", "patch"]},
    ]  # fmt: skip


def role_rules(mode: SelfUpgrade) -> list[dict[str, Any]]:
    """The Role rules of self-upgrade: the candidate (made by ``agent install`` with no
    replica: no create needed) started and stopped, its own Deployment moved to the proved
    image, its own Role's rules."""
    from agent.upgrade.deployment import CANDIDATE, NAME

    if mode is SelfUpgrade.OFF:
        return []
    return [
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": [NAME, CANDIDATE], "verbs": ["get", "patch"]},
        {"apiGroups": [_RBAC], "resources": ["roles"], "resourceNames": [NAME], "verbs": _role_verbs(mode)},
    ]  # fmt: skip


def _role_verbs(mode: SelfUpgrade) -> list[str]:
    return ["get", "patch"] if mode is SelfUpgrade.NO_NEW_RULES else ["get", "patch", "escalate"]


def fit_rules(
    rules: Iterable[dict[str, Any]] | None, mode: SelfUpgrade
) -> tuple[dict[str, Any], ...] | None:
    """A release's rules for the agent's own roles as an agent installed with ``mode`` declares
    them: with ``no-new-rules``, without ``escalate`` (a release is built with the rules of
    ``on``; the agent never asks for a right install did not give it), else as they are."""
    if rules is None:
        return None
    if mode is not SelfUpgrade.NO_NEW_RULES:
        return tuple(rules)
    fitted = []
    for rule in rules:
        verbs = [v for v in rule.get("verbs") or [] if v != "escalate"]
        if verbs:
            fitted.append({**rule, "verbs": verbs})
    return tuple(fitted)


__all__ = [
    "ENV_SELF_UPGRADE",
    "FLAG",
    "HELP",
    "SelfUpgrade",
    "SelfUpgradeError",
    "UpgradeDisabledError",
    "cluster_rules",
    "disabled_message",
    "fit_rules",
    "parse",
    "role_rules",
]
