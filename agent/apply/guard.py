"""What bundle content may never touch: the agent itself.

A bundle is applied as its ServiceAccount, or, without one, as the agent; either way its
content must not reach the agent's own objects, or a bundle could reset the anti-rollback
serial, swap the trust configuration, rewrite the revision store or read another bundle's
sensitive outputs. :class:`Guard` refuses, before anything is written (the whole group's plan
fails, nothing is applied), any object that is:

- in the agent's namespace, or that namespace itself;
- of the ``fleetlet.io`` API group (BundleDeployments, BundleOutputs, requests...), or one of
  its CustomResourceDefinitions;
- the agent's cluster-wide RBAC or admission policies (ClusterRoles, ClusterRoleBindings,
  ValidatingAdmissionPolicies and their bindings named ``fleetlet-...``).

A cluster admin can let named bundles manage them (``--allow-agent-objects``), e.g. a bundle
that upgrades the agent itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.api import API_GROUP
from agent.kube import ObjectRef

_RBAC = "rbac.authorization.k8s.io"
_ADMISSION = "admissionregistration.k8s.io"
_NAMED_KINDS = {
    (_RBAC, "ClusterRole"),
    (_RBAC, "ClusterRoleBinding"),
    (_ADMISSION, "ValidatingAdmissionPolicy"),
    (_ADMISSION, "ValidatingAdmissionPolicyBinding"),
}
AGENT_PREFIX = "fleetlet-"


def _group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


@dataclass(frozen=True, kw_only=True)
class Guard:
    """The agent's own objects, off limits to bundle content (see the module docstring)."""

    agent_namespace: str
    allowed: frozenset[str] = field(default_factory=frozenset)
    """Bundles a cluster admin lets manage the agent's objects."""

    def refusal(self, bundle: str, ref: ObjectRef) -> str | None:
        """Why bundle ``bundle`` may not apply ``ref``, or None when it may."""
        if bundle in self.allowed:
            return None
        group = _group(ref.api_version)
        if ref.namespace == self.agent_namespace:
            where = f"the agent's namespace {self.agent_namespace}"
        elif group == "" and ref.kind == "Namespace" and ref.name == self.agent_namespace:
            where = "the agent's namespace"
        elif group == API_GROUP:
            where = f"the {API_GROUP} API (the agent's own objects)"
        elif ref.kind == "CustomResourceDefinition" and ref.name.endswith(f".{API_GROUP}"):
            where = f"a CustomResourceDefinition of {API_GROUP}"
        elif (group, ref.kind) in _NAMED_KINDS and ref.name.startswith(AGENT_PREFIX):
            where = f"the agent's own {ref.kind}"
        else:
            return None
        return (
            f"{where} is off limits to bundle content (a cluster admin may allow the bundle "
            "with --allow-agent-objects)"
        )


__all__ = ["AGENT_PREFIX", "Guard"]
