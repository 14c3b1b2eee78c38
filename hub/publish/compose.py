"""Each cluster's ``set.yaml`` bytes and set digest, composed from one template per shape.

Clusters with the same entries and groups (a *shape*: a few hundred in a fleet of 100,000) have
sets that differ only in ``cluster`` and ``serial``. For each shape the agent's own encoders
(:func:`agent.api.dump_set`, :func:`agent.api.canonical_bytes`) write the set of one cluster
once; every other cluster's bytes are that template with its own two values put in, and its
set digest is the template's SHA-256 state after the shared prefix (``apiVersion`` and
``bundleDeployments`` come before ``cluster`` in both sorted encodings), copied and fed the
short rest. So 100,000 sets of 20 bundles cost about what 100,000 short strings cost.

Each template is checked when it is made: put back together for its own cluster it must give
exactly the encoders' bytes, else that shape is encoded the slow way, cluster by cluster.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime

from agent.api import (
    BundleDeploymentEntry,
    CommitSignature,
    canonical_bytes,
    dump_set,
    dump_yaml,
    set_digest,
)
from hub.fleet.render import ClusterPlan, Header, build_set


@dataclass(frozen=True, slots=True)
class _Template:
    """A shape's set split around the two per-cluster values."""

    yaml_head: bytes  # up to the "cluster:" line
    yaml_between: bytes  # after it, up to the "serial:" line
    yaml_tail: bytes  # after the "serial:" line
    jcs_hash: hashlib._Hash  # SHA-256 state after the JCS prefix, up to the cluster's value
    jcs_between: bytes  # after the cluster's value, up to the serial's
    jcs_tail: bytes


def _split_lines(data: bytes, key: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(before, the top-level ``key`` line, after); None when there is not exactly one."""
    marker = b"\n" + key
    at = data.find(marker)
    if at < 0 or data.find(marker, at + 1) >= 0:
        return None
    start = at + 1
    end = data.index(b"\n", start) + 1
    return data[:start], data[start:end], data[end:]


def _make_template(plan: ClusterPlan, header: Header) -> _Template | None:
    deployment_set = build_set(plan, header)
    name = deployment_set.cluster
    yaml_bytes = dump_set(deployment_set)
    jcs = canonical_bytes(deployment_set)
    # Top-level keys sit at column 0 (nested lines are indented, list items start with "- ",
    # strings never hold a raw line break), so these lines are the set's own fields.
    by_cluster = _split_lines(yaml_bytes, b"cluster: ")
    if by_cluster is None or by_cluster[1] != _cluster_line(name):
        return None
    head, _, rest = by_cluster
    by_serial = _split_lines(b"\n" + rest, b"serial: ")
    if by_serial is None or by_serial[1] != b"serial: %d\n" % header.serial:
        return None
    between, tail = by_serial[0][1:], by_serial[2]
    # In JCS the set's own "cluster" is the last one: everything after it is the header
    # (times, group names, source), where no '"cluster":' can occur inside a string.
    cluster_value = b',"cluster":' + json.dumps(name).encode()
    at = jcs.rfind(cluster_value)
    serial_value = b',"serial":%d,' % header.serial
    at_serial = jcs.rfind(serial_value)
    if at < 0 or at_serial < at:
        return None
    prefix = jcs[: at + len(b',"cluster":')]
    jcs_between = jcs[at + len(cluster_value) : at_serial + len(b',"serial":')]
    jcs_tail = jcs[at_serial + len(serial_value) - 1 :]
    template = _Template(
        yaml_head=head,
        yaml_between=between,
        yaml_tail=tail,
        jcs_hash=hashlib.sha256(prefix),
        jcs_between=jcs_between,
        jcs_tail=jcs_tail,
    )
    # Put back together for its own cluster, it must be exactly what the encoders wrote.
    if _yaml(template, name, header.serial) != yaml_bytes:
        return None
    if _digest(template, name, header.serial) != set_digest(deployment_set):
        return None
    return template


# Words YAML 1.1 reads as something else than a string when plain (agent.api quotes them).
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")


def _cluster_line(name: str) -> bytes:
    """``cluster: <name>`` as the agent's encoder writes it (quoted when YAML needs it).

    A cluster name is a DNS label: one starting with a letter that is no YAML word is plain
    (the agent's rule; tests/test_hub_compose.py checks the two agree), others go through the
    agent's encoder.
    """
    if name[:1] in _LOWER and name not in _YAML_WORDS and name.isascii():
        return b"cluster: " + name.encode() + b"\n"
    return dump_yaml({"cluster": name})


def _yaml(template: _Template, name: str, serial: int) -> bytes:
    return b"".join(
        (
            template.yaml_head,
            _cluster_line(name),
            template.yaml_between,
            b"serial: %d\n" % serial,
            template.yaml_tail,
        )
    )


def _digest(template: _Template, name: str, serial: int) -> str:
    state = template.jcs_hash.copy()
    state.update(
        json.dumps(name).encode() + template.jcs_between + b"%d" % serial + template.jcs_tail
    )
    return "sha256:" + state.hexdigest()


@dataclass(slots=True)
class SetComposer:
    """Sets of one publication (one issue time, expiry and fleet source) for many clusters.

    :meth:`digest` is :func:`agent.api.set_digest` and :meth:`set_bytes` is
    :func:`agent.api.dump_set` of the cluster's set, without building it. Raises
    ValidationError (from :func:`~hub.fleet.render.build_set`) for an invalid header.
    """

    issued_at: datetime
    expires_at: datetime
    source_repo: str
    source_commit: str
    source_signed_by: CommitSignature | None = None
    _templates: dict[tuple[int, tuple[str, ...]], _Template | None] = field(default_factory=dict)
    _keep: list[tuple[BundleDeploymentEntry, ...]] = field(default_factory=list)

    def header(self, serial: int) -> Header:
        return Header(
            serial=serial,
            issued_at=self.issued_at,
            expires_at=self.expires_at,
            source_repo=self.source_repo,
            source_commit=self.source_commit,
            source_signed_by=self.source_signed_by,
        )

    def _template(self, plan: ClusterPlan) -> _Template | None:
        key = (id(plan.entries), plan.groups)
        if key not in self._templates:
            self._templates[key] = _make_template(plan, self.header(1))
            self._keep.append(plan.entries)  # the id stays valid while the tuple lives
        return self._templates[key]

    def shape(self, plan: ClusterPlan) -> tuple[int, tuple[str, ...]]:
        """The key of the plan's shape: clusters sharing it differ only in name and serial."""
        self._template(plan)
        return (id(plan.entries), plan.groups)

    def set_bytes(self, plan: ClusterPlan, serial: int) -> bytes:
        template = self._template(plan)
        if template is None:
            return dump_set(build_set(plan, self.header(serial)))
        return _yaml(template, plan.cluster.name, serial)

    def digest(self, plan: ClusterPlan, serial: int) -> str:
        template = self._template(plan)
        if template is None:
            return set_digest(build_set(plan, self.header(serial)))
        return _digest(template, plan.cluster.name, serial)

    def parts(self, plan: ClusterPlan, serial: int) -> tuple[bytes, bytes, bytes] | None:
        """(what comes before, the cluster's own bytes, what comes after) of ``set_bytes``:
        the middle part differs between clusters of a shape, the outer two do not (for the
        pack's deltas). None for a shape encoded the slow way."""
        template = self._template(plan)
        if template is None:
            return None
        own = _cluster_line(plan.cluster.name) + template.yaml_between + b"serial: %d\n" % serial
        return template.yaml_head, own, template.yaml_tail
