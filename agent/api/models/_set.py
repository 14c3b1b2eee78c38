"""The per-cluster publication: the hub's signed set of bundle deployments for one cluster.

Part of :mod:`agent.api.models`; written by :mod:`hub.publish`, read by :mod:`agent.state`,
:mod:`agent.verify` and the reconcile.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

from agent.api.depgraph import find_cycle
from agent.api.models._patterns import (
    COMMIT,
    COMMIT_TEXT,
    DIGEST,
    DIGEST_TEXT,
    DNS_LABEL,
    DNS_LABEL_TEXT,
    GROUP_VERSION,
    NO_WHITESPACE,
)
from agent.api.models._spec import BundleDeploymentSpec
from agent.api.validation import ApiObject, api_field, show
from agent.errors import FieldProblem

# --- the per-cluster publication ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitSignature(ApiObject):
    """Who signed the fleet commit, as the hub verified it against its commit policy before
    publishing (`fleet.yaml: commitSigning`)."""

    format: Literal["ssh", "gitsign"] = api_field(
        "`ssh`: an SSH signature (git's `gpg.format=ssh`); `gitsign`: a Sigstore keyless "
        "signature made by gitsign (`gpg.format=x509`)."
    )
    principal: str = api_field(
        "The signer, as the policy names it (e.g. alice@example.com); for gitsign, the "
        "certificate's subject.",
        pattern=NO_WHITESPACE,
        expected="an identity without whitespace",
        max_length=1024,
    )
    key: str = api_field(
        "The signing key's fingerprint (`SHA256:...`, as `ssh-keygen -l` prints it); for "
        "gitsign, the SHA-256 of the short-lived signing certificate, written the same way.",
        pattern=r"^SHA256:[A-Za-z0-9+/]{43}$",
        expected="SHA256:<43 base64 characters>",
        max_length=50,
    )
    policy: str = api_field(
        "Digest of the commit policy the signature was verified against.",
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        max_length=71,
    )
    issuer: str | None = api_field(
        "For gitsign: the OIDC issuer in the signing certificate.",
        default=None,
        pattern=NO_WHITESPACE,
        expected="a URL without whitespace",
        max_length=1024,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SetSource(ApiObject):
    """The fleet repository commit a set was rendered from."""

    repo: str = api_field(
        "URL of the fleet repository.",
        pattern=NO_WHITESPACE,
        max_length=2048,
        expected="a URL without whitespace",
    )
    commit: str = api_field(
        "The fleet repository's commit.", pattern=COMMIT, expected=COMMIT_TEXT, max_length=40
    )
    signed_by: CommitSignature | None = api_field(
        "Who signed the commit, verified by the hub (absent: no commit policy).", default=None
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentEntry(ApiObject):
    """One bundle of a set: its name (the BundleDeployment's name) and spec."""

    name: str = api_field(
        "Name of the bundle, unique in the set; the name of its BundleDeployment.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    spec: BundleDeploymentSpec = api_field("The BundleDeployment's spec.")

    @property
    def group(self) -> str:
        """The lockstep group: ``spec.group``, or the bundle's own name."""
        return self.spec.group or self.name


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentSet(ApiObject):
    """Everything one cluster runs: the payload of a publication, one per cluster.

    Written as ``set.yaml`` on the cluster's branch. Each bundle's group is listed in
    ``groups``, which gives the order groups are applied in: a group comes after every group
    it depends on.
    """

    API_KIND: ClassVar[tuple[str, str] | None] = (GROUP_VERSION, "BundleDeploymentSet")

    cluster: str = api_field(
        "The cluster this set is for; an agent refuses a set for another cluster.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    serial: int = api_field(
        "Grows each time this cluster's content changes; an agent refuses a serial not "
        "greater than the last it accepted.",
        minimum=1,
        maximum=2**53 - 1,
    )
    issued_at: datetime = api_field("When the set was published.")
    expires_at: datetime = api_field(
        "After this time an agent refuses the set (so a frozen hub cannot pin old content)."
    )
    source: SetSource = api_field("The fleet repository commit the set was rendered from.")
    bundle_deployments: tuple[BundleDeploymentEntry, ...] = api_field(
        "The bundles, by name.",
        default=(),
        max_items=10000,
        list_type="map",
        list_keys=("name",),
    )
    groups: tuple[str, ...] = api_field(
        "Every group of the set, each after the groups it depends on: the apply order.",
        default=(),
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
        max_items=10000,
        list_type="set",
    )

    def entry(self, name: str) -> BundleDeploymentEntry | None:
        """The bundle named ``name``, or ``None``."""
        return next((e for e in self.bundle_deployments if e.name == name), None)

    def extra_problems(self) -> list[FieldProblem]:
        """Time order, groups listed and used, dependencies known, acyclic and in order."""
        problems: list[FieldProblem] = []
        if self.expires_at <= self.issued_at:
            problems.append(
                FieldProblem(
                    path="expiresAt", expected="a time after issuedAt", found=show(self.expires_at)
                )
            )
        position = {g: i for i, g in enumerate(self.groups)}
        listed = "a group listed in groups"
        deps: dict[str, set[str]] = defaultdict(set)
        # Where each dependency is declared, to report a cycle on the entry that closes it.
        declared: dict[tuple[str, str], str] = {}
        for i, entry in enumerate(self.bundle_deployments):
            base = f"bundleDeployments[{i}]"
            group = entry.group
            if group not in position:
                where = f"{base}.spec.group" if entry.spec.group else f"{base}.name"
                found = show(group) + ("" if entry.spec.group else " (the default group)")
                problems.append(FieldProblem(path=where, expected=listed, found=found))
            for j, dep in enumerate(entry.spec.depends_on):
                where = f"{base}.spec.dependsOn[{j}]"
                if dep == group:
                    problems.append(
                        FieldProblem(
                            path=where,
                            expected=f"another group than the bundle's own ({group})",
                            found=show(dep),
                        )
                    )
                elif dep not in position:
                    problems.append(FieldProblem(path=where, expected=listed, found=show(dep)))
                else:
                    deps[group].add(dep)
                    declared.setdefault((group, dep), where)
        used = {e.group for e in self.bundle_deployments}
        for k, group in enumerate(self.groups):
            if group not in used:
                problems.append(
                    FieldProblem(
                        path=f"groups[{k}]",
                        expected="a group that has at least one bundle",
                        found=show(group),
                    )
                )
        cycle = find_cycle(deps)
        if cycle:
            where = declared[(cycle[-2], cycle[-1])]
            problems.append(
                FieldProblem(
                    path=where,
                    expected="no dependency cycle",
                    found=f"{show(cycle[-1])} (cycle " + " -> ".join(cycle) + ")",
                )
            )
            return problems
        for group, needs in sorted(deps.items()):
            for dep in sorted(needs):
                if group in position and position[dep] > position[group]:
                    problems.append(
                        FieldProblem(
                            path=f"groups[{position[group]}]",
                            expected=f"{show(group)} after the groups it depends on ({show(dep)})",
                            found=f"{show(group)} at {position[group]}, {show(dep)} at "
                            f"{position[dep]}",
                        )
                    )
        return problems
