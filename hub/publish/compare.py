"""The diff stage: which clusters need a new set, with which serial, on which shards.

Change detection compares the ``bundleDeployments`` and ``groups`` blocks of a branch's
canonical ``set.yaml`` with those of the new set, through their digest: the hub's commits
record it as a trailer (``Content-Digest``), so an unchanged cluster costs a lookup in the
branch facts (:class:`~hub.publish.facts.BranchFacts`). A branch written by someone else is read
and compared block by block. Serial, times and source are not content: a new fleet commit that
changes nothing for a cluster republishes nothing there.

Moves between shards: a cluster whose branch is in another shard than the one the fleet now
gives it is *moving*. Its next set gets a serial above every serial any shard holds for it,
and the very same commit goes to its new shard and to every shard still holding its branch,
so its agent, pointed at either repository, sees the same commit and never an older serial.
Once the move is older than the publication validity (``expiresAfter``), the old branches are
deleted (see docs/scaling.md, "Moving a cluster to another shard").
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import compress, repeat
from typing import Literal, NamedTuple

import yaml

from agent.api import BundleDeploymentEntry, dump_yaml, load_set, parse_time, to_dict
from agent.api.yamlio import SAFE_LOADER
from agent.errors import ValidationError
from agent.verify.publication import BUNDLE_FILE, SET_FILE
from hub.errors import PublishError
from hub.fleet.render import ClusterPlan
from hub.fleet.shards import ShardMap
from hub.publish.facts import BranchFacts
from hub.publish.git import BranchStore

Status = Literal["added", "changed", "moved", "refreshed", "unchanged", "orphaned"]
STATUSES: tuple[Status, ...] = ("added", "changed", "moved", "refreshed", "unchanged", "orphaned")
CONTENT_KEYS = ("bundleDeployments", "groups")


def blocks(data: bytes) -> dict[str, str]:
    """Top-level blocks of a canonical set.yaml: key -> its lines (key line included)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in data.decode("utf-8", "replace").splitlines(keepends=True):
        if line[:1] not in (" ", "-", "") and ":" in line:
            key = line.split(":", 1)[0]
            current = found.setdefault(key, [])
        if current is not None:
            current.append(line)
    return {k: "".join(v) for k, v in found.items()}


@dataclass(slots=True)
class ContentCache:
    """Canonical YAML of entries, computed once per shared entry object."""

    fragments: dict[int, str] = field(default_factory=dict)
    keep: list[BundleDeploymentEntry] = field(default_factory=list)
    digests: dict[tuple[int, int], str] = field(default_factory=dict)
    keep_tuples: list[tuple[object, object]] = field(default_factory=list)

    def content(self, plan: ClusterPlan) -> dict[str, str]:
        out: dict[str, str] = {}
        if plan.entries:
            parts = ["bundleDeployments:\n"]
            for entry in plan.entries:
                frag = self.fragments.get(id(entry))
                if frag is None:
                    frag = dump_yaml([to_dict(entry)]).decode("utf-8")
                    self.fragments[id(entry)] = frag
                    self.keep.append(entry)  # ids stay valid while the entry lives
                parts.append(frag)
            out["bundleDeployments"] = "".join(parts)
        if plan.groups:
            out["groups"] = "groups:\n" + dump_yaml(list(plan.groups)).decode("utf-8")
        return out

    def digest(self, plan: ClusterPlan) -> str:
        """sha256 of the content blocks: what the commit trailer records (one per shape)."""
        # Clusters of one shape share their entries and groups objects: two ids are the key.
        key = (id(plan.entries), id(plan.groups))
        found = self.digests.get(key)
        if found is None:
            content = self.content(plan)
            text = "".join(content[k] for k in CONTENT_KEYS if k in content)
            found = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
            self.digests[key] = found
            self.keep_tuples.append((plan.entries, plan.groups))  # ids stay valid
        return found


@dataclass(frozen=True, slots=True)
class _Current:
    serial: int
    expires_at: datetime
    content: dict[str, str] | None  # None: not canonical, compare as changed


def read_current(cluster: str, data: bytes) -> _Current:
    """Serial, expiry and content blocks of a branch's set.yaml.

    Raises PublishError when the branch does not hold a readable set.
    """
    found = blocks(data)
    head = "".join(found.get(k, "") for k in ("serial", "expiresAt"))
    try:
        raw = yaml.load(head, Loader=SAFE_LOADER) or {}
    except yaml.YAMLError:
        raw = {}
    serial = raw.get("serial") if isinstance(raw, dict) else None
    expires = raw.get("expiresAt") if isinstance(raw, dict) else None
    expires_at = parse_time(expires) if isinstance(expires, str) else None
    if not isinstance(serial, int) or expires_at is None:
        # Not in the canonical form we write: read it the slow, validating way.
        try:
            old = load_set(data, origin=f"fleetlet/clusters/{cluster}:{SET_FILE}")
        except ValidationError as exc:
            raise PublishError(
                f"branch fleetlet/clusters/{cluster} holds an unreadable {SET_FILE} ({exc}); "
                "fix or delete the branch"
            ) from exc
        return _Current(serial=old.serial, expires_at=old.expires_at, content=None)
    return _Current(
        serial=serial,
        expires_at=expires_at,
        content={k: found[k] for k in CONTENT_KEYS if k in found},
    )


