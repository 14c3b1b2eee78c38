"""``agent install`` of a self-upgrade setting: rights added before the agent is told, taken
away after.

Adding rights is the install's usual order: the ClusterRole and Role first, then the agent's
Deployment (its pod replaced by one with the new ``FLEETLET_SELF_UPGRADE``); from ``off`` the
candidate Deployment comes before it. Taking them away (the live agent's Deployment says a setting that grants more than
the new one, :func:`installed_setting`), :func:`apply_installation`:

1. applies everything as usual, except the agent's ClusterRole and Role, which keep the rules of
   the installed setting, so the agent's pod is replaced by one that knows the new setting;
2. waits (bounded) until the old pod is gone: an upgrade it was in the middle of is stopped and
   rolled back with the rights it had;
3. gives the ClusterRole and Role the new setting's rules, then deletes what the new setting
   leaves out (the candidate Deployment, for ``off``).

An install stopped between two steps leaves the agent holding more rights than its setting
uses, never an agent that counts on rights it lost; running it again finishes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent.install.installer import Change, install
from agent.install.manifests import (
    NAME,
    InstallConfig,
    Object,
    install_objects,
    left_out_objects,
    rbac_objects,
)
from agent.kube import KubeClient, ObjectRef
from agent.upgrade.deployment import CANDIDATE
from agent.upgrade.rights import ENV_SELF_UPGRADE, SelfUpgrade, SelfUpgradeError, parse

_RANK = {SelfUpgrade.OFF: 0, SelfUpgrade.NO_NEW_RULES: 1, SelfUpgrade.ON: 2}
"""How much each setting grants: each grants what those below it grant, and more."""


def installed_setting(kube: KubeClient, namespace: str) -> SelfUpgrade | None:
    """The setting the live agent's Deployment runs with (None: no agent installed; ``on`` for
    an agent installed before the setting existed, or one that says what this one cannot read:
    the widest, so that narrowing is done in order)."""
    live = kube.get(ObjectRef("apps/v1", "Deployment", NAME, namespace))
    if live is None:
        return None
    containers = ((live.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "containers"
    ) or []
    agent: dict[str, Any] = next((c for c in containers if c.get("name") == "agent"), {})
    said = next((e.get("value") for e in agent.get("env") or [] if e.get("name") == ENV_SELF_UPGRADE), None)  # fmt: skip
    try:
        return parse(said)
    except SelfUpgradeError:
        return SelfUpgrade.ON


def apply_installation(
    kube: KubeClient,
    config: InstallConfig,
    *,
    report: Callable[[Change], None] | None = None,
    rollout_timeout: float = 90.0,
) -> list[Change]:
    """Install ``config`` (see the module docstring); what happened to each object, once.

    Raises what :func:`agent.install.installer.install` raises.
    """
    objects = install_objects(config)
    left_out = left_out_objects(config)
    before = installed_setting(kube, config.namespace)
    if before is SelfUpgrade.OFF and config.self_upgrade is not SelfUpgrade.OFF:
        # The candidate exists before an agent that may upgrade itself starts.
        candidate = next(o for o in objects if _key(o) == ("Deployment", CANDIDATE))
        objects.remove(candidate)
        objects.insert(
            objects.index(next(o for o in objects if _key(o) == ("Deployment", NAME))), candidate
        )
    if before is None or _RANK[before] <= _RANK[config.self_upgrade]:
        return install(kube, objects, report=report, left_out=left_out)
    kept = {_key(o): o for o in rbac_objects(config.namespace, before) if _own_role(o)}
    changes = install(kube, [kept.get(_key(o), o) for o in objects], report=report)
    _await_replaced(kube, config.namespace, rollout_timeout)
    narrowed = [o for o in objects if _own_role(o)]
    changes += install(kube, narrowed, report=report, left_out=left_out)
    return _folded(changes)


def _own_role(obj: Object) -> bool:
    return obj["kind"] in ("ClusterRole", "Role") and obj["metadata"]["name"] == NAME


def _key(obj: Object) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _await_replaced(kube: KubeClient, namespace: str, timeout: float) -> None:
    """Until the agent's Deployment runs its new pod template: with ``Recreate`` the controller
    starts the new pod only once the old one is gone. Returns at ``timeout`` all the same (a
    pod that cannot start must not keep rights the user takes away)."""
    deadline = time.monotonic() + timeout
    ref = ObjectRef("apps/v1", "Deployment", NAME, namespace)
    while time.monotonic() < deadline:
        live: dict[str, Any] = kube.get(ref) or {}
        status = live.get("status") or {}
        wanted = int((live.get("spec") or {}).get("replicas", 1) or 0)
        current = int(status.get("observedGeneration") or 0) >= int(
            (live.get("metadata") or {}).get("generation") or 0
        )
        if not live or (
            current
            and int(status.get("updatedReplicas") or 0) >= wanted
            and int(status.get("replicas") or 0) == int(status.get("updatedReplicas") or 0)
        ):
            return
        time.sleep(0.5)


def _folded(changes: list[Change]) -> list[Change]:
    """One change per object, in the order first met: the last that did something."""
    found: dict[ObjectRef, Change] = {}
    for change in changes:
        if change.ref not in found or change.action != "unchanged":
            found[change.ref] = change
    return list(found.values())


__all__ = ["apply_installation", "installed_setting"]
