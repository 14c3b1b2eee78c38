"""The hub's runs: ``render``, ``diff`` and ``publish`` a fleet directory.

:func:`prepare` loads, resolves and plans (nothing touches git). :func:`publish` compares the
plans with the cluster branches (one fetch), picks the clusters whose content changed or whose
publication is about to expire, signs ONE publication for all of them, commits each branch
without a work tree and pushes every changed branch in ONE push. Anything failing before the
push leaves the git server untouched.

Change detection compares the ``bundleDeployments`` and ``groups`` blocks of each branch's
canonical ``set.yaml`` with the same blocks of the new set (built from a per-entry cache, so
10,000 clusters sharing 20 bundles cost 20 serialisations, not 200,000). Serial, times and
source are not content: a new fleet commit that changes nothing for a cluster republishes
nothing there.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml

from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    dump_set,
    dump_yaml,
    load_set,
    parse_time,
    set_digest,
    to_dict,
)
from agent.api.yamlio import SAFE_LOADER
from agent.errors import FieldProblem, ValidationError, VerificationError
from agent.verify import TrustPolicy, verify_publication
from agent.verify.merkle import MerkleTree, publication_leaf
from agent.verify.publication import (
    BUNDLE_FILE,
    PROOF_FILE,
    SET_FILE,
    STATEMENT_FILE,
    ClusterProof,
    PublicationStatement,
)
from hub.errors import FleetRepoError, PublishError
from hub.fleet.model import Fleet, load_fleet
from hub.fleet.render import ClusterPlan, Header, build_set, plan_clusters
from hub.fleet.source import FleetSource, fleet_source
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner, sign_publication
from hub.resolve import Resolver, ResolveSettings

Progress = Callable[[str], None]
Status = Literal["added", "changed", "refreshed", "unchanged", "orphaned"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A loaded, resolved and planned fleet."""

    fleet: Fleet
    source: FleetSource
    plans: Mapping[str, ClusterPlan]
    references: int
    timings: Mapping[str, float]


def prepare(
    fleet_dir: str | Path,
    *,
    only: Iterable[str] | None = None,
    resolve_settings: ResolveSettings | None = None,
    registry_credentials: Mapping[str, tuple[str, str]] | None = None,
    progress: Progress | None = None,
) -> Prepared:
    """Load ``fleet_dir``, pin every source its (selected) clusters use and plan every set.

    ``registry_credentials`` maps a registry host to (user, password) for tag resolution.

    Raises FleetRepoError (invalid fleet, unknown ``only`` cluster), ResolveError or
    SourceUnavailableError (a reference could not be pinned).
    """
    timings: dict[str, float] = {}
    started = time.perf_counter()
    fleet = load_fleet(fleet_dir)
    names = sorted(set(only)) if only is not None else None
    if names is not None:
        unknown = [n for n in names if fleet.cluster(n) is None]
        if unknown:
            raise FleetRepoError(
                [
                    FieldProblem(path="--cluster", expected="a cluster of the fleet", found=n)
                    for n in unknown
                ],
                origin=str(fleet.root),
            )
    source = fleet_source(fleet.root, fleet.files, repo_url=fleet.settings.repo)
    timings["load"] = time.perf_counter() - started
    started = time.perf_counter()
    bundles = list(fleet.bundles)
    if names is not None:
        # Only what the selected clusters receive needs pinning.
        selected = [c for c in fleet.clusters if c.name in names]
        bundles = [b for b in bundles if any(t.matches(c) for c in selected for t in b.targets)]
    settings = resolve_settings or ResolveSettings(
        insecure_registries=fleet.settings.insecure_registries,
        registry_credentials=registry_credentials,
    )

    def resolve_progress(done: int, total: int, what: str) -> None:
        if progress is not None and (done == total or done % 25 == 0):
            progress(f"resolved {done}/{total} references")

    with Resolver(settings=settings, progress=resolve_progress) as resolver:
        pins = resolver.resolve_bundles(bundles)
    timings["resolve"] = time.perf_counter() - started
    started = time.perf_counter()
    plans = plan_clusters(fleet, pins, only=names)
    timings["plan"] = time.perf_counter() - started
    return Prepared(fleet=fleet, source=source, plans=plans, references=len(pins), timings=timings)


# --- render ---------------------------------------------------------------------------------


