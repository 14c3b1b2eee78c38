"""The CustomResourceDefinitions of fleetlet.io/v1alpha1 and the API reference, generated.

``python -m agent.api.crds --write`` writes ``crds/*.yaml`` and ``docs/api.md`` from the type
declarations in :mod:`agent.api.models`; ``--check`` exits 1 when the files on disk differ from
what would be written (CI and a test run it, so they never drift).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.api.approvals import (
    ApprovalPolicySpec,
    BundleDeploymentRequestSpec,
    BundleDeploymentRequestStatus,
)
from agent.api.canonical import dump_yaml
from agent.api.generated import write_or_check
from agent.api.models import (
    API_GROUP,
    API_VERSION,
    BUILTIN_FORMATS,
    BundleDeploymentSet,
    BundleDeploymentSpec,
    BundleDeploymentStatus,
    BundleOutputsSpec,
)
from agent.api.reasons import FAILED, REASON_HELP, ROLLED_BACK, RUNNING, SUCCEEDED, Phase
from agent.api.schema import anchor, object_schema, types_markdown
from agent.api.validation import ApiObject

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class Column:
    """An ``additionalPrinterColumns`` entry."""

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


@dataclass(frozen=True, kw_only=True)
class Crd:
    """One CustomResourceDefinition: names, scope, schema roots and printer columns."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    doc: str
    spec: type[ApiObject]
    status: type[ApiObject] | None
    columns: tuple[Column, ...]
    scope: str = "Cluster"
    categories: tuple[str, ...] = ("fleetlet",)

    @property
    def name(self) -> str:
        return f"{self.plural}.{API_GROUP}"

    @property
    def file(self) -> str:
        return f"crds/{self.name}.yaml"


def _condition(kind: str, field: str) -> str:
    return f'.status.conditions[?(@.type=="{kind}")].{field}'


AGE = Column(name="Age", json_path=".metadata.creationTimestamp", type="date")

CRDS: tuple[Crd, ...] = (
    Crd(
        kind="BundleDeployment",
        plural="bundledeployments",
        short_names=("bd",),
        doc="What this cluster runs of one bundle, and how it is doing. Created by the agent "
        "from the verified BundleDeploymentSet; the name is the bundle's name.",
        spec=BundleDeploymentSpec,
        status=BundleDeploymentStatus,
        columns=(
            Column(name="Group", json_path=".spec.group", description="Lockstep group."),
            Column(
                name="Target",
                json_path=".status.targetRevision.serial",
                type="integer",
                description="Serial of the revision the agent is moving to, or stopped short "
                "of (the applied one once there).",
            ),
            Column(
                name="Applied",
                json_path=".status.appliedRevision.serial",
                type="integer",
                description="Serial of the revision whose objects are in the cluster.",
            ),
            Column(
                name="Ready",
                json_path=_condition("Ready", "status"),
                description="Whether the applied revision is healthy (Unknown while moving).",
            ),
            Column(
                name="Phase",
                json_path=".status.phase",
                description="What is happening now (Applying, HealthChecking, RollingBack, "
                "Ready, Failed, RolledBack, Waiting, Paused).",
            ),
            Column(
                name="Reason",
                json_path=_condition("Ready", "reason"),
                description="Why (or why not) Ready.",
            ),
            Column(name="Format", json_path=".spec.format", priority=1),
            AGE,
        ),
    ),
    Crd(
        kind="BundleOutputs",
        plural="bundleoutputs",
        short_names=("bo",),
        doc="The outputs of a bundle's latest successful run, kept in sync by the agent. "
        "Cluster-scoped and named like its BundleDeployment; sensitive values are in Secrets "
        "of the agent's namespace, referenced by name and key.",
        spec=BundleOutputsSpec,
        status=None,
        columns=(
            Column(name="BundleDeployment", json_path=".spec.bundleDeployment"),
            Column(name="Run", json_path=".spec.runId"),
            Column(name="Serial", json_path=".spec.serial", type="integer"),
            AGE,
        ),
    ),
    Crd(
        kind="BundleDeploymentRequest",
        plural="bundledeploymentrequests",
        short_names=("bdr",),
        doc="A request to move one lockstep group to exactly pinned revisions, with a preview "
        "of what that does to the cluster, in the manner of cert-manager's CertificateRequest: "
        "the agent creates it and waits; a user holding the verb `approve` on it (or the "
        "cluster's ApprovalPolicy) decides through the status subresource. See "
        "docs/approvals.md.",
        spec=BundleDeploymentRequestSpec,
        status=BundleDeploymentRequestStatus,
        columns=(
            Column(name="Group", json_path=".spec.group", description="Lockstep group."),
            Column(name="Serial", json_path=".spec.serial", type="integer"),
            Column(
                name="Created",
                json_path=".spec.preview.created",
                type="integer",
                description="Objects the move creates.",
            ),
            Column(name="Changed", json_path=".spec.preview.changed", type="integer"),
            Column(name="Deleted", json_path=".spec.preview.deleted", type="integer"),
            Column(
                name="Findings",
                json_path=".spec.preview.findings",
                type="integer",
                description="Security findings: RBAC, CRDs, webhooks, privileged pods, namespaces.",
            ),
            Column(
                name="Decision",
                json_path=".status.decision",
                description="Approved or Denied (empty while pending).",
            ),
            Column(name="By", json_path=".status.decidedBy", description="Who decided."),
            Column(
                name="Superseded",
                json_path=_condition("Superseded", "status"),
                description="True when a newer publication replaced the request.",
            ),
            Column(name="Reason", json_path=".status.reason", priority=1),
            Column(name="Rule", json_path=".status.rule", priority=1),
            Column(name="Digest", json_path=".spec.setDigest", priority=1),
            AGE,
        ),
    ),
    Crd(
        kind="ApprovalPolicy",
        plural="approvalpolicies",
        short_names=("ap",),
        doc="The cluster admin's approval rules for this cluster: whether every move needs "
        "an approval, and CEL rules over a request's preview that approve it automatically "
        "(as the approver ServiceAccount named here). See docs/approvals.md.",
        spec=ApprovalPolicySpec,
        status=None,
        columns=(
            Column(name="RequireApproval", json_path=".spec.requireApproval", type="boolean"),
            Column(name="Rules", json_path=".spec.rules[*].name"),
            Column(name="Approver", json_path=".spec.approver"),
            AGE,
        ),
    ),
)


