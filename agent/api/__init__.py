"""The hub <-> agent contract: the fleetlet.io/v1alpha1 types, their validation, canonical bytes
and digests, and the ``set.yaml`` format. The hub imports these; the agent defines them.

Quick reference:

- ``set_from_dict(d, origin=...)`` / ``load_set(bytes, origin=...)`` -> :class:`BundleDeploymentSet`
  (raise ``ValidationError`` with every problem, ``FloatingReferenceError`` for unpinned sources);
- ``set_to_dict(s)``, ``dump_set(s)`` (canonical YAML), ``canonical_bytes(obj)`` (RFC 8785 JSON),
  ``set_digest(s)`` (``sha256:<hex>`` of the canonical bytes), ``set_from_canonical(bytes)``
  (the set exactly as its canonical bytes say);
- ``from_dict(cls, d)`` / ``to_dict(obj)`` for any API type (e.g. a BundleDeploymentStatus).
"""

# The names are checked against agent.api._all, which imports them.
# ruff: noqa: F405

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.api._all import *  # noqa: F403

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "BUILTIN_FORMATS",
    "GROUP_VERSION",
    "ApiObject",
    "ApprovalPolicySpec",
    "ApprovalRule",
    "BundleDeploymentEntry",
    "BundleDeploymentRequestSpec",
    "BundleDeploymentRequestStatus",
    "BundleDeploymentSet",
    "BundleDeploymentSpec",
    "BundleDeploymentStatus",
    "BundleOutputsSpec",
    "BundlePin",
    "CommitSignature",
    "Condition",
    "ConditionCheck",
    "FieldExpression",
    "Finding",
    "FormatOptions",
    "HealthCheck",
    "HealthChecks",
    "ManifestSelector",
    "ObjectChange",
    "ObjectReference",
    "Output",
    "OutputValue",
    "Patch",
    "PatchTarget",
    "PinProblem",
    "RequestPreview",
    "ResourceCounts",
    "Revision",
    "RunSummary",
    "SecretKeyReference",
    "SecretReference",
    "SecuritySummary",
    "SetSource",
    "Source",
    "SourceAuth",
    "canonical_bytes",
    "digest_of",
    "dump_set",
    "dump_yaml",
    "format_time",
    "from_dict",
    "load_set",
    "load_yaml",
    "parse_time",
    "set_digest",
    "set_from_canonical",
    "set_from_dict",
    "set_to_dict",
    "to_dict",
]


def __getattr__(name: str) -> Any:
    """The exported names, imported on first use (``fleetlet render`` reads YAML with
    :mod:`agent.api.yamlio` without loading every API type)."""
    if name not in __all__:
        raise AttributeError(f"module 'agent.api' has no attribute {name!r}")
    from agent.api import _all

    value = getattr(_all, name)
    globals()[name] = value
    return value
