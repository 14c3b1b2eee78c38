"""What the approval step (:mod:`agent.approve.gate`) works with, and what it tells the reconcile
(:mod:`agent.reconcile.context`) a waiting group waits on. Apart from the step, so that the
reconcile's context names them without importing the step that uses the context."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.approve.policy import Policy, load
from agent.approve.request import Requests
from agent.kube import KubeClient


@dataclass(frozen=True, kw_only=True)
class WaitingOn:
    """What a group whose move awaits a decision waits on, as the pass that decided to wait
    read it: its BundleDeploymentRequest (name and resourceVersion) and every ApprovalPolicy
    (name to resourceVersion). Until one of them changes (a decision, an edit, a deletion, a
    policy added, changed or removed), another pass would decide the same."""

    request: str
    request_version: str
    policies: Mapping[str, str] = field(default_factory=dict)


class Approvals:
    """What the approval step works with: this agent's requests and the cluster's
    ApprovalPolicies (read once per group move)."""

    def __init__(self, *, kube: KubeClient, agent_namespace: str) -> None:
        self.kube = kube
        self.agent_namespace = agent_namespace
        self.requests = Requests(kube=kube, owner=agent_namespace)

    def policies(self) -> list[Policy]:
        """Raises the KubeClient's errors."""
        return load(self.kube)

    def approver(self, service_account: str) -> tuple[KubeClient, str]:
        """A client acting as an approver ServiceAccount of the agent's namespace, and its
        user name."""
        user = f"system:serviceaccount:{self.agent_namespace}:{service_account}"
        return self.kube.impersonating(service_account, self.agent_namespace), user


__all__ = ["Approvals", "WaitingOn"]
