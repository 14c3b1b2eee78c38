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
import multiprocessing
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.api.reasons import SUCCEEDED
from hub.errors import GitTransportError
from hub.publish.shards import parallel_for
from hub.status.document import (
    format_time,
    installation_state,
)
from hub.status.shard import (
    DocumentsUnavailable,
    StatusCacheError,
    StatusShard,
    cold_refresh,
    no_gc,
)
from hub.status.view import ClusterView, RefreshResult

_VIEW_FILE = "view.sqlite"
_VIEW_FORMAT = 4  # 3: each installation's applied and newest-run serials; 4: generations
_DOCUMENTS_KEPT = 256


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
        follow: bool = False,
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
            StatusShard(
                i,
                url,
                self.cache_dir / ("status.git" if i == 0 else f"status-{i}.git"),
                credentials,
            )
            for i, url in enumerate(urls)
        ]
        self.repo = self._shards[0].repo
        self._views: list[dict[str, ClusterView]] = [{} for _ in urls]  # per shard
        self._clusters: dict[str, ClusterView] = {}  # the shown view of each cluster
        self._ordered: list[ClusterView] | None = None  # _clusters' values by name (cache)
        self._documents: OrderedDict[tuple[int, str], dict[str, Any]] = OrderedDict()
        self.last_refresh: datetime | None = None
        self.version = 0  # grows whenever the view changes
        # With follow, refresh() reads what another process (the one refreshing from git)
        # wrote into the shared view file, from the generation seen last.
        self.follow = follow
        self._generation = 0
        self._load_view()

    # --- refresh -------------------------------------------------------------------------

    def refresh(self) -> RefreshResult:
        """List the status branches of every shard, fetch those that moved, summarise their
        documents.

        Raises GitTransportError if a server cannot be listed or fetched; the view then
        stays as it was (clusters grow stale by the clock, not by an error). A following
        view (``follow``) reads the shared view file instead (:meth:`_follow`).
        """
        if self.follow:
            return self._follow()
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

        def work(shard: StatusShard) -> tuple[dict[str, str], dict[str, ClusterView]]:
            return shard.refresh(self._views[shard.index], self.credentials)

        if len(warm) == 1:
            found[warm[0].index] = work(warm[0])
        elif warm:
            parallel = parallel_for(s.url for s in warm)
            with ThreadPoolExecutor(max_workers=min(parallel, len(warm))) as threads:
                for shard, outcome in zip(warm, threads.map(work, warm), strict=True):
                    found[shard.index] = outcome
        return [found[s.index] for s in self._shards]

    def _in_processes(
        self, shards: list[StatusShard]
    ) -> dict[int, tuple[dict[str, str], dict[str, ClusterView]]]:
        """Raises GitTransportError, BrokenProcessPool (a worker could not run)."""
        found = {}
        context = multiprocessing.get_context("spawn")
        workers = min(len(shards), max(2, os.cpu_count() or 2))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {
                s.index: pool.submit(cold_refresh, s.index, s.url, s.path, self.credentials)
                for s in shards
            }
            for index, future in futures.items():
                outcome = future.result()
                if isinstance(outcome, str):
                    raise GitTransportError(outcome)
                found[index] = outcome
        return found

    def _by_name(self) -> list[ClusterView]:
        """The shown views sorted by name (under the lock), kept until the view changes: a
        page of 100 at 100,000 clusters must not sort the fleet."""
        if self._ordered is None:
            self._ordered = [self._clusters[n] for n in sorted(self._clusters)]
        return self._ordered

    def _show(self, name: str) -> None:
        """The newest view of ``name`` over the shards (under the lock)."""
        found = [v[name] for v in self._views if name in v]
        if found:
            self._clusters[name] = max(found, key=ClusterView.rank)
        else:
            self._clusters.pop(name, None)
        self._ordered = None

    # --- the on-disk cache ---------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        """The shared view file (SQLite in WAL mode: the processes of ``hub serve --workers``
        read it while the one refreshing writes). A file of another format is started
        anew. Raises StatusCacheError."""
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.cache_dir / _VIEW_FILE, timeout=30)
            db.execute("PRAGMA journal_mode=WAL")
            if db.execute("PRAGMA user_version").fetchone()[0] != _VIEW_FORMAT:
                with db:
                    for table in ("shards", "views", "removed", "generation"):
                        db.execute(f"DROP TABLE IF EXISTS {table}")
                    db.execute(
                        "CREATE TABLE shards (shard INTEGER PRIMARY KEY, url TEXT, format INTEGER)"
                    )
                    # Each row says in which generation it was written; a removed branch
                    # leaves a row in "removed" (until it comes back), so a follower reads
                    # only what changed since the generation it saw.
                    db.execute(
                        "CREATE TABLE views (shard INTEGER, name TEXT, tip TEXT, source TEXT, "
                        "error TEXT, data TEXT, generation INTEGER, PRIMARY KEY (shard, name))"
                    )
                    db.execute("CREATE INDEX views_generation ON views (generation)")
                    db.execute(
                        "CREATE TABLE removed (shard INTEGER, name TEXT, generation INTEGER, "
                        "PRIMARY KEY (shard, name))"
                    )
                    db.execute("CREATE TABLE generation (n INTEGER)")
                    db.execute("INSERT INTO generation VALUES (0)")
                    db.execute(f"PRAGMA user_version = {_VIEW_FORMAT}")
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
                generation = db.execute("SELECT n FROM generation").fetchone()[0] + 1
                for shard, (tips, updates) in zip(self._shards, results, strict=True):
                    db.execute(
                        "INSERT OR REPLACE INTO shards VALUES (?, ?, ?)",
                        (shard.index, shard.url, _VIEW_FORMAT),
                    )
                    gone = [(shard.index, n) for n in set(known[shard.index]) - set(tips)]
                    db.executemany("DELETE FROM views WHERE shard = ? AND name = ?", gone)
                    db.executemany(
                        "INSERT OR REPLACE INTO removed VALUES (?, ?, ?)",
                        [(i, n, generation) for i, n in gone],
                    )
                    db.executemany(
                        "DELETE FROM removed WHERE shard = ? AND name = ?",
                        [(shard.index, n) for n in updates],
                    )
                    db.executemany(
                        "INSERT OR REPLACE INTO views VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [(*v.row(), generation) for v in updates.values()],
                    )
                db.execute("UPDATE generation SET n = ?", (generation,))
                self._generation = generation
        except sqlite3.Error as exc:
            raise StatusCacheError(f"cannot write the hub status cache: {exc}") from exc

    def _load_view(self) -> None:
        # A missing, foreign or corrupt cache only means a cold start.
        path = self.cache_dir / _VIEW_FILE
        if not path.is_file():
            return
        try:
            with contextlib.closing(self._db()) as db, db:  # the generation, then rows as new
                self._generation = db.execute("SELECT n FROM generation").fetchone()[0]
                shards = self._known_shards(db)
                with no_gc():
                    for row in db.execute("SELECT * FROM views"):
                        if row[0] in shards:
                            view = ClusterView.of_row(row[:6])
                            self._views[row[0]][view.name] = view
        except (sqlite3.Error, StatusCacheError, ValueError, KeyError, TypeError):
            self._views = [{} for _ in self._shards]
            return
        for name in {n for views in self._views for n in views}:
            self._show(name)

    def _known_shards(self, db: sqlite3.Connection) -> dict[int, str]:
        """Shard -> URL of the shards in the view file that are this view's shards (same
        index, same URL)."""
        return {
            shard: url
            for shard, url, fmt in db.execute("SELECT shard, url, format FROM shards")
            if fmt == _VIEW_FORMAT and shard < len(self._shards) and self._shards[shard].url == url
        }

    def _follow(self) -> RefreshResult:
        """Read what changed in the shared view file since the generation seen last.
        Raises StatusCacheError."""
        started = datetime.now(UTC)
        result = RefreshResult(listed=0)
        try:
            with contextlib.closing(self._db()) as db, db:  # the generation, then rows as new
                generation = db.execute("SELECT n FROM generation").fetchone()[0]
                if generation != self._generation:
                    shards = self._known_shards(db)
                    since = self._generation
                    rows = db.execute("SELECT * FROM views WHERE generation > ?", (since,))
                    moved = [ClusterView.of_row(row[:6]) for row in rows if row[0] in shards]
                    removed = db.execute(
                        "SELECT shard, name FROM removed WHERE generation > ?", (since,)
                    ).fetchall()
        except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            raise StatusCacheError(f"cannot read the hub status cache: {exc}") from exc
        if generation != self._generation:
            with self._lock:
                for shard, name in removed:
                    if shard < len(self._views) and self._views[shard].pop(name, None):
                        result.removed.append(name)
                for view in moved:
                    self._views[view.shard][view.name] = view
                    result.moved.append(view.name)
                for name in {*result.moved, *result.removed}:
                    self._show(name)
                self.version += 1
            self._generation = generation
        with self._lock:
            result.listed = len(self._clusters)
            self.last_refresh = started
        result.moved.sort()
        result.removed.sort()
        result.seconds = (datetime.now(UTC) - started).total_seconds()
        return result

    # --- documents, on demand -----------------------------------------------------------

    def document(self, name: str) -> dict[str, Any] | None:
        """The last good status document of ``name`` (None: none), read from the cache
        repository (recent ones kept in memory). Raises DocumentsUnavailable when it has to
        be fetched and cannot be."""
        with self._lock:
            view = self._clusters.get(name)
        return None if view is None else self.documents([view]).get(name)

    def documents(self, views: Sequence[ClusterView]) -> dict[str, dict[str, Any] | None]:
        """Cluster -> the last good document of each of ``views`` (None: none). Recent ones
        come from memory; the others from the cache repositories, the shards in parallel,
        fetched where the cache lacks them (one request per shard for a page, shared with
        the pages asking at the same time). Raises DocumentsUnavailable."""
        found: dict[str, dict[str, Any] | None] = {}
        wanted: dict[int, dict[str, str]] = {}
        with self._lock:
            for view in views:
                if view.source is None:
                    found[view.name] = None
                    continue
                doc = self._documents.get((view.shard, view.source))
                if doc is not None:
                    self._documents.move_to_end((view.shard, view.source))
                    found[view.name] = doc
                else:
                    wanted.setdefault(view.shard, {})[view.name] = view.source
        if not wanted:
            return found
        futures = {shard: self._shards[shard].documents(w) for shard, w in wanted.items()}
        failure: DocumentsUnavailable | None = None
        for shard, future in futures.items():
            try:
                read = future.result()
            except DocumentsUnavailable as exc:
                failure = failure or exc
                continue
            with self._lock:
                for name, doc in read.items():
                    found[name] = doc
                    if doc is not None:
                        self._documents[(shard, wanted[shard][name])] = doc
                while len(self._documents) > _DOCUMENTS_KEPT:
                    self._documents.popitem(last=False)
        if failure is not None:
            raise failure
        return found

    # --- reading the view ----------------------------------------------------------------

    def clusters(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Every cluster, sorted by name: heartbeat, its age, stale, error, counts."""
        now = now or datetime.now(UTC)
        with self._lock:
            views = self._by_name()
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
            "notifyChannel": view.notify_channel,
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
        page: list[tuple[ClusterView, list[str], bool]] = []
        skip, count = offset, 0
        for view, wanted, stale in self._matching(cluster, bundle, state, now):
            if skip >= len(wanted):
                skip -= len(wanted)
                continue
            wanted, skip = wanted[skip:], 0
            page.append((view, wanted, stale))
            count += len(wanted)
            if limit is not None and count >= limit:
                break
        # The page's documents, in one request per shard where the cache lacks them.
        documents = self.documents([view for view, _, _ in page])
        found = []
        for view, wanted, stale in page:
            items = (documents.get(view.name) or {}).get("bundles", {})
            channel = view.notify_channel
            for name in wanted:
                if name in items:
                    found.append(
                        _installation_summary(
                            view.name,
                            name,
                            items[name],
                            stale=stale,
                            accepted=view.last_accepted_serial,
                            channel=channel,
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
                views = self._by_name()
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
            return [v.name for v in self._by_name()]

    def tips(self) -> dict[str, str]:
        """Cluster -> the tip its shown view was read at (changes when the view does)."""
        with self._lock:
            return {name: f"{v.shard}:{v.tip}" for name, v in self._clusters.items()}


def _installation_summary(
    cluster: str,
    bundle: str,
    item: Mapping[str, Any],
    *,
    stale: bool,
    accepted: int | None,
    channel: str | None = None,
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
        "notifyChannel": channel,
    }


def _run_brief(run: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {k: run.get(k) for k in ("id", "operation", "result", "finishedAt")}
