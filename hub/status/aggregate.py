"""The fleet as the agents report it: every ``fleetlet/status/<cluster>`` branch, aggregated.

:class:`FleetStatus` lists the status branches with ONE ref listing, fetches only the branches
whose tip moved since the last refresh (one fetch for all of them), and reads each moved
branch's ``status.json`` straight from the object database (no work tree, no checkout). The
view (per cluster: heartbeat, sequence, bundles; or the error its document had) lives in
memory and in a JSON file beside a local bare cache repository, so a restarted hub starts warm
and fetches nothing that did not move.

Staleness is computed when the view is read, against the clock, never stored: a cluster quiet
for longer than ``stale_after`` is ``Stale`` and so are its installations.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pygit2

from agent.api.reasons import FAILED, ROLLED_BACK, RUNNING, SUCCEEDED
from agent.api.status import MAX_LOAD_BYTES
from agent.errors import PermanentError
from hub.errors import GitTransportError

STATUS_PREFIX = "refs/heads/fleetlet/status/"
STATUS_FILE = "status.json"
_TRACK_PREFIX = "refs/fleetlet/status/"
_VIEW_FILE = "view.json"
_VIEW_FORMAT = 1
_EXPLICIT_REFSPECS = 64

STATES = ("Ready", "Progressing", "Degraded", "RolledBack", "Paused", "Stale")


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
        doc = json.loads(data)
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
    """One cluster as its status branch last said. ``document`` None: never parsed well."""

    name: str
    tip: str
    document: dict[str, Any] | None = None
    error: str | None = None
    source: str | None = None  # the commit ``document`` was read from (None: no document)

    @property
    def heartbeat(self) -> datetime | None:
        if self.document is None:
            return None
        return parse_time(self.document["heartbeat"], origin=self.name)

    def stale(self, now: datetime, stale_after: timedelta) -> bool:
        beat = self.heartbeat
        return beat is None or now - beat > stale_after


@dataclass(slots=True)
class RefreshResult:
    """What one refresh did: branches listed, moved (fetched), removed, and seconds spent."""

    listed: int
    moved: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def installation_state(bundle: Mapping[str, Any], *, stale: bool) -> str:
    """The one-word state of an installation, from its conditions and its newest run.

    Stale beats everything (an old report says nothing about now); then Paused, Progressing
    (a run in progress or Progressing=True), RolledBack (the newest run was rolled back, or
    Ready says RolledBack),
    Degraded (Degraded=True, Ready=False or the newest run failed), Ready.
    """
    if stale:
        return "Stale"
    conditions = {c.get("type"): c for c in bundle.get("conditions", []) if isinstance(c, dict)}

    def true(kind: str) -> bool:
        return str(conditions.get(kind, {}).get("status")) == "True"

    runs = bundle.get("runs") or []
    last = runs[0].get("result") if runs and isinstance(runs[0], dict) else None
    ready = conditions.get("Ready", {})
    if true("Paused") or ready.get("reason") == "Paused":
        return "Paused"
    if last == RUNNING or true("Progressing"):
        return "Progressing"
    if last == ROLLED_BACK or ready.get("reason") == "RolledBack":
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


class FleetStatus:
    """The aggregated status of every cluster that pushes to ``repo_url``.

    ``credentials`` (user, password) serve smart-HTTP basic auth; ``cache_dir`` holds the bare
    cache repository and the saved view (created if missing). Thread-safe: :meth:`refresh`
    swaps the view under a lock, readers get consistent snapshots.
    """

    def __init__(
        self,
        *,
        repo_url: str,
        credentials: tuple[str, str] | None = None,
        cache_dir: Path,
        stale_after: timedelta = timedelta(minutes=5),
    ) -> None:
        self.repo_url = repo_url
        self.credentials = credentials
        self.cache_dir = Path(cache_dir)
        self.stale_after = stale_after
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._clusters: dict[str, ClusterView] = {}
        self.last_refresh: datetime | None = None
        git_dir = self.cache_dir / "status.git"
        try:
            if (git_dir / "HEAD").is_file():
                self.repo = pygit2.Repository(str(git_dir))
            else:
                git_dir.mkdir(parents=True, exist_ok=True)
                self.repo = pygit2.init_repository(str(git_dir), bare=True)
        except (pygit2.GitError, OSError) as exc:
            raise StatusCacheError(f"hub status cache {git_dir}: {exc}") from exc
        self._load_view()

    # --- refresh -------------------------------------------------------------------------

    def refresh(self) -> RefreshResult:
        """List the status branches, fetch those that moved, re-read their documents.

        Raises GitTransportError if the server cannot be listed or fetched; the view then
        stays as it was (clusters grow stale by the clock, not by an error).
        """
        started = datetime.now(UTC)
        with self._refresh_lock:
            remote = self.repo.remotes.create_anonymous(self.repo_url)
            try:
                heads = remote.list_heads(callbacks=_Callbacks(self.credentials))
            except (pygit2.GitError, OSError) as exc:
                raise GitTransportError(
                    f"cannot list status branches of {self.repo_url}: {_first_line(exc)}"
                ) from exc
            tips: dict[str, str] = {}
            for head in heads:
                name = str(head.name)
                oid = getattr(head, "oid", None)
                if name.startswith(STATUS_PREFIX) and oid is not None:
                    tips[name[len(STATUS_PREFIX) :]] = str(oid)
            with self._lock:
                known = {name: view.tip for name, view in self._clusters.items()}
            moved = sorted(c for c, tip in tips.items() if known.get(c) != tip)
            removed = sorted(set(known) - set(tips))
            result = RefreshResult(listed=len(tips), moved=moved, removed=removed)
            missing = [c for c in moved if pygit2.Oid(hex=tips[c]) not in self.repo]
            if missing:
                self._fetch(remote, missing)
            with _no_gc():
                updates = {
                    c: self._read(c, tips[c], known_view=self._clusters.get(c)) for c in moved
                }
            with self._lock:
                for name in removed:
                    self._clusters.pop(name, None)
                self._clusters.update(updates)
                self.last_refresh = started
            result.errors = {c: v.error for c, v in updates.items() if v.error}
            if moved or removed:
                self._save_view()
        result.seconds = (datetime.now(UTC) - started).total_seconds()
        return result

    def _fetch(self, remote: pygit2.Remote, clusters: list[str]) -> None:
        # One fetch. Either way the client wants only the tips it lacks and offers the ones it
        # has, so the server sends the moved branches' new objects and nothing else. A few
        # moved branches get one refspec each; beyond that one wildcard: libgit2 matches every
        # refspec against every advertised ref (10,000 explicit refspecs: minutes).
        if len(clusters) <= _EXPLICIT_REFSPECS:
            specs = [f"+{STATUS_PREFIX}{c}:{_TRACK_PREFIX}{c}" for c in clusters]
        else:
            specs = [f"+{STATUS_PREFIX}*:{_TRACK_PREFIX}*"]
        try:
            remote.fetch(specs, callbacks=_Callbacks(self.credentials))
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(
                f"git fetch of status branches from {self.repo_url} failed: {_first_line(exc)}"
            ) from exc

    def _document_at(self, cluster: str, commit_id: str) -> dict[str, Any]:
        """The checked document in ``commit_id`` of ``cluster``'s branch, read from the odb.

        Raises StatusDocumentError (missing file, bad document, another cluster's) or
        pygit2.GitError / KeyError (object missing locally).
        """
        origin = f"{STATUS_PREFIX}{cluster}:{STATUS_FILE}"
        commit = self.repo[pygit2.Oid(hex=commit_id)].peel(pygit2.Commit)
        try:
            entry = commit.tree[STATUS_FILE]
        except KeyError:
            raise StatusDocumentError(f"{origin}: no such file on the branch") from None
        doc = parse_status(self.repo[entry.id].read_raw(), origin=origin)
        if doc["cluster"] != cluster:
            raise StatusDocumentError(
                f"{origin}: cluster: expected {cluster!r}, got {doc['cluster']!r}"
            )
        return doc

    def _read(self, cluster: str, tip: str, *, known_view: ClusterView | None) -> ClusterView:
        """Read one branch's document; a bad one gives a view with ``error`` set (and the last
        good document, if any)."""
        previous, source = None, None
        if known_view is not None:
            previous, source = known_view.document, known_view.source
        try:
            doc = self._document_at(cluster, tip)
        except (pygit2.GitError, KeyError, ValueError) as exc:
            # StatusDocumentError is a ValueError; so is a malformed object id.
            return ClusterView(cluster, tip, previous, str(exc), source)
        if previous is not None and doc["sequence"] < previous["sequence"]:
            # Newer always wins: a branch reset to an older document does not roll the view back.
            return ClusterView(
                cluster,
                tip,
                previous,
                f"{STATUS_PREFIX}{cluster}: sequence {doc['sequence']} is older than "
                f"{previous['sequence']}; kept the newer document",
                source,
            )
        return ClusterView(cluster, tip, doc, None, tip)

    # --- the on-disk cache ---------------------------------------------------------------

    def _save_view(self) -> None:
        # Tips and errors only: the documents are in the cache repository already, and
        # re-encoding them all would cost more than the refresh itself at 10,000 clusters.
        with self._lock:
            data = {
                "format": _VIEW_FORMAT,
                "repo": self.repo_url,
                "clusters": {
                    name: {"tip": v.tip, "source": v.source, "error": v.error}
                    for name, v in self._clusters.items()
                },
            }
        path = self.cache_dir / _VIEW_FILE
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data, separators=(",", ":")))
            os.replace(tmp, path)
        except OSError as exc:
            raise StatusCacheError(f"cannot write the hub status cache {path}: {exc}") from exc

    def _load_view(self) -> None:
        # A missing, foreign or corrupt cache only means a cold start; a cluster whose
        # objects are missing locally is simply fetched again at the next refresh.
        path = self.cache_dir / _VIEW_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if (
            not isinstance(data, dict)
            or data.get("format") != _VIEW_FORMAT
            or data.get("repo") != self.repo_url
        ):
            return
        with _no_gc():
            self._load_documents(data.get("clusters", {}))

    def _load_documents(self, clusters: dict[str, Any]) -> None:
        for name, item in clusters.items():
            try:
                tip, source, error = item["tip"], item.get("source"), item.get("error")
                doc = self._document_at(name, source) if source else None
            except (pygit2.GitError, KeyError, ValueError, TypeError):
                continue
            self._clusters[name] = ClusterView(name, tip, doc, error, source)

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
        beat = view.heartbeat
        doc = view.document or {}
        return {
            "name": view.name,
            "heartbeat": format_time(beat) if beat else None,
            "heartbeatAgeSeconds": round((now - beat).total_seconds(), 3) if beat else None,
            "stale": view.stale(now, self.stale_after),
            "agentVersion": doc.get("agentVersion"),
            "sequence": doc.get("sequence"),
            "lastAcceptedSerial": doc.get("lastAcceptedSerial"),
            "lastRefusal": doc.get("lastRefusal"),
            "installations": len(doc.get("bundles", {})),
            "error": view.error,
        }

    def installations(
        self,
        *,
        cluster: str | None = None,
        bundle: str | None = None,
        state: str | None = None,
        now: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Installation summaries (cluster × bundle), sorted, filtered by each given field."""
        now = now or datetime.now(UTC)
        with self._lock:
            if cluster is None:
                views = list(self._clusters.values())
            else:
                views = [self._clusters[cluster]] if cluster in self._clusters else []
        found = []
        for view in sorted(views, key=lambda v: v.name):
            stale = view.stale(now, self.stale_after)
            for name, item in sorted((view.document or {}).get("bundles", {}).items()):
                if bundle is not None and name != bundle:
                    continue
                summary = _installation_summary(view.name, name, item, stale=stale)
                if state is None or summary["state"] == state:
                    found.append(summary)
        return found

    def installation(
        self, cluster: str, bundle: str, *, now: datetime | None = None
    ) -> dict[str, Any] | None:
        """One installation's detail (conditions, revisions, health, runs), or None."""
        now = now or datetime.now(UTC)
        with self._lock:
            view = self._clusters.get(cluster)
        if view is None or view.document is None:
            return None
        item = view.document["bundles"].get(bundle)
        if item is None:
            return None
        stale = view.stale(now, self.stale_after)
        return {
            **_installation_summary(cluster, bundle, item, stale=stale),
            "conditions": item.get("conditions", []),
            "appliedRevision": item.get("appliedRevision"),
            "lastHealthyRevision": item.get("lastHealthyRevision"),
            "health": item.get("health"),
            "driftCount": item.get("driftCount", 0),
            "runs": item.get("runs", []),
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

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._clusters)

    def tips(self) -> dict[str, str]:
        with self._lock:
            return {name: v.tip for name, v in self._clusters.items()}


def _installation_summary(
    cluster: str, bundle: str, item: Mapping[str, Any], *, stale: bool
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
        "state": installation_state(item, stale=stale),
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
