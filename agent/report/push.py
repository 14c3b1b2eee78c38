"""Push the cluster's status document to ``fleetlet/status/<cluster>`` (no work tree).

:class:`StatusPusher` keeps the LATEST document, in memory and in ``<workdir>/status.json``, and
pushes it as ``status.json`` in a commit on top of the branch's remote tip (a fast-forward, so
a concurrent writer is detected, never overwritten): after each change, and as a heartbeat
every ``heartbeat_interval`` seconds otherwise. While the git server is unreachable the latest
document stays pending (also across restarts) and is pushed when the server is back; between
two failed pushes :meth:`StatusPusher.tick` waits a backoff that doubles, with jitter (each push
is bounded by the connection and read timeouts), so a hung git server costs the agent's work
one timeout per backoff, not one per tick.

Nothing older overwrites newer: every document carries a ``sequence`` that grows by one per
document written, and before pushing the remote document is read; if its sequence is not lower
than ours the push is refused with :class:`StatusSupersededError`. After a push of its own the
pusher builds the next commit on it without fetching (the push names it as the branch's old
value, so the server refuses it if anyone else wrote since: then it fetches and reads the
remote document as above). One exception: a pusher whose
workdir held no state (a new pod, a lost volume) continues from the remote's sequence, since
what it observes now is newer than anything pushed before.

Beside it, each commit carries ``cluster.json`` (:mod:`agent.api.facts`): the cluster facts the
agent's renders used and the bundles it runs, given to :meth:`StatusPusher.update`, so that
``hub diff`` renders as the agent does. It is kept apart so that the hub's status aggregation,
which parses every cluster's ``status.json``, reads no more bytes. Its blob is the same object
while the facts do not change, so it only travels when they do; until the agent gives facts
(after a restart, before its first render) the tip's ``cluster.json`` is carried over.

Each commit's message carries the document's summary (:func:`agent.api.status.status_summary`),
which a hub aggregating a large fleet reads instead of the document.

The local bare repository under ``workdir`` only ever fetches this cluster's status branch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pygit2

from agent.api.facts import (
    FACTS_FILE,
    ReportedFacts,
    dump_reported_facts,
    load_reported_facts,
)
from agent.api.status import (
    SCHEMA_VERSION,
    STATUS_FILE,
    ClusterStatus,
    bound_status,
    dump_status,
    load_status,
    status_branch,
    status_to_dict,
    summary_message,
)
from agent.backoff import attempts, pause
from agent.errors import PermanentError, ValidationError
from agent.source.credentials import GitAuthError, GitCallbacks, GitCredentials
from agent.source.lsrefs import GitUnavailableError

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agent.report.metrics import Metrics

__all__ = [
    "GitAuthError",
    "GitUnavailableError",
    "PushResult",
    "StatusPusher",
    "StatusSupersededError",
]

DEFAULT_HEARTBEAT_INTERVAL = 60.0
# Attempts when the branch moves between our fetch and our push (another writer).
PUSH_ATTEMPTS = 5
_AUTHOR = ("fleetlet-agent", "agent@fleetlet.invalid")
_STATE_FILE = "pushed.json"
# The local repository gains a commit, a tree and a blob per push; it is made anew (it is a
# cache: fetches are shallow, one commit deep) after this many pushes, to bound its size.
DEFAULT_RECYCLE_EVERY = 200


class StatusSupersededError(PermanentError):
    """The remote status document is as new as ours or newer: ours is not pushed."""

    reason = "StatusSuperseded"


@dataclass(frozen=True, kw_only=True, slots=True)
class PushResult:
    """A successful push: the commit now at the branch tip and the document's sequence."""

    commit: str
    sequence: int
    heartbeat: datetime


class _PushCallbacks(GitCallbacks):
    """One-shot credentials, plus the server's verdict on each pushed reference."""

    def __init__(self, credentials: GitCredentials | None) -> None:
        super().__init__(credentials)
        self.rejected: str | None = None

    def push_update_reference(self, refname: str, message: str | None) -> None:
        # push() can return normally although the server refused: this is the only sign.
        if message:
            self.rejected = f"{refname}: {message}"


