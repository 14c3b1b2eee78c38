"""The objects a registry+v1 bundle becomes, generated as operator-controller generates them.

One function per kind of object, in operator-controller's generator order
(``internal/operator-controller/rukpak/render/registryv1``): ServiceAccounts, Roles and
RoleBindings from ``permissions``, ClusterRoles and ClusterRoleBindings from
``clusterPermissions``, CRDs, the bundle's other manifests, the install strategy's Deployments,
the admission webhook configurations, the webhook Services and the certificate objects.
Generated names (the RBAC objects) use operator-controller's own scheme, base36 of the SHA-224
of the Go JSON encoding of the permission, so an operator moved from OLM v1 to fleetlet keeps
the names of its roles.

Everything here works on plain JSON data already checked by :mod:`agent.render.registry_v1`
(its validation refuses what operator-controller refuses), so nothing here raises.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.render.manifests import Manifest

MAX_NAME_LENGTH = 63
RBAC_GROUP = "rbac.authorization.k8s.io"
CERT_MANAGER_API = "cert-manager.io/v1"
CERT_MANAGER_INJECT = "cert-manager.io/inject-ca-from"
TARGET_NAMESPACES = "olm.targetNamespaces"
OPERATOR_NAMESPACE = "olm.operatorNamespace"

# registry+v1's supported kinds besides the CSV and CRDs, and whether OLM namespaces them
# (operator-registry's pkg/lib/bundle/supported_resources.go).
SUPPORTED_KINDS: Mapping[str, bool] = {
    "ClusterRole": False,
    "ClusterRoleBinding": False,
    "Service": True,
    "ServiceAccount": True,
    "Role": True,
    "RoleBinding": True,
    "PrometheusRule": True,
    "ServiceMonitor": True,
    "Secret": True,
    "ConfigMap": True,
    "PodDisruptionBudget": True,
    "PriorityClass": False,
    "VerticalPodAutoscaler": False,
    "ConsoleYAMLSample": False,
}

# Where webhook serving certificates are mounted, replacing whatever the bundle mounted there.
_CERT_VOLUMES = (
    ("webhook-cert", "/tmp/k8s-webhook-server/serving-certs", "tls.crt", "tls.key"),
    ("apiservice-cert", "/apiserver.local.config/certificates", "apiserver.crt", "apiserver.key"),
)


@dataclass(frozen=True, kw_only=True)
class Bundle:
    """A loaded registry+v1 bundle: its package, CSV, CRDs and other manifests."""

    package: str
    csv: Manifest
    crds: Sequence[Manifest]
    others: Sequence[Manifest]

    @property
    def name(self) -> str:
        return str(self.csv["metadata"]["name"])

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.csv.get("spec")
        return spec if isinstance(spec, dict) else {}

    def strategy(self, key: str) -> list[dict[str, Any]]:
        """``spec.install.spec.<key>`` (deployments, permissions, clusterPermissions)."""
        install = _dict(_dict(self.spec.get("install")).get("spec"))
        return [item for item in _list(install.get(key)) if isinstance(item, dict)]

    def webhooks(self, kind: str | None = None) -> list[dict[str, Any]]:
        """``spec.webhookdefinitions`` (of one ``type``)."""
        found = [w for w in _list(self.spec.get("webhookdefinitions")) if isinstance(w, dict)]
        return [w for w in found if kind is None or w.get("type") == kind]

    def install_modes(self) -> set[str]:
        """The install modes the CSV says it supports."""
        return {
            str(m.get("type"))
            for m in _list(self.spec.get("installModes"))
            if isinstance(m, dict) and m.get("supported") is True
        }


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where the operator goes: its namespace, the namespaces it watches (``("",)``: all),
    and whether webhook certificates come from cert-manager (``False``: no certificate
    provider, as operator-controller's bare renderer, which its regression files show)."""

    install_namespace: str
    target_namespaces: tuple[str, ...]
    cert_manager: bool = True

    @property
    def all_namespaces(self) -> bool:
        return self.target_namespaces == ("",)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


# --- names -------------------------------------------------------------------------------------


