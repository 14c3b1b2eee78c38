"""The fleet repo's model: settings, clusters, bundles, their sources, targets and overrides.

:mod:`hub.fleet.load` reads a fleet directory into these (the format is documented in
``docs/fleet-repo.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from hub.fleet.selectors import LabelSelector
from hub.rollout.model import Strategy

if TYPE_CHECKING:
    from hub.fleet.commits import CommitPolicy
    from hub.fleet.signing import SourceSigning

SOURCE_KINDS = ("image", "git", "http", "helm")
APPROVALS = ("none", "manual")
DEFAULT_EXPIRES_AFTER = timedelta(days=7)
DEFAULT_REFRESH_BEFORE = timedelta(days=2)
DEFAULT_SHARD_LABEL = "fleetlet.io/shard"
MAX_SHARDS = 4096
SHARD_PLACEHOLDER = "{shard}"


@dataclass(frozen=True, slots=True)
class Sharding:
    """``fleet.yaml: shards``: how cluster and status branches spread over repositories.

    ``count`` repositories; a cluster goes to the shard its ``label`` names, else to a stable
    hash of its name (:mod:`hub.fleet.shards`). ``repo`` and ``status_repo`` are URL templates
    with ``{shard}`` (optional: the CLI's ``--repo`` can give them).
    """

    count: int = 1
    label: str = DEFAULT_SHARD_LABEL
    repo: str | None = None
    status_repo: str | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """``fleet.yaml``: what the whole fleet shares."""

    name: str
    repo: str | None
    expires_after: timedelta
    refresh_before: timedelta
    identity: str | None
    issuer: str | None
    insecure_registries: tuple[str, ...]
    shards: Sharding = field(default_factory=Sharding)
    rollout: Strategy | None = None
    """The rollout strategy of every group whose bundles name none (docs/rollouts.md)."""
    commit_signing: CommitPolicy | None = None
    """``commitSigning``: who must have signed the fleet commit (the hub's trusted copy
    decides, see :mod:`hub.fleet.commits`)."""
    source_signing: SourceSigning | None = None
    """``sourceSigning``: who must have signed the OCI sources (:mod:`hub.fleet.signing`)."""


class Cluster(NamedTuple):
    """A cluster of the inventory. A tuple: every run makes one per cluster of the fleet.

    ``hashed_shard``: (shards, the hashed shard of the name among them), when the parsed-file
    cache knew it; not part of what the cluster is (equality ignores it).
    """

    name: str
    labels: Mapping[str, str]
    file: str
    hashed_shard: tuple[int, int] | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cluster):
            return NotImplemented
        return (self.name, self.labels, self.file) == (other.name, other.labels, other.file)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal


@dataclass(frozen=True, slots=True)
class SourceRef:
    """One source of a bundle as written: ``ref_field`` is tag/branch/digest/commit/sha256, or
    ``url`` for an http source without a hash (to be downloaded and hashed)."""

    kind: str
    uri: str
    ref_field: str
    ref: str
    extra: tuple[tuple[str, Any], ...] = ()
    chart: str = ""
    """The chart's name in the repository (``helm`` sources only)."""
    verify: str = ""
    """``image`` sources: the name of the signature policy it must satisfy (``verify``;
    :mod:`hub.fleet.signing`)."""

    @property
    def pinned(self) -> bool:
        return self.ref_field in ("digest", "commit", "sha256")

    def describe(self) -> str:
        if self.kind == "http":
            return f"http {self.uri}"
        if self.kind == "helm":
            return f"helm {self.uri} chart {self.chart} version {self.ref}"
        if self.ref_field == "version":
            return f"{self.kind} {self.uri} version {self.ref}"
        sep = "@" if self.ref_field in ("digest", "commit") else ":"
        return f"{self.kind} {self.uri}{sep}{self.ref} ({self.ref_field})"


@dataclass(frozen=True, slots=True)
class ChartDependency:
    """A chart dependency that is not vendored, pinned by the hub; the agent places it at
    ``destination`` (relative to where the parent chart's source goes: ``<chart>/charts``)."""

    kind: str
    """``helm`` (a Helm repository's archive) or ``image`` (a chart in an OCI registry)."""
    uri: str
    chart: str
    version: str
    pin: str
    """sha256 hex (``helm``) or manifest digest (``image``)."""
    archive_url: str | None
    tag: str | None
    destination: str


@dataclass(frozen=True, slots=True)
class ChartPin:
    """What a version range resolved to: the exact version and the pin of its bytes, plus the
    dependencies the chart does not vendor (each pinned too)."""

    version: str
    pin: str
    """sha256 hex of the archive (``helm``) or the manifest digest (``image``)."""
    archive_url: str | None = None
    """``helm``: the archive's URL from the repository's index."""
    tag: str | None = None
    """``image``: the tag the version was read from (Helm writes ``+`` as ``_`` in tags)."""
    dependencies: tuple[ChartDependency, ...] = ()


Pin = str | ChartPin
"""A resolved source: a digest, commit or sha256 hex, or a chart resolved from a version."""


class SignedPins(dict[SourceRef, Pin]):
    """Pins, and ``proofs``: the ``signature`` each verified image source carries into the set
    (:mod:`hub.resolve.signatures`)."""

    def __init__(self, pins: Mapping[SourceRef, Pin], proofs: Mapping[SourceRef, Any]) -> None:
        super().__init__(pins)
        self.proofs = dict(proofs)


@dataclass(frozen=True, slots=True)
class Target:
    """Clusters named in ``clusters`` and/or matched by ``clusterSelector`` (both, if both given)."""

    names: frozenset[str] | None
    selector: LabelSelector | None

    def matches(self, cluster: Cluster) -> bool:
        if self.names is not None and cluster.name not in self.names:
            return False
        return self.selector is None or self.selector.matches(cluster.labels)


@dataclass(frozen=True, slots=True)
class Override:
    """Per-target changes. ``by_name`` overrides (with ``clusters``) apply after selector ones."""

    index: int
    target: Target
    values: Mapping[str, Any] | None
    paused: bool | None
    approval: str | None
    namespace: str | None
    sources: tuple[SourceRef, ...] | None = None
    """Replaces the bundle's sources (a canary gets the new version first)."""
    path: str | None = None
    """Replaces ``formatOptions.path`` (Rancher Fleet's per-target ``kustomize.dir``)."""
    patches: tuple[Mapping[str, Any], ...] | None = None
    """Appended to the bundle's ``patches`` (checked by the agent's API when rendered)."""
    encrypted_values: Mapping[str, Any] | None = None
    """Replaces the bundle's encrypted values (a SOPS document, :mod:`hub.fleet.secrets`)."""
    sets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """helm's ``setString``/``setJson``/``setFile`` items, appended after the bundle's
    (:mod:`hub.fleet.helmsets`)."""

    @property
    def by_name(self) -> bool:
        return self.target.names is not None


@dataclass(frozen=True, slots=True)
class Bundle:
    name: str
    file: str
    sources: tuple[SourceRef, ...]
    spec: Mapping[str, Any]
    targets: tuple[Target, ...]
    overrides: tuple[Override, ...]
    rollout: Strategy | str | None = None
    """Its group's rollout strategy; ``"none"``: published at once; None: not said here."""
    encrypted_values: Mapping[str, Any] | None = None
    """The SOPS document its ``encryptedValues`` names (:mod:`hub.fleet.secrets`): carried
    whole to ``formatOptions.encryptedValues``, opened only by the cluster's agent."""
    verify: str | None = None
    """``verify``: the signature policy of its image sources that name none."""

    @property
    def group(self) -> str:
        group = self.spec.get("group")
        return group if isinstance(group, str) and group else self.name

    @property
    def all_sources(self) -> tuple[SourceRef, ...]:
        """Every source any cluster may receive: the bundle's own and its overrides'."""
        extra = [s for o in self.overrides for s in (o.sources or ())]
        return tuple(dict.fromkeys([*self.sources, *extra]))

    def applied_overrides(self, cluster: Cluster) -> tuple[Override, ...]:
        """The overrides that apply to ``cluster``, in application order: selector overrides in
        file order, then name overrides in file order (the more specific one wins)."""
        hits = [o for o in self.overrides if o.target.matches(cluster)]
        return tuple(sorted(hits, key=lambda o: (o.by_name, o.index)))


@dataclass(frozen=True, slots=True)
class Fleet:
    root: Path
    settings: Settings
    clusters: tuple[Cluster, ...]
    bundles: tuple[Bundle, ...]
    files: tuple[str, ...] = field(default=())
    by_name: Mapping[str, Cluster] = field(default_factory=dict, compare=False, repr=False)
    rollouts: Mapping[str, Strategy] = field(default_factory=dict)
    """Group -> its rollout strategy (groups published at once are not in it)."""

    def cluster(self, name: str) -> Cluster | None:
        if self.by_name:
            return self.by_name.get(name)
        for c in self.clusters:
            if c.name == name:
                return c
        return None
