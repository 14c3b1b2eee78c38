"""One status repository (a shard) and its local bare cache repository: list its status
branches, fetch the moved ones (protocol v2 when the server speaks it, else libgit2), read each
moved branch's summary straight from the object database.

Over protocol v2 a refresh fetches the moved tips only (``deepen 1``: not the heartbeats
between two refreshes, nor a new hub the whole history of every branch), and where the server
filters (``filter tree:0``) only their commits: each commit's message carries the summary of
its document (:func:`agent.api.status.status_summary`), which is all the fleet-wide view
needs. A document is fetched when a page asks for it (its tree, by id). Commits without a
summary (agents before it) have their documents fetched at once.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pygit2

from agent.api.status import SUMMARY_TRAILER, message_summary
from agent.errors import PermanentError, TemporaryError
from hub.errors import GitTransportError
from hub.publish.git import Callbacks
from hub.publish.pack import store_received
from hub.status import fetch as fetch_v2
from hub.status.document import StatusDocumentError, parse_status
from hub.status.view import ClusterView

STATUS_PREFIX = "refs/heads/fleetlet/status/"
STATUS_FILE = "status.json"
_TRACK_PREFIX = "refs/fleetlet/status/"
_EXPLICIT_REFSPECS = 64


READERS = 8
"""Threads of one hub process reading one shard's documents for pages, each with a libgit2
Repository of its own (no libgit2 object is shared between threads)."""
FETCH_CONNECTIONS = 2
"""Connections at once from one hub process to one shard's server for the documents pages
ask for; what readers ask meanwhile waits and goes in the next fetch, whole."""
FETCH_TIMEOUT = 20.0
"""Seconds a fetch of documents for a page may wait on the server."""
RETRY_AFTER = 5
"""Seconds after a failed fetch of documents during which pages are answered at once with
503 and this Retry-After, instead of opening one more connection each."""


class StatusCacheError(PermanentError):
    """The hub's status cache directory cannot be created, opened or written."""


class DocumentsUnavailable(TemporaryError):
    """The status documents a page needs cannot be fetched from their repository now
    (``delay``: seconds to wait before asking again)."""