def go_json(value: object) -> str:
    """``value`` as Go's ``encoding/json`` writes it (compact, HTML characters escaped)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text


def deep_hash(value: object) -> str:
    """operator-controller's ``DeepHashObject``: base36 of the SHA-224 of the Go JSON
    encoding (with the encoder's trailing newline)."""
    number = int.from_bytes(hashlib.sha224((go_json(value) + "\n").encode()).digest(), "big")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while number:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
    return out or "0"


def name_with_suffix(base: str, suffix: str) -> str:
    """``base-suffix``, ``base`` cut so the whole fits in 63 characters."""
    if len(base) + len(suffix) > MAX_NAME_LENGTH:
        base = base[: MAX_NAME_LENGTH - len(suffix) - 1]
    return f"{base}-{suffix}"


def _policy_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A PolicyRule with Go's field order and ``omitempty`` (what the name hash sees)."""
    out: dict[str, Any] = {"verbs": rule.get("verbs")}
    for key in ("apiGroups", "resources", "resourceNames", "nonResourceURLs"):
        if rule.get(key):
            out[key] = rule[key]
    return out


def _permission_name(bundle: Bundle, account: str, rules: Sequence[Mapping[str, Any]]) -> str:
    permission = {"serviceAccountName": account, "rules": [_policy_rule(r) for r in rules]}
    return name_with_suffix(f"{bundle.name}-{account}", deep_hash(permission))


def _account(permission: Mapping[str, Any]) -> str:
    return str(permission.get("serviceAccountName") or "") or "default"


def service_name(deployment: str) -> str:
    """The webhook Service of a deployment (OLM v0's naming)."""
    return name_with_suffix(deployment.replace(".", "-"), "service")


def certificate_name(deployment: str) -> str:
    """The serving certificate (and its Secret) of a deployment's webhooks."""
    return name_with_suffix(service_name(deployment), "cert")


def _inject_ca(obj: Manifest, placement: Placement, deployment: str) -> None:
    if placement.cert_manager:
        annotations = obj["metadata"].setdefault("annotations", {})
        annotations[CERT_MANAGER_INJECT] = (
            f"{placement.install_namespace}/{certificate_name(deployment)}"
        )


# --- generators --------------------------------------------------------------------------------


def service_accounts(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """One ServiceAccount per account the permissions name (``default`` is not created)."""
    names = {
        _account(p) for p in bundle.strategy("permissions") + bundle.strategy("clusterPermissions")
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": placement.install_namespace},
        }
        for name in sorted(names - {"default"})
    ]


def roles(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """A Role and RoleBinding per permission in each watched namespace (none when watching
    all namespaces: the permissions become cluster roles)."""
    if placement.all_namespaces:
        return []
    out: list[Manifest] = []
    for namespace in placement.target_namespaces:
        for permission in bundle.strategy("permissions"):
            account = _account(permission)
            rules = _list(permission.get("rules"))
            name = _permission_name(bundle, account, rules)
            out.append(
                {
                    "apiVersion": f"{RBAC_GROUP}/v1",
                    "kind": "Role",
                    "metadata": {"name": name, "namespace": namespace},
                    "rules": copy.deepcopy(rules),
                }
            )
            out.append(_binding("RoleBinding", name, namespace, account, placement))
    return out


def cluster_roles(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """A ClusterRole and ClusterRoleBinding per cluster permission; watching all namespaces,
    the namespaced permissions too, each with get/list/watch on namespaces added (OLM v0)."""
    permissions = [
        (_account(p), _list(p.get("rules"))) for p in bundle.strategy("clusterPermissions")
    ]
    if placement.all_namespaces:
        read_namespaces = {
            "verbs": ["get", "list", "watch"],
            "apiGroups": [""],
            "resources": ["namespaces"],
        }
        permissions += [
            (_account(p), [*_list(p.get("rules")), read_namespaces])
            for p in bundle.strategy("permissions")
        ]
    out: list[Manifest] = []
    for account, rules in permissions:
        name = _permission_name(bundle, account, rules)
        out.append(
            {
                "apiVersion": f"{RBAC_GROUP}/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": copy.deepcopy(rules),
            }
        )
        out.append(_binding("ClusterRoleBinding", name, None, account, placement))
    return out


def _binding(
    kind: str, name: str, namespace: str | None, account: str, placement: Placement
) -> Manifest:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": kind,
        "metadata": metadata,
        "roleRef": {
            "apiGroup": RBAC_GROUP,
            "kind": kind.removesuffix("Binding"),
            "name": name,
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": account, "namespace": placement.install_namespace}
        ],
    }


def crds(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """The bundle's CRDs; those a conversion webhook serves point at its Service."""
    conversions: dict[str, dict[str, Any]] = {}
    for webhook in bundle.webhooks("ConversionWebhook"):
        for crd in _list(webhook.get("conversionCRDs")):
            conversions[str(crd)] = webhook
    out: list[Manifest] = []
    for crd in bundle.crds:
        obj = copy.deepcopy(crd)
        converting = conversions.get(str(obj["metadata"]["name"]))
        if converting is not None:
            webhook = converting
            spec = obj.setdefault("spec", {})
            deployment = str(webhook.get("deploymentName"))
            spec["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {
                            "namespace": placement.install_namespace,
                            "name": service_name(deployment),
                            "path": webhook.get("webhookPath") or "/",
                            "port": _container_port(webhook),
                        }
                    },
                    "conversionReviewVersions": webhook.get("admissionReviewVersions"),
                },
            }
            _inject_ca(obj, placement, deployment)
        out.append(obj)
    return out


