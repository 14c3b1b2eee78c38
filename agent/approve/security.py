"""What a move means for the cluster's security, object by object.

:func:`findings` compares an object before and after a move and says what a cluster admin
should know before approving it, by category:

- ``rbac``: rights handed to someone. A Role or ClusterRole added, or widened (a grant it did
  not have: every new (apiGroup, resource, verb, name) tuple counts), with the wildcards,
  ``escalate``, ``bind``, ``impersonate`` and secrets access among the new grants; a RoleBinding
  or ClusterRoleBinding added, or given new subjects or another role; and the objects that hand
  rights to whoever uses them without any binding: a ``kubernetes.io/service-account-token``
  Secret (the ServiceAccount's token, for anyone who reads the Secret) and a hostPath
  PersistentVolume (the node's files, for any claim bound to it, past Pod Security admission);
- ``crds``: a CustomResourceDefinition added or changed;
- ``webhooks``: what the API server admits and where it sends requests. An admission webhook
  configuration or admission policy (and binding) added or changed; an APIService served by a
  Service (an aggregated API: the API server forwards that group's requests, with the user's
  identity, to the Service); a Namespace whose Pod Security ``enforce`` level is relaxed (to
  ``privileged``, to a lower level, or the label removed);
- ``privileged``: a pod spec (of a Pod or of any workload's pod template) that gains
  privileges: a privileged or privilege-escalating container, added capabilities, a hostPath
  volume, the host's network, PID or IPC namespace, a host port;
- ``namespaces``: a Namespace created.

Deletions only take rights away: they are listed in the preview, not here. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent.api.approvals import Finding, ObjectAction

Object = Mapping[str, Any]

RBAC_GROUP = "rbac.authorization.k8s.io"
ADMISSION_GROUP = "admissionregistration.k8s.io"
ADMISSION_KINDS = frozenset(
    {
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    }
)
APISERVICE_GROUP = "apiregistration.k8s.io"
TOKEN_SECRET = "kubernetes.io/service-account-token"
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
POD_SECURITY_LEVELS = {"privileged": 0, "baseline": 1, "restricted": 2}
"""Pod Security levels, least strict first (an unknown value: the API server refuses it)."""
POWERFUL_VERBS = ("escalate", "bind", "impersonate")
READ_VERBS = frozenset({"get", "list", "watch", "*"})
MAX_DETAILS = 16

Grant = tuple[str, str, str, str]
"""(apiGroup, resource, verb, resourceName or "" for all) or ("url", path, verb, "")."""


def _group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --- RBAC -------------------------------------------------------------------------------------


def grants(role: Object | None) -> set[Grant]:
    """Every (apiGroup, resource, verb, name) a Role/ClusterRole grants (non-resource URLs
    as ``("url", path, verb, "")``)."""
    out: set[Grant] = set()
    for rule in _list(_map(role).get("rules")):
        rule = _map(rule)
        verbs = [str(v) for v in _list(rule.get("verbs"))]
        names = [str(n) for n in _list(rule.get("resourceNames"))] or [""]
        for url in _list(rule.get("nonResourceURLs")):
            out |= {("url", str(url), v, "") for v in verbs}
        for group in _list(rule.get("apiGroups")):
            for resource in _list(rule.get("resources")):
                out |= {(str(group), str(resource), v, n) for v in verbs for n in names}
    return out


def _grant_details(new: set[Grant], *, cluster_wide: bool) -> list[str]:
    details = ["cluster-wide"] if cluster_wide else []
    for label, position in (("apiGroups", 0), ("resources", 1), ("verbs", 2)):
        if any(g[position] == "*" for g in new if g[0] != "url"):
            details.append(f"{label}: *")
    verbs = {g[2] for g in new}
    details += [v for v in POWERFUL_VERBS if v in verbs]
    secrets = sorted(
        {g[2] for g in new if g[0] in ("", "*") and g[1] in ("secrets", "*") and g[2] in READ_VERBS}
    )
    if secrets:
        details.append("secrets: " + ",".join(secrets))
    if any(g[0] == "url" for g in new):
        details.append("non-resource URLs")
    # Then what is granted, one line per resource (bounded by the caller).
    by_resource: dict[str, set[str]] = {}
    for group, resource, verb, name in sorted(new):
        if group == "url":
            key = f"url {resource}"
        else:
            key = f"{resource}.{group}" if group else resource
            if name:
                key += f"/{name}"
        by_resource.setdefault(key, set()).add(verb)
    details += [f"{key}: {','.join(sorted(v))}" for key, v in sorted(by_resource.items())]
    return details


def _subjects(binding: Object | None) -> set[str]:
    out = set()
    for subject in _list(_map(binding).get("subjects")):
        subject = _map(subject)
        where = f"{subject.get('namespace')}/" if subject.get("namespace") else ""
        out.add(f"{subject.get('kind')} {where}{subject.get('name')}")
    return out


def _role_ref(binding: Object | None) -> str:
    ref = _map(_map(binding).get("roleRef"))
    return f"{ref.get('kind')} {ref.get('name')}" if ref else ""


def _rbac(kind: str, action: ObjectAction, before: Object | None, after: Object) -> list[str]:
    if kind in ("Role", "ClusterRole"):
        new = grants(after) - grants(before)
        aggregation = _map(after.get("aggregationRule"))
        widened = bool(new) or (
            aggregation and aggregation != _map(_map(before).get("aggregationRule"))
        )
        if action != "created" and not widened:
            return []
        details = _grant_details(new, cluster_wide=kind == "ClusterRole")
        if aggregation:
            details.insert(1, "aggregates other ClusterRoles")
        return details or ["grants nothing"]
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        added = sorted(_subjects(after) - _subjects(before))
        role = _role_ref(after)
        if action != "created" and not added and role == _role_ref(before):
            return []
        details = ["cluster-wide"] if kind == "ClusterRoleBinding" else []
        details.append(f"roleRef: {role}")
        if role == "ClusterRole cluster-admin":
            details.append("cluster-admin")
        details += [f"subject: {s}" for s in added]
        return details
    return []


# --- objects that grant without a binding, or change admission -----------------------------


def _token_secret(action: ObjectAction, before: Object | None, after: Object) -> list[str]:
    if after.get("type") != TOKEN_SECRET:
        return []
    account = _map(_map(after.get("metadata")).get("annotations")).get(
        "kubernetes.io/service-account.name"
    )
    was = _map(_map(_map(before).get("metadata")).get("annotations")).get(
        "kubernetes.io/service-account.name"
    )
    if action != "created" and _map(before).get("type") == TOKEN_SECRET and was == account:
        return []
    return [f"token of ServiceAccount {account}", "readable by whoever may read this Secret"]


def _host_volume(before: Object | None, after: Object) -> list[str]:
    path = _map(_map(after.get("spec")).get("hostPath")).get("path")
    if path is None or path == _map(_map(_map(before).get("spec")).get("hostPath")).get("path"):
        return []
    return [f"hostPath {path}", "any claim bound to it reads and writes the node's files"]


def _api_service(after: Object) -> list[str]:
    spec = _map(after.get("spec"))
    service = _map(spec.get("service"))
    if not service:
        return []  # served locally by the API server itself
    details = [
        f"{spec.get('version')}.{spec.get('group')} served by Service "
        f"{service.get('namespace')}/{service.get('name')}",
        "the API server forwards these requests, with the user's identity",
    ]
    if spec.get("insecureSkipTLSVerify") is True:
        details.append("insecureSkipTLSVerify")
    return details


def _enforce(obj: Object | None) -> str | None:
    value = _map(_map(_map(obj).get("metadata")).get("labels")).get(ENFORCE_LABEL)
    return None if value is None else str(value)


def _pod_security(action: ObjectAction, before: Object | None, after: Object) -> list[str]:
    now, was = _enforce(after), _enforce(before)
    if action == "created" or now == was:
        return [f"Pod Security enforce: {now}"] if now == "privileged" else []
    if now is None:
        return [f"Pod Security enforce label removed (was {was}): the cluster's default applies"]
    strict = POD_SECURITY_LEVELS.get
    if was is None or strict(now, 0) < strict(was, 0):
        return [f"Pod Security enforce relaxed: {was or 'the cluster default'} -> {now}"]
    return []


# --- pods ---------------------------------------------------------------------------------


def pod_spec(obj: Object | None) -> Mapping[str, Any] | None:
    """The pod spec of a Pod, a workload's pod template or a CronJob's job template."""
    obj = _map(obj)
    spec = _map(obj.get("spec"))
    if obj.get("kind") == "Pod":
        return spec
    if obj.get("kind") == "CronJob":
        spec = _map(_map(spec.get("jobTemplate")).get("spec"))
    template = _map(spec.get("template"))
    inner = template.get("spec")
    return inner if isinstance(inner, Mapping) else None


def privileges(spec: Mapping[str, Any] | None) -> set[str]:
    """What a pod spec may do beyond an ordinary pod, one fact each."""
    if spec is None:
        return set()
    out = {f"{key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key) is True}
    for volume in _list(spec.get("volumes")):
        path = _map(_map(volume).get("hostPath")).get("path")
        if path is not None:
            out.add(f"hostPath {path}")
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in _list(spec.get(field)):
            container = _map(container)
            name = container.get("name", "?")
            context = _map(container.get("securityContext"))
            if context.get("privileged") is True:
                out.add(f"privileged container {name}")
            if context.get("allowPrivilegeEscalation") is True:
                out.add(f"privilege escalation container {name}")
            for cap in _list(_map(context.get("capabilities")).get("add")):
                out.add(f"capability {cap} container {name}")
            for port in _list(container.get("ports")):
                if _map(port).get("hostPort"):
                    out.add(f"hostPort {_map(port)['hostPort']} container {name}")
    return out


# --- all categories -------------------------------------------------------------------------


def findings(
    *,
    bundle: str,
    target: str,
    api_version: str,
    kind: str,
    action: ObjectAction,
    before: Object | None,
    after: Object | None,
) -> list[tuple[str, Finding]]:
    """(category, finding) pairs for one object a move creates or changes (none for
    deletions, refusals and objects it leaves as they are)."""
    if action not in ("created", "changed") or after is None:
        return []
    group = _group(api_version)
    out: list[tuple[str, list[str]]] = []
    if group == RBAC_GROUP:
        out.append(("rbac", _rbac(kind, action, before, after)))
    elif kind == "CustomResourceDefinition" and group == "apiextensions.k8s.io":
        spec = _map(after.get("spec"))
        names = _map(spec.get("names"))
        what = f"{names.get('kind')} ({spec.get('group')}, {spec.get('scope', 'Namespaced')})"
        out.append(("crds", [what, "new API" if action == "created" else "definition changed"]))
    elif kind in ADMISSION_KINDS and group == ADMISSION_GROUP:
        hooks = [_map(w) for w in _list(after.get("webhooks"))]
        details = [
            f"webhook {w.get('name')} (failurePolicy {w.get('failurePolicy', 'Fail')})"
            for w in hooks
        ] or [kind]
        out.append(("webhooks", details))
    elif kind == "APIService" and group == APISERVICE_GROUP:
        out.append(("webhooks", _api_service(after)))
    elif kind == "Secret" and api_version == "v1":
        out.append(("rbac", _token_secret(action, before, after)))
    elif kind == "PersistentVolume" and api_version == "v1":
        out.append(("rbac", _host_volume(before, after)))
    elif kind == "Namespace" and api_version == "v1":
        if action == "created":
            out.append(("namespaces", ["created"]))
        out.append(("webhooks", _pod_security(action, before, after)))
    gained = privileges(pod_spec(after)) - privileges(pod_spec(before))
    if gained:
        out.append(("privileged", sorted(gained)))
    return [
        (
            category,
            Finding(
                bundle=bundle,
                object=target[:512],
                action=action,
                details=_bounded(details),
            ),
        )
        for category, details in out
        if details
    ]


def _bounded(details: Iterable[str]) -> tuple[str, ...]:
    items = [d[:256] for d in details]
    if len(items) > MAX_DETAILS:
        items = [*items[: MAX_DETAILS - 1], f"... and {len(items) - MAX_DETAILS + 1} more"]
    return tuple(items)


__all__ = ["findings", "grants", "pod_spec", "privileges"]
