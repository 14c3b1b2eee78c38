"""A group's content on a cluster (its *variant*), and sets with one group's content replaced.

A variant is the tuple of a cluster's entries of one group (each bundle's name and whole spec,
every source pinned), named by the SHA-256 of their canonical bytes; the group absent is the
variant :data:`ABSENT`. Clusters of one shape share their entries, so a fleet of 10,000
clusters has a handful of variants per group.

What a cluster holds now is read from its branch (signed and digest-pinned already), one set
parsed per distinct content digest (:class:`BranchContent`). What it should hold during a
rollout is that set with the rolling group's entries replaced by the rollout's previous or new
variant (:class:`Rewriter`), every other group as it is: a rollout step never touches the rest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.api import BundleDeploymentEntry, canonical_bytes, from_dict, load_set, to_dict
from agent.errors import ValidationError
from agent.verify.publication import SET_FILE
from hub.errors import PublishError
from hub.fleet.render import order_groups
from hub.publish.git import BranchStore

ABSENT = ""
"""The variant of a cluster that does not run the group."""

Entries = tuple[BundleDeploymentEntry, ...]


class RolloutContentError(PublishError):
    """A set cannot be made with a group's other variant (a dependency on a group it lacks),
    or a recorded variant is unreadable."""


def variant_of(entries: Iterable[BundleDeploymentEntry]) -> str:
    """The variant name of a group's entries: ``sha256:<hex>`` (:data:`ABSENT` for none)."""
    ordered = sorted(entries, key=lambda e: e.name)
    if not ordered:
        return ABSENT
    digest = hashlib.sha256()
    for entry in ordered:
        digest.update(canonical_bytes(entry))
        digest.update(b"\n")
    return "sha256:" + digest.hexdigest()


def variant_bytes(entries: Entries) -> bytes:
    """A variant as recorded in git: a JSON list of the entries (API form), by name."""
    items = [to_dict(e) for e in sorted(entries, key=lambda e: e.name)]
    return json.dumps(items, sort_keys=True, separators=(",", ":")).encode()


def variant_from_bytes(data: bytes, *, name: str) -> Entries:
    """Raises RolloutContentError when ``data`` is not the variant ``name``."""
    try:
        items = json.loads(data)
        entries = tuple(from_dict(BundleDeploymentEntry, item) for item in items)
    except (ValueError, TypeError, ValidationError) as exc:
        raise RolloutContentError(f"rollout variant {name}: unreadable: {exc}") from exc
    if variant_of(entries) != name:
        raise RolloutContentError(f"rollout variant {name}: its entries have another digest")
    return entries


@dataclass(slots=True)
class Variants:
    """Variants met in one run: name -> entries, and each shared entry tuple's variant of a
    group, computed once."""

    known: dict[str, Entries] = field(default_factory=lambda: {ABSENT: ()})
    _of: dict[tuple[int, str], str] = field(default_factory=dict)
    _keep: list[Entries] = field(default_factory=list)

    def of(self, entries: Entries, group: str) -> str:
        """The variant of ``group`` in ``entries`` (remembered by the tuple's identity)."""
        key = (id(entries), group)
        found = self._of.get(key)
        if found is None:
            mine = tuple(e for e in entries if e.group == group)
            found = variant_of(mine)
            self.known.setdefault(found, mine)
            self._of[key] = found
            self._keep.append(entries)  # the id stays valid while the tuple lives
        return found

    def entries(self, name: str) -> Entries:
        """Raises KeyError for a variant not met (load it with :meth:`add`)."""
        return self.known[name]

    def add(self, name: str, entries: Entries) -> None:
        self.known.setdefault(name, entries)


def group_order(entries: Sequence[BundleDeploymentEntry], *, cluster: str) -> tuple[str, ...]:
    """The ``groups`` of a set with ``entries``: dependencies first, ties by name.

    Raises RolloutContentError when a group depends on a group the set lacks (a group that
    a rollout holds back, or brings in, together with a group that needs it).
    """
    deps: dict[str, set[str]] = {}
    for entry in entries:
        deps.setdefault(entry.group, set()).update(entry.spec.depends_on)
    for group, needed in sorted(deps.items()):
        missing = sorted(d for d in needed if d not in deps)
        if missing:
            raise RolloutContentError(
                f"cluster {cluster}: group {group!r} depends on {', '.join(missing)}, which its "
                "set would lack while a rollout holds it back; roll them out together (one "
                "group) or give the dependency its rollout first"
            )
    return tuple(order_groups({g: sorted(d) for g, d in deps.items()}))


@dataclass(slots=True)
class Rewriter:
    """Entries with one group's content replaced, shared between the clusters that had the
    same entries (so the sets composed from them share their templates)."""

    variants: Variants
    _done: dict[tuple[int, str, str], tuple[Entries, tuple[str, ...]]] = field(default_factory=dict)
    _keep: list[Entries] = field(default_factory=list)

    def replace(
        self, entries: Entries, group: str, variant: str, *, cluster: str
    ) -> tuple[Entries, tuple[str, ...]]:
        """(``entries`` with ``group``'s entries being ``variant``, their group order).

        Raises RolloutContentError, KeyError (a variant not loaded).
        """
        key = (id(entries), group, variant)
        found = self._done.get(key)
        if found is None:
            rest = [e for e in entries if e.group != group]
            merged = tuple(sorted([*rest, *self.variants.entries(variant)], key=lambda e: e.name))
            found = (merged, group_order(merged, cluster=cluster))
            self._done[key] = found
            self._keep.append(entries)
        return found


class BranchContent:
    """What each cluster's branch holds (entries and groups), one set parsed per content
    digest. The stores must have been listed (``fetch``)."""

    def __init__(self, stores: Mapping[int, BranchStore], home: Callable[[str], int]) -> None:
        self.stores = stores
        self.home = home
        self._by_digest: dict[str, tuple[Entries, tuple[str, ...]]] = {}

    def holder(self, cluster: str) -> BranchStore | None:
        """The store of the cluster's branch: its own shard's, else any holding it."""
        own = self.stores.get(self.home(cluster))
        if own is not None and cluster in own.tips:
            return own
        return next((s for s in self.stores.values() if cluster in s.tips), None)

    def of(self, cluster: str) -> tuple[Entries, tuple[str, ...]] | None:
        """(entries, groups) on the cluster's branch; None without a branch.

        Raises RolloutContentError (an unreadable set), GitTransportError.
        """
        store = self.holder(cluster)
        if store is None:
            return None
        facts = store.facts(cluster)
        digest = facts.digest if facts is not None else ""
        if digest and digest in self._by_digest:
            return self._by_digest[digest]
        data = store.read_file(cluster, SET_FILE)
        if data is None:
            raise RolloutContentError(f"branch fleetlet/clusters/{cluster} has no {SET_FILE}")
        try:
            found = load_set(data, origin=f"fleetlet/clusters/{cluster}:{SET_FILE}")
        except ValidationError as exc:
            raise RolloutContentError(
                f"branch fleetlet/clusters/{cluster} holds an unreadable {SET_FILE}: {exc}"
            ) from exc
        value = (tuple(found.bundle_deployments), tuple(found.groups))
        if digest:
            self._by_digest[digest] = value
        return value


__all__ = [
    "ABSENT",
    "BranchContent",
    "Entries",
    "Rewriter",
    "RolloutContentError",
    "Variants",
    "group_order",
    "variant_bytes",
    "variant_from_bytes",
    "variant_of",
]