class ClusterChange(NamedTuple):
    """What the publication does to one cluster.

    ``shards`` are the shards whose branch gets the new commit (its own first, then those
    still holding its branch while it moves); ``parent`` the commit it follows (None: a new
    history, when a target shard does not hold the current tip); ``moving_since`` when its
    move began (empty when not moving). A tuple: one is made per cluster of the fleet.
    """

    cluster: str
    status: Status
    serial_before: int | None
    serial_after: int | None
    shards: tuple[int, ...] = ()
    parent: str | None = None
    moving_since: str = ""


@dataclass(frozen=True, slots=True)
class Deletion:
    """A cluster's branch left behind in ``shard`` by a finished move, at ``tip``."""

    cluster: str
    shard: int
    tip: str


_TODO: frozenset[Status] = frozenset(("added", "changed", "moved", "refreshed"))


class Decisions:
    """What the publication does to every cluster: the record of each cluster it acts on (or
    finds orphaned), and the names of the unchanged ones, whose records (a lookup of their
    facts each) are made only when asked for: at 100,000 clusters they are most of a diff.
    """

    def __init__(
        self,
        *,
        acted: list[ClusterChange],
        deletions: list[Deletion],
        unchanged: set[str],
        record: Callable[[str], ClusterChange],
    ) -> None:
        self.acted = acted  # by name, planned clusters first, then the orphaned
        self.deletions = deletions
        self.unchanged = unchanged
        self._record = record
        self._changes: list[ClusterChange] | None = None

    @property
    def todo(self) -> list[ClusterChange]:
        """The clusters that get a new commit, by name."""
        return [c for c in self.acted if c.status in _TODO]

    @property
    def changes(self) -> list[ClusterChange]:
        """Every cluster's record: the planned ones by name, then the orphaned."""
        if self._changes is None:
            by_name = {c.cluster: c for c in self.acted if c.status != "orphaned"}
            planned = sorted([*by_name, *self.unchanged])
            self._changes = [by_name.get(n) or self._record(n) for n in planned]
            self._changes += [c for c in self.acted if c.status == "orphaned"]
        return self._changes

    def count(self, *statuses: Status) -> int:
        acted = sum(1 for c in self.acted if c.status in statuses)
        return acted + (len(self.unchanged) if "unchanged" in statuses else 0)


