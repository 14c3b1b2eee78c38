"""Every object that puts a cluster into a fleet, built from one :class:`InstallConfig`.

The single source of the agent's manifests: ``fleetlet agent install`` applies them,
``fleetlet agent install --dry-run -o yaml`` prints them, and the kustomize base in
``deploy/agent/`` is written from them (``python -m agent.install.manifests --write``; a test
runs ``--check`` so the two never drift). What the base leaves out is the cluster's own
configuration (repository, identity, trusted root, credentials): the install command makes it
from flags; a kustomize user makes it with generators (docs/operations.md).

The objects, in the order they are applied:

1. the CRDs (:mod:`agent.api.crds`);
2. the agent's namespace (Pod Security ``restricted`` enforced) and ServiceAccount;
3. least-privilege RBAC: a ClusterRole for fleetlet's own objects, a Role for its namespace, and
   a Role in ``default`` that only creates and patches Events (where Events about
   cluster-scoped BundleDeployments go, as kubelet and client-go put them);
4. the configuration: ConfigMap ``fleetlet-agent`` (repository, cluster), Secret
   ``fleetlet-trust`` (trusted root and identity policy), credentials Secrets, the hub's public
   key;
5. approvals enforced by the API server (:func:`approval_policies`): the
   ValidatingAdmissionPolicy ``fleetlet-approvals`` and its binding, the ClusterRole
   ``fleetlet-approver`` and the Role ``fleetlet-preview-reader`` (:mod:`agent.approve.admission`);
6. the probe/metrics Service, an optional ServiceMonitor, and the Deployment, pinned to an
   image digest, with a hash of the configuration in its pod template so a changed
   configuration restarts the agent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.api.canonical import dump_yaml
from agent.api.crds import CRDS, crd_document
from agent.api.generated import write_or_check
from agent.approve.admission import approver_objects, auto_approver_objects, policy_objects
from agent.errors import PermanentError
from agent.install.names import DEFAULT_NAMESPACE
from agent.upgrade.deployment import ENV_DEPLOYMENT, candidate_of
from agent.upgrade.rights import ENV_SELF_UPGRADE, SelfUpgrade, cluster_rules, role_rules

Object = dict[str, Any]

NAME = "fleetlet-agent"
EVENTS_NAMESPACE = "default"
"""Events about cluster-scoped objects (BundleDeployments) go here, as client-go does."""
FIELD_MANAGER = "fleetlet-install"
PROBE_PORT = 8081
CONFIG_HASH_ANNOTATION = "fleetlet.io/config-sha256"
MANAGED_BY = {"app.kubernetes.io/managed-by": "fleetlet"}

RELEASE_IMAGE = "fleetlet-agent@sha256:" + "0" * 64
"""The image of the released agent. No image is published yet: until one is, this is a
placeholder (all zeros) that ``agent install`` refuses and kustomize users replace with the
``images:`` transformer (name ``fleetlet-agent``, ``digest: sha256:...``)."""

# The configuration objects (their names are what the Deployment refers to).
CONFIG_MAP = "fleetlet-agent"
TRUST_SECRET = "fleetlet-trust"
GIT_SECRET = "fleetlet-git-credentials"
STATUS_GIT_SECRET = "fleetlet-status-git-credentials"
REGISTRY_SECRET = "fleetlet-registry-credentials"
HUB_KEY_CONFIG_MAP = "fleetlet-hub-key"

_DIGEST_REFERENCE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")


class InstallConfigError(PermanentError):
    """An install setting that cannot work (an image without a digest, a missing file)."""


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """Git credentials as the agent reads them from a mounted Secret (keys: ``username`` +
    ``password``, or ``token``, or ``ssh-privatekey``; see docs/operations.md)."""

    username: str | None = None
    password: str | None = None
    token: str | None = None
    ssh_private_key: str | None = None
    known_hosts: str | None = None

    def data(self) -> dict[str, str]:
        found = {
            "username": self.username,
            "password": self.password,
            "token": self.token,
            "ssh-privatekey": self.ssh_private_key,
        }
        return {k: v for k, v in found.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class InstallConfig:
    """What makes one cluster's installation (see ``fleetlet agent install --help``)."""

    image: str
    repo: str
    cluster: str
    identity: str
    issuer: str
    trusted_root: str
    """The content of ``trusted_root.json``."""
    namespace: str = DEFAULT_NAMESPACE
    status_repo: str | None = None
    git: Credentials | None = None
    status_git: Credentials | None = None
    registry_config: str | None = None
    """A docker config JSON: the Secret ``fleetlet-registry-credentials`` bundle sources name."""
    hub_public_key: str | None = None
    source_policy: str | None = None
    """``--verify-sources``: the cluster's source signature policy, self-contained (YAML, keys
    inline; its trusted root in ``source_trusted_root``)."""
    source_trusted_root: str | None = None
    poll_interval: float | None = None
    log_format: str = "json"
    service_monitor: bool = False
    self_upgrade: SelfUpgrade = SelfUpgrade.ON
    """``--self-upgrade``: the rights and the candidate Deployment of the agent's own upgrades."""
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_image(self.image)
        for name in ("repo", "cluster", "identity", "issuer", "trusted_root"):
            if not getattr(self, name):
                raise InstallConfigError(f"install: {name} is required")


