"""The ``registry+v1`` format: an OLM bundle converted into plain objects the way OLM v1's
operator-controller converts it, so that an operator installs without OLM.

A bundle is the bundle image's tree: ``metadata/annotations.yaml`` (the package name) and
``manifests/`` (no subdirectories): one ClusterServiceVersion, the CRDs, other manifests of
the kinds registry+v1 allows (ConfigMap, Secret, Service, RBAC, ServiceMonitor...). An
optional ``metadata/properties.yaml`` is merged into the CSV's ``olm.properties`` annotation.
``formatOptions.path`` renders a bundle kept in a subdirectory of the tree.

What it becomes (:mod:`agent.render._olm_objects`, operator-controller's generators): the
install strategy's Deployments in the install namespace (pods annotated with the CSV's
annotations, ``olm.targetNamespaces`` and ``olm.operatorNamespace``), the ServiceAccounts they
run as, Roles and RoleBindings from ``permissions`` in each watched namespace, ClusterRoles and
ClusterRoleBindings from ``clusterPermissions`` (and from ``permissions`` when watching every
namespace, with read access to namespaces added, as OLM does), the CRDs, the other manifests
(namespaced ones moved into the install namespace). The CSV itself is not applied.

Install modes, as operator-controller decides them:

- the install namespace is ``formatOptions.installNamespace``, else ``targetNamespace``;
- no ``watchNamespace``: AllNamespaces, which the CSV must support;
- ``watchNamespace`` equal to the install namespace: OwnNamespace; another namespace:
  SingleNamespace; either must be supported by the CSV. MultiNamespace is not offered (as in
  OLM v1: one watch namespace at most).

Webhooks are handled as operator-controller does with its default certificate provider,
cert-manager: each webhook deployment gets a Service, a self-signed ``Issuer`` and a
``Certificate`` whose Secret is mounted where the operator expects its serving certificate;
the webhook configurations and conversion CRDs get ``cert-manager.io/inject-ca-from``. So a
bundle with webhooks needs cert-manager on the cluster: when the cluster's served APIs are
known (the agent) and ``cert-manager.io/v1`` is not among them, the bundle is refused with
that reason before anything is applied. APIService definitions are refused (operator-controller
refuses them too). Every check operator-controller's bundle validator makes is made here, and
all its findings are reported at once.

A bundle that ships, as a file, an object the CSV also generates (its ServiceAccount, a
webhook Service: security-profiles-operator, OpenShift's opentelemetry-operator) renders one
object, the copy operator-controller applies last (:func:`merge_duplicates`; each merge is
logged). A CSV whose ``spec.version`` is not a semantic version (a template bundle never
filled in: ``0${VERSION}``) is refused, as operator-controller cannot read it.

Where fleetlet differs, on purpose: webhook configurations (cluster-scoped) carry no namespace;
a ``containerPort`` a webhook leaves out is 443 everywhere (operator-controller writes 0 in the
client config); ServiceAccounts come out sorted by name.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.render._olm_objects import (
    CERT_MANAGER_API,
    SUPPORTED_KINDS,
    Bundle,
    Placement,
    generate,
    go_json,
    others,
)
from agent.render.detect import OLM_ANNOTATIONS
from agent.render.manifests import InvalidManifestError, Manifest, load_documents, parse_manifests
from agent.render.plain import RenderRequest, render_root
from agent.source.tree import LinkEscapeError, resolve_inside

PACKAGE_ANNOTATION = "operators.operatorframework.io.bundle.package.v1"
MANIFESTS = "manifests"
PROPERTIES = "metadata/properties.yaml"
INSTALL_MODES = ("AllNamespaces", "OwnNamespace", "SingleNamespace")

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_FORBIDDEN_WEBHOOK_GROUPS = ("olm.operatorframework.io", "*")
_FORBIDDEN_ADMISSION_RESOURCES = (
    "*",
    "mutatingwebhookconfiguration",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfiguration",
    "validatingwebhookconfigurations",
)


_log = logging.getLogger(__name__)
# blang/semver's Parse (OperatorVersion): MAJOR.MINOR.PATCH, no leading zeros, optional
# -prerelease and +build.
_NUMBER = r"(?:0|[1-9][0-9]*)"
_SEMVER = re.compile(
    rf"{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    r"(?:-(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
    r"(?:\.(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?\Z",
    re.ASCII,
)


class RegistryV1Error(InvalidManifestError):
    """A registry+v1 bundle that cannot be converted, or options it does not support;
    ``rule`` says which (InvalidBundle, UnsupportedInstallMode, NoInstallNamespace,
    WebhooksNeedCertManager, UnsupportedBundle)."""

    reason = "RenderFailed"


def load_bundle(root: Path, *, request: RenderRequest) -> Bundle:
    """Read the bundle at ``root``: annotations, manifests, properties.

    Raises RegistryV1Error (InvalidBundle) and the manifest parser's InvalidManifestError.
    """
    source = request.source
    parse = request.limits.parse

    def refuse(message: str, file: str = "") -> RegistryV1Error:
        return RegistryV1Error(message, source=source, file=file, rule="InvalidBundle")

    annotations_doc = _read_one(root, OLM_ANNOTATIONS, request=request, required=True)
    annotations = annotations_doc.get("annotations") if annotations_doc else None
    if not isinstance(annotations, dict):
        raise refuse("no annotations mapping", OLM_ANNOTATIONS)
    package = annotations.get(PACKAGE_ANNOTATION)
    directory = root / MANIFESTS
    if not directory.is_dir():
        raise refuse(f"no {MANIFESTS}/ directory")
    csv: Manifest | None = None
    crds: list[Manifest] = []
    others: list[Manifest] = []
    names = sorted(os.listdir(directory))
    if len(names) > request.limits.max_files:
        raise refuse(f"more than {request.limits.max_files} files", MANIFESTS)
    for name in names:
        relative = f"{MANIFESTS}/{name}"
        _inside(root, relative, source)
        path = directory / name
        if path.is_dir():
            raise refuse("subdirectories are not allowed in manifests/", relative)
        for obj in parse_manifests(path.read_bytes(), source=source, file=relative, limits=parse):
            kind = obj["kind"]
            if kind == "ClusterServiceVersion":
                if csv is not None:
                    raise refuse("a second ClusterServiceVersion", relative)
                csv = obj
            elif kind == "CustomResourceDefinition":
                crds.append(obj)
            else:
                others.append(obj)
    if csv is None:
        raise refuse(f"no ClusterServiceVersion in {MANIFESTS}/")
    _merge_properties(csv, _read_one(root, PROPERTIES, request=request, required=False), source)
    return Bundle(
        package=package if isinstance(package, str) else "",
        csv=csv,
        crds=crds,
        others=others,
    )


def _inside(root: Path, relative: str, source: str) -> None:
    try:
        resolve_inside(root, relative)
    except LinkEscapeError as exc:
        raise RegistryV1Error(
            f"symlink points outside the bundle: {exc}",
            source=source,
            file=relative,
            rule="SymlinkEscapes",
        ) from None


def _read_one(
    root: Path, relative: str, *, request: RenderRequest, required: bool
) -> dict[str, Any] | None:
    path = root / relative
    _inside(root, relative, request.source)
    if not path.is_file():
        if required:
            raise RegistryV1Error(
                "missing: not a registry+v1 bundle",
                source=request.source,
                file=relative,
                rule="InvalidBundle",
            )
        return None
    documents = load_documents(
        path.read_bytes(), source=request.source, file=relative, limits=request.limits.parse
    )
    first = documents[0] if documents else None
    if not isinstance(first, dict):
        raise RegistryV1Error(
            "expected a mapping", source=request.source, file=relative, rule="InvalidBundle"
        )
    return first


def _merge_properties(csv: Manifest, doc: Mapping[str, Any] | None, source: str) -> None:
    """Append ``metadata/properties.yaml``'s properties to the CSV's ``olm.properties``."""
    if doc is None or not doc.get("properties"):
        return
    listed = doc["properties"]
    annotations = csv["metadata"].setdefault("annotations", {})
    try:
        existing = json.loads(annotations.get("olm.properties") or "[]")
    except ValueError as exc:
        raise RegistryV1Error(
            f"the CSV's olm.properties annotation is not JSON: {exc}",
            source=source,
            file=PROPERTIES,
            rule="InvalidBundle",
        ) from None
    if not isinstance(listed, list) or not isinstance(existing, list):
        raise RegistryV1Error(
            "properties must be a list", source=source, file=PROPERTIES, rule="InvalidBundle"
        )
    # Go's property.Property: type, then value.
    merged = [{"type": p.get("type"), "value": p.get("value")} for p in [*existing, *listed]]
    annotations["olm.properties"] = go_json(merged)


# --- validation --------------------------------------------------------------------------------


def validate_bundle(bundle: Bundle) -> list[str]:
    """Every problem operator-controller's bundle validator (and its manifest provider)
    would find, in its order; empty when the bundle can be converted."""
    problems: list[str] = []
    spec = bundle.spec
    version = spec.get("version")
    if version is not None and not (isinstance(version, str) and _SEMVER.match(version)):
        # operator-controller cannot even read such a CSV (its version is a semver type).
        problems.append(
            f"spec.version {json.dumps(version)} is not a semantic version (a template bundle "
            "whose version was never filled in?)"
        )
    deployments = [str(d.get("name")) for d in bundle.strategy("deployments")]
    for name, count in sorted(Counter(deployments).items()):
        if count > 1:
            problems.append(f"the CSV has two strategy deployments named {name!r}")
        if not _is_subdomain(name):
            problems.append(f"strategy deployment name {name!r} is not a DNS-1123 subdomain")
    crd_names = [str(c["metadata"]["name"]) for c in bundle.crds]
    for name, count in sorted(Counter(crd_names).items()):
        if count > 1:
            problems.append(f"the bundle has CustomResourceDefinition {name!r} twice")
    owned = _owned_crds(spec)
    problems += [
        f"the CSV owns CustomResourceDefinition {name!r}, which the bundle lacks"
        for name in sorted(set(owned) - set(crd_names))
    ]
    if not bundle.package:
        problems.append(f"{OLM_ANNOTATIONS} names no package ({PACKAGE_ANNOTATION})")
    problems += _webhook_problems(bundle, deployments, owned)
    problems += [
        f"{o['kind']} {o['metadata']['name']}: kind not supported in a registry+v1 bundle"
        for o in bundle.others
        if o["kind"] not in SUPPORTED_KINDS
    ]
    apiservices = _dict(spec.get("apiservicedefinitions")).get("owned")
    if apiservices:
        problems.append(
            "APIService definitions (spec.apiservicedefinitions.owned) are not supported"
        )
    if not bundle.install_modes() & set(INSTALL_MODES):
        problems.append(f"the CSV supports none of the install modes {', '.join(INSTALL_MODES)}")
    return problems


def _webhook_problems(
    bundle: Bundle, deployments: Sequence[str], owned: Sequence[str]
) -> list[str]:
    problems: list[str] = []
    webhooks = bundle.webhooks()
    conversions = bundle.webhooks("ConversionWebhook")
    if conversions and bundle.install_modes() != {"AllNamespaces"}:
        problems += [
            f"conversion webhook {w.get('generateName')!r}: conversion webhooks need a bundle "
            "that supports only the AllNamespaces install mode"
            for w in conversions
        ]
    for w in webhooks:
        name, kind = w.get("generateName"), w.get("type")
        if w.get("deploymentName") not in deployments:
            problems.append(
                f"{kind} {name!r} names deployment {w.get('deploymentName')!r}, which the CSV "
                "does not have"
            )
        if not isinstance(name, str) or not _is_subdomain(name):
            problems.append(f"{kind} name {name!r} is not a DNS-1123 subdomain")
    seen = Counter((str(w.get("type")), str(w.get("generateName"))) for w in webhooks)
    problems += [f"two {kind} webhooks named {name!r}" for (kind, name), n in seen.items() if n > 1]
    referenced = Counter(str(c) for w in conversions for c in _list(w.get("conversionCRDs")))
    problems += [
        f"CustomResourceDefinition {crd!r} is converted by several conversion webhooks"
        for crd, n in sorted(referenced.items())
        if n > 1
    ]
    problems += [
        f"conversion webhook references CustomResourceDefinition {crd!r}, which the CSV does "
        "not own"
        for crd in sorted(referenced)
        if crd not in owned
    ]
    converted = set(referenced)
    problems += [
        f"CustomResourceDefinition {c['metadata']['name']} must set "
        "spec.preserveUnknownFields to false for its conversion webhook"
        for c in bundle.crds
        if c["metadata"]["name"] in converted and _dict(c.get("spec")).get("preserveUnknownFields")
    ]
    for w in webhooks:
        if w.get("type") == "ConversionWebhook":
            continue
        for rule in _list(w.get("rules")):
            for group in _list(_dict(rule).get("apiGroups")):
                if group in _FORBIDDEN_WEBHOOK_GROUPS:
                    problems.append(
                        f"webhook {w.get('generateName')!r} may not intercept API group {group!r}"
                    )
                if group == "admissionregistration.k8s.io":
                    problems += [
                        f"webhook {w.get('generateName')!r} may not intercept "
                        f"admissionregistration.k8s.io resource {resource!r}"
                        for resource in _list(_dict(rule).get("resources"))
                        if str(resource).lower() in _FORBIDDEN_ADMISSION_RESOURCES
                    ]
    return problems


def _owned_crds(spec: Mapping[str, Any]) -> list[str]:
    owned = _list(_dict(spec.get("customresourcedefinitions")).get("owned"))
    return [str(o.get("name")) for o in owned if isinstance(o, dict)]


def _is_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


# --- placement ---------------------------------------------------------------------------------


def placement_for(
    bundle: Bundle,
    *,
    install_namespace: str | None,
    watch_namespace: str | None,
    source: str,
    cert_manager: bool = True,
) -> Placement:
    """Where the operator goes and what it watches, checked against the CSV's install modes.

    Raises RegistryV1Error (NoInstallNamespace, UnsupportedInstallMode).
    """
    if not install_namespace:
        raise RegistryV1Error(
            "no install namespace: set formatOptions.installNamespace (or targetNamespace)",
            source=source,
            rule="NoInstallNamespace",
        )
    modes = bundle.install_modes()
    supported = ", ".join(sorted(modes & set(INSTALL_MODES))) or "none"

    def refuse(message: str) -> RegistryV1Error:
        return RegistryV1Error(
            f"{message} (the CSV supports: {supported})",
            source=source,
            rule="UnsupportedInstallMode",
        )

    if watch_namespace is None:
        if "AllNamespaces" not in modes:
            raise refuse(
                "watching all namespaces (no formatOptions.watchNamespace) is not supported; "
                "set formatOptions.watchNamespace"
            )
        return Placement(
            install_namespace=install_namespace, target_namespaces=("",), cert_manager=cert_manager
        )
    if watch_namespace == install_namespace and "OwnNamespace" not in modes:
        raise refuse(f"watching its own namespace {install_namespace!r} is not supported")
    if watch_namespace != install_namespace and "SingleNamespace" not in modes:
        raise refuse(f"watching another namespace ({watch_namespace!r}) is not supported")
    return Placement(
        install_namespace=install_namespace,
        target_namespaces=(watch_namespace,),
        cert_manager=cert_manager,
    )


def convert(
    bundle: Bundle,
    *,
    install_namespace: str | None,
    watch_namespace: str | None = None,
    source: str = "bundle",
    cert_manager: bool = True,
) -> list[Manifest]:
    """The objects of ``bundle`` installed in ``install_namespace`` watching
    ``watch_namespace`` (None: all namespaces). ``cert_manager=False`` renders webhooks
    without a certificate provider (as operator-controller's bare renderer; for comparing
    with its regression files).

    Raises RegistryV1Error (InvalidBundle listing every problem, and placement_for's).
    """
    problems = validate_bundle(bundle)
    if problems:
        raise RegistryV1Error(
            f"{len(problems)} problem{'s' if len(problems) > 1 else ''}: {'; '.join(problems)}",
            source=source,
            file=f"{MANIFESTS}/ (CSV {bundle.name})",
            rule="InvalidBundle",
        )
    placement = placement_for(
        bundle,
        install_namespace=install_namespace,
        watch_namespace=watch_namespace,
        source=source,
        cert_manager=cert_manager,
    )
    objects, merged = merge_duplicates(generate(bundle, placement), others(bundle, placement))
    for line in merged:
        _log.info("%s: %s", source, line)
    return objects


def merge_duplicates(
    objects: Sequence[Manifest], files: Sequence[Manifest] = ()
) -> tuple[list[Manifest], list[str]]:
    """One object per identity (group, kind, namespace, name), as operator-controller ends up
    with one: it renders both copies, in its generators' order, and applies them in that order
    with one field manager, so the later copy is the object. Bundles meet this when they ship
    a ServiceAccount the CSV's permissions also name (generated first, the bundle's file wins)
    or a webhook Service (the bundle's file first, the one generated for the webhook wins).

    ``files`` are the bundle's own manifests as placed (to say where each copy came from).
    Returns the objects, each at the place of its first copy, and one line per merge.
    """
    last: dict[tuple[str, str, str, str], int] = {}
    for index, obj in enumerate(objects):
        last[_identity(obj)] = index
    kept: list[Manifest] = []
    placed: set[tuple[str, str, str, str]] = set()
    merged: list[str] = []
    for index, obj in enumerate(objects):
        identity = _identity(obj)
        if identity in placed:
            continue
        placed.add(identity)
        winner = last[identity]
        kept.append(objects[winner])
        if winner != index:
            _group, kind, namespace, name = identity
            copies = [o for o in objects if _identity(o) == identity]
            origins = ", ".join(
                f"{MANIFESTS}/" if any(o == f for f in files) else "generated from the CSV"
                for o in copies
            )
            winner_origin = (
                f"the one from {MANIFESTS}/"
                if any(objects[winner] == f for f in files)
                else "the one generated from the CSV"
            )
            merged.append(
                f"{kind} {namespace + '/' if namespace else ''}{name} comes {len(copies)} times "
                f"({origins}): merged into {winner_origin}, which operator-controller applies "
                "last"
            )
    return kept, merged


def _identity(obj: Manifest) -> tuple[str, str, str, str]:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    meta = obj["metadata"]
    return group, str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"])


class RegistryV1Format:
    """The built-in ``registry+v1`` format."""

    name = "registry+v1"

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]:
        """The objects of the bundle at ``formatOptions.path`` (default: the tree).

        Raises RegistryV1Error, InvalidManifestError.
        """
        root = render_root(tree, request)
        bundle = load_bundle(root, request=request)
        options = request.options
        install = options.get("installNamespace") or request.namespace
        if bundle.webhooks() and _lacks_cert_manager(request):
            raise RegistryV1Error(
                f"the bundle has webhooks ({len(bundle.webhooks())}); their serving "
                f"certificates come from cert-manager, and this cluster does not serve "
                f"{CERT_MANAGER_API}: install cert-manager first",
                source=request.source,
                rule="WebhooksNeedCertManager",
            )
        return convert(
            bundle,
            install_namespace=str(install) if install else None,
            watch_namespace=options.get("watchNamespace"),
            source=request.source,
        )


def _lacks_cert_manager(request: RenderRequest) -> bool:
    """Known not to serve cert-manager (unknown APIs, as on the hub: assume it does)."""
    served = request.cluster.api_versions
    return bool(served) and CERT_MANAGER_API not in served


__all__ = [
    "RegistryV1Error",
    "RegistryV1Format",
    "convert",
    "load_bundle",
    "placement_for",
    "validate_bundle",
]