def render(prepared: Prepared, out: Path, *, issued_at: datetime | None = None) -> list[Path]:
    """Write ``<cluster>.yaml`` (canonical set.yaml, serial 1, unsigned) for every plan.

    ``issued_at`` defaults to the fleet commit's time, so the same commit renders the same
    bytes. Raises PublishError if ``out`` cannot be written.
    """
    issued = issued_at or prepared.source.time
    header = Header(
        serial=1,
        issued_at=issued,
        expires_at=issued + prepared.fleet.settings.expires_after,
        source_repo=prepared.source.repo,
        source_commit=prepared.source.commit,
    )
    written: list[Path] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in sorted(prepared.plans):
            path = out / f"{name}.yaml"
            path.write_bytes(dump_set(build_set(prepared.plans[name], header)))
            written.append(path)
    except OSError as exc:
        raise PublishError(f"cannot write rendered sets to {out}: {exc}") from exc
    return written


# --- comparing with the branches -----------------------------------------------------------


_CONTENT_KEYS = ("bundleDeployments", "groups")


def _blocks(data: bytes) -> dict[str, str]:
    """Top-level blocks of a canonical set.yaml: key -> its lines (key line included)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in data.decode("utf-8", "replace").splitlines(keepends=True):
        if line[:1] not in (" ", "-", "") and ":" in line:
            key = line.split(":", 1)[0]
            current = blocks.setdefault(key, [])
        if current is not None:
            current.append(line)
    return {k: "".join(v) for k, v in blocks.items()}


@dataclass(slots=True)
class _ContentCache:
    """Canonical YAML of entries, computed once per shared entry object."""

    fragments: dict[int, str] = field(default_factory=dict)
    keep: list[BundleDeploymentEntry] = field(default_factory=list)
    digests: dict[tuple[int, tuple[str, ...]], str] = field(default_factory=dict)
    keep_tuples: list[tuple[BundleDeploymentEntry, ...]] = field(default_factory=list)

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
        """sha256 of the content blocks: what the commit trailer records.

        Clusters of the same shape share their entries tuple: one digest per shape.
        """
        key = (id(plan.entries), plan.groups)
        found = self.digests.get(key)
        if found is None:
            content = self.content(plan)
            text = "".join(content[k] for k in _CONTENT_KEYS if k in content)
            found = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
            self.digests[key] = found
            self.keep_tuples.append(plan.entries)
        return found


_TRAILER = re.compile(r"^([A-Z][A-Za-z-]*): (\S+)$", re.MULTILINE)


def _trailers(message: str) -> dict[str, str]:
    return dict(_TRAILER.findall(message))


@dataclass(frozen=True, slots=True)
class _Current:
    serial: int
    expires_at: datetime
    content: dict[str, str] | None  # None: not canonical, compare as changed


def _current(cluster: str, data: bytes) -> _Current:
    """Serial, expiry and content blocks of a branch's set.yaml.

    Raises PublishError when the branch does not hold a readable set.
    """
    blocks = _blocks(data)
    head = "".join(blocks.get(k, "") for k in ("serial", "expiresAt"))
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
        content={k: blocks[k] for k in _CONTENT_KEYS if k in blocks},
    )


@dataclass(frozen=True, slots=True)
class ClusterChange:
    cluster: str
    status: Status
    serial_before: int | None
    serial_after: int | None


def _decide(
    prepared: Prepared,
    store: BranchStore,
    *,
    now: datetime,
    refresh_before: timedelta,
    cache: _ContentCache,
    signed: bool,
) -> list[ClusterChange]:
    changes: list[ClusterChange] = []
    for name in sorted(prepared.plans):
        if name not in store.tips:
            changes.append(ClusterChange(name, "added", None, 1))
            continue
        # Fast path: the trailers of our own last commit say what the branch holds, so an
        # unchanged cluster costs one small commit read, not a set.yaml parse.
        trailers = _trailers(store.message(name) or "")
        digest = cache.digest(prepared.plans[name])
        if (
            trailers.get("Content-Digest") == digest
            and trailers.get("Serial", "").isdigit()
            and (expiry := parse_time(trailers.get("Expires-At", ""))) is not None
            and expiry - now > refresh_before
            and not (signed and trailers.get("Signed") != "true")
        ):
            serial = int(trailers["Serial"])
            changes.append(ClusterChange(name, "unchanged", serial, serial))
            continue
        data = store.read_file(name, SET_FILE)
        if data is None:
            raise PublishError(
                f"branch fleetlet/clusters/{name} has no {SET_FILE}; fix or delete the branch"
            )
        current = _current(name, data)
        if current.content is not None and current.content == cache.content(prepared.plans[name]):
            # An unsigned branch (an earlier --no-sign) is re-signed when signing is on.
            unsigned = signed and store.read_file(name, BUNDLE_FILE) is None
            if unsigned or current.expires_at - now <= refresh_before:
                status: Status = "refreshed"
            else:
                changes.append(ClusterChange(name, "unchanged", current.serial, current.serial))
                continue
        else:
            status = "changed"
        changes.append(ClusterChange(name, status, current.serial, current.serial + 1))
    for name in sorted(set(store.tips) - {c.name for c in prepared.fleet.clusters}):
        changes.append(ClusterChange(name, "orphaned", None, None))
    return changes


# --- publish -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishReport:
    changes: tuple[ClusterChange, ...]
    pushed: tuple[str, ...]
    signed: bool
    issued_at: datetime | None
    expires_at: datetime | None
    statement_sha256: str | None
    timings: Mapping[str, float]

    def count(self, *statuses: Status) -> int:
        return sum(1 for c in self.changes if c.status in statuses)

    def to_dict(self, *, bundles: int, references: int) -> dict[str, Any]:
        return {
            "clusters": {
                s: self.count(s) for s in ("added", "changed", "refreshed", "unchanged", "orphaned")
            },
            "bundles": bundles,
            "references": references,
            "pushed": list(self.pushed),
            "signed": self.signed,
            "issuedAt": _fmt(self.issued_at),
            "expiresAt": _fmt(self.expires_at),
            "statementSha256": self.statement_sha256,
            "changes": [
                {
                    "cluster": c.cluster,
                    "status": c.status,
                    "serialBefore": c.serial_before,
                    "serialAfter": c.serial_after,
                }
                for c in self.changes
                if c.status != "unchanged"
            ],
            "seconds": {k: round(v, 3) for k, v in self.timings.items()},
        }


def _fmt(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


def publish(
    prepared: Prepared,
    store: BranchStore,
    *,
    signer: PublicationSigner | None,
    now: datetime | None = None,
    progress: Progress | None = None,
    check: TrustPolicy | None = None,
) -> PublishReport:
    """Publish every changed or expiring cluster of ``prepared`` to ``store`` in one push.

    ``signer`` None publishes WITHOUT a Sigstore bundle (agents refuse it; experiments only).
    ``check`` (the trust policy agents use) verifies one branch of the new publication with
    ``verify_publication`` before anything is pushed, so a signer that agents would refuse
    (wrong identity or issuer, foreign root) stops the run with PublishError.
    Raises GitTransportError (fetch or push failed, nothing pushed), PushRejectedError (some
    branches refused: rerun), PublishError, or the signing errors of ``sign_publication``;
    nothing is pushed when anything fails before the push.
    """
    timings = dict(prepared.timings)
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    settings = prepared.fleet.settings
    say = progress or (lambda _msg: None)

    started = time.perf_counter()
    say(f"fetching cluster branches from {store.url}")
    store.fetch()
    timings["fetch"] = time.perf_counter() - started

    started = time.perf_counter()
    cache = _ContentCache()
    changes = _decide(
        prepared,
        store,
        now=now,
        refresh_before=settings.refresh_before,
        cache=cache,
        signed=signer is not None,
    )
    timings["compare"] = time.perf_counter() - started
    todo = [c for c in changes if c.status in ("added", "changed", "refreshed")]
    if not todo:
        return PublishReport(
            changes=tuple(changes),
            pushed=(),
            signed=signer is not None,
            issued_at=None,
            expires_at=None,
            statement_sha256=None,
            timings=timings,
        )

    started = time.perf_counter()
    expires = now + settings.expires_after
    sets: list[BundleDeploymentSet] = []
    for c in todo:
        assert c.serial_after is not None
        header = Header(
            serial=c.serial_after,
            issued_at=now,
            expires_at=expires,
            source_repo=prepared.source.repo,
            source_commit=prepared.source.commit,
        )
        sets.append(build_set(prepared.plans[c.cluster], header))
    timings["render"] = time.perf_counter() - started

    started = time.perf_counter()
    say(f"signing one publication for {len(sets)} clusters")
    if signer is not None:
        publication = sign_publication(
            sets=sets,
            signer=signer,
            issued_at=now,
            expires_at=expires,
            source_repo=prepared.source.repo,
            source_commit=prepared.source.commit,
        )
        files = {name: part.files for name, part in publication.clusters.items()}
        statement_bytes = publication.statement_bytes
    else:
        files, statement_bytes = _unsigned(sets, now, expires, prepared.source)
    if check is not None and signer is not None:
        first = todo[0]
        try:
            verify_publication(
                files=files[first.cluster],
                cluster=first.cluster,
                last_serial=first.serial_before,
                trust=check,
                now=now,
            )
        except VerificationError as exc:
            raise PublishError(
                f"the new publication would be refused by agents ({exc.reason}): {exc}; "
                "nothing was pushed"
            ) from exc
    timings["sign"] = time.perf_counter() - started

    started = time.perf_counter()
    say(f"committing {len(todo)} cluster branches")
    for c in todo:
        # Trailers let the next run skip unchanged clusters cheaply (see _decide); the set
        # itself stays the only thing agents trust.
        message = (
            f"fleetlet: {c.status} {c.cluster}, serial {c.serial_after}\n\n"
            f"Source: {prepared.source.repo}@{prepared.source.commit}\n"
            f"Serial: {c.serial_after}\n"
            f"Expires-At: {_fmt(expires)}\n"
            f"Content-Digest: {cache.digest(prepared.plans[c.cluster])}\n"
            f"Signed: {'true' if signer is not None else 'false'}\n"
        )
        store.commit(c.cluster, files[c.cluster], message=message, when=now)
    timings["commit"] = time.perf_counter() - started

    started = time.perf_counter()
    say(f"pushing {len(todo)} branches in one push")
    result = store.push([c.cluster for c in todo])
    timings["push"] = time.perf_counter() - started
    return PublishReport(
        changes=tuple(changes),
        pushed=result.pushed,
        signed=signer is not None,
        issued_at=now,
        expires_at=expires,
        statement_sha256=hashlib.sha256(statement_bytes).hexdigest(),
        timings=timings,
    )


def _unsigned(
    sets: list[BundleDeploymentSet], issued: datetime, expires: datetime, source: FleetSource
) -> tuple[dict[str, Mapping[str, bytes]], bytes]:
    """The branch files of a publication WITHOUT its Sigstore bundle (``--no-sign``)."""
    ordered = sorted(sets, key=lambda s: s.cluster)
    digests = [set_digest(s) for s in ordered]
    tree = MerkleTree(
        [
            publication_leaf(cluster=s.cluster, serial=s.serial, set_digest=d)
            for s, d in zip(ordered, digests, strict=True)
        ]
    )
    statement = PublicationStatement(
        merkle_root=tree.root,
        tree_size=tree.size,
        issued_at=issued,
        expires_at=expires,
        source_repo=source.repo,
        source_commit=source.commit,
        serial_min=min(s.serial for s in ordered),
        serial_max=max(s.serial for s in ordered),
    )
    statement_bytes = statement.to_bytes()
    out: dict[str, Mapping[str, bytes]] = {}
    for index, s in enumerate(ordered):
        proof = ClusterProof(
            cluster=s.cluster,
            leaf_index=index,
            tree_size=tree.size,
            hashes=tuple(tree.inclusion_proof(index)),
        )
        out[s.cluster] = {
            SET_FILE: dump_set(s),
            STATEMENT_FILE: statement_bytes,
            PROOF_FILE: proof.to_bytes(),
        }
    return out, statement_bytes


# --- diff ----------------------------------------------------------------------------------


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


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for k in sorted(value):
            _flatten(value[k], f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list | tuple) and value:
        for i, v in enumerate(value):
            _flatten(v, f"{path}[{i}]", out)
    else:
        out[path] = value


def _entry_fields(before: BundleDeploymentEntry, after: BundleDeploymentEntry) -> list[Any]:
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    _flatten(to_dict(before.spec), "", old)
    _flatten(to_dict(after.spec), "", new)
    return [
        (p, old.get(p), new.get(p)) for p in sorted(set(old) | set(new)) if old.get(p) != new.get(p)
    ]


def diff(
    prepared: Prepared, store: BranchStore, *, now: datetime | None = None
) -> list[ClusterDiff]:
    """What ``publish`` would do to each planned cluster, bundle by bundle (no push).

    Raises GitTransportError if the branches cannot be fetched, PublishError if a branch holds
    an unreadable set.
    """
    now = now or datetime.now(UTC)
    store.fetch()
    cache = _ContentCache()
    decisions = {
        c.cluster: c
        for c in _decide(
            prepared,
            store,
            now=now,
            refresh_before=prepared.fleet.settings.refresh_before,
            cache=cache,
            signed=False,
        )
    }
    out: list[ClusterDiff] = []
    for name in sorted(decisions):
        decision = decisions[name]
        plan = prepared.plans.get(name)
        old_entries: dict[str, BundleDeploymentEntry] = {}
        old_groups: tuple[str, ...] = ()
        data = store.read_file(name, SET_FILE)
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
                    fields = _entry_fields(old_entries[bname], new_entries[bname])
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


__all__ = [
    "BundleDiff",
    "ClusterChange",
    "ClusterDiff",
    "Prepared",
    "PublishReport",
    "diff",
    "prepare",
    "publish",
    "render",
]
