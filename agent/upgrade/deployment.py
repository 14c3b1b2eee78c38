"""The agent's own Deployment and its candidate: what an in-cluster upgrade changes.

An agent installed by ``fleetlet agent install`` runs in the Deployment
:data:`~agent.upgrade.deployment.NAME` of its namespace, and knows it (``FLEETLET_AGENT_DEPLOYMENT``
in its pod). Its release, the agent artifact the signed set pins (:mod:`agent.upgrade.artifact`),
then names a container image by digest and declares what that image needs of the cluster
(:class:`Release`): fleetlet's CRDs and the rules of the agent's ClusterRole and Role. The
acting agent, through :class:`AgentDeployment`:

1. **declares** the release's CRDs (only fleetlet's, only ones that exist, never one that stops
   serving a version the cluster serves: the old agent keeps reading its objects) and the rules
   of its own ClusterRole and Role, remembering the rules it replaced;
2. **starts the candidate**: the Deployment :data:`CANDIDATE`, which ``agent install`` makes
   with no replica (so the agent never needs to create a Deployment), gets its own pod spec
   with the new image and ``FLEETLET_AGENT_CANDIDATE`` set, and one replica;
3. reads how the candidate is doing (:meth:`AgentDeployment.candidate`): Available, or why
   not (a replica the API server refused, a rollout past its deadline);
4. on success **promotes** the image into its own Deployment and stops the candidate (no
   replica); on failure stops the candidate and **reverts** the rules (the old agent's rights back;
   the CRDs stay: the release may only add to them, which the old agent reads as before).

The Lease handshake with the candidate and the report are :mod:`agent.upgrade.incluster`'s.
Every call goes through a :class:`Door` (:class:`agent.kube.KubeClient` has these methods).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.upgrade.artifact import MANIFEST, InvalidAgentImageError

NAME = "fleetlet-agent"
"""The agent's Deployment, ClusterRole, Role and ServiceAccount (as ``agent install`` names them)."""
CANDIDATE = "fleetlet-agent-candidate"
ENV_DEPLOYMENT = "FLEETLET_AGENT_DEPLOYMENT"
"""Set in the agent's pod to its Deployment's name: the agent upgrades in the cluster."""
ATTEMPT_ANNOTATION = "fleetlet.io/agent-attempt"
CRD_NAMES = (
    "approvalpolicies.fleetlet.io",
    "bundledeploymentrequests.fleetlet.io",
    "bundledeployments.fleetlet.io",
    "bundleoutputs.fleetlet.io",
)
"""The CRDs the agent may update (by resourceNames; a new kind needs ``agent install``)."""
_DIGEST_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
_RBAC = "rbac.authorization.k8s.io/v1"
_CRD = "apiextensions.k8s.io/v1"