def _fmt(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def decide(
    plans: Mapping[str, ClusterPlan],
    fleet_clusters: set[str],
    stores: Mapping[int, BranchStore],
    shard_map: ShardMap,
    *,
    now: datetime,
    refresh_before: timedelta,
    move_window: timedelta,
    cache: ContentCache,
    signed: bool,
) -> Decisions:
    """Compare every planned cluster with the branches the stores listed.

    Raises PublishError when a branch holds an unreadable set.
    """
    assignment = shard_map.assignment
    # Branches outside their cluster's shard (moves; clusters no longer in the fleet): rare.
    elsewhere: dict[str, list[int]] = {}
    for shard in sorted(stores):
        tips = stores[shard].tips
        # (the branches whose cluster is assigned another shard, without a loop per branch)
        homes_of = map(assignment.get, tips)
        for name in compress(tips, map(operator.ne, repeat(shard), homes_of)):
            elsewhere.setdefault(name, []).append(shard)
    # Times in the trailers' fixed format compare as strings: no parsing per cluster.
    refresh_at = _fmt(now + refresh_before)
    unchanged = _unchanged(plans, stores, refresh_at, signed, cache) - elsewhere.keys()
    acted: list[ClusterChange] = []
    deletions: list[Deletion] = []
    judged: dict[str, ClusterChange] = {}  # unchanged clusters the general case judged
    homes = {s: (s,) for s in stores}
    for name in sorted(plans.keys() - unchanged):
        plan = plans[name]
        home = assignment[name]
        shards = ([home] if name in stores[home].tips else []) + elsewhere.get(name, [])
        if not shards:
            acted.append(ClusterChange(name, "added", None, 1, homes[home]))
            continue
        held = {s: f for s in shards if (f := stores[s].facts(name)) is not None}
        change, gone = _decide_one(
            name, plan, home, held, stores, now, refresh_at, move_window, cache, signed
        )
        if change.status == "unchanged":
            unchanged.add(name)
            judged[name] = change
        else:
            acted.append(change)
        deletions += gone
    for name in sorted(elsewhere.keys() - fleet_clusters):
        acted.append(ClusterChange(name, "orphaned", None, None, tuple(elsewhere[name])))

    def record(name: str) -> ClusterChange:
        if name in judged:
            return judged[name]
        home = assignment[name]
        facts = stores[home].facts(name)
        assert facts is not None  # an unchanged cluster's facts were known for its tip
        return ClusterChange(name, "unchanged", facts.serial, facts.serial, homes[home], facts.tip)

    return Decisions(acted=acted, deletions=deletions, unchanged=unchanged, record=record)


def _unchanged(
    plans: Mapping[str, ClusterPlan],
    stores: Mapping[int, BranchStore],
    refresh_at: str,
    signed: bool,
    cache: ContentCache,
) -> set[str]:
    """The planned clusters whose branch holds a hub commit of their content, not moving, not
    expiring before ``refresh_at`` and signed if the publication is: each shape's clusters
    against the groups of branches with its digest, by set intersections (clusters of one
    shape share their plan's entries and groups objects)."""
    good: dict[str, list[AbstractSet[str]]] = {}
    for store in stores.values():
        for (digest, expires, was_signed, moving, usable), held in store.fact_groups().items():
            fresh = expires > refresh_at and not moving and (was_signed or not signed)
            if digest and usable and fresh:
                good.setdefault(digest, []).append(held)
    if not good:
        return set()
    out: set[str] = set()
    for shape in _shapes(plans):
        found = good.get(cache.digest(plans[shape[0]]))
        if found:
            members = set(shape)
            for group in found:
                out |= group & members
    return out


def _shapes(plans: Mapping[str, ClusterPlan]) -> list[list[str]]:
    """The names of each shape's clusters: from the planner when it grouped them
    (:class:`~hub.fleet.render.Plans`), else grouped here."""
    grouped = getattr(plans, "shapes", None)
    if grouped is not None:
        return list(grouped.values())
    by: dict[tuple[int, int], list[str]] = {}
    for name, plan in plans.items():
        by.setdefault((id(plan.entries), id(plan.groups)), []).append(name)
    return list(by.values())


def _decide_one(
    name: str,
    plan: ClusterPlan,
    home: int,
    held: Mapping[int, BranchFacts],
    stores: Mapping[int, BranchStore],
    now: datetime,
    refresh_at: str,
    move_window: timedelta,
    cache: ContentCache,
    signed: bool,
) -> tuple[ClusterChange, list[Deletion]]:
    """The general case: a branch not written by a hub, expiring, changed or moving."""
    # The branch the cluster's content is judged by: its own shard's, else the newest.
    source = home if home in held else max(held, key=lambda s: (held[s].serial, -s))
    facts = held[source]
    others = sorted(s for s in held if s != home)
    serial = max(f.serial for f in held.values())
    expiry = facts.expires_at
    if facts.digest and serial >= 0 and expiry:
        same = facts.digest == cache.digest(plan)
        unsigned = signed and not facts.signed
    else:
        # Not the hub's own commit (no trailers): read the set itself.
        data = stores[source].read_file(name, SET_FILE)
        if data is None:
            raise PublishError(
                f"branch fleetlet/clusters/{name} has no {SET_FILE} in {stores[source].url}; "
                "fix or delete the branch"
            )
        current = read_current(name, data)
        serial = max(serial, current.serial)
        expiry = _fmt(current.expires_at)
        same = current.content is not None and current.content == cache.content(plan)
        unsigned = signed and stores[source].read_file(name, BUNDLE_FILE) is None
    since = min((f.moving_since for f in held.values() if f.moving_since), default="")
    finished = bool(others) and bool(since) and _elapsed(since, now) >= move_window
    if others and not since:
        since = _fmt(now)  # the move begins with this publication
    tips = {f.tip for f in held.values()}
    status: Status
    if not same:
        status = "changed"
    elif others and (home not in held or len(tips) > 1) and not finished:
        status = "moved"
    elif unsigned or expiry <= refresh_at:
        status = "refreshed"
    elif not others and facts.moving_since:
        status = "refreshed"  # the move is over: its trailer goes with a new commit
    else:
        status = "unchanged"
    gone: list[Deletion] = []
    if finished:
        gone = [Deletion(name, s, held[s].tip) for s in others]
        others = []
    targets = (home, *others)
    if status == "unchanged":
        return ClusterChange(name, status, serial, serial, targets, facts.tip), gone
    # The same commit goes to every target shard: it follows the current tip only where every
    # target holds that tip; otherwise (a shard the cluster moves to) it starts a new history,
    # whose objects are all in the publication's pack.
    same_tip = all(s in held and held[s].tip == facts.tip for s in targets)
    change = ClusterChange(
        name,
        status,
        serial,
        serial + 1,
        targets,
        facts.tip if same_tip else None,
        since if others else "",
    )
    return change, gone


def _elapsed(since: str, now: datetime) -> timedelta:
    began = parse_time(since)
    return now - began if began is not None else timedelta(0)
