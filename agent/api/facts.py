"""The cluster facts an agent reports beside its status (``cluster.json`` on
``fleetlet/status/<cluster>``), so that the hub renders a cluster's bundles as the agent does.

What the agent's own renders depend on besides the set: the cluster's Kubernetes version and
served API versions (helm's ``.Capabilities``, :class:`agent.render.facts.ClusterFacts`) and
which bundles it already runs (those render as an upgrade: ``.Release.IsUpgrade``); and the
public halves of the cluster's age keys (``ageRecipients``, newest first: what operators
encrypt a SOPS file to, :mod:`agent.secrets.keys`). ``hub diff --cluster`` and
``hub recipients`` read this file, on demand: the hub's status aggregation reads
``status.json`` alone, whose size this does not grow.

The document is small JSON (sorted keys, no whitespace)::

    {"ageRecipients": ["age1..."], "apiVersions": [...], "cluster": "edge-1",
     "installed": ["web"], "kubeVersion": "v1.32.0", "schemaVersion": 1}

``ageRecipients`` is absent when the agent reported none (an older agent).

A reader refuses (``ValidationError``) anything that is not exactly that shape, bounded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agent.errors import FieldProblem, ValidationError
from agent.render.facts import ClusterFacts, InvalidClusterFactsError

FACTS_FILE = "cluster.json"
FACTS_SCHEMA_VERSION = 1
MAX_FACTS_BYTES = 1024 * 1024
"""What :func:`load_reported_facts` accepts (a cluster serving thousands of kinds fits)."""
MAX_ITEMS = 20_000
_MAX_ITEM = 512
_AGE_RECIPIENT = re.compile(r"^age1[02-9ac-hj-np-z]{58}$")


@dataclass(frozen=True, kw_only=True)
class ReportedFacts:
    """A cluster's facts as its agent reported them."""

    cluster: str
    facts: ClusterFacts
    installed: frozenset[str] = frozenset()
    """Bundles with a healthy revision in the cluster (they render as an upgrade)."""
    age_recipients: tuple[str, ...] = ()
    """The cluster's age public keys, newest first (the first is the one to encrypt to)."""


def dump_reported_facts(reported: ReportedFacts) -> bytes:
    """The document's bytes (stable: the same facts always give the same bytes)."""
    doc = {
        "schemaVersion": FACTS_SCHEMA_VERSION,
        "cluster": reported.cluster,
        "kubeVersion": reported.facts.kube_version,
        "apiVersions": list(reported.facts.api_versions),
        "installed": sorted(reported.installed),
    }
    if reported.age_recipients:
        doc["ageRecipients"] = list(reported.age_recipients)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def load_reported_facts(data: bytes, *, origin: str) -> ReportedFacts:
    """Parse ``cluster.json`` bytes.

    Raises ValidationError (too large, not JSON, not the document's shape, a malformed
    Kubernetes version).
    """

    def refuse(path: str, expected: str, found: str) -> ValidationError:
        return ValidationError(
            [FieldProblem(path=path, expected=expected, found=found)], origin=origin
        )

    if len(data) > MAX_FACTS_BYTES:
        raise refuse("(document)", f"at most {MAX_FACTS_BYTES} bytes", f"{len(data)} bytes")
    try:
        doc: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise refuse("(document)", "UTF-8 JSON", str(exc)) from exc
    if not isinstance(doc, dict):
        raise refuse("(document)", "a JSON object", type(doc).__name__)
    if doc.get("schemaVersion") != FACTS_SCHEMA_VERSION:
        raise refuse("schemaVersion", str(FACTS_SCHEMA_VERSION), repr(doc.get("schemaVersion")))
    cluster = doc.get("cluster")
    if not isinstance(cluster, str) or not cluster:
        raise refuse("cluster", "a cluster name", repr(cluster))
    version = doc.get("kubeVersion")
    if version is not None and not isinstance(version, str):
        raise refuse("kubeVersion", "a version such as v1.32.0, or null", repr(version))
    lists: dict[str, list[str]] = {}
    for key in ("apiVersions", "installed", "ageRecipients"):
        items = doc.get(key, [])
        if (
            not isinstance(items, list)
            or len(items) > MAX_ITEMS
            or not all(isinstance(i, str) and 0 < len(i) <= _MAX_ITEM for i in items)
        ):
            raise refuse(key, f"a list of at most {MAX_ITEMS} non-empty strings", "something else")
        lists[key] = items
    if not all(_AGE_RECIPIENT.match(r) for r in lists["ageRecipients"]):
        raise refuse("ageRecipients", "age X25519 recipients (age1...)", "something else")
    try:
        facts = ClusterFacts.of(kube_version=version, api_versions=lists["apiVersions"])
    except InvalidClusterFactsError as exc:
        raise refuse("kubeVersion", "a version such as v1.32.0", repr(version)) from exc
    return ReportedFacts(
        cluster=cluster,
        facts=facts,
        installed=frozenset(lists["installed"]),
        age_recipients=tuple(lists["ageRecipients"]),
    )


__all__ = [
    "FACTS_FILE",
    "FACTS_SCHEMA_VERSION",
    "ReportedFacts",
    "dump_reported_facts",
    "load_reported_facts",
]