def others(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """The bundle's other manifests, namespaced ones moved into the install namespace."""
    out: list[Manifest] = []
    for item in bundle.others:
        obj = copy.deepcopy(item)
        if SUPPORTED_KINDS.get(str(obj["kind"])):
            obj["metadata"]["namespace"] = placement.install_namespace
        out.append(obj)
    return out


def deployments(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """The install strategy's Deployments in the install namespace, their pods annotated with
    the CSV's annotations and OLM's ``olm.targetNamespaces``/``olm.operatorNamespace``, one
    old ReplicaSet kept (OLM v0's parity), webhook servers given their serving certificate."""
    with_webhooks = {str(w.get("deploymentName")) for w in bundle.webhooks()}
    csv_annotations = _dict(bundle.csv["metadata"].get("annotations"))
    out: list[Manifest] = []
    for item in bundle.strategy("deployments"):
        name = str(item.get("name"))
        spec = copy.deepcopy(_dict(item.get("spec")))
        template = spec.setdefault("template", {})
        template_meta = template.setdefault("metadata", {})
        annotations = {**csv_annotations, **_dict(template_meta.get("annotations"))}
        annotations[TARGET_NAMESPACES] = ",".join(placement.target_namespaces)
        annotations[OPERATOR_NAMESPACE] = placement.install_namespace
        template_meta["annotations"] = annotations
        spec["revisionHistoryLimit"] = 1
        metadata: dict[str, Any] = {"name": name, "namespace": placement.install_namespace}
        labels = item.get("label")
        if isinstance(labels, dict) and labels:
            metadata["labels"] = dict(labels)
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata}
        deployment["spec"] = spec
        if name in with_webhooks and placement.cert_manager:
            _mount_certificate(deployment, certificate_name(name))
        out.append(deployment)
    return out


def _mount_certificate(deployment: Manifest, secret: str) -> None:
    """Replace the volumes at the certificate paths (and the volumes named like ours) with
    the serving certificate's Secret, in every container (operator-controller's way)."""
    pod = deployment["spec"]["template"].setdefault("spec", {})
    containers = [c for c in _list(pod.get("containers")) if isinstance(c, dict)]
    removed = {name for name, *_ in _CERT_VOLUMES}
    paths = {path for _, path, *_ in _CERT_VOLUMES}
    for container in containers:
        for mount in _list(container.get("volumeMounts")):
            if isinstance(mount, dict) and mount.get("mountPath") in paths:
                removed.add(str(mount.get("name")))
    volumes = [
        {
            "name": name,
            "secret": {
                "secretName": secret,
                "items": [{"key": "tls.crt", "path": cert}, {"key": "tls.key", "path": key}],
            },
        }
        for name, _, cert, key in _CERT_VOLUMES
    ]
    kept = [v for v in _list(pod.get("volumes")) if _dict(v).get("name") not in removed]
    pod["volumes"] = kept + volumes
    mounts = [{"name": name, "mountPath": path} for name, path, *_ in _CERT_VOLUMES]
    for container in containers:
        existing = _list(container.get("volumeMounts"))
        container["volumeMounts"] = [
            m for m in existing if _dict(m).get("name") not in removed
        ] + copy.deepcopy(mounts)


def _container_port(webhook: Mapping[str, Any]) -> int:
    port = webhook.get("containerPort")
    return port if isinstance(port, int) and not isinstance(port, bool) and port > 0 else 443


def admission_webhooks(bundle: Bundle, placement: Placement, kind: str) -> list[Manifest]:
    """One Validating- or MutatingWebhookConfiguration per webhook definition of that type,
    calling its deployment's Service, limited to the watched namespaces."""
    mutating = kind == "MutatingAdmissionWebhook"
    out: list[Manifest] = []
    for webhook in bundle.webhooks(kind):
        deployment = str(webhook.get("deploymentName"))
        name = str(webhook.get("generateName")).removesuffix("-")
        service: dict[str, Any] = {
            "namespace": placement.install_namespace,
            "name": service_name(deployment),
        }
        if webhook.get("webhookPath"):
            service["path"] = webhook["webhookPath"]
        service["port"] = _container_port(webhook)
        entry: dict[str, Any] = {"name": name}
        for key in (
            "rules",
            "failurePolicy",
            "matchPolicy",
            "objectSelector",
            "sideEffects",
            "timeoutSeconds",
            "admissionReviewVersions",
        ):
            if webhook.get(key) not in (None, [], {}):
                entry[key] = copy.deepcopy(webhook[key])
        entry["clientConfig"] = {"service": service}
        if mutating and webhook.get("reinvocationPolicy"):
            entry["reinvocationPolicy"] = webhook["reinvocationPolicy"]
        if not placement.all_namespaces:
            entry["namespaceSelector"] = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "In",
                        "values": list(placement.target_namespaces),
                    }
                ]
            }
        obj: Manifest = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration"
            if mutating
            else "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [entry],
        }
        _inject_ca(obj, placement, deployment)
        out.append(obj)
    return out