def crd_document(crd: Crd) -> dict[str, Any]:
    """The CustomResourceDefinition object (apiextensions.k8s.io/v1)."""
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string", "description": "APIVersion of the object."},
        "kind": {"type": "string", "description": "Kind of the object."},
        "metadata": {"type": "object"},
        "spec": object_schema(crd.spec),
    }
    if crd.status is not None:
        properties["status"] = object_schema(crd.status)
    version: dict[str, Any] = {
        "name": API_VERSION,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "description": crd.doc,
                "properties": properties,
                "required": ["spec"],
            }
        },
        "additionalPrinterColumns": [_column(c) for c in crd.columns],
    }
    if crd.status is not None:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd.name},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": crd.kind,
                "listKind": f"{crd.kind}List",
                "plural": crd.plural,
                "singular": crd.kind.lower(),
                "shortNames": list(crd.short_names),
                "categories": list(crd.categories),
            },
            "scope": crd.scope,
            "versions": [version],
        },
    }


def _column(column: Column) -> dict[str, Any]:
    out: dict[str, Any] = {"name": column.name, "type": column.type, "jsonPath": column.json_path}
    if column.description:
        out["description"] = column.description
    if column.priority:
        out["priority"] = column.priority
    return out


_INTRO = f"""\
# API reference: `{API_GROUP}/{API_VERSION}`

<!-- Generated by `python -m agent.api.crds --write` from agent/api/models/: do not edit.
     A test fails when this file differs from what the generator writes. -->

The contract between the hub and the agent. The agent owns it (`agent/api/`); the hub imports
it. One declaration per field drives the Python types, their validation, the CRD schemas in
`crds/` and this page.

## Validation

Every document is validated completely: all problems are reported at once, each with the path
of the field, what was expected and what was found, e.g.
`bundleDeployments[3].spec.sources[0].digest: expected sha256:<64 hex>, got "latest"`.
Unknown fields are refused. Times are RFC 3339 UTC with whole seconds
(`2026-11-22T22:00:00Z`). When every problem of a set is an unpinned source (a missing or
malformed `digest`, `commit` or `sha256`: a tag, a branch, a URL without a hash) the error is a
`FloatingReferenceError`; floating references are never accepted.

Rules marked *Rules* below are stated once, in CEL: the API server enforces them on the custom
resources (`x-kubernetes-validations`) and fleetlet enforces the same rule in Python (rules
about updates, using `oldSelf`, exist only in the API server).

## Canonical form and digests

A set's digest (`sha256:<hex>`, the Merkle leaf's set digest) is the sha256 of its **canonical
bytes**: RFC 8785 (JCS) JSON of the set's JSON form, in which fields at their default are left
out (an explicit default and an omitted field are the same set), keys are sorted and times are
written as above. The same set therefore has the same digest whatever produced it (key order,
YAML style, explicit defaults).

`set.yaml` on a cluster's branch is the set in canonical YAML: block style, sorted keys,
two-space indentation, lists at their key's indentation, strings plain when unambiguous and
double-quoted (JSON escapes) otherwise. The agent hashes the set it parsed, not the file's
bytes. Loading is bounded (16 MiB, nesting, node count) and refuses aliases, duplicate keys and
non-JSON YAML tags.

## Formats

Built in: {", ".join(f"`{f}`" for f in BUILTIN_FORMATS)}. Any other name is looked up among
the format plugins (Python entry points in the group `fleetlet.formats`).
"""


