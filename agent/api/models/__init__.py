"""The fleetlet.io/v1alpha1 API: the types the hub publishes and the agent accepts.

Each type is declared once, in the private module of what it is about; parsing, validation, the
CRD schemas (:mod:`agent.api.crds`) and ``docs/api.md`` are derived from these declarations.
Constructors validate and raise :class:`~agent.errors.ValidationError` (paths relative to the
object constructed). Callers import from here (or from :mod:`agent.api`), never from the private
modules:

- ``_patterns``: the API group and version, the field patterns and limits;
- ``_references``: Secrets, Secret keys, source credentials and cluster objects referred to;
- ``_source``: where content comes from, pinned to immutable content;
- ``_format``: how a bundle's tree is rendered (format options, patches);
- ``_health``: how a bundle's health is checked;
- ``_spec``: what one cluster runs of one bundle (``BundleDeploymentSpec``);
- ``_status``: what the agent reports of a bundle (conditions, revisions, runs);
- ``_outputs``: the values read back from the cluster after a run;
- ``_set``: the per-cluster publication (``BundleDeploymentSet``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.api.models._format import FormatOptions, Patch, PatchTarget
    from agent.api.models._health import ConditionCheck, FieldExpression, HealthCheck, HealthChecks
    from agent.api.models._outputs import BundleOutputsSpec, OutputValue
    from agent.api.models._patterns import (
        API_GROUP,
        API_VERSION,
        API_VERSION_PATTERN,
        BUILTIN_FORMATS,
        COMMIT,
        COMMIT_TEXT,
        DIGEST,
        DIGEST_TEXT,
        DNS_LABEL,
        DNS_LABEL_TEXT,
        DNS_SUBDOMAIN,
        DNS_SUBDOMAIN_TEXT,
        FORMAT_NAME,
        GROUP_VERSION,
        KIND,
        MAX_NAMES,
        OBJECT_NAME,
        OUTPUT_NAME,
        PIN,
        REASON,
        REASON_TEXT,
        RUN_ID,
        SHA256_HEX,
    )
    from agent.api.models._references import (
        ObjectReference,
        SecretKeyReference,
        SecretReference,
        SourceAuth,
    )
    from agent.api.models._set import (
        BundleDeploymentEntry,
        BundleDeploymentSet,
        CommitSignature,
        SetSource,
    )
    from agent.api.models._source import Source
    from agent.api.models._spec import BundleDeploymentSpec, ManifestSelector, Output
    from agent.api.models._status import (
        BundleDeploymentStatus,
        Condition,
        ResourceCounts,
        Revision,
        RunSummary,
    )
    from agent.api.validation import PinProblem

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "API_VERSION_PATTERN",
    "BUILTIN_FORMATS",
    "COMMIT",
    "COMMIT_TEXT",
    "DIGEST",
    "DIGEST_TEXT",
    "DNS_LABEL",
    "DNS_LABEL_TEXT",
    "DNS_SUBDOMAIN",
    "DNS_SUBDOMAIN_TEXT",
    "FORMAT_NAME",
    "GROUP_VERSION",
    "KIND",
    "MAX_NAMES",
    "OBJECT_NAME",
    "OUTPUT_NAME",
    "PIN",
    "REASON",
    "REASON_TEXT",
    "RUN_ID",
    "SHA256_HEX",
    "BundleDeploymentEntry",
    "BundleDeploymentSet",
    "BundleDeploymentSpec",
    "BundleDeploymentStatus",
    "BundleOutputsSpec",
    "CommitSignature",
    "Condition",
    "ConditionCheck",
    "FieldExpression",
    "FormatOptions",
    "HealthCheck",
    "HealthChecks",
    "ManifestSelector",
    "ObjectReference",
    "Output",
    "OutputValue",
    "Patch",
    "PatchTarget",
    "PinProblem",
    "ResourceCounts",
    "Revision",
    "RunSummary",
    "SecretKeyReference",
    "SecretReference",
    "SetSource",
    "Source",
    "SourceAuth",
]

# Where __getattr__ looks for a name, in this order (each module imports those it builds on).
_MODULES = (
    "agent.api.models._patterns",
    "agent.api.models._format",
    "agent.api.models._references",
    "agent.api.models._source",
    "agent.api.models._health",
    "agent.api.models._outputs",
    "agent.api.models._spec",
    "agent.api.models._status",
    "agent.api.models._set",
    "agent.api.validation",
)


def __getattr__(name: str) -> Any:
    """The exported names, each imported on first use: ``fleetlet render --path`` checks its
    options with :class:`FormatOptions` without loading the set, the status and the other
    types (about 15 ms of a render's start)."""
    if name not in __all__:
        raise AttributeError(f"module 'agent.api.models' has no attribute {name!r}")
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        if name in vars(module):
            value = vars(module)[name]
            globals()[name] = value
            return value
    raise AttributeError(f"module 'agent.api.models' has no attribute {name!r}")  # pragma: no cover