def check_image(image: str) -> None:
    """Refuse an image that is not pinned by digest, or the unreleased placeholder.

    Raises InstallConfigError.
    """
    if image == RELEASE_IMAGE:
        raise InstallConfigError(
            "no agent image is published yet: build one (scripts/build-images.sh), push it, and "
            "give --image REGISTRY/fleetlet-agent@sha256:<digest>"
        )
    if not _DIGEST_REFERENCE.match(image):
        raise InstallConfigError(
            f"--image {image}: pin the agent by digest (REPOSITORY@sha256:<64 hex digits>), "
            "so every cluster runs exactly the image that was tested; a tag can move"
        )


def _labels(**extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "fleetlet", **extra}


def _meta(name: str, namespace: str | None = None, **labels: str) -> Object:
    meta: Object = {"name": name, "labels": _labels(**labels)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


# --- the objects that do not depend on the cluster's configuration -------------------------------


def crds() -> list[Object]:
    """fleetlet's CustomResourceDefinitions."""
    return [crd_document(crd) for crd in CRDS]


def namespace_objects(namespace: str) -> list[Object]:
    """The agent's namespace (Pod Security ``restricted``) and its ServiceAccount."""
    ns: Object = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": _meta(namespace, **MANAGED_BY),
    }
    ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "restricted"
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME, namespace)}
    return [ns, sa]


def rbac_objects(namespace: str, self_upgrade: SelfUpgrade = SelfUpgrade.ON) -> list[Object]:
    """Least privilege (docs/operations.md, "The RBAC model"): the agent's own API objects
    cluster-wide; Secrets, ConfigMaps, Events and ServiceAccount impersonation in its
    namespace; Events only in ``default``; the rights ``self_upgrade`` grants
    (:mod:`agent.upgrade.rights`). No wildcard, no built-in admin role."""
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]
    all_verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    cluster_role: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(NAME),
        "rules": [
            # One BundleDeployment per bundle of the set, and its status between stages.
            {"apiGroups": ["fleetlet.io"], "resources": ["bundledeployments"], "verbs": all_verbs},
            {
                "apiGroups": ["fleetlet.io"],
                "resources": ["bundledeployments/status"],
                "verbs": ["get", "update", "patch"],
            },
            # Outputs of the latest successful run (sensitive values in Secrets of its namespace).
            {"apiGroups": ["fleetlet.io"], "resources": ["bundleoutputs"], "verbs": all_verbs},
            # Approval requests: it asks, reads the decision, marks a pending one Superseded
            # (custom verb "supersede") and deletes old ones. It may never decide: no custom
            # verb "approve", which the ValidatingAdmissionPolicy fleetlet-approvals requires
            # for any decision whatever RBAC allows on /status.
            {
                "apiGroups": ["fleetlet.io"],
                "resources": ["bundledeploymentrequests"],
                "verbs": ["get", "list", "watch", "create", "delete", "supersede"],
            },
            {
                "apiGroups": ["fleetlet.io"],
                "resources": ["bundledeploymentrequests/status"],
                "verbs": ["get", "update", "patch"],
            },
            # The cluster admin's approval rules, read only.
            {
                "apiGroups": ["fleetlet.io"],
                "resources": ["approvalpolicies"],
                "verbs": ["get", "list", "watch"],
            },
            # Upgrading itself (agent.upgrade.rights; none with --self-upgrade=off).
            *cluster_rules(self_upgrade),
        ],
    }  # fmt: skip
    role: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(NAME, namespace),
        "rules": [
            # State, the revision store, sensitive outputs; credentials are mounted, not read.
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": all_verbs},
            {
                "apiGroups": ["", "events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch"],
            },
            # Act as the ServiceAccount a bundle names: only those of this namespace (the
            # authorization of impersonation is namespaced). Narrow with resourceNames.
            {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
            # Which agent acts (one at a time, also during an agent upgrade: agent.upgrade).
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update", "patch"],
            },
            # Upgrading itself (agent.upgrade.rights; none with --self-upgrade=off).
            *role_rules(self_upgrade),
        ],
    }  # fmt: skip
    events_role: Object = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(f"{NAME}-events", EVENTS_NAMESPACE),
        "rules": [
            # Events about cluster-scoped BundleDeployments: create, and patch to count repeats.
            {
                "apiGroups": ["", "events.k8s.io"],
                "resources": ["events"],
                "verbs": ["create", "patch"],
            },
        ],
    }

    def binding(kind: str, role_kind: str, name: str, ns: str | None) -> Object:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": _meta(name, ns),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
            "subjects": subject,
        }

    return [
        cluster_role,
        binding("ClusterRoleBinding", "ClusterRole", NAME, None),
        role,
        binding("RoleBinding", "Role", NAME, namespace),
        events_role,
        binding("RoleBinding", "Role", f"{NAME}-events", EVENTS_NAMESPACE),
    ]