def _port_order(port: Mapping[str, Any]) -> tuple[int, int]:
    target = port["targetPort"]
    if isinstance(target, str):
        target = int(target) if target.isdigit() else 0
    return (int(port["port"]), int(target))


def services(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """A Service per deployment that serves webhooks, one port per distinct webhook port."""
    ports: dict[str, list[dict[str, Any]]] = {}
    for webhook in bundle.webhooks():
        port = _container_port(webhook)
        target = webhook.get("targetPort")
        entry = {"name": str(port), "port": port, "targetPort": port if target is None else target}
        listed = ports.setdefault(str(webhook.get("deploymentName")), [])
        if entry not in listed:
            listed.append(entry)
    out: list[Manifest] = []
    for item in bundle.strategy("deployments"):
        name = str(item.get("name"))
        if name not in ports:
            continue
        spec: dict[str, Any] = {"ports": sorted(ports[name], key=_port_order)}
        selector = _dict(_dict(_dict(item.get("spec")).get("selector")).get("matchLabels"))
        if selector:
            spec["selector"] = dict(selector)
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service_name(name), "namespace": placement.install_namespace},
                "spec": spec,
            }
        )
    return out


def certificates(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """Per deployment that serves webhooks, a self-signed cert-manager Issuer and the serving
    Certificate (OLM v0's: two years, renewed a day before expiry)."""
    if not placement.cert_manager:
        return []
    namespace = placement.install_namespace
    out: list[Manifest] = []
    for deployment in sorted({str(w.get("deploymentName")) for w in bundle.webhooks()}):
        service = service_name(deployment)
        certificate = certificate_name(deployment)
        issuer = name_with_suffix(certificate, "selfsigned-issuer")
        out.append(
            {
                "apiVersion": CERT_MANAGER_API,
                "kind": "Issuer",
                "metadata": {"name": issuer, "namespace": namespace},
                "spec": {"selfSigned": {}},
            }
        )
        out.append(
            {
                "apiVersion": CERT_MANAGER_API,
                "kind": "Certificate",
                "metadata": {"name": certificate, "namespace": namespace},
                "spec": {
                    "secretName": certificate,
                    "commonName": f"{service}.{namespace}",
                    "usages": ["server auth"],
                    "dnsNames": [
                        f"{service}.{namespace}",
                        f"{service}.{namespace}.svc",
                        f"{service}.{namespace}.svc.cluster.local",
                    ],
                    "issuerRef": {"name": issuer},
                    "duration": "17520h0m0s",
                    "renewBefore": "24h0m0s",
                },
            }
        )
    return out


def generate(bundle: Bundle, placement: Placement) -> list[Manifest]:
    """Every object of the bundle, in operator-controller's generator order."""
    return [
        *service_accounts(bundle, placement),
        *roles(bundle, placement),
        *cluster_roles(bundle, placement),
        *crds(bundle, placement),
        *others(bundle, placement),
        *deployments(bundle, placement),
        *admission_webhooks(bundle, placement, "ValidatingAdmissionWebhook"),
        *admission_webhooks(bundle, placement, "MutatingAdmissionWebhook"),
        *services(bundle, placement),
        *certificates(bundle, placement),
    ]


__all__ = [
    "CERT_MANAGER_API",
    "SUPPORTED_KINDS",
    "Bundle",
    "Placement",
    "deep_hash",
    "generate",
    "go_json",
    "name_with_suffix",
]