class StatusShard:
    """One status repository and its local bare cache repository."""

    def __init__(
        self, index: int, url: str, path: Path, credentials: tuple[str, str] | None = None
    ) -> None:
        self.index = index
        self.url = url
        self.path = path
        self.credentials = credentials
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
        self._recent: dict[str, bytes] = {}  # commit id -> bytes, fetched by this refresh
        self._refused: dict[str, str] = {}  # cluster -> why its pack was refused, this refresh
        # Documents for pages (:meth:`documents`): reader threads, each with its Repository.
        self._readers: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._flights_lock = threading.Lock()
        self._flights: dict[str, Future[None]] = {}  # tree id -> the fetch bringing it
        self._queued: list[str] = []  # trees of the next fetch, not started yet
        self._next: Future[None] | None = None  # ... and its future
        self._fetching = 0  # fetches in flight (at most FETCH_CONNECTIONS)
        self._failed: tuple[float, str] | None = None  # (until when, why) after a failure

    def refresh(
        self, known: Mapping[str, ClusterView], credentials: tuple[str, str] | None
    ) -> tuple[dict[str, str], dict[str, ClusterView]]:
        """(every branch's tip, the views of the moved ones). Raises GitTransportError.

        Through protocol v2 when the server speaks it (:mod:`hub.status.fetch`: the moved
        tips only, commits only where the server filters), else through libgit2.
        """
        tips = None
        if self.v2 and fetch_v2.supported(self.url):
            try:
                tips = self.list_and_fetch_v2(known, credentials)
            except fetch_v2.NotProtocolV2:
                self.v2 = False
            except GitTransportError:
                if not known:
                    raise
                # v2 commands are separate requests: a branch that moved between the listing
                # and the fetch is "not our ref" any more. libgit2 lists and fetches in one.
                tips = None
        if tips is None:
            tips = self.list_and_fetch({n: v.tip for n, v in known.items()}, credentials)
        moved = [c for c, tip in tips.items() if (v := known.get(c)) is None or v.tip != tip]
        try:
            with no_gc():
                return tips, {c: self.read(c, tips[c], known.get(c)) for c in moved}
        finally:
            self._recent, self._refused = {}, {}

    def list_and_fetch_v2(
        self, known: Mapping[str, ClusterView], credentials: tuple[str, str] | None
    ) -> dict[str, str]:
        """Protocol v2: list, then fetch the moved tips (one connection over git://): their
        commits alone where the server filters, and the documents of those whose message
        carries no summary. Raises GitTransportError, NotProtocolV2."""
        with fetch_v2.Session(self.url, credentials=credentials) as session:
            tips = session.refs(STATUS_PREFIX, what="status branches")
            moved = [
                c
                for c, tip in tips.items()
                if (v := known.get(c)) is None
                or (v.tip != tip and pygit2.Oid(hex=tip) not in self.repo)
            ]
            if not moved:
                return tips
            haves = sorted({known[c].tip for c in moved if c in known})
            commits_only = session.filters
            self._fetch_each(
                session, {c: tips[c] for c in moved}, haves, depth=1, commits_only=commits_only
            )
            if commits_only:
                bare = {c: tree for c in moved if (tree := self._unsummarised(tips[c]))}
                if bare:
                    self._fetch_each(session, bare, [])
        return tips

    def _fetch_each(
        self, session: fetch_v2.Session, wants: Mapping[str, str], haves: list[str], **how: Any
    ) -> None:
        """Fetch and keep the objects ``wants`` names (cluster -> object id) in one pack; when
        that pack is refused for what it inflates to (a status push built as a zlib bomb),
        cluster by cluster, so that only the offending branches are refused, each named (their
        views carry the reason). Raises GitTransportError."""
        try:
            self._keep_recent(session.fetch_pack(sorted(set(wants.values())), haves, **how))
            return
        except fetch_v2.PackRefusedError:
            pass
        for cluster, oid in sorted(wants.items()):
            try:
                self._keep_recent(session.fetch_pack([oid], haves, **how))
            except fetch_v2.PackRefusedError as exc:
                self._refused[cluster] = f"{STATUS_PREFIX}{cluster}: status refused: {exc}"

    def _keep_recent(self, fetched: tuple[bytes, list[tuple[str, bytes, bytes, int, int]]]) -> None:
        pack, objects = fetched
        self._keep(pack, objects)
        # The commits just parsed are read from here, not from the object database.
        self._recent.update(
            {oid.hex(): data for kind, data, oid, *_ in objects if kind == "commit"}
        )

    def _keep(self, pack: bytes, objects: list[tuple[str, bytes, bytes, int, int]]) -> None:
        """Store a fetched pack as it came (indexed, not compressed again)."""
        if not objects:
            return
        try:
            store_received(pack, [(oid, at, crc) for _, _, oid, at, crc in objects], self.path)
        except OSError as exc:
            raise StatusCacheError(f"hub status cache {self.path}: {exc}") from exc

    def _unsummarised(self, commit_id: str) -> str | None:
        """The tree of ``commit_id`` when its message carries no summary (else None)."""
        try:
            commit = self._commit(commit_id, commit_id)
        except (KeyError, ValueError, pygit2.GitError):
            return None
        if message_summary(_message(commit)) is not None:
            return None
        return str(commit[5:45].decode())

    def list_and_fetch(
        self, known: Mapping[str, str], credentials: tuple[str, str] | None
    ) -> dict[str, str]:
        """Every status branch's tip (one listing); the moved ones' objects fetched.

        Raises GitTransportError.
        """
        remote = self.repo.remotes.create_anonymous(self.url)
        try:
            heads = remote.list_heads(callbacks=Callbacks(credentials))
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
            # The tips only: not every heartbeat since (a commit each), nor, for a new hub,
            # the whole history of every branch (libgit2 cannot be shallow on a local path).
            depth = 1 if "://" in self.url and not self.url.startswith("file:") else 0
            try:
                remote.fetch(specs, callbacks=Callbacks(credentials), depth=depth)
            except (pygit2.GitError, OSError) as exc:
                raise GitTransportError(
                    f"git fetch of status branches from {self.url} failed: {_first_line(exc)}"
                ) from exc
        return tips

    def document(self, cluster: str, commit_id: str) -> dict[str, Any]:
        """The checked document in ``commit_id`` of ``cluster``'s branch, read from the odb
        (its tree fetched first when the cache holds the commit alone). For the refresh's
        thread (it uses :attr:`repo`); pages read through :meth:`documents`.

        Raises StatusDocumentError (missing file, bad document, another cluster's),
        GitTransportError (it could not be fetched) or pygit2.GitError / KeyError (object
        missing locally).
        """
        origin = f"{STATUS_PREFIX}{cluster}:{STATUS_FILE}"
        tree_id = self._commit(commit_id, origin)[5:45].decode()
        if tree_id not in self.odb:
            try:
                self._fetch_objects([tree_id])
            except fetch_v2.PackRefusedError as exc:
                raise fetch_v2.PackRefusedError(f"{origin}: status refused: {exc}") from exc
        return _read_document(self.odb, cluster, tree_id, origin)

    # --- documents for pages, from any thread --------------------------------------------

    def documents(self, wanted: Mapping[str, str]) -> Future[dict[str, dict[str, Any] | None]]:
        """Cluster -> its document at the commit ``wanted`` gives (None: not readable: bad
        document, object missing), as a future: read by one of this shard's :data:`READERS`
        reader threads, each with a Repository of its own (libgit2 objects are not shared
        across threads), fetching the trees the cache lacks (:meth:`_fetch_shared`: at most
        :data:`FETCH_CONNECTIONS` fetches at once, each tree fetched once for every page that
        asks for it). The future raises DocumentsUnavailable when they cannot be fetched."""
        with self._flights_lock:
            if self._readers is None:
                self._readers = ThreadPoolExecutor(
                    max_workers=READERS, thread_name_prefix=f"status-{self.index}-docs"
                )
            readers = self._readers
        return readers.submit(self._read_documents, dict(wanted))

    def _reader_odb(self) -> Any:
        """The object database of this reader thread's own Repository."""
        odb = getattr(self._local, "odb", None)
        if odb is None:
            try:
                odb = self._local.odb = pygit2.Repository(str(self.path)).odb
            except pygit2.GitError as exc:
                raise StatusCacheError(f"hub status cache {self.path}: {exc}") from exc
        return odb

    def _read_documents(self, wanted: dict[str, str]) -> dict[str, dict[str, Any] | None]:
        odb = self._reader_odb()
        trees: dict[str, str] = {}
        found: dict[str, dict[str, Any] | None] = {}
        for cluster, commit_id in wanted.items():
            try:
                kind, commit = odb.read(commit_id)[:2]
            except (KeyError, ValueError, pygit2.GitError):
                found[cluster] = None
                continue
            if kind != pygit2.enums.ObjectType.COMMIT or not commit.startswith(b"tree "):
                found[cluster] = None
                continue
            trees[cluster] = bytes(commit[5:45]).decode()
        missing = sorted({tree for tree in trees.values() if tree not in odb})
        if missing:
            try:
                self._fetch_shared(missing)
            except fetch_v2.PackRefusedError:
                # One branch's pack too large to inflate: the others of the batch one by one,
                # the refused one reads as not readable (the refresh names it).
                for tree in missing:
                    try:
                        self._fetch_objects([tree], timeout=FETCH_TIMEOUT)
                    except fetch_v2.PackRefusedError:
                        continue
        for cluster, tree in trees.items():
            origin = f"{STATUS_PREFIX}{cluster}:{STATUS_FILE}"
            try:
                found[cluster] = _read_document(odb, cluster, tree, origin)
            except (KeyError, ValueError, pygit2.GitError):
                found[cluster] = None  # StatusDocumentError is a ValueError
        return found

    def _fetch_shared(self, trees: list[str]) -> None:
        """Fetch ``trees``, sharing fetches with the readers asking at the same time: a tree
        already asked for is waited for; the others join the next batch, which the first
        connection free (at most :data:`FETCH_CONNECTIONS`) fetches whole, every tree queued
        meanwhile in one request. After a failure the next ones fail at once for
        :data:`RETRY_AFTER` seconds (no connection per page to a server that is down).
        Raises DocumentsUnavailable."""
        waits: set[Future[None]] = set()
        with self._flights_lock:
            self._check_failed()
            for tree in trees:
                flight = self._flights.get(tree)
                if flight is None:
                    if self._next is None:
                        self._next = Future()
                    flight = self._flights[tree] = self._next
                    self._queued.append(tree)
                waits.add(flight)
        self._drive()
        for flight in waits:
            flight.result()

    def _check_failed(self) -> None:
        """Raises DocumentsUnavailable within :data:`RETRY_AFTER` of a failed fetch (under
        the lock)."""
        failed = self._failed
        if failed is not None and time.monotonic() < failed[0]:
            raise DocumentsUnavailable(failed[1], delay=RETRY_AFTER)

    def _drive(self) -> None:
        """Fetch the queued batch if a connection is free, then each batch queued meanwhile;
        return when none is left (or every connection is taken: its fetcher takes it)."""
        with self._flights_lock:
            if not self._queued or self._fetching >= FETCH_CONNECTIONS:
                return
            self._fetching += 1
            batch, flight = self._queued, self._next
            self._queued, self._next = [], None
        while True:
            assert flight is not None
            try:
                with self._flights_lock:
                    self._check_failed()
                self._fetch_objects(sorted(set(batch)), timeout=FETCH_TIMEOUT)
            except (DocumentsUnavailable, fetch_v2.PackRefusedError) as exc:
                flight.set_exception(exc)  # a refused pack: the server is fine, no pause
            except Exception as exc:  # GitTransportError, StatusCacheError; or a bug: the
                # readers waiting for this batch must not wait forever.
                message = f"status documents of {self.url} cannot be fetched now: {exc}"
                with self._flights_lock:
                    self._failed = (time.monotonic() + RETRY_AFTER, message)
                flight.set_exception(DocumentsUnavailable(message, delay=RETRY_AFTER))
            else:
                flight.set_result(None)
            with self._flights_lock:
                for tree in batch:
                    if self._flights.get(tree) is flight:
                        del self._flights[tree]
                if not self._queued:
                    self._fetching -= 1
                    return
                batch, flight = self._queued, self._next
                self._queued, self._next = [], None

    def summary(self, cluster: str, commit_id: str) -> dict[str, Any]:
        """What the view reads of ``commit_id``: the summary its message carries (a document
        with a subset of the fields), else its document. Raises what :meth:`document` does."""
        commit = self._commit(commit_id, f"{STATUS_PREFIX}{cluster}")
        summary = message_summary(_message(commit))
        if summary is None:
            return self.document(cluster, commit_id)
        origin = f"{STATUS_PREFIX}{cluster}@{commit_id[:12]}: {SUMMARY_TRAILER}"
        return _checked(parse_status(summary, origin=origin), cluster, origin)

    def _commit(self, commit_id: str, origin: str) -> bytes:
        recent = self._recent.get(commit_id)
        if recent is not None:
            return recent
        kind, commit = self.odb.read(commit_id)[:2]
        if kind != pygit2.enums.ObjectType.COMMIT or not commit.startswith(b"tree "):
            raise StatusDocumentError(f"{origin}: the branch tip is not a commit")
        return bytes(commit)

    def _fetch_objects(self, wanted: list[str], *, timeout: float = 120.0) -> None:
        """Fetch objects by id (protocol v2: any object the server holds). Raises
        GitTransportError."""
        if not fetch_v2.supported(self.url):
            raise GitTransportError(f"{self.url}: cannot fetch {wanted[0]} (protocol v2 only)")
        try:
            with fetch_v2.Session(
                self.url, credentials=self.credentials, timeout=timeout
            ) as session:
                self._keep(*session.fetch_pack(wanted, []))
        except fetch_v2.NotProtocolV2 as exc:
            raise GitTransportError(f"{self.url}: cannot fetch {wanted[0]}: {exc}") from exc

    def read(self, cluster: str, tip: str, known: ClusterView | None) -> ClusterView:
        """The view of one moved branch; a bad document gives a view with ``error`` set (and
        the last good summary, if any)."""
        base = ClusterView(name=cluster, shard=self.index, tip=tip)
        if known is not None:
            base = replace(known, tip=tip, error=None)
        refused = self._refused.get(cluster)
        if refused is not None:
            return replace(base, error=refused)
        try:
            doc = self.summary(cluster, tip)
        except (pygit2.GitError, KeyError, ValueError, GitTransportError) as exc:
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


