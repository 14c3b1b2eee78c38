"""The fleet as the agents report it: every ``fleetlet/status/<cluster>`` branch, aggregated.

Status branches may be spread over several repositories (the fleet's shards).
:class:`FleetStatus` lists each with ONE ref listing, fetches only the branches whose tip moved
since the last refresh (one fetch per shard, the shards in parallel), and reads each moved
branch's ``status.json`` straight from the object database (no work tree, no checkout).

The view keeps a compact summary per cluster (heartbeat, sequence, the state of each
installation; or the error its document had), not the documents: 100,000 documents of a few
KB would be gigabytes of Python objects. A document is read again from the local cache
repository, on demand, for the pages that show one cluster (a small cache keeps the recent
ones). The summaries also live in an SQLite file beside the cache repositories, so a restarted
hub starts warm in about a second and fetches nothing that did not move.

A cluster whose status is in several shards (it moved from one to another) is shown as its
newest document says (heartbeat, then sequence, then the lower shard): every replica of the
hub reading the same shards gives the same answers.

Staleness is computed when the view is read, against the clock, never stored: a cluster quiet
for longer than ``stale_after`` is ``Stale`` and so are its installations.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import sqlite3
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pygit2

from agent.api.reasons import FAILED, ROLLED_BACK, RUNNING, SUCCEEDED
from agent.api.status import MAX_LOAD_BYTES
from agent.errors import PermanentError
from hub.errors import GitTransportError
from hub.publish.pack import PackWriter
from hub.status import fetch as fetch_v2

STATUS_PREFIX = "refs/heads/fleetlet/status/"
STATUS_FILE = "status.json"
_TRACK_PREFIX = "refs/fleetlet/status/"
_VIEW_FILE = "view.sqlite"
_VIEW_FORMAT = 3  # 3: each installation's applied and newest-run serials
_EXPLICIT_REFSPECS = 64
_DOCUMENTS_KEPT = 256
_PARALLEL = 8

STATES = (
    "Ready",
    "Progressing",
    "AwaitingApproval",
    "Denied",
    "Degraded",
    "RolledBack",
    "Paused",
    "Stale",
)

_loads: Callable[[bytes], Any] = json.loads
try:  # 4x faster than the standard library on status documents, when installed
    from orjson import loads as _orjson_loads

    _loads = _orjson_loads
except ImportError:  # pragma: no cover - depends on the installation
    pass


class StatusCacheError(PermanentError):
    """The hub's status cache directory cannot be created, opened or written."""


class StatusDocumentError(ValueError):
    """A status document that cannot be used (not JSON, wrong kind, missing fields)."""


