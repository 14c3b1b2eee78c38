"""What one cluster runs of one bundle: :class:`BundleDeploymentSpec`, with the manifest selectors
and the outputs it declares.

Part of :mod:`agent.api.models`; used by the publication (:mod:`agent.api.models._set`), the
reconcile and the apply.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from agent.api.helmsets import HELM_SET_RULES
from agent.api.models._format import FormatOptions, Patch
from agent.api.models._health import HealthChecks
from agent.api.models._patterns import (
    DNS_LABEL,
    DNS_LABEL_TEXT,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_TEXT,
    FIELD_PATH,
    FIELD_PATH_TEXT,
    FORMAT_NAME,
    KIND,
    MAX_SOURCES,
    OBJECT_NAME,
    OUTPUT_NAME,
    Approval,
    DeletionPolicy,
)
from agent.api.models._references import ObjectReference
from agent.api.models._source import Source
from agent.api.validation import ApiObject, Rule, api_field, show
from agent.errors import FieldProblem


@dataclass(frozen=True, kw_only=True, slots=True)
class ManifestSelector(ApiObject):
    """Manifests of this API group and kind (and name, if given)."""

    api_group: str = api_field(
        "API group (empty for the core group), e.g. `monitoring.coreos.com`.",
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$",
        expected="an API group (DNS subdomain) or empty",
        max_length=253,
    )
    kind: str = api_field(
        "Kind, e.g. `ServiceMonitor`.",
        pattern=KIND,
        max_length=63,
        expected="a Kind (CamelCase, e.g. ServiceMonitor)",
    )
    name: str | None = api_field(
        "Only the manifest with this name (default: every manifest of the kind).",
        default=None,
        pattern=OBJECT_NAME,
        expected="an object name",
        max_length=253,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Output(ApiObject):
    """A value read from the cluster after each successful run (Porter-style outputs).

    Secret ``.data`` values are base64-decoded; other non-string values are rendered as JSON.
    Sensitive outputs are kept in a Secret in the agent's namespace, never in plain text
    outside the cluster.
    """

    name: str = api_field(
        "Name of the output, unique in the bundle.",
        pattern=OUTPUT_NAME,
        max_length=63,
        expected="an output name (letters, digits, '_', '-'; not starting with a digit)",
    )
    object: ObjectReference = api_field("The object the value is read from.")
    field_path: str = api_field(
        "Path of the field, e.g. `.spec.clusterIP` or `.data.password`.",
        pattern=FIELD_PATH,
        expected=FIELD_PATH_TEXT,
        max_length=512,
    )
    sensitive: bool = api_field(
        "Keep the value only in a Secret (reported as a reference, never as text).",
        default=False,
    )


def _format_option_only(field: str, attr: str, refused: tuple[str, ...], who: str) -> Rule:
    names = ", ".join(f"'{f}'" for f in refused)
    return Rule(
        cel=f"!has(self.formatOptions) || !has(self.formatOptions.{field}) "
        f"|| !(self.format in [{names}])",
        expected=f"formatOptions.{field} only with {who}",
        check=lambda s: getattr(s.format_options, attr) is None or s.format not in refused,
        field=f"formatOptions.{field}",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentSpec(ApiObject):
    """What one cluster runs of one bundle: where the content is, how to render it, how to
    roll it out, check it and report on it."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        _format_option_only(
            "values", "values", ("plain", "kustomize", "registry+v1"), "helm or a plugin format"
        ),
        _format_option_only(
            "encryptedValues",
            "encrypted_values",
            ("plain", "kustomize", "registry+v1"),
            "helm or a plugin format",
        ),
        *HELM_SET_RULES,
        _format_option_only(
            "installNamespace",
            "install_namespace",
            ("plain", "kustomize", "helm"),
            "registry+v1 or a plugin format",
        ),
        _format_option_only(
            "watchNamespace",
            "watch_namespace",
            ("plain", "kustomize", "helm"),
            "registry+v1 or a plugin format",
        ),
        Rule(
            cel="!has(self.createNamespace) || !self.createNamespace || "
            "(has(self.formatOptions) && has(self.formatOptions.targetNamespace))",
            expected="formatOptions.targetNamespace with createNamespace (the namespace to create)",
            check=lambda s: not s.create_namespace or s.format_options.target_namespace is not None,
            field="createNamespace",
        ),
    )

    sources: tuple[Source, ...] = api_field(
        "Where the content comes from, each pinned; together they compose the bundle's tree.",
        min_items=1,
        max_items=MAX_SOURCES,
    )
    format: str = api_field(
        "How the tree is rendered: `plain`, `kustomize`, `helm`, `registry+v1`, or the name "
        "of a format plugin (entry point group `fleetlet.formats`).",
        default="plain",
        pattern=FORMAT_NAME,
        max_length=63,
        expected="a format name (plain, kustomize, helm, registry+v1 or a plugin's name)",
    )
    format_options: FormatOptions = api_field("Options of the format.", default=FormatOptions())
    patches: tuple[Patch, ...] = api_field(
        "Patches applied to the rendered objects, in order (any format): per-cluster tweaks "
        "without a new bundle. The hub appends the patches of matching overrides.",
        default=(),
        max_items=64,
    )
    group: str | None = api_field(
        "Lockstep group: the bundles of a group are applied, health-checked and rolled back "
        "together. Default: the bundle's own name (a group of one).",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    depends_on: tuple[str, ...] = api_field(
        "Groups that must be healthy before this bundle's group is applied.",
        default=(),
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
        max_items=32,
        list_type="set",
    )
    paused: bool = api_field(
        "Leave the bundle's objects as they are: no apply, no drift correction.", default=False
    )
    health_checks: HealthChecks = api_field("Health assessment.", default=HealthChecks())
    optional: tuple[ManifestSelector, ...] = api_field(
        "Manifests skipped (and reported) when their API is not served by the cluster, e.g. "
        "ServiceMonitors where Prometheus is not installed.",
        default=(),
        max_items=64,
    )
    outputs: tuple[Output, ...] = api_field(
        "Values read from the cluster after each successful run.",
        default=(),
        max_items=64,
        list_type="map",
        list_keys=("name",),
    )
    approval: Approval = api_field(
        "`manual`: a change to this bundle waits for an approved BundleDeploymentRequest.",
        default="none",
    )
    service_account_name: str | None = api_field(
        "Apply as this ServiceAccount of the agent's namespace (impersonation) instead of the "
        "agent's own identity.",
        default=None,
        pattern=DNS_SUBDOMAIN,
        expected=DNS_SUBDOMAIN_TEXT,
        max_length=253,
    )
    deletion_policy: DeletionPolicy = api_field(
        "What happens to the bundle's objects when the bundle is removed: `Delete` them or "
        "`Orphan` them (leave them, without the agent's ownership).",
        default="Delete",
    )
    keep_crds: bool = api_field(
        "Keep CustomResourceDefinitions (and so every custom resource) when deleting.",
        default=True,
        name="keepCRDs",
    )
    take_ownership: bool = api_field(
        "Take over fields owned by other field managers (server-side apply with force). "
        "Default false: a conflict fails the apply.",
        default=False,
    )
    create_namespace: bool = api_field(
        "Create `formatOptions.targetNamespace` with the bundle when it does not render it "
        "(Fleet's and Argo CD's CreateNamespace), with `namespaceLabels` and "
        "`namespaceAnnotations` (e.g. Pod Security labels). The namespace is kept when the "
        "bundle is removed.",
        default=False,
    )
    namespace_labels: Mapping[str, Any] | None = api_field(
        "Labels of the namespace `createNamespace` makes (label key to string value).",
        default=None,
        free_form=True,
    )
    namespace_annotations: Mapping[str, Any] | None = api_field(
        "Annotations of the namespace `createNamespace` makes (key to string value).",
        default=None,
        free_form=True,
    )

    def extra_problems(self) -> list[FieldProblem]:
        """Namespace labels and annotations are string to string."""
        problems: list[FieldProblem] = []
        for field_name, values in (
            ("namespaceLabels", self.namespace_labels),
            ("namespaceAnnotations", self.namespace_annotations),
        ):
            for key, value in (values or {}).items():
                if not isinstance(value, str):
                    problems.append(
                        FieldProblem(
                            path=f"{field_name}.{key}", expected="a string value", found=show(value)
                        )
                    )
        return problems