def _message(commit: bytes) -> bytes:
    """A raw commit's message (after its headers)."""
    at = commit.find(b"\n\n")
    return commit[at + 2 :] if at >= 0 else b""


def _checked(doc: dict[str, Any], cluster: str, origin: str) -> dict[str, Any]:
    if doc["cluster"] != cluster:
        raise StatusDocumentError(
            f"{origin}: cluster: expected {cluster!r}, got {doc['cluster']!r}"
        )
    return doc


def _read_document(odb: Any, cluster: str, tree_id: str, origin: str) -> dict[str, Any]:
    """The checked ``status.json`` of tree ``tree_id`` in ``odb``. Raises StatusDocumentError,
    KeyError, pygit2.GitError."""
    tree = odb.read(tree_id)[1]
    entry = _tree_entry(tree, STATUS_FILE.encode())
    if entry is None:
        raise StatusDocumentError(f"{origin}: no such file on the branch")
    kind, data = odb.read(entry.hex())[:2]
    if kind != pygit2.enums.ObjectType.BLOB:
        raise StatusDocumentError(f"{origin}: {STATUS_FILE} is not a file")
    return _checked(parse_status(data, origin=origin), cluster, origin)


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


def cold_refresh(
    index: int, url: str, path: Path, credentials: tuple[str, str] | None
) -> tuple[dict[str, str], dict[str, ClusterView]] | str:
    """:meth:`_Shard.refresh` of a shard known nothing of, in a worker process; the error
    message instead of raising (exceptions of our own do not always cross processes)."""
    try:
        return StatusShard(index, url, path, credentials).refresh({}, credentials)
    except (GitTransportError, StatusCacheError) as exc:
        return str(exc)


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
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