def _content_key(s: ClusterStatus) -> bytes:
    """The document's bytes without what every new document changes (time, sequence)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return dump_status(dataclasses.replace(s, heartbeat=epoch, sequence=0))


def _utc(now: float) -> datetime:
    return datetime.fromtimestamp(int(now), tz=UTC)


class StatusPusher:
    """Keeps the latest status document of ``cluster`` and pushes it to its status branch.

    ``update()`` records a new document when its content changed; ``should_push(now)`` says
    whether a push is due (a pending document, or the heartbeat); ``push(now)`` pushes;
    ``tick(now)`` does both. Thread-safe. The document's ``heartbeat`` and ``sequence`` are
    set here (what the caller puts there is ignored); it is bounded with ``bound_status``.
    ``metrics``, when given, counts pushes that succeeded and failed.
    ``formats`` (the formats this agent can render) are written into every document that
    names none: they are the agent's, not any one reconcile's.
    """

    def __init__(
        self,
        *,
        repo_url: str,
        cluster: str,
        credentials: GitCredentials | None,
        workdir: Path,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        max_bytes: int | None = None,
        connect_timeout: float = 10.0,
        io_timeout: float = 30.0,
        recycle_every: int = DEFAULT_RECYCLE_EVERY,
        retry_backoff: float | None = None,
        max_backoff: float = 300.0,
        rng: Callable[[], float] = random.random,
        metrics: Metrics | None = None,
        formats: Sequence[str] = (),
    ) -> None:
        """``retry_backoff``: the wait after a failed push before :meth:`tick` tries again
        (default: the heartbeat interval, at most 10 s), doubling up to ``max_backoff``; half
        of each wait is drawn at random."""
        self.repo_url = repo_url
        self._metrics = metrics
        self.formats = tuple(sorted(set(formats)))
        self.cluster = cluster
        self.branch = status_branch(cluster)
        self.ref = "refs/heads/" + self.branch
        self.tracking_ref = "refs/remotes/origin/" + self.branch
        self.heartbeat_interval = heartbeat_interval
        self.workdir = Path(workdir)
        self._credentials = credentials
        self._recycle_every = recycle_every
        self._bound: dict[str, Any] = {} if max_bytes is None else {"max_bytes": max_bytes}
        self._lock = threading.RLock()
        self.pushes = 0  # successful pushes (metrics, tests)
        self.retries = 0  # attempts made again because the branch moved (another writer)
        self.last_error: Exception | None = None
        self.attempts = 0  # pushes tried (metrics, tests)
        self.failures = 0  # failed pushes in a row
        self.retry_at: float | None = None
        """No push from :meth:`tick` before this time (after a failure)."""
        self._retry_backoff = (
            retry_backoff if retry_backoff is not None else min(heartbeat_interval, 10.0)
        )
        self._max_backoff = max(max_backoff, self._retry_backoff)
        self._rng = rng
        # libgit2's timeouts are process-wide (see agent.source.branch).
        pygit2.settings.server_connect_timeout = int(connect_timeout * 1000)
        pygit2.settings.server_timeout = int(io_timeout * 1000)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._repo = self._open_repo()
        self._latest: ClusterStatus | None = None
        self.amend: Callable[[ClusterStatus], ClusterStatus] | None = None
        """Changes every document before it is kept (``agent run``: the agent entry's report,
        :mod:`agent.upgrade.process`)."""
        self._facts: bytes | None = None
        """``cluster.json`` as last given (None: none given yet: the remote's is kept)."""
        self._pushed_sequence = 0
        self._pushed_at: float | None = None
        self._fresh = True
        self._own_tip: pygit2.Oid | None = None
        """The commit this pusher pushed last (None: not known to be the remote's tip)."""
        self._load_state()

    # --- local state --------------------------------------------------------------------

    @property
    def latest(self) -> ClusterStatus | None:
        """The latest document (pushed or pending)."""
        return self._latest

    @property
    def pending(self) -> bool:
        """Whether the latest document has not reached the server yet."""
        return self._latest is not None and self._latest.sequence > self._pushed_sequence

    def _open_repo(self, *, anew: bool = False) -> pygit2.Repository:
        path = self.workdir / "status.git"
        if not anew:
            try:
                return pygit2.Repository(str(path))
            except pygit2.GitError:
                pass
        # A disposable cache: anything there that is not a repository is made anew.
        shutil.rmtree(path, ignore_errors=True)
        return pygit2.init_repository(str(path), bare=True)

    def resume(self) -> None:
        """This agent acts again after another one wrote the branch (an agent upgrade's
        hand-over or roll-back, :mod:`agent.upgrade.process`): the next push continues after
        the remote's sequence instead of refusing to go back."""
        with self._lock:
            self._load_state()
            self._fresh = True
            self._own_tip = None

    def _load_state(self) -> None:
        doc_path = self.workdir / STATUS_FILE
        state_path = self.workdir / _STATE_FILE
        self._facts = self._load_facts()
        try:
            self._latest = load_status(doc_path.read_bytes(), origin=str(doc_path))
        except FileNotFoundError:
            return
        except ValidationError:
            # A damaged local copy is dropped: the next update() writes a new document.
            return
        if self._latest.cluster != self.cluster:
            self._latest = None
            return
        self._fresh = False
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
            self._pushed_sequence = int(state["sequence"])
            self._pushed_at = float(state["at"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            pass

    def _load_facts(self) -> bytes | None:
        """The local ``cluster.json`` when it is this cluster's and readable, else None."""
        path = self.workdir / FACTS_FILE
        try:
            data = path.read_bytes()
            if load_reported_facts(data, origin=str(path)).cluster == self.cluster:
                return data
        except (OSError, ValidationError):
            pass
        return None

    def _write(self, name: str, data: bytes) -> None:
        path = self.workdir / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as exc:
            # The local copy only serves a restart: the document stays in memory and is pushed.
            _log.warning("status: cannot keep %s on local storage: %s", path, exc)

    def _stamp(self, s: ClusterStatus, now: float, *, sequence: int) -> ClusterStatus:
        """``s`` written anew (time, sequence), bounded, kept as the latest, saved."""
        stamped = bound_status(
            dataclasses.replace(s, heartbeat=_utc(now), sequence=sequence), **self._bound
        )
        self._latest = stamped
        self._write(STATUS_FILE, dump_status(stamped))
        return stamped

    def update(
        self,
        status: ClusterStatus,
        *,
        now: float | None = None,
        facts: ReportedFacts | None = None,
    ) -> bool:
        """Record ``status`` as the latest document if its content (or ``facts``, written as
        ``cluster.json``; None: unchanged) changed; return whether.

        Raises ValueError if ``status`` or ``facts`` is for another cluster.
        """
        if status.cluster != self.cluster:
            raise ValueError(f"status of cluster {status.cluster!r} given to {self.cluster!r}")
        if facts is not None and facts.cluster != self.cluster:
            raise ValueError(f"facts of cluster {facts.cluster!r} given to {self.cluster!r}")
        now = time.time() if now is None else now
        with self._lock:
            new_facts = dump_reported_facts(facts) if facts is not None else None
            facts_changed = new_facts is not None and new_facts != self._facts
            if facts_changed:
                self._facts = new_facts
                self._write(FACTS_FILE, new_facts or b"")
            # ``truncated`` is ours to say (after bounding), not the caller's.
            status = dataclasses.replace(status, truncated=False)
            if self.amend is not None:
                status = self.amend(status)
            if self.formats and not status.formats:
                status = dataclasses.replace(
                    status, formats=self.formats, schema_version=SCHEMA_VERSION
                )
            candidate = bound_status(status, **self._bound)
            if (
                not facts_changed
                and self._latest is not None
                and _content_key(candidate) == _content_key(self._latest)
            ):
                return False
            sequence = self._latest.sequence + 1 if self._latest is not None else 1
            self._stamp(candidate, now, sequence=sequence)
            return True

    def should_push(self, now: float | None = None) -> bool:
        """Whether a push is due: the latest document is pending, or the heartbeat is due."""
        now = time.time() if now is None else now
        with self._lock:
            if self._latest is None:
                return False
            if self.pending or self._pushed_at is None:
                return True
            return now - self._pushed_at >= self.heartbeat_interval

    def tick(self, now: float | None = None) -> PushResult | None:
        """Push if due (see :meth:`should_push`) and no backoff runs after a failed push; the
        result, or ``None`` when not due.

        Raises what :meth:`push` raises (the document stays pending).
        """
        now = time.time() if now is None else now
        with self._lock:
            if not self.should_push(now):
                return None
            if self.retry_at is not None and now < self.retry_at:
                return None
            return self.push(now=now)

    # --- pushing ------------------------------------------------------------------------

    def push(self, *, now: float | None = None) -> PushResult:
        """Push the latest document now (a heartbeat if nothing changed).

        Raises GitUnavailableError (temporary: the server is unreachable or the branch kept
        moving; the document stays pending), GitAuthError (credentials refused),
        StatusSupersededError (the remote document is as new or newer), ValueError if no
        document was given yet.
        """
        now = time.time() if now is None else now
        with self._lock:
            if self._latest is None:
                raise ValueError("no status document to push yet (call update() first)")
            doc = self._latest
            if not self.pending or now - doc.heartbeat.timestamp() >= self.heartbeat_interval:
                # A heartbeat, or a document kept through an outage: written again, now.
                doc = self._stamp(doc, now, sequence=doc.sequence + 1)
            self.attempts += 1
            began = time.monotonic()
            try:
                result = self._push(doc, now)
            except Exception as exc:
                self.last_error = exc
                if self._metrics is not None:
                    self._metrics.status_pushed(ok=False)
                self.failures += 1
                # From when the failure was known: a push that hung for its timeout must not
                # leave a backoff that is already over.
                waited = time.monotonic() - began
                wait = waited + pause(
                    self.failures,
                    initial=self._retry_backoff,
                    maximum=self._max_backoff,
                    rng=self._rng,
                )
                self.retry_at = now + wait
                raise
            if self._metrics is not None:
                self._metrics.status_pushed(ok=True)
            self.last_error = None
            self.failures = 0
            self.retry_at = None
            self._fresh = False
            self._pushed_sequence = result.sequence
            self._pushed_at = now
            self._write(
                _STATE_FILE,
                json.dumps(
                    {"sequence": result.sequence, "at": now, "commit": result.commit}
                ).encode(),
            )
            self.pushes += 1
            if self._recycle_every > 0 and self.pushes % self._recycle_every == 0:
                self._repo = self._open_repo(anew=True)
                self._own_tip = None
            return result

    def _push(self, doc: ClusterStatus, now: float) -> PushResult:
        last = ""
        # Another writer moved the branch between our fetch and our push: fetch again, after a
        # short backoff with jitter (two writers do not collide again in step). The first
        # attempt builds on the commit we pushed last, without a fetch: the push names it as
        # the branch's old value, so the server refuses it (and we fetch) if anyone else
        # wrote since; what is pushed is never built on anything but the remote's tip.
        for attempt in attempts(PUSH_ATTEMPTS, initial=0.05, maximum=1.0):
            if attempt:
                self.retries += 1
            own, self._own_tip = self._own_tip, None
            tip = own if own is not None and not attempt else self._fetch()
            remote_sequence = self._remote_sequence(tip)
            if remote_sequence is not None and remote_sequence >= doc.sequence:
                if not self._fresh:
                    raise StatusSupersededError(
                        f"{self.repo_url} {self.branch}: the remote status has sequence "
                        f"{remote_sequence}, not older than ours ({doc.sequence}); not pushed"
                    )
                # A new workdir: continue after what was pushed before.
                doc = self._stamp(doc, now, sequence=remote_sequence + 1)
            commit = self._commit(doc, tip, now)
            callbacks = _PushCallbacks(self._credentials)
            try:
                self._remote().push([f"{self.ref}:{self.ref}"], callbacks=callbacks)
            except pygit2.GitError as exc:
                # Also how libgit2 reports a tip that moved since our fetch (non-fast-forward).
                last = str(exc)
                continue
            if callbacks.rejected is None:
                self._own_tip = commit
                return PushResult(
                    commit=str(commit), sequence=doc.sequence, heartbeat=doc.heartbeat
                )
            last = callbacks.rejected
        raise GitUnavailableError(
            f"{self.repo_url}: cannot push {self.branch} after {PUSH_ATTEMPTS} attempts: {last}"
        )

    def _remote(self) -> pygit2.Remote:
        return self._repo.remotes.create_anonymous(self.repo_url)

    def _fetch(self) -> pygit2.Oid | None:
        """Fetch this branch only; its tip, or ``None`` when the branch does not exist."""
        try:
            self._remote().fetch(
                [f"+{self.ref}:{self.tracking_ref}"],
                callbacks=GitCallbacks(self._credentials),
                prune=pygit2.enums.FetchPrune.PRUNE,
                # Only the tip is needed (its sequence, and the parent of our commit).
                depth=1,
            )
        except pygit2.GitError as exc:
            text = str(exc)
            if "401" in text or "403" in text or "authentication" in text.lower():
                raise GitAuthError(f"{self.repo_url}: cannot fetch {self.branch}: {text}") from exc
            raise GitUnavailableError(
                f"{self.repo_url}: cannot fetch {self.branch}: {text}"
            ) from exc
        ref = self._repo.references.get(self.tracking_ref)
        target = ref.target if ref is not None else None
        return target if isinstance(target, pygit2.Oid) else None

    def _remote_sequence(self, tip: pygit2.Oid | None) -> int | None:
        """The sequence of the remote document, or ``None`` (no branch, or unreadable)."""
        if tip is None:
            return None
        try:
            commit = self._repo[tip]
            blob = (
                self._repo[commit.tree[STATUS_FILE].id]
                if isinstance(commit, pygit2.Commit)
                else None
            )
            if not isinstance(blob, pygit2.Blob):
                return None
            return load_status(bytes(blob.data), origin=f"{self.branch}@{tip}").sequence
        except (KeyError, ValueError, AttributeError, pygit2.GitError, ValidationError):
            # Not a status document we can read: ours replaces it.
            return None

    def _commit(self, doc: ClusterStatus, tip: pygit2.Oid | None, now: float) -> pygit2.Oid:
        repo = self._repo
        blob = repo.create_blob(dump_status(doc))
        builder = repo.TreeBuilder()
        builder.insert(STATUS_FILE, blob, pygit2.GIT_FILEMODE_BLOB)
        facts = self._facts_blob(tip)
        if facts is not None:
            builder.insert(FACTS_FILE, facts, pygit2.GIT_FILEMODE_BLOB)
        tree = builder.write()
        signature = pygit2.Signature(*_AUTHOR, int(now), 0)
        commit = repo.create_commit(
            None,
            signature,
            signature,
            summary_message(status_to_dict(doc)),
            tree,
            [tip] if tip is not None else [],
        )
        repo.references.create(self.ref, commit, force=True)
        return commit

    def _facts_blob(self, tip: pygit2.Oid | None) -> pygit2.Oid | None:
        """``cluster.json``: as last given, else the tip's (kept), else none."""
        if self._facts is not None:
            return self._repo.create_blob(self._facts)
        if tip is None:
            return None
        try:
            commit = self._repo[tip]
            if isinstance(commit, pygit2.Commit):
                entry = commit.tree[FACTS_FILE]
                if entry.filemode == pygit2.GIT_FILEMODE_BLOB:
                    return entry.id
        except (KeyError, pygit2.GitError):
            pass
        return None
