"""Inventories (the objects a bundle revision owns) and pruning.

An :class:`Inventory` is the set of objects a bundle's revision owns, each by API group, kind,
namespace and name (plus its UID once applied). When a bundle moves to a new revision,
:func:`plan_prune` compares its old and new inventories: objects only in the old one are
deleted (after the group is healthy; the caller decides when), except

* CustomResourceDefinitions, kept unless the bundle's settings let them go (``keepCRDs``:
  deleting a CRD deletes every custom resource of it);
* objects another bundle (of this group or another) now claims: they are handed over, never
  deleted and recreated (the new owner's apply relabels them; they keep their UID).

:func:`prune` then deletes, and re-checks each object live first: an object that is not
labelled as this bundle's (never ours, or relabelled by its new owner), that our field manager
never applied, or that is not the very object recorded (another UID), is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.apply.plan import api_group
from agent.kube import CONTENT_FIELD_MANAGER, ConflictError, KubeClient, ObjectRef
from agent.render.plain import BUNDLE_LABEL

CRD_GROUP = "apiextensions.k8s.io"


@dataclass(frozen=True, order=True, kw_only=True)
class Key:
    """An object's identity, independent of API version: group, kind, namespace, name."""

    group: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        kind = f"{self.kind}.{self.group}" if self.group else self.kind
        return f"{kind} {self.namespace}/{self.name}" if self.namespace else f"{kind} {self.name}"

    @property
    def is_crd(self) -> bool:
        """Whether this is a CustomResourceDefinition."""
        return self.kind == "CustomResourceDefinition" and self.group == CRD_GROUP


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One object of an inventory: its key, the apiVersion to reach it by, its UID ("" until
    applied)."""

    key: Key
    api_version: str
    uid: str = ""

    @property
    def ref(self) -> ObjectRef:
        """The reference KubeClient takes."""
        return ObjectRef(self.api_version, self.key.kind, self.key.name, self.key.namespace or None)

    def to_json(self) -> dict[str, str]:
        """The entry as a JSON object."""
        data = {
            "apiVersion": self.api_version,
            "kind": self.key.kind,
            "name": self.key.name,
        }
        if self.key.namespace:
            data["namespace"] = self.key.namespace
        if self.uid:
            data["uid"] = self.uid
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        """Parse :meth:`to_json`'s output. Raises KeyError, TypeError on a malformed entry."""
        return cls.of(
            ObjectRef(
                str(data["apiVersion"]),
                str(data["kind"]),
                str(data["name"]),
                str(data["namespace"]) if data.get("namespace") else None,
            ),
            uid=str(data.get("uid") or ""),
        )

    @classmethod
    def of(cls, ref: ObjectRef, *, uid: str = "") -> Entry:
        """The entry of an object reference."""
        key = Key(
            group=api_group(ref.api_version),
            kind=ref.kind,
            namespace=ref.namespace or "",
            name=ref.name,
        )
        return cls(key=key, api_version=ref.api_version, uid=uid)


@dataclass(frozen=True)
class Inventory:
    """The objects one bundle revision owns, by key (order: sorted by key)."""

    entries: Mapping[Key, Entry] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Inventory:
        """An inventory of the given entries (a later entry for a key wins)."""
        return cls({e.key: e for e in entries})

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> Inventory:
        """The inventory of rendered manifests (no UIDs yet). Raises InvalidError."""
        return cls.of(Entry.of(ObjectRef.of(obj)) for obj in objects)

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries[k] for k in sorted(self.entries))

    def __len__(self) -> int:
        return len(self.entries)

    def to_json(self) -> list[dict[str, str]]:
        """The inventory as a JSON list, sorted by key."""
        return [entry.to_json() for entry in self]

    @classmethod
    def from_json(cls, data: Iterable[Mapping[str, Any]]) -> Inventory:
        """Parse :meth:`to_json`'s output. Raises KeyError, TypeError."""
        return cls.of(Entry.from_json(item) for item in data)


@dataclass(frozen=True, kw_only=True)
class PruneItem:
    """One object of an old revision that the new one dropped, and what becomes of it."""

    bundle: str
    entry: Entry
    action: Literal["delete", "keep", "handover"]
    reason: str