def service(namespace: str) -> Object:
    """The probe server's port as a Service: what a ServiceMonitor selects for /metrics."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(NAME, namespace),
        "spec": {
            "selector": {"app.kubernetes.io/name": NAME},
            "ports": [{"name": "metrics", "port": PROBE_PORT, "targetPort": "health"}],
        },
    }


def service_monitor(namespace: str) -> Object:
    """A Prometheus Operator ServiceMonitor scraping the agent's /metrics (optional: the
    ``monitoring.coreos.com`` API must be served)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(NAME, namespace),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
        },
    }


def approval_policies(namespace: str) -> list[Object]:
    """What makes the API server enforce approvals (docs/approvals.md): the
    ValidatingAdmissionPolicy ``fleetlet-approvals`` and its binding, the ClusterRole
    ``fleetlet-approver`` for people who decide, the Role ``fleetlet-preview-reader`` of the
    agent's namespace. Not the opt-in auto-approver (``deploy/agent/auto-approver/``)."""
    return [*policy_objects(), *approver_objects(namespace)]


def deployment(
    *,
    namespace: str,
    image: str,
    config_hash: str | None = None,
    hub_public_key: bool = False,
    source_policy: tuple[str, ...] = (),
    poll_interval: float | None = None,
    log_format: str = "json",
    self_upgrade: SelfUpgrade = SelfUpgrade.ON,
    extra_env: Mapping[str, str] | None = None,
) -> Object:
    """The agent: one replica, ``Recreate`` (never two agents at once), probes and metrics on
    :data:`PROBE_PORT`, non-root with a read-only root filesystem, settings from the
    ConfigMap ``fleetlet-agent`` and the Secret ``fleetlet-trust``."""

    def from_config(var: str, key: str, *, optional: bool = False) -> Object:
        ref: Object = {"name": CONFIG_MAP, "key": key}
        if optional:
            ref["optional"] = True
        return {"name": var, "valueFrom": {"configMapKeyRef": ref}}

    def from_trust(var: str, key: str) -> Object:
        return {"name": var, "valueFrom": {"secretKeyRef": {"name": TRUST_SECRET, "key": key}}}

    env: list[Object] = [
        from_config("FLEETLET_REPO", "repo"),
        from_config("FLEETLET_CLUSTER", "cluster"),
        from_config("FLEETLET_STATUS_REPO", "status-repo", optional=True),
        from_trust("FLEETLET_IDENTITY", "identity"),
        from_trust("FLEETLET_ISSUER", "issuer"),
        {"name": "FLEETLET_TRUSTED_ROOT", "value": "/etc/fleetlet/trust/trusted_root.json"},
        {"name": "FLEETLET_GIT_CREDENTIALS_DIR", "value": "/etc/fleetlet/git"},
        {"name": "FLEETLET_STATUS_GIT_CREDENTIALS_DIR", "value": "/etc/fleetlet/status-git"},
        {"name": "FLEETLET_CACHE_DIR", "value": "/var/cache/fleetlet"},
        {"name": "FLEETLET_PROBE_ADDRESS", "value": f":{PROBE_PORT}"},
        {"name": "FLEETLET_LOG_FORMAT", "value": log_format},
        {
            "name": "FLEETLET_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        # In a pod, the agent upgrades itself by this Deployment (agent.upgrade.incluster); the
        # image it runs (an upgrade sets the release's digest; a new install sets this back).
        {"name": ENV_DEPLOYMENT, "value": NAME},
        {"name": "FLEETLET_AGENT_IMAGE", "value": image.rpartition("@")[2]},
        # What it may do to upgrade itself: what its RBAC grants (agent.upgrade.rights).
        {"name": ENV_SELF_UPGRADE, "value": self_upgrade.value},
        # libgit2 reads $HOME/.ssh/known_hosts for ssh:// repositories.
        {"name": "HOME", "value": "/home/fleetlet"},
    ]
    if poll_interval is not None:
        env.append({"name": "FLEETLET_POLL_INTERVAL", "value": f"{poll_interval:g}"})
    mounts: list[Object] = [
        {"name": "trust", "mountPath": "/etc/fleetlet/trust", "readOnly": True},
        {"name": "git-credentials", "mountPath": "/etc/fleetlet/git", "readOnly": True},
        {
            "name": "status-git-credentials",
            "mountPath": "/etc/fleetlet/status-git",
            "readOnly": True,
        },
        {"name": "ssh", "mountPath": "/home/fleetlet/.ssh", "readOnly": True},
        {"name": "cache", "mountPath": "/var/cache/fleetlet"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Object] = [
        # Required: without its trust configuration the agent does not start (fails closed).
        {
            "name": "trust",
            "secret": {
                "secretName": TRUST_SECRET,
                "items": [
                    {"key": key, "path": key} for key in ("trusted_root.json", *source_policy)
                ],
                "defaultMode": 0o440,
            },
        },
        {
            "name": "git-credentials",
            "secret": {"secretName": GIT_SECRET, "optional": True, "defaultMode": 0o440},
        },
        {
            "name": "status-git-credentials",
            "secret": {"secretName": STATUS_GIT_SECRET, "optional": True, "defaultMode": 0o440},
        },
        {"name": "ssh", "configMap": {"name": "fleetlet-ssh-known-hosts", "optional": True}},
        # A cache (content by digest, the branch's bare repository): what matters is in the
        # cluster, so it is rebuilt after a restart.
        {"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    if source_policy:  # the cluster's own source signature policy (--verify-sources)
        env.append(
            {"name": "FLEETLET_SOURCE_POLICY", "value": f"/etc/fleetlet/trust/{SOURCE_POLICY}"}
        )
    if hub_public_key:
        env.append({"name": "FLEETLET_HUB_PUBLIC_KEY", "value": "/etc/fleetlet/hub/hub.pub"})
        mounts.append({"name": "hub-key", "mountPath": "/etc/fleetlet/hub", "readOnly": True})
        volumes.append({"name": "hub-key", "configMap": {"name": HUB_KEY_CONFIG_MAP}})
    env += [{"name": k, "value": v} for k, v in sorted((extra_env or {}).items())]
    template_meta: Object = {"labels": _labels()}
    if config_hash:
        template_meta["annotations"] = {CONFIG_HASH_ANNOTATION: config_hash}
    probe = {"httpGet": {"path": "/healthz", "port": "health"}}
    container: Object = {
        "name": "agent",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        # Every setting comes from the FLEETLET_* environment (see `fleetlet agent run -h`).
        "command": ["fleetlet", "agent", "run"],
        "env": env,
        "ports": [{"name": "health", "containerPort": PROBE_PORT, "protocol": "TCP"}],
        # /healthz: the poll loop is alive; /readyz: a first tick completed; /metrics.
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
        # From bench/agent_footprint.py (docs/benchmarks.md): the supervisor idles at about
        # 52 MB and 1 CPU-second per hour; the pod peaks at about 150 MB while a worker moves a
        # 2,000-object group with a Helm chart (workers exit: the request covers the idle
        # agent, the limit the peak with room for larger groups).
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "192Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(NAME, namespace),
        "spec": {
            # Never two agents at once: one writer per cluster; Recreate stops the old pod first.
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {
                "metadata": template_meta,
                "spec": {
                    "serviceAccountName": NAME,
                    # Crash safety does not depend on it; a clean stop between stages is cheaper.
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


# --- the cluster's configuration -----------------------------------------------------------------


def _secret(name: str, namespace: str, data: Mapping[str, str], type_: str = "Opaque") -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(name, namespace),
        "type": type_,
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }


SOURCE_POLICY = "source-policy.yaml"
SOURCE_TRUSTED_ROOT = "source-trusted-root.json"


def source_policy_files(config: InstallConfig) -> dict[str, str]:
    """The Secret ``fleetlet-trust``'s files of the cluster's source policy (none without)."""
    files: dict[str, str] = {}
    if config.source_policy:
        files[SOURCE_POLICY] = config.source_policy
        if config.source_trusted_root:
            files[SOURCE_TRUSTED_ROOT] = config.source_trusted_root
    return files


def _config_map(name: str, namespace: str, data: Mapping[str, str]) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(name, namespace),
        "data": dict(sorted(data.items())),
    }


def config_objects(config: InstallConfig) -> list[Object]:
    """ConfigMap ``fleetlet-agent``, Secret ``fleetlet-trust`` and, when given, the
    credentials Secrets, the hub's public key and the ssh known hosts."""
    ns = config.namespace
    settings = {"repo": config.repo, "cluster": config.cluster}
    if config.status_repo:
        settings["status-repo"] = config.status_repo
    objects = [
        _config_map(CONFIG_MAP, ns, settings),
        # The trusted root and the identity policy: from the cluster's own configuration,
        # never from the repository they protect.
        _secret(
            TRUST_SECRET,
            ns,
            {
                "trusted_root.json": config.trusted_root,
                "identity": config.identity,
                "issuer": config.issuer,
                **source_policy_files(config),
            },
        ),
    ]
    for name, creds in ((GIT_SECRET, config.git), (STATUS_GIT_SECRET, config.status_git)):
        if creds is not None and creds.data():
            objects.append(_secret(name, ns, creds.data()))
    known_hosts = next(
        (c.known_hosts for c in (config.git, config.status_git) if c and c.known_hosts), None
    )
    if known_hosts:
        objects.append(_config_map("fleetlet-ssh-known-hosts", ns, {"known_hosts": known_hosts}))
    if config.registry_config:
        registry = _secret(
            REGISTRY_SECRET,
            ns,
            {".dockerconfigjson": config.registry_config},
            "kubernetes.io/dockerconfigjson",
        )
        # Meant for bundle sources (agent.source.compose.SOURCE_CREDENTIAL_LABEL); each entry
        # of the docker config names the registry it is for.
        registry["metadata"]["labels"]["fleetlet.io/source-credential"] = "true"
        objects.append(registry)
    if config.hub_public_key:
        objects.append(_config_map(HUB_KEY_CONFIG_MAP, ns, {"hub.pub": config.hub_public_key}))
    return objects


def config_hash(objects: Sequence[Object]) -> str:
    """SHA-256 of the configuration objects' data: the pod template annotation that makes a
    changed configuration restart the agent (and an unchanged one leave it alone)."""
    digest = hashlib.sha256()
    for obj in objects:
        body = {"kind": obj["kind"], "name": obj["metadata"]["name"], "data": obj.get("data")}
        digest.update(json.dumps(body, sort_keys=True).encode())
    return digest.hexdigest()


def install_objects(config: InstallConfig) -> list[Object]:
    """Everything ``fleetlet agent install`` applies, in order."""
    configuration = config_objects(config)
    objects = [
        *crds(),
        *namespace_objects(config.namespace),
        *rbac_objects(config.namespace, config.self_upgrade),
        *configuration,
        *approval_policies(config.namespace),
        service(config.namespace),
    ]
    if config.service_monitor:
        objects.append(service_monitor(config.namespace))
    agent = deployment(
        namespace=config.namespace,
        image=config.image,
        config_hash=config_hash(configuration),
        hub_public_key=bool(config.hub_public_key),
        source_policy=tuple(source_policy_files(config)),
        poll_interval=config.poll_interval,
        log_format=config.log_format,
        self_upgrade=config.self_upgrade,
        extra_env=config.extra_env,
    )
    if config.self_upgrade is SelfUpgrade.OFF:
        return [*objects, agent]  # and the candidate deleted: left_out_objects
    # The candidate of an in-cluster upgrade, with no replica until one (agent.upgrade).
    return [*objects, agent, candidate_of(agent)]


def left_out_objects(config: InstallConfig) -> list[Object]:
    """What another setting of the same installation has and this one has not: ``agent
    install`` deletes them (the candidate Deployment with ``--self-upgrade=off``)."""
    if config.self_upgrade is not SelfUpgrade.OFF:
        return []
    candidate = candidate_of(deployment(namespace=config.namespace, image=config.image))
    return [{k: candidate[k] for k in ("apiVersion", "kind", "metadata")}]


# --- the kustomize base in deploy/ ---------------------------------------------------------------

_HEADER = (
    "# Generated by `python -m agent.install.manifests --write` from agent/install/manifests.py\n"
    "# (the same objects `fleetlet agent install` applies): edit there, not here.\n"
)


def base_files() -> dict[str, bytes]:
    """``{path relative to the repository root: content}`` of the generated kustomize base."""
    from agent.install.components import component_files

    ns = DEFAULT_NAMESPACE

    def file(note: str, objects: Sequence[Object]) -> bytes:
        comment = "".join(f"# {line}\n" if line else "#\n" for line in note.splitlines())
        body = b"---\n".join(dump_yaml(o) for o in objects)
        return (_HEADER + comment).encode() + body

    return {
        "deploy/agent/namespace.yaml": file(
            "The agent's namespace: its state, revision store, sensitive outputs and the\n"
            "ServiceAccounts bundles run as. Nothing else should live here.",
            namespace_objects(ns)[:1],
        ),
        "deploy/agent/serviceaccount.yaml": file("", namespace_objects(ns)[1:]),
        "deploy/agent/rbac.yaml": file(
            'Least privilege (docs/operations.md, "The RBAC model"). Note: an overlay that\n'
            "sets `namespace:` also moves the Role and RoleBinding fleetlet-agent-events out\n"
            "of `default`; patch them back (events about cluster-scoped objects go there).",
            rbac_objects(ns),
        ),
        "deploy/agent/service.yaml": file("/healthz, /readyz and /metrics.", [service(ns)]),
        "deploy/agent/deployment.yaml": file(
            "Needs, in its namespace: ConfigMap fleetlet-agent (repo, cluster[, status-repo])\n"
            "and Secret fleetlet-trust (trusted_root.json, identity, issuer); optionally the\n"
            "Secrets fleetlet-git-credentials, fleetlet-status-git-credentials. The image is a\n"
            "placeholder digest: set yours with kustomize `images:` (see docs/operations.md).\n"
            "fleetlet-agent-candidate has no replica: the agent runs a new image in it to\n"
            "upgrade itself (docs/operations.md, agent upgrades).",
            [agent := deployment(namespace=ns, image=RELEASE_IMAGE), candidate_of(agent)],
        ),
        "deploy/agent/approvals/policy.yaml": file(
            "Approvals enforced by kube-apiserver (docs/approvals.md): who may decide a\n"
            "BundleDeploymentRequest. Needs Kubernetes 1.30+ (ValidatingAdmissionPolicy GA).",
            policy_objects(),
        ),
        "deploy/agent/approvals/approver.yaml": file(
            "For the people who decide: kubectl create clusterrolebinding alice-approves\n"
            "--clusterrole=fleetlet-approver --user=alice (or a ClusterRole of your own with\n"
            "resourceNames: named-resource RBAC works with the verb approve). The Role reads\n"
            "the whole diffs of large previews (fleetlet preview --full).",
            approver_objects(ns),
        ),
        "deploy/agent/auto-approver/auto-approver.yaml": file(
            "OPT-IN: the identity the agent approves as when a rule of the cluster's\n"
            'ApprovalPolicy matches (docs/approvals.md, "What is trusted").',
            auto_approver_objects(ns),
        ),
        "deploy/agent/monitoring/servicemonitor.yaml": file(
            "Optional: needs the Prometheus Operator's CRDs.", [service_monitor(ns)]
        ),
        **component_files(dump_yaml, _HEADER),  # --self-upgrade's kustomize components
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``--write`` the kustomize base or ``--check`` it; returns the exit code."""
    return write_or_check(
        base_files,
        prog="python -m agent.install.manifests",
        description="Write deploy/agent/ from the objects `fleetlet agent install` applies.",
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(main())