class Door(Protocol):
    """The object calls an in-cluster upgrade makes (what :class:`agent.kube.KubeClient` does)."""

    def get(self, obj: Any) -> dict[str, Any] | None: ...
    def patch(self, obj: Any, patch: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Release:
    """An agent release for the cluster: its container image (by digest) and what it needs."""

    version: str
    image: str
    crds: tuple[dict[str, Any], ...] = ()
    cluster_rules: tuple[dict[str, Any], ...] | None = None
    """The rules of ClusterRole :data:`NAME` (None: left as they are)."""
    role_rules: tuple[dict[str, Any], ...] | None = None
    """The rules of Role :data:`NAME` in the agent's namespace (None: left as they are)."""


def read_release(root: Path, source: str) -> Release:
    """The release in ``root/fleetlet-agent.json`` of the artifact ``source`` (``uri@digest``).

    Raises InvalidAgentImageError naming the artifact and the key.
    """

    def bad(key: str, expected: str) -> InvalidAgentImageError:
        return InvalidAgentImageError(
            f"agent image {source}: {MANIFEST}: {key}: expected {expected}"
        )

    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidAgentImageError(
            f"agent image {source}: no readable {MANIFEST} ({exc})"
        ) from exc
    if not isinstance(manifest, dict):
        raise bad("(top)", "an object")
    image = manifest.get("image")
    if not isinstance(image, str) or not _DIGEST_IMAGE.match(image):
        raise bad(
            "image", "the container image, REPOSITORY@sha256:<64 hex> (in a pod the agent runs one)"
        )
    crds = manifest.get("crds") or []
    if not isinstance(crds, list) or not all(isinstance(c, dict) for c in crds):
        raise bad("crds", "a list of CustomResourceDefinitions")
    for crd in crds:
        name = str((crd.get("metadata") or {}).get("name") or "")
        if crd.get("kind") != "CustomResourceDefinition" or name not in CRD_NAMES:
            raise bad(f"crds[{name or '?'}]", "one of fleetlet's CRDs: " + ", ".join(CRD_NAMES))
    rules: dict[str, tuple[dict[str, Any], ...] | None] = {}
    raw_rules = manifest.get("rbac") or {}
    if not isinstance(raw_rules, dict):
        raise bad("rbac", "an object with clusterRole and role (lists of rules)")
    for key in ("clusterRole", "role"):
        value = raw_rules.get(key)
        if value is not None and not (
            isinstance(value, list)
            and all(isinstance(r, dict) and isinstance(r.get("verbs"), list) for r in value)
        ):
            raise bad(f"rbac.{key}", "a list of RBAC rules (each with verbs)")
        rules[key] = None if value is None else tuple(value)
    return Release(
        version=str(manifest.get("version") or "")[:64],
        image=image,
        crds=tuple(crds),
        cluster_rules=rules["clusterRole"],
        role_rules=rules["role"],
    )


def release_manifest(image: str, *, version: str) -> dict[str, Any]:
    """``fleetlet-agent.json`` of a release of this checkout's agent, as container ``image``:
    the CRDs and the rules of the objects ``agent install`` makes (agent.install.manifests)."""
    from agent.install.manifests import crds, rbac_objects

    objects = {o["metadata"]["name"] + "/" + o["kind"]: o for o in rbac_objects("fleetlet-system")}
    return {
        "version": version,
        "image": image,
        "crds": crds(),
        "rbac": {
            "clusterRole": objects[f"{NAME}/ClusterRole"]["rules"],
            "role": objects[f"{NAME}/Role"]["rules"],
        },
    }


class UpgradeStepError(Exception):
    """A step of the in-cluster upgrade failed: ``reason`` (one word) and what happened."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class Declared:
    """What :meth:`AgentDeployment.declare` replaced: the rules to put back on a rollback."""

    rules: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """``{"ClusterRole" | "Role": the rules before}``."""


@dataclass(frozen=True, slots=True)
class CandidateState:
    available: bool
    problem: str = ""
    """Why it never will be without a change (a refused replica, a rollout past its deadline)."""
    said: str = ""
    """Its conditions, for a message."""


class AgentDeployment:
    """The agent's Deployment ``name`` in ``namespace`` and its candidate, through ``door``."""

    def __init__(self, door: Door, namespace: str, name: str = NAME) -> None:
        self.door = door
        self.namespace = namespace
        self.name = name

    def _ref(self, kind: str, name: str, *, namespaced: bool = True) -> dict[str, Any]:
        api = {"Deployment": "apps/v1", "CustomResourceDefinition": _CRD}.get(kind, _RBAC)
        meta: dict[str, Any] = {"name": name}
        if namespaced:
            meta["namespace"] = self.namespace
        return {"apiVersion": api, "kind": kind, "metadata": meta}

    def own(self) -> dict[str, Any]:
        """The agent's live Deployment. Raises UpgradeStepError (absent), the door's errors."""
        live = self.door.get(self._ref("Deployment", self.name))
        if live is None:
            raise UpgradeStepError(
                "NotInstalled", f"Deployment {self.namespace}/{self.name} (the agent's) is missing"
            )
        return live

    # -- 1. what the new image needs of the cluster -----------------------------------------

    def declare(self, release: Release) -> Declared:
        """The release's CRDs and rules in place; returns the rules replaced. Raises
        UpgradeStepError (a CRD missing or narrowed), the door's errors (ForbiddenError: the
        agent's RBAC lacks ``escalate`` on its own roles, from an older ``agent install``)."""
        for crd in release.crds:
            name = crd["metadata"]["name"]
            live = self.door.get(self._ref("CustomResourceDefinition", name, namespaced=False))
            if live is None:
                raise UpgradeStepError(
                    "NewCrd",
                    f"the release adds CRD {name}: a new kind needs `fleetlet agent install` "
                    "(the agent may only update fleetlet's existing CRDs)",
                )
            served = _served(live) - _served(crd)
            if served:
                raise UpgradeStepError(
                    "CrdNarrowed",
                    f"the release's CRD {name} stops serving {', '.join(sorted(served))}, which "
                    "the running agent reads: a release may only add to a CRD",
                )
        declared = Declared()
        try:
            for crd in release.crds:
                ref = self._ref(
                    "CustomResourceDefinition", crd["metadata"]["name"], namespaced=False
                )
                self.door.patch(ref, {"spec": crd["spec"]})
            for kind, rules in (
                ("ClusterRole", release.cluster_rules),
                ("Role", release.role_rules),
            ):
                if rules is None:
                    continue
                ref = self._ref(kind, self.name, namespaced=kind == "Role")
                live = self.door.get(ref)
                if live is None:
                    raise UpgradeStepError("NotInstalled", f"{kind} {self.name} is missing")
                before = list(live.get("rules") or [])
                if before != list(rules):
                    self.door.patch(ref, {"rules": list(rules)})
                    declared.rules[kind] = before
        except Exception:
            self.revert(declared)
            raise
        return declared

    def revert(self, declared: Declared) -> None:
        """The rules :meth:`declare` replaced, put back (the door's errors)."""
        for kind, rules in declared.rules.items():
            self.door.patch(self._ref(kind, self.name, namespaced=kind == "Role"), {"rules": rules})
        declared.rules.clear()

    # -- 2. the candidate --------------------------------------------------------------------

    def start_candidate(self, release: Release, env: Mapping[str, str]) -> None:
        """The Deployment :data:`CANDIDATE` (``agent install`` makes it with no replica) given
        the agent's pod spec, ``release.image`` and ``env``, and one replica."""
        own = self.own()
        ref = self._ref("Deployment", CANDIDATE)
        if self.door.get(ref) is None:
            raise UpgradeStepError(
                "NotInstalled",
                f"Deployment {self.namespace}/{CANDIDATE} is missing: an install from before "
                "in-cluster upgrades; run `fleetlet agent install` again",
            )
        template = candidate_of(own)["spec"]["template"]
        _set_container(template, release.image, env)
        attempt = env.get("FLEETLET_AGENT_CANDIDATE", "")
        self.door.patch(
            ref,
            {
                "metadata": {"annotations": {ATTEMPT_ANNOTATION: attempt}},
                "spec": {"replicas": 1, "template": template},
            },
        )

    def candidate(self) -> CandidateState:
        """How the candidate is doing (its Deployment's status, as the controller says)."""
        live = self.door.get(self._ref("Deployment", CANDIDATE))
        if live is None:
            return CandidateState(available=False, problem=f"Deployment {CANDIDATE} is gone")
        status = live.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        said = "; ".join(
            f"{t}={c.get('status')} ({c.get('reason')}: {c.get('message')})"
            for t, c in sorted(conditions.items())
        )
        current = int(status.get("observedGeneration") or 0) >= int(
            (live.get("metadata") or {}).get("generation") or 0
        )
        available = (
            current
            and (conditions.get("Available") or {}).get("status") == "True"
            and int(status.get("availableReplicas") or 0) >= 1
            and int(status.get("updatedReplicas") or 0) >= 1
        )
        problem = ""
        failure = conditions.get("ReplicaFailure") or {}
        progressing = conditions.get("Progressing") or {}
        if not current:
            pass  # the conditions are an earlier attempt's until the controller saw this one
        elif failure.get("status") == "True":
            problem = f"a replica was refused ({failure.get('reason')}: {failure.get('message')})"
        elif progressing.get("reason") == "ProgressDeadlineExceeded":
            problem = f"its rollout stalled ({progressing.get('message')})"
        return CandidateState(available=bool(available), problem=problem, said=said)

    def stop_candidate(self) -> bool:
        """The candidate scaled to no replica (its pods deleted); False: it had none (or is
        not installed)."""
        ref = self._ref("Deployment", CANDIDATE)
        live = self.door.get(ref)
        if live is None or not (live.get("spec") or {}).get("replicas"):
            return False
        self.door.patch(ref, {"spec": {"replicas": 0}})
        return True

    # -- 3. the candidate proved itself -------------------------------------------------------

    def promote(self, release: Release, env: Mapping[str, str]) -> None:
        """The agent's own Deployment moved to ``release.image`` with ``env`` set (its pod is
        replaced: ``Recreate``), then the candidate stopped."""
        own = self.own()
        template = copy.deepcopy(((own.get("spec") or {}).get("template")) or {})
        _set_container(template, release.image, env)
        containers = template["spec"]["containers"]
        version = (own.get("metadata") or {}).get("resourceVersion")
        self.door.patch(
            self._ref("Deployment", self.name),
            {
                "metadata": {"resourceVersion": version},
                "spec": {"template": {"spec": {"containers": containers}}},
            },
        )
        self.stop_candidate()


def candidate_of(own: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate Deployment made from the agent's ``own``: its pod spec, labels and
    selector of its own (the Service and ``own`` never select it), no replica."""
    spec = copy.deepcopy(dict(own.get("spec") or {}))
    labels = {"app.kubernetes.io/name": CANDIDATE, "app.kubernetes.io/part-of": "fleetlet"}
    template = spec.setdefault("template", {})
    template.setdefault("metadata", {})["labels"] = labels
    spec.update(
        replicas=0,
        selector={"matchLabels": {"app.kubernetes.io/name": CANDIDATE}},
        strategy={"type": "Recreate"},
    )
    meta = own.get("metadata") or {}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": CANDIDATE, "namespace": meta.get("namespace"), "labels": labels},
        "spec": spec,
    }


_REPLACED = ("FLEETLET_AGENT_CANDIDATE", "FLEETLET_AGENT_IMAGE", "FLEETLET_AGENT_VERSION")


def _set_container(template: dict[str, Any], image: str, env: Mapping[str, str]) -> None:
    """The agent's container (``agent``, else the first) in ``template``: ``image``, and the
    upgrade's variables replaced by ``env``."""
    containers = template.get("spec", {}).get("containers") or []
    if not containers:
        raise UpgradeStepError("NotInstalled", "the agent's Deployment has no container")
    container = next((c for c in containers if c.get("name") == "agent"), containers[0])
    container["image"] = image
    kept = [e for e in container.get("env") or [] if e.get("name") not in (*_REPLACED, *env)]
    container["env"] = kept + [{"name": k, "value": v} for k, v in sorted(env.items())]


def _served(crd: Mapping[str, Any]) -> set[str]:
    versions = (crd.get("spec") or {}).get("versions") or []
    return {str(v.get("name")) for v in versions if isinstance(v, dict) and v.get("served")}


def own_image(deployment: Mapping[str, Any]) -> str:
    """The agent container's image in a Deployment ("" when it has none)."""
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    container = next((c for c in containers if c.get("name") == "agent"), None)
    return str((container or (containers[0] if containers else {})).get("image") or "")


__all__ = [
    "ATTEMPT_ANNOTATION",
    "CANDIDATE",
    "CRD_NAMES",
    "ENV_DEPLOYMENT",
    "NAME",
    "AgentDeployment",
    "CandidateState",
    "Declared",
    "Door",
    "Release",
    "UpgradeStepError",
    "candidate_of",
    "own_image",
    "read_release",
    "release_manifest",
]