def parse_status(data: bytes, *, origin: str) -> dict[str, Any]:
    """Parse and check the fields the hub relies on; return the document as a dict.

    Raises StatusDocumentError naming ``origin`` and the first problem. Not the agent's full
    schema check (``agent.api.status.load_status``): that costs about 2.5 ms for a 7 KB
    document, 25 s for 10,000 clusters, against 0.1 ms here; and the hub needs only these
    fields, so a field it does not read never hides a whole cluster.
    """
    if len(data) > MAX_LOAD_BYTES:
        raise StatusDocumentError(f"{origin}: {len(data)} bytes, more than {MAX_LOAD_BYTES}")
    try:
        doc = _loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StatusDocumentError(f"{origin}: not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise StatusDocumentError(f"{origin}: expected an object, got {type(doc).__name__}")
    if doc.get("kind") != "ClusterStatus":
        raise StatusDocumentError(
            f"{origin}: kind: expected ClusterStatus, got {doc.get('kind')!r}"
        )
    for key, kind in (("cluster", str), ("heartbeat", str), ("sequence", int), ("bundles", dict)):
        if not isinstance(doc.get(key), kind) or isinstance(doc.get(key), bool):
            raise StatusDocumentError(
                f"{origin}: {key}: expected {kind.__name__}, got {doc.get(key)!r:.80}"
            )
    parse_time(doc["heartbeat"], origin=f"{origin}: heartbeat")
    for name, bundle in doc["bundles"].items():
        if not isinstance(bundle, dict):
            raise StatusDocumentError(f"{origin}: bundles.{name}: expected an object")
        for key in ("conditions", "runs"):
            if not isinstance(bundle.get(key, []), list):
                raise StatusDocumentError(f"{origin}: bundles.{name}.{key}: expected a list")
        for i, run in enumerate(bundle.get("runs", [])):
            if not isinstance(run, dict) or not isinstance(run.get("id"), str):
                raise StatusDocumentError(f"{origin}: bundles.{name}.runs[{i}]: expected an id")
            if not isinstance(run.get("outputs", {}), dict):
                raise StatusDocumentError(
                    f"{origin}: bundles.{name}.runs[{i}].outputs: expected an object"
                )
    return doc


def parse_time(text: str, *, origin: str) -> datetime:
    """An RFC 3339 UTC time. Raises StatusDocumentError."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, AttributeError) as exc:
        raise StatusDocumentError(f"{origin}: not an RFC 3339 time: {text!r:.60}") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class ClusterView:
    """One cluster as its status branch in one shard last said, in compact form.

    ``states`` is (bundle, state) per installation, the state as the document says it (Stale
    is the clock's, applied when read). ``source`` is the commit the summary was read from
    (None: never a good document); ``error`` why the tip's document was not used.
    """

    name: str
    shard: int
    tip: str
    source: str | None = None
    error: str | None = None
    heartbeat: str | None = None
    sequence: int | None = None
    agent_version: str | None = None
    last_accepted_serial: int | None = None
    last_refusal: Any = None
    states: tuple[tuple[str, str], ...] = ()
    serials: bytes = b""
    """Per item of ``states``: the serial of its applied revision and of its newest run (0:
    none), packed as unsigned 64-bit pairs (a few bytes per installation, at 100,000 clusters)."""
    beat: datetime | None = field(default=None, compare=False)  # the heartbeat, parsed

    def __post_init__(self) -> None:
        # Parsed once: staleness is asked of every cluster on every pass over the fleet.
        self.beat = parse_time(self.heartbeat, origin=self.name) if self.heartbeat else None

    def stale(self, now: datetime, stale_after: timedelta) -> bool:
        beat = self.beat
        return beat is None or now - beat > stale_after

    def revisions(self) -> dict[str, tuple[str, int, int]]:
        """Bundle -> (state as reported, applied serial, newest run's serial); 0 for none."""
        count = len(self.states)
        pairs = (
            struct.unpack(f"<{2 * count}Q", self.serials) if len(self.serials) == 16 * count else ()
        )
        return {
            bundle: (state, pairs[2 * i] if pairs else 0, pairs[2 * i + 1] if pairs else 0)
            for i, (bundle, state) in enumerate(self.states)
        }

    def rank(self) -> tuple[str, int, int]:
        """Which of a cluster's views (one per shard holding its status) is shown: newest."""
        return (self.heartbeat or "", self.sequence or 0, -self.shard)

    def summarised(self, doc: Mapping[str, Any], commit: str) -> ClusterView:
        items = sorted(doc["bundles"].items())
        accepted = doc.get("lastAcceptedSerial")
        states = tuple(
            (sys.intern(name), sys.intern(installation_state(item, stale=False, accepted=accepted)))
            for name, item in items
        )
        serials = struct.pack(
            f"<{2 * len(items)}Q", *(n for _, item in items for n in _serials(item))
        )
        version = doc.get("agentVersion")
        return ClusterView(
            name=self.name,
            shard=self.shard,
            tip=self.tip,
            source=commit,
            error=None,
            heartbeat=doc["heartbeat"],
            sequence=doc["sequence"],
            agent_version=sys.intern(version) if isinstance(version, str) else None,
            last_accepted_serial=doc.get("lastAcceptedSerial"),
            last_refusal=doc.get("lastRefusal"),
            states=states,
            serials=serials,
        )

    def row(self) -> tuple[int, str, str, str | None, str | None, str]:
        data = {
            "h": self.heartbeat,
            "s": self.sequence,
            "v": self.agent_version,
            "a": self.last_accepted_serial,
            "r": self.last_refusal,
            "b": self.states,
            "n": self.serials.hex(),
        }
        return (self.shard, self.name, self.tip, self.source, self.error, json.dumps(data))

    @classmethod
    def of_row(cls, row: Sequence[Any]) -> ClusterView:
        shard, name, tip, source, error, blob = row
        data = json.loads(blob)
        return cls(
            name=name,
            shard=shard,
            tip=tip,
            source=source,
            error=error,
            heartbeat=data["h"],
            sequence=data["s"],
            agent_version=sys.intern(data["v"]) if data["v"] else None,
            last_accepted_serial=data["a"],
            last_refusal=data["r"],
            states=tuple((sys.intern(b), sys.intern(st)) for b, st in data["b"]),
            serials=bytes.fromhex(data["n"]),
        )


_MAX_SERIAL = 2**53 - 1


def _serials(item: Mapping[str, Any]) -> tuple[int, int]:
    """(applied revision's serial, newest run's serial) of an installation; 0 for none."""
    applied = item.get("appliedRevision")
    runs = item.get("runs") or []
    first = applied.get("serial") if isinstance(applied, dict) else None
    last = runs[0].get("serial") if runs and isinstance(runs[0], dict) else None
    return tuple(  # type: ignore[return-value]
        v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_SERIAL else 0
        for v in (first, last)
    )


@dataclass(slots=True)
class RefreshResult:
    """What one refresh did: branches listed, moved (fetched), removed, and seconds spent."""

    listed: int
    moved: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def installation_state(
    bundle: Mapping[str, Any], *, stale: bool, accepted: int | None = None
) -> str:
    """The one-word state of an installation, from its conditions and its newest run.

    Stale beats everything (an old report says nothing about now); then Paused,
    AwaitingApproval and Denied (Ready says so: the group's move waits for, or was refused,
    an approval), Progressing (a run in progress or Progressing=True), RolledBack (the newest
    run was rolled back, or Ready says RolledBack), Degraded (Degraded=True, Ready=False or
    the newest run failed), Ready.

    A rolled back run is history, not the state, once the agent accepted a newer set
    (``accepted``: the document's ``lastAcceptedSerial``) and says Ready (Healthy): that set's
    target is the revision it runs (a rollout reverted the failed one, or a fix equals it);
    a set still wanting the failed revision keeps Ready False with reason RolledBack.
    """
    if stale:
        return "Stale"
    # The document comes from a branch anyone with push access writes: read it defensively.
    listed = bundle.get("conditions")
    conditions = {
        c["type"]: c
        for c in (listed if isinstance(listed, list) else [])
        if isinstance(c, dict) and isinstance(c.get("type"), str)
    }

    def true(kind: str) -> bool:
        return str(conditions.get(kind, {}).get("status")) == "True"

    runs = bundle.get("runs")
    runs = runs if isinstance(runs, list) else []
    last = runs[0].get("result") if runs and isinstance(runs[0], dict) else None
    ready = conditions.get("Ready", {})
    if true("Paused") or ready.get("reason") == "Paused":
        return "Paused"
    if ready.get("reason") in ("AwaitingApproval", "Denied"):
        return str(ready["reason"])
    if last == RUNNING or true("Progressing"):
        return "Progressing"
    run_serial = runs[0].get("serial") if runs and isinstance(runs[0], dict) else None
    past = (
        last == ROLLED_BACK
        and true("Ready")
        and ready.get("reason") == "Healthy"
        and isinstance(accepted, int)
        and isinstance(run_serial, int)
        and accepted > run_serial
    )
    if (last == ROLLED_BACK and not past) or ready.get("reason") == "RolledBack":
        # Also after a later drift-correction run: the failed serial is still not applied.
        return "RolledBack"
    if true("Degraded") or str(ready.get("status")) == "False" or last == FAILED:
        return "Degraded"
    if true("Ready"):
        return "Ready"
    return "Progressing"


class _Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    def __init__(self, credentials: tuple[str, str] | None) -> None:
        super().__init__()
        self._creds = credentials

    def credentials(self, url: str, username_from_url: str | None, allowed_types: Any) -> Any:
        if self._creds is None:
            raise pygit2.Passthrough
        return pygit2.UserPass(*self._creds)


class _Shard:
    """One status repository and its local bare cache repository."""

    def __init__(self, index: int, url: str, path: Path) -> None:
        self.index = index
        self.url = url
        self.path = path
        try:
            if (path / "HEAD").is_file():
                self.repo = pygit2.Repository(str(path))
            else:
                path.mkdir(parents=True, exist_ok=True)
                self.repo = pygit2.init_repository(str(path), bare=True)
        except (pygit2.GitError, OSError) as exc:
            raise StatusCacheError(f"hub status cache {path}: {exc}") from exc
        self.odb = self.repo.odb
        self.v2 = True  # the server speaks protocol v2 (until it shows it does not)

    def refresh(
        self, known: Mapping[str, ClusterView], credentials: tuple[str, str] | None
    ) -> tuple[dict[str, str], dict[str, ClusterView]]:
        """(every branch's tip, the views of the moved ones). Raises GitTransportError.

        A shard the hub knows goes through protocol v2 when the server speaks it
        (:mod:`hub.status.fetch`: the moved tips only); a cold one, or a v0-only server,
        through libgit2.
        """
        tips = None
        if known and self.v2 and fetch_v2.supported(self.url):
            try:
                tips = self.list_and_fetch_v2(known, credentials)
            except fetch_v2.NotProtocolV2:
                self.v2 = False
            except GitTransportError:
                # v2 commands are separate requests: a branch that moved between the listing
                # and the fetch is "not our ref" any more. libgit2 lists and fetches in one.
                tips = None
        if tips is None:
            tips = self.list_and_fetch({n: v.tip for n, v in known.items()}, credentials)
        moved = [c for c, tip in tips.items() if (v := known.get(c)) is None or v.tip != tip]
        with _no_gc():
            return tips, {c: self.read(c, tips[c], known.get(c)) for c in moved}

    def list_and_fetch_v2(
        self, known: Mapping[str, ClusterView], credentials: tuple[str, str] | None
    ) -> dict[str, str]:
        """Protocol v2: list, then fetch the moved tips against their previous ones (one
        connection over git://). Raises GitTransportError, NotProtocolV2."""
        with fetch_v2.Session(self.url, credentials=credentials) as session:
            tips = session.refs(STATUS_PREFIX)
            moved = [
                c
                for c, tip in tips.items()
                if (v := known.get(c)) is None
                or (v.tip != tip and pygit2.Oid(hex=tip) not in self.repo)
            ]
            if not moved:
                return tips
            haves = sorted({known[c].tip for c in moved if c in known})
            objects = session.fetch(sorted({tips[c] for c in moved}), haves)
        pack = PackWriter()
        for kind, data in objects:
            pack.add(kind, data)
        try:
            pack.write(Path(self.repo.path))
        except OSError as exc:
            raise StatusCacheError(f"hub status cache {self.repo.path}: {exc}") from exc
        return tips

    def list_and_fetch(
        self, known: Mapping[str, str], credentials: tuple[str, str] | None
    ) -> dict[str, str]:
        """Every status branch's tip (one listing); the moved ones' objects fetched.

        Raises GitTransportError.
        """
        remote = self.repo.remotes.create_anonymous(self.url)
        try:
            heads = remote.list_heads(callbacks=_Callbacks(credentials))
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(
                f"cannot list status branches of {self.url}: {_first_line(exc)}"
            ) from exc
        tips: dict[str, str] = {}
        cut = len(STATUS_PREFIX)
        for head in heads:
            name = str(head.name)
            oid = getattr(head, "oid", None)
            if name.startswith(STATUS_PREFIX) and oid is not None:
                tips[name[cut:]] = str(oid)
        missing = [
            c
            for c, tip in tips.items()
            if known.get(c) != tip and pygit2.Oid(hex=tip) not in self.repo
        ]
        if missing:
            # One fetch. Either way the client wants only the tips it lacks and offers the
            # ones it has, so the server sends the moved branches' new objects and nothing
            # else. A few moved branches get one refspec each; beyond that one wildcard:
            # libgit2 matches every refspec against every advertised ref.
            if len(missing) <= _EXPLICIT_REFSPECS:
                specs = [f"+{STATUS_PREFIX}{c}:{_TRACK_PREFIX}{c}" for c in sorted(missing)]
            else:
                specs = [f"+{STATUS_PREFIX}*:{_TRACK_PREFIX}*"]
            try:
                remote.fetch(specs, callbacks=_Callbacks(credentials))
            except (pygit2.GitError, OSError) as exc:
                raise GitTransportError(
                    f"git fetch of status branches from {self.url} failed: {_first_line(exc)}"
                ) from exc
        return tips

    def document(self, cluster: str, commit_id: str) -> dict[str, Any]:
        """The checked document in ``commit_id`` of ``cluster``'s branch, read from the odb.

        Raises StatusDocumentError (missing file, bad document, another cluster's) or
        pygit2.GitError / KeyError (object missing locally).
        """
        origin = f"{STATUS_PREFIX}{cluster}:{STATUS_FILE}"
        # Raw reads from the object database: no Python object per commit and tree.
        kind, commit = self.odb.read(commit_id)[:2]
        if kind != pygit2.enums.ObjectType.COMMIT or not commit.startswith(b"tree "):
            raise StatusDocumentError(f"{origin}: the branch tip is not a commit")
        kind, tree = self.odb.read(commit[5:45].decode())[:2]
        entry = _tree_entry(tree, STATUS_FILE.encode())
        if entry is None:
            raise StatusDocumentError(f"{origin}: no such file on the branch")
        kind, data = self.odb.read(entry.hex())[:2]
        if kind != pygit2.enums.ObjectType.BLOB:
            raise StatusDocumentError(f"{origin}: {STATUS_FILE} is not a file")
        doc = parse_status(data, origin=origin)
        if doc["cluster"] != cluster:
            raise StatusDocumentError(
                f"{origin}: cluster: expected {cluster!r}, got {doc['cluster']!r}"
            )
        return doc

    def read(self, cluster: str, tip: str, known: ClusterView | None) -> ClusterView:
        """The view of one moved branch; a bad document gives a view with ``error`` set (and
        the last good summary, if any)."""
        base = ClusterView(name=cluster, shard=self.index, tip=tip)
        if known is not None:
            base = replace(known, tip=tip, error=None)
        try:
            doc = self.document(cluster, tip)
        except (pygit2.GitError, KeyError, ValueError) as exc:
            # StatusDocumentError is a ValueError; so is a malformed object id.
            return replace(base, error=str(exc))
        if known is not None and known.sequence is not None and doc["sequence"] < known.sequence:
            # Newer always wins: a branch reset to an older document does not roll it back.
            return replace(
                base,
                error=f"{STATUS_PREFIX}{cluster}: sequence {doc['sequence']} is older than "
                f"{known.sequence}; kept the newer document",
            )
        return base.summarised(doc, tip)


def _tree_entry(tree: bytes, name: bytes) -> bytes | None:
    """The object id of regular file ``name`` in a raw tree (``<mode> <name>NUL<20 bytes>``
    entries), or None."""
    at = 0
    while at < len(tree):
        space = tree.index(b" ", at)
        nul = tree.index(b"\0", space)
        if tree[space + 1 : nul] == name:
            return tree[nul + 1 : nul + 21] if tree[at:space] in (b"100644", b"100755") else None
        at = nul + 21
    return None


def _cold_refresh(
    index: int, url: str, path: Path, credentials: tuple[str, str] | None
) -> tuple[dict[str, str], dict[str, ClusterView]] | str:
    """:meth:`_Shard.refresh` of a shard known nothing of, in a worker process; the error
    message instead of raising (exceptions of our own do not always cross processes)."""
    try:
        return _Shard(index, url, path).refresh({}, credentials)
    except (GitTransportError, StatusCacheError) as exc:
        return str(exc)


class FleetStatus:
    """The aggregated status of every cluster that pushes to ``repo_url``.

    ``repo_url`` is one status repository or the list of the fleet's status shards.
    ``credentials`` (user, password) serve smart-HTTP basic auth; ``cache_dir`` holds the bare
    cache repositories and the saved view (created if missing). Thread-safe: :meth:`refresh`
    swaps the view under a lock, readers get consistent snapshots. Raises StatusCacheError
    when the cache cannot be opened.
    """

    def __init__(
        self,
        *,
        repo_url: str | Sequence[str],
        credentials: tuple[str, str] | None = None,
        cache_dir: Path,
        stale_after: timedelta = timedelta(minutes=5),
    ) -> None:
        urls = [repo_url] if isinstance(repo_url, str) else list(repo_url)
        if not urls:
            raise StatusCacheError("no status repository given")
        self.repo_urls = urls
        self.repo_url = urls[0]
        self.credentials = credentials
        self.cache_dir = Path(cache_dir)
        self.stale_after = stale_after
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._shards = [
            _Shard(i, url, self.cache_dir / ("status.git" if i == 0 else f"status-{i}.git"))
            for i, url in enumerate(urls)
        ]
        self.repo = self._shards[0].repo
        self._views: list[dict[str, ClusterView]] = [{} for _ in urls]  # per shard
        self._clusters: dict[str, ClusterView] = {}  # the shown view of each cluster
        self._documents: OrderedDict[tuple[int, str], dict[str, Any]] = OrderedDict()
        self.last_refresh: datetime | None = None
        self.version = 0  # grows whenever the view changes
        self._load_view()

    # --- refresh -------------------------------------------------------------------------

    def refresh(self) -> RefreshResult:
        """List the status branches of every shard, fetch those that moved, summarise their
        documents.

        Raises GitTransportError if a server cannot be listed or fetched; the view then
        stays as it was (clusters grow stale by the clock, not by an error).
        """
        started = datetime.now(UTC)
        with self._refresh_lock:
            with self._lock:
                known = [{n: v.tip for n, v in views.items()} for views in self._views]

            results = self._refresh_shards()
            result = RefreshResult(listed=0)
            touched: set[str] = set()
            for shard, (tips, updates) in zip(self._shards, results, strict=True):
                removed = sorted(set(known[shard.index]) - set(tips))
                result.listed += len(tips)
                result.moved += list(updates)
                result.removed += removed
                result.errors.update({c: v.error for c, v in updates.items() if v.error})
                touched.update(updates, removed)
                with self._lock:
                    views = self._views[shard.index]
                    for name in removed:
                        views.pop(name, None)
                    views.update(updates)
            with self._lock:
                for name in touched:
                    self._show(name)
                self.last_refresh = started
                if touched:
                    self.version += 1
            result.moved.sort()
            result.removed.sort()
            if touched:
                self._save_view(results, known)
        result.seconds = (datetime.now(UTC) - started).total_seconds()
        return result

    def _refresh_shards(self) -> list[tuple[dict[str, str], dict[str, ClusterView]]]:
        """Each shard's tips and moved views. Shards this hub knows nothing of yet (a cold
        start: every document to read) go to worker processes, 2 at a time: parsing is CPU
        work that threads of one process cannot share. The others are refreshed in threads
        (their cost is waiting on the server)."""
        cold = [s for s in self._shards if not self._views[s.index]]
        warm = [s for s in self._shards if self._views[s.index]]
        found: dict[int, tuple[dict[str, str], dict[str, ClusterView]]] = {}
        if len(cold) > 1:
            try:
                found.update(self._in_processes(cold))
            except (BrokenProcessPool, OSError):
                warm = self._shards  # no worker processes here: threads, then
        else:
            warm = self._shards

        def work(shard: _Shard) -> tuple[dict[str, str], dict[str, ClusterView]]:
            return shard.refresh(self._views[shard.index], self.credentials)

        if len(warm) == 1:
            found[warm[0].index] = work(warm[0])
        elif warm:
            with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(warm))) as threads:
                for shard, outcome in zip(warm, threads.map(work, warm), strict=True):
                    found[shard.index] = outcome
        return [found[s.index] for s in self._shards]

    def _in_processes(
        self, shards: list[_Shard]
    ) -> dict[int, tuple[dict[str, str], dict[str, ClusterView]]]:
        """Raises GitTransportError, BrokenProcessPool (a worker could not run)."""
        found = {}
        context = multiprocessing.get_context("spawn")
        workers = min(len(shards), max(2, os.cpu_count() or 2))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {
                s.index: pool.submit(_cold_refresh, s.index, s.url, s.path, self.credentials)
                for s in shards
            }
            for index, future in futures.items():
                outcome = future.result()
                if isinstance(outcome, str):
                    raise GitTransportError(outcome)
                found[index] = outcome
        return found

    def _show(self, name: str) -> None:
        """The newest view of ``name`` over the shards (under the lock)."""
        found = [v[name] for v in self._views if name in v]
        if found:
            self._clusters[name] = max(found, key=ClusterView.rank)
        else:
            self._clusters.pop(name, None)

    # --- the on-disk cache ---------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.cache_dir / _VIEW_FILE)
            db.execute(
                "CREATE TABLE IF NOT EXISTS shards (shard INTEGER PRIMARY KEY, url TEXT, "
                "format INTEGER)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS views (shard INTEGER, name TEXT, tip TEXT, "
                "source TEXT, error TEXT, data TEXT, PRIMARY KEY (shard, name))"
            )
            return db
        except (sqlite3.Error, OSError) as exc:
            raise StatusCacheError(
                f"hub status cache {self.cache_dir / _VIEW_FILE}: {exc}"
            ) from exc

    def _save_view(
        self,
        results: Sequence[tuple[dict[str, str], dict[str, ClusterView]]],
        known: Sequence[Mapping[str, str]],
    ) -> None:
        # Only what moved is written: a 1% refresh of 100,000 clusters writes 1,000 rows.
        try:
            with contextlib.closing(self._db()) as db, db:
                for shard, (tips, updates) in zip(self._shards, results, strict=True):
                    db.execute(
                        "INSERT OR REPLACE INTO shards VALUES (?, ?, ?)",
                        (shard.index, shard.url, _VIEW_FORMAT),
                    )
                    gone = [(shard.index, n) for n in set(known[shard.index]) - set(tips)]
                    db.executemany("DELETE FROM views WHERE shard = ? AND name = ?", gone)
                    db.executemany(
                        "INSERT OR REPLACE INTO views VALUES (?, ?, ?, ?, ?, ?)",
                        [v.row() for v in updates.values()],
                    )
        except sqlite3.Error as exc:
            raise StatusCacheError(f"cannot write the hub status cache: {exc}") from exc

    def _load_view(self) -> None:
        # A missing, foreign or corrupt cache only means a cold start.
        path = self.cache_dir / _VIEW_FILE
        if not path.is_file():
            return
        try:
            with contextlib.closing(self._db()) as db:
                shards = {
                    shard: url
                    for shard, url, fmt in db.execute("SELECT shard, url, format FROM shards")
                    if fmt == _VIEW_FORMAT
                }
                with _no_gc():
                    for row in db.execute("SELECT * FROM views"):
                        shard = row[0]
                        if (
                            shard < len(self._shards)
                            and shards.get(shard) == self._shards[shard].url
                        ):
                            view = ClusterView.of_row(row)
                            self._views[shard][view.name] = view
        except (sqlite3.Error, StatusCacheError, ValueError, KeyError, TypeError):
            self._views = [{} for _ in self._shards]
            return
        for name in {n for views in self._views for n in views}:
            self._show(name)

    # --- documents, on demand -----------------------------------------------------------

    def document(self, name: str) -> dict[str, Any] | None:
        """The last good status document of ``name`` (None: none), read from the cache
        repository (recent ones kept in memory)."""
        with self._lock:
            view = self._clusters.get(name)
            if view is None or view.source is None:
                return None
            key = (view.shard, view.source)
            doc = self._documents.get(key)
            if doc is not None:
                self._documents.move_to_end(key)
                return doc
        try:
            doc = self._shards[view.shard].document(name, view.source)
        except (pygit2.GitError, KeyError, ValueError):
            return None
        with self._lock:
            self._documents[key] = doc
            while len(self._documents) > _DOCUMENTS_KEPT:
                self._documents.popitem(last=False)
        return doc

    # --- reading the view ----------------------------------------------------------------

    def clusters(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Every cluster, sorted by name: heartbeat, its age, stale, error, counts."""
        now = now or datetime.now(UTC)
        with self._lock:
            views = sorted(self._clusters.values(), key=lambda v: v.name)
        return [self._cluster_summary(v, now) for v in views]

    def cluster(self, name: str, *, now: datetime | None = None) -> dict[str, Any] | None:
        with self._lock:
            view = self._clusters.get(name)
        return None if view is None else self._cluster_summary(view, now or datetime.now(UTC))

    def _cluster_summary(self, view: ClusterView, now: datetime) -> dict[str, Any]:
        beat = view.beat
        return {
            "name": view.name,
            "heartbeat": format_time(beat) if beat else None,
            "heartbeatAgeSeconds": round((now - beat).total_seconds(), 3) if beat else None,
            "stale": view.stale(now, self.stale_after),
            "agentVersion": view.agent_version,
            "sequence": view.sequence,
            "lastAcceptedSerial": view.last_accepted_serial,
            "lastRefusal": view.last_refusal,
            "installations": len(view.states),
            "error": view.error,
        }

    def cells(self, name: str, *, now: datetime | None = None) -> dict[str, str] | None:
        """Bundle -> state of a cluster's installations (Stale when the cluster is), from
        the summary alone; None for an unknown cluster."""
        with self._lock:
            view = self._clusters.get(name)
        if view is None:
            return None
        stale = view.stale(now or datetime.now(UTC), self.stale_after)
        return {bundle: "Stale" if stale else state for bundle, state in view.states}

    def installations(
        self,
        *,
        cluster: str | None = None,
        bundle: str | None = None,
        state: str | None = None,
        now: datetime | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Installation summaries (cluster × bundle), sorted, filtered by each given field;
        ``offset`` and ``limit`` page through them.

        The summaries' states select (and skip) installations; only the documents of the
        clusters on the page are read.
        """
        found = []
        skip = offset
        for view, wanted, stale in self._matching(cluster, bundle, state, now):
            if skip >= len(wanted):
                skip -= len(wanted)
                continue
            wanted, skip = wanted[skip:], 0
            items = (self.document(view.name) or {}).get("bundles", {})
            for name in wanted:
                if name in items:
                    found.append(
                        _installation_summary(
                            view.name,
                            name,
                            items[name],
                            stale=stale,
                            accepted=view.last_accepted_serial,
                        )
                    )
                if limit is not None and len(found) >= limit:
                    return found
        return found

    def count_installations(
        self,
        *,
        cluster: str | None = None,
        bundle: str | None = None,
        state: str | None = None,
        now: datetime | None = None,
    ) -> int:
        """How many installations :meth:`installations` would list (no document read)."""
        return sum(len(w) for _, w, _ in self._matching(cluster, bundle, state, now))

    def _matching(
        self, cluster: str | None, bundle: str | None, state: str | None, now: datetime | None
    ) -> Iterator[tuple[ClusterView, list[str], bool]]:
        now = now or datetime.now(UTC)
        with self._lock:
            if cluster is None:
                views = sorted(self._clusters.values(), key=lambda v: v.name)
            else:
                views = [self._clusters[cluster]] if cluster in self._clusters else []
        for view in views:
            stale = view.stale(now, self.stale_after)
            wanted = [
                b
                for b, st in view.states
                if (bundle is None or b == bundle)
                and (state is None or ("Stale" if stale else st) == state)
            ]
            if wanted:
                yield view, wanted, stale

    def installation(
        self, cluster: str, bundle: str, *, now: datetime | None = None
    ) -> dict[str, Any] | None:
        """One installation's detail (conditions, revisions, health, runs), or None."""
        now = now or datetime.now(UTC)
        with self._lock:
            view = self._clusters.get(cluster)
        if view is None:
            return None
        document = self.document(cluster) or {}
        item = document.get("bundles", {}).get(bundle)
        if item is None:
            return None
        stale = view.stale(now, self.stale_after)
        return {
            **_installation_summary(
                cluster, bundle, item, stale=stale, accepted=view.last_accepted_serial
            ),
            "conditions": item.get("conditions", []),
            "appliedRevision": item.get("appliedRevision"),
            "lastHealthyRevision": item.get("lastHealthyRevision"),
            "health": item.get("health"),
            "driftCount": item.get("driftCount", 0),
            "runs": item.get("runs", []),
            "requests": [
                r
                for r in document.get("requests", [])
                if isinstance(r, dict) and r.get("group") == item.get("group")
            ],
        }

    def runs(self, cluster: str, bundle: str) -> list[dict[str, Any]] | None:
        """The runs of an installation, newest first, or None if no such installation."""
        detail = self.installation(cluster, bundle)
        return None if detail is None else list(detail["runs"])

    def run(self, cluster: str, bundle: str, run_id: str) -> dict[str, Any] | None:
        """One run by id, or ``latest``: the newest succeeded run. None if none."""
        runs = self.runs(cluster, bundle) or []
        for run in runs:
            if run_id == "latest" and run.get("result") == SUCCEEDED:
                return run
            if run.get("id") == run_id:
                return run
        return None

    def view(self, name: str) -> ClusterView | None:
        """The compact summary shown for ``name`` (None: never reported). Views are replaced,
        never changed, so the caller may keep it."""
        with self._lock:
            return self._clusters.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._clusters)

    def tips(self) -> dict[str, str]:
        """Cluster -> the tip its shown view was read at (changes when the view does)."""
        with self._lock:
            return {name: f"{v.shard}:{v.tip}" for name, v in self._clusters.items()}


def _installation_summary(
    cluster: str, bundle: str, item: Mapping[str, Any], *, stale: bool, accepted: int | None
) -> dict[str, Any]:
    runs = item.get("runs") or []
    last = runs[0] if runs else None
    latest_ok = next((r for r in runs if r.get("result") == SUCCEEDED), None)
    applied = item.get("appliedRevision")
    return {
        "cluster": cluster,
        "bundle": bundle,
        "name": f"{cluster}/{bundle}",
        "group": item.get("group"),
        "state": installation_state(item, stale=stale, accepted=accepted),
        "appliedSerial": applied.get("serial") if isinstance(applied, dict) else None,
        "lastRun": _run_brief(last),
        "lastSuccessfulRun": latest_ok.get("id") if latest_ok else None,
        "driftCount": item.get("driftCount", 0),
    }


def _run_brief(run: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {k: run.get(k) for k in ("id", "operation", "result", "finishedAt")}


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while parsing thousands of documents, then freeze.

    Parsed JSON holds no cycles, but each collection walks every live container: with 10,000
    documents kept, the collections the parsing triggers cost more than the parsing, and every
    later full collection would walk them again (a pause of about a second). ``gc.freeze()``
    moves what exists into the permanent generation, never scanned; documents replaced later
    are still freed by reference counting, as they hold no cycles.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
