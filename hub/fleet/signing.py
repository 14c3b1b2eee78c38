"""Source signature policies in the fleet repository: ``fleet.yaml: sourceSigning``, and which
policy each OCI source must satisfy.

::

    # fleet.yaml
    sourceSigning:
      policies:
        release:                      # agent/verify/sources.py: keys, identities, trustedRoot
          keys: [keys/release.pub]
        upstream:
          identities:
            - issuer: https://token.actions.githubusercontent.com
              subjectRegExp: ^https://github\\.com/acme/.+$
        platform:                     # agent/verify/notation.py
          notation:
            trustStore: [trust/acme-ca.pem]
            trustedIdentities: ["x509.subject: C=US, ST=WA, O=Acme, CN=release"]
      default: release                # every image source that names none

    # a bundle file: for all its image sources, or one source
    verify: upstream
    sources:
      - {kind: image, uri: registry.example.com/charts/web, tag: 1.2.0, verify: release}

The policy of a source: its own ``verify``, else its bundle's, else the fleet's ``default``;
none: the source is published unverified, as before. Files are read from the fleet
repository (paths relative to its root, never leaving it).

The policies are as trustworthy as the fleet commit that carries them: whoever can push to
the fleet repository can change them, so pair them with signed fleet commits
(:mod:`hub.fleet.commits`), whose policy the hub holds itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import FieldProblem
from agent.verify.sources import SourcePolicy, file_reader, parse_source_policy

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True, slots=True)
class SourceSigning:
    """``sourceSigning``: named policies, and the default one (None: no default)."""

    policies: Mapping[str, SourcePolicy] = field(default_factory=dict)
    default: str | None = None

    def chosen(self, source_verify: str, bundle_verify: str | None) -> str | None:
        """The name of the policy a source must satisfy, or None."""
        return source_verify or bundle_verify or self.default


def parse_source_signing(raw: Any, root: Path, problems: list[FieldProblem]) -> SourceSigning:
    """``fleet.yaml: sourceSigning`` (problems are added under ``sourceSigning.``)."""
    where = "sourceSigning"
    if not isinstance(raw, dict):
        problems.append(FieldProblem(path=where, expected="a mapping", found=repr(raw)))
        return SourceSigning()
    for key in sorted(set(raw) - {"policies", "default"}, key=str):
        problems.append(
            FieldProblem(path=f"{where}.{key}", expected="policies or default", found="unknown")
        )
    policies_raw = raw.get("policies")
    if not isinstance(policies_raw, dict) or not policies_raw:
        problems.append(
            FieldProblem(
                path=f"{where}.policies",
                expected="a mapping of policy name to {keys, identities, trustedRoot, notation}",
                found=repr(policies_raw),
            )
        )
        return SourceSigning()
    read = file_reader(root)
    policies: dict[str, SourcePolicy] = {}
    for name, body in policies_raw.items():
        at = f"{where}.policies.{name}"
        if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
            problems.append(
                FieldProblem(path=at, expected="a name of a-z, 0-9 and -", found=repr(name))
            )
            continue
        policy = parse_source_policy(body, name=name, where=at, read=read, problems=problems)
        if policy is not None:
            policies[name] = policy
    default = raw.get("default")
    if default is not None and (not isinstance(default, str) or default not in policies_raw):
        problems.append(
            FieldProblem(
                path=f"{where}.default",
                expected=f"one of the policies ({', '.join(sorted(map(str, policies_raw)))})",
                found=repr(default),
            )
        )
        default = None
    return SourceSigning(policies=policies, default=default)


def check_verify_name(
    value: Any, signing: SourceSigning | None, where: str, problems: list[FieldProblem]
) -> str:
    """A ``verify`` field of a bundle or source: the name of a policy of ``sourceSigning``
    ("" with a problem when it is not one)."""
    names = sorted(signing.policies) if signing is not None else []
    if isinstance(value, str) and value in names:
        return value
    expected = (
        f"the name of a sourceSigning policy of fleet.yaml ({', '.join(names)})"
        if names
        else "the name of a policy, but fleet.yaml has no sourceSigning.policies"
    )
    problems.append(FieldProblem(path=where, expected=expected, found=repr(value)))
    return ""