@dataclass(frozen=True)
class PrunePlan:
    """What pruning a group will do, per object."""

    items: tuple[PruneItem, ...] = ()

    def of(self, action: str) -> list[PruneItem]:
        """The items with that action."""
        return [i for i in self.items if i.action == action]


def plan_prune(
    old: Mapping[str, Inventory],
    new: Mapping[str, Inventory],
    *,
    keep_crds: Mapping[str, bool] | None = None,
    claimed_elsewhere: Mapping[Key, str] | None = None,
) -> PrunePlan:
    """What to do with the objects the group's bundles owned (``old``, per bundle) and no
    longer own (``new``, per bundle; a bundle absent from ``new`` owns nothing any more).

    ``keep_crds`` per bundle (default True: keep); ``claimed_elsewhere`` maps keys to bundles
    outside the group that now own them (they are handed over).
    """
    keep = keep_crds or {}
    claimed: dict[Key, str] = dict(claimed_elsewhere or {})
    for bundle, inventory in new.items():
        for key in inventory.entries:
            claimed.setdefault(key, bundle)
    items: list[PruneItem] = []
    for bundle in sorted(old):
        still = new.get(bundle, Inventory())
        for entry in old[bundle]:
            if entry.key in still:
                continue
            owner = claimed.get(entry.key)
            if owner is not None and owner != bundle:
                items.append(
                    PruneItem(
                        bundle=bundle,
                        entry=entry,
                        action="handover",
                        reason=f"handed over to bundle {owner}",
                    )
                )
            elif entry.key.is_crd and keep.get(bundle, True):
                items.append(
                    PruneItem(
                        bundle=bundle,
                        entry=entry,
                        action="keep",
                        reason="CustomResourceDefinitions are kept (keepCRDs)",
                    )
                )
            else:
                items.append(
                    PruneItem(
                        bundle=bundle,
                        entry=entry,
                        action="delete",
                        reason="not in the new revision",
                    )
                )
    return PrunePlan(tuple(items))


@dataclass(frozen=True, kw_only=True)
class PruneOutcome:
    """One pruned (or spared) object: ``done`` is deleted / gone / kept / handed-over /
    not-ours / replaced, with a ``reason``."""

    bundle: str
    entry: Entry
    done: Literal["deleted", "gone", "kept", "handed-over", "not-ours", "replaced"]
    reason: str


def prune(kube: KubeClient, plan: PrunePlan) -> list[PruneOutcome]:
    """Delete the plan's ``delete`` items that are still ours, and report on every item.

    An object is deleted only when it exists, is labelled ``fleetlet.io/bundle=<its bundle>``,
    has fields managed by our field manager and (when the inventory has its UID) is that very
    object; the delete is conditional on the live UID, so an object replaced meanwhile is never
    deleted.

    Raises ForbiddenError, ApiUnavailableError, KubeApiError (the first failed deletion).
    """
    outcomes: list[PruneOutcome] = []
    for item in plan.items:
        entry = item.entry

        def report(done: Any, reason: str, item: PruneItem = item) -> None:
            outcomes.append(
                PruneOutcome(bundle=item.bundle, entry=item.entry, done=done, reason=reason)
            )

        if item.action == "keep":
            report("kept", item.reason)
            continue
        if item.action == "handover":
            report("handed-over", item.reason)
            continue
        live = kube.get(entry.ref)
        if live is None:
            report("gone", "already deleted")
            continue
        meta = live.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(BUNDLE_LABEL)
        if owner != item.bundle:
            if owner:
                report("handed-over", f"labelled as bundle {owner}'s")
            else:
                report("not-ours", "not labelled as a fleetlet bundle's object")
            continue
        managers = {m.get("manager") for m in meta.get("managedFields") or []}
        if CONTENT_FIELD_MANAGER not in managers:
            report("not-ours", f"labelled {owner} but never applied by {CONTENT_FIELD_MANAGER}")
            continue
        uid = str(meta.get("uid") or "")
        if entry.uid and uid != entry.uid:
            report("replaced", f"UID {uid} is not the applied object's {entry.uid}")
            continue
        try:
            gone = kube.delete(entry.ref, uid=uid or None)
        except ConflictError:
            report("replaced", "replaced while pruning")
            continue
        report("deleted" if gone else "gone", item.reason)
    return outcomes