def api_markdown() -> str:
    """The whole ``docs/api.md``."""
    parts = [_INTRO, "## Custom resources", ""]
    for crd in CRDS:
        parts += [
            f"### {crd.kind}",
            "",
            crd.doc,
            "",
            f"- Name: `{crd.name}`; scope: {crd.scope}; short names: "
            + ", ".join(f"`{s}`" for s in crd.short_names)
            + "; categories: "
            + ", ".join(f"`{c}`" for c in crd.categories)
            + ".",
            f"- `spec`: [{crd.spec.__name__}](#{anchor(crd.spec)})"
            + (
                f"; `status` (subresource): [{crd.status.__name__}](#{anchor(crd.status)})"
                if crd.status
                else "; no status."
            ),
            "- `kubectl get` columns: "
            + ", ".join(f"{c.name} (`{c.json_path}`)" for c in crd.columns if not c.priority)
            + "; with `-o wide` also "
            + ", ".join(c.name for c in crd.columns if c.priority)
            + ".",
            "",
        ]
    parts += [
        "## Condition reasons",
        "",
        "The reasons of a BundleDeployment's `Ready`, `Progressing` and `Degraded` conditions",
        "(`agent/api/reasons.py`). A failed step reports the reason of its error instead when",
        "it has one of its own (a refused publication: `SignatureInvalid`, `SerialNotNewer`...).",
        "",
        "| reason | meaning |",
        "| --- | --- |",
        *[f"| `{reason}` | {text} |" for reason, text in REASON_HELP.items()],
        "",
        "`status.phase` (the PHASE column): "
        + ", ".join(f"`{p}`" for p in Phase)
        + ". Run results (`status.lastRun.result`, the run history, the status document): "
        + ", ".join(f"`{r}`" for r in (RUNNING, SUCCEEDED, FAILED, ROLLED_BACK))
        + ".",
        "",
        "## The per-cluster set (`set.yaml`)",
        "",
        "Not a custom resource: the payload the hub publishes on each cluster's branch and the",
        "agent verifies before creating the BundleDeployments it lists.",
        "",
        "## Types",
        "",
        types_markdown(
            [
                BundleDeploymentSet,
                *[c.spec for c in CRDS],
                *[c.status for c in CRDS if c.status is not None],
            ]
        ),
    ]
    return "\n".join(parts).rstrip("\n") + "\n"


def generated_files() -> dict[str, bytes]:
    """``{path relative to the repository root: content}`` of every generated file."""
    files = {crd.file: dump_yaml(crd_document(crd)) for crd in CRDS}
    files["docs/api.md"] = api_markdown().encode("utf-8")
    return files


def main(argv: Sequence[str] | None = None) -> int:
    """``--write`` the generated files or ``--check`` them; returns the exit code."""
    return write_or_check(
        generated_files,
        prog="python -m agent.api.crds",
        description="Generate crds/*.yaml and docs/api.md from the API types.",
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(main())
