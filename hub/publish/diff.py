"""What a publish would change, cluster by cluster and bundle by bundle, without pushing:
``hub diff`` (:mod:`hub.cli`), the pull-request review (:mod:`hub.review`) and previews
(:mod:`hub.preview`). Re-exported by :mod:`hub.publish.flow`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from agent.api import BundleDeploymentEntry, load_set, to_dict
from agent.errors import ValidationError
from agent.verify.publication import SET_FILE
from hub.errors import PublishError
from hub.publish.compare import ContentCache, Status, decide
from hub.publish.git import BranchStore
from hub.publish.prepared import Prepared, sharded_stores
from hub.publish.shards import ShardedStore


@dataclass(frozen=True, slots=True)
class BundleDiff:
    name: str
    change: Literal["added", "removed", "changed"]
    fields: tuple[tuple[str, Any, Any], ...]  # (path, before, after) for "changed"


@dataclass(frozen=True, slots=True)
class ClusterDiff:
    cluster: str
    status: Status
    serial_before: int | None
    bundles: tuple[BundleDiff, ...]
    groups_before: tuple[str, ...]
    groups_after: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "status": self.status,
            "serialBefore": self.serial_before,
            "bundles": [
                {
                    "name": b.name,
                    "change": b.change,
                    **(
                        {"fields": [{"path": p, "before": x, "after": y} for p, x, y in b.fields]}
                        if b.change == "changed"
                        else {}
                    ),
                }
                for b in self.bundles
            ],
            **(
                {"groups": {"before": list(self.groups_before), "after": list(self.groups_after)}}
                if self.groups_before != self.groups_after
                else {}
            ),
        }


ENCRYPTED_VALUES = "formatOptions.encryptedValues"
"""Shown whole, as ``encrypted`` or ``encrypted, changed``: the hub cannot open it."""


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if path == ENCRYPTED_VALUES and value is not None:
        out[path] = value  # opaque: compared whole, never listed value by value
    elif isinstance(value, Mapping) and value:
        for k in sorted(value):
            _flatten(value[k], f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list | tuple) and value:
        for i, v in enumerate(value):
            _flatten(v, f"{path}[{i}]", out)
    else:
        out[path] = value


def entry_fields(
    before: BundleDeploymentEntry | None, after: BundleDeploymentEntry | None
) -> list[tuple[str, Any, Any]]:
    """(path, before, after) of every spec field that differs (None: the entry is absent),
    paths flattened like ``formatOptions.values.replicas``."""
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    if before is not None:
        _flatten(to_dict(before.spec), "", old)
    if after is not None:
        _flatten(to_dict(after.spec), "", new)
    return [
        (p, *_opaque(p, old.get(p), new.get(p)))
        for p in sorted(set(old) | set(new))
        if old.get(p) != new.get(p)
    ]


def _opaque(path: str, before: Any, after: Any) -> tuple[Any, Any]:
    """Encrypted values as what can be said of them (sops keeps a value's ciphertext while its
    plaintext stays, so a changed document means changed values or a re-encryption)."""
    if path != ENCRYPTED_VALUES:
        return before, after
    return (
        "encrypted" if before is not None else None,
        "encrypted, changed" if after is not None else None,
    )


def diff(
    prepared: Prepared, store: BranchStore | ShardedStore, *, now: datetime | None = None
) -> list[ClusterDiff]:
    """What ``publish`` would do to each planned cluster, bundle by bundle (no push).

    Raises GitTransportError if the branches cannot be fetched, PublishError if a branch holds
    an unreadable set.
    """
    now = now or datetime.now(UTC)
    sharded = sharded_stores(prepared, store)
    sharded.each(lambda _s, st: st.fetch())
    cache = ContentCache()
    decisions = {
        c.cluster: c
        for c in decide(
            prepared.plans,
            {c.name for c in prepared.fleet.clusters},
            sharded.stores,
            prepared.shard_map,
            now=now,
            refresh_before=prepared.fleet.settings.refresh_before,
            move_window=prepared.fleet.settings.expires_after,
            cache=cache,
            signed=False,
        ).changes
    }
    out: list[ClusterDiff] = []
    for name in sorted(decisions):
        decision = decisions[name]
        plan = prepared.plans.get(name)
        old_entries: dict[str, BundleDeploymentEntry] = {}
        old_groups: tuple[str, ...] = ()
        holder = next(
            (sharded.stores[s] for s in decision.shards if name in sharded.stores[s].tips), None
        )
        data = holder.read_file(name, SET_FILE) if holder is not None else None
        if data is not None and decision.status == "changed":
            try:
                old = load_set(data, origin=f"fleetlet/clusters/{name}:{SET_FILE}")
            except ValidationError as exc:
                raise PublishError(
                    f"branch fleetlet/clusters/{name} holds an unreadable {SET_FILE}: {exc}"
                ) from exc
            old_entries = {e.name: e for e in old.bundle_deployments}
            old_groups = old.groups
        new_entries = {e.name: e for e in plan.entries} if plan else {}
        new_groups = plan.groups if plan else ()
        bundles: list[BundleDiff] = []
        if decision.status in ("added", "changed"):
            for bname in sorted(set(old_entries) | set(new_entries)):
                if bname not in old_entries:
                    bundles.append(BundleDiff(bname, "added", ()))
                elif bname not in new_entries:
                    bundles.append(BundleDiff(bname, "removed", ()))
                elif old_entries[bname] != new_entries[bname]:
                    fields = entry_fields(old_entries[bname], new_entries[bname])
                    bundles.append(BundleDiff(bname, "changed", tuple(fields)))
        if decision.status != "changed":
            old_groups = new_groups
        out.append(
            ClusterDiff(
                cluster=name,
                status=decision.status,
                serial_before=decision.serial_before,
                bundles=tuple(bundles),
                groups_before=old_groups,
                groups_after=new_groups,
            )
        )
    return out


__all__ = ["BundleDiff", "ClusterDiff", "diff", "entry_fields"]
