"""The agent's own branch ``fleetlet/clusters/<cluster>`` in the desired-state repository.

:meth:`BranchWatcher.poll` is the idle poll: ONE ref listing, no fetch, no object transferred.
By default it asks a git:// or http(s):// server for this one branch only (a protocol v2
``ls-refs`` with ``ref-prefix``, :mod:`agent.source.lsrefs`); otherwise (``protocol_v2=False``,
ssh, v0-only servers) it is libgit2's listing (pygit2 ``Remote.list_heads``), which carries
every branch of the repository. :meth:`BranchWatcher.fetch` fetches only this cluster's branch,
with an explicit refspec and no tags, into a local bare repository under ``cache_dir``, and
reads the publication's files from the commit's tree (no work tree). Other clusters' branches
are never fetched: their refs and objects never reach the local repository.

libgit2's connect and I/O timeouts are process-wide settings; the watcher sets them when it
is created (so a git server that accepts but never answers cannot stall the agent), and so is
the number of pack files libgit2 keeps open: each fetch adds a pack file, and without a bound
every publication ever received would hold a file descriptor. The local repository is a cache
of this one branch: after ``recycle_packs`` fetches it is made anew, so it does not grow with
the fleet's history either.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pygit2

from agent.errors import PermanentError
from agent.source.content import LocalStorageError
from agent.source.credentials import (
    GitAuthError,
    GitCallbacks,
    GitCredentials,
)
from agent.source.lsrefs import GitUnavailableError, NotProtocolV2, ls_ref_v2
from agent.verify.publication import BRANCH_FILES

__all__ = [
    "BRANCH_FILES",
    "BranchContentError",
    "BranchNotFoundError",
    "BranchWatcher",
    "FetchTooLargeError",
    "GitAuthError",
    "GitUnavailableError",
    "NotProtocolV2",
    "branch_ref",
    "ls_ref_v2",
]

BRANCH_PREFIX = "refs/heads/fleetlet/clusters/"
_LOCAL_STORAGE_MESSAGES = ("no space left", "read-only file system", "disk quota exceeded")
MAX_OPEN_PACKS = 16
"""Pack files libgit2 keeps open at once (process-wide; its default is unbounded)."""
TRACKING_PREFIX = "refs/remotes/origin/fleetlet/clusters/"
_REMOTE = "origin"


class BranchNotFoundError(PermanentError):
    """This cluster's branch does not exist on the server (not published yet, or deleted)."""

    reason = "BranchNotFound"


class BranchContentError(PermanentError):
    """The branch's commit lacks a publication file, or has a directory in its place."""

    reason = "BranchContentInvalid"


class FetchTooLargeError(PermanentError):
    """The server sent more bytes than the watcher accepts for one branch."""

    reason = "FetchTooLarge"


def branch_ref(cluster: str) -> str:
    """``refs/heads/fleetlet/clusters/<cluster>``.

    Raises ValueError if ``cluster`` cannot be one ref component (empty, ``/``, ``..``...).
    """
    ref = BRANCH_PREFIX + cluster
    if not cluster or "/" in cluster or not pygit2.reference_is_valid_name(ref):
        raise ValueError(f"cluster name {cluster!r} is not a valid git branch component")
    return ref


class BranchWatcher:
    """Polls and fetches one cluster's branch of ``repo_url`` into ``cache_dir/branch.git``."""

    def __init__(
        self,
        *,
        repo_url: str,
        cluster: str,
        cache_dir: Path,
        credentials: GitCredentials | None = None,
        connect_timeout: float = 10.0,
        io_timeout: float = 30.0,
        max_fetch_bytes: int = 64 * 1024 * 1024,
        protocol_v2: bool = True,
        recycle_packs: int = 64,
    ) -> None:
        """``protocol_v2``: poll git:// and http(s):// servers with a protocol v2 ``ls-refs``
        asking for this one ref (see :func:`ls_ref_v2`) instead of libgit2's full listing;
        servers that do not speak v2, and other schemes, get the libgit2 listing.

        Raises ValueError for an invalid cluster name; opens (or creates) the local repo.
        """
        self.repo_url = repo_url
        self.cluster = cluster
        self.ref = branch_ref(cluster)
        self.tracking_ref = TRACKING_PREFIX + cluster
        self.refspec = f"+{self.ref}:{self.tracking_ref}"
        self.path = Path(cache_dir) / "branch.git"
        self._credentials = credentials
        self._max_fetch_bytes = max_fetch_bytes
        self._protocol_v2 = protocol_v2
        self._connect_timeout = connect_timeout
        self._io_timeout = io_timeout
        self._lock = threading.Lock()
        self.polls = 0  # ref listings made (metrics, tests)
        self.fetches = 0  # network fetches made
        self._recycle_packs = recycle_packs
        pygit2.settings.server_connect_timeout = int(connect_timeout * 1000)
        pygit2.settings.server_timeout = int(io_timeout * 1000)
        pygit2.settings.mwindow_file_limit = MAX_OPEN_PACKS
        self._repo = self._open()

    def _open(self) -> pygit2.Repository:
        try:
            repo = self._open_or_init()
        except pygit2.GitError:
            # The cache is disposable: a repository broken by a crash is made again.
            shutil.rmtree(self.path, ignore_errors=True)
            repo = self._open_or_init()
        # Tracking refs of another cluster (the cache directory was reused after a rename)
        # are dropped: this repository only ever holds this cluster's branch.
        for name in list(repo.references):
            if name != self.tracking_ref:
                repo.references.delete(name)
        return repo

    def _open_or_init(self) -> pygit2.Repository:
        if (self.path / "HEAD").exists():
            repo = pygit2.Repository(str(self.path))
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            repo = pygit2.init_repository(str(self.path), bare=True)
        # A named remote whose only refspec is this branch, without tags: what ``git fetch``
        # in this directory would do too (handy when debugging on a node).
        if _REMOTE not in repo.remotes.names():
            repo.remotes.create(_REMOTE, self.repo_url, self.refspec)
        wanted = {
            f"remote.{_REMOTE}.url": self.repo_url,
            f"remote.{_REMOTE}.fetch": self.refspec,
            f"remote.{_REMOTE}.tagopt": "--no-tags",
        }
        config = repo.config
        for key, value in wanted.items():
            if key not in config or config[key] != value:
                config[key] = value
        return repo

    def _remote(self) -> pygit2.Remote:
        # A fresh Remote object per operation: libgit2 keeps transport state in each one.
        return self._repo.remotes[_REMOTE]

    def _callbacks(self) -> GitCallbacks:
        return GitCallbacks(
            self._credentials, max_bytes=self._max_fetch_bytes, too_large=FetchTooLargeError
        )

    def poll(self) -> str | None:
        """The commit id at the tip of this cluster's branch on the server, or None if the
        branch does not exist. One ref listing; nothing is fetched.

        Raises GitUnavailableError (temporary), GitAuthError (permanent).
        """
        with self._lock:
            self.polls += 1
            if self._protocol_v2:
                try:
                    return ls_ref_v2(
                        self.repo_url,
                        self.ref,
                        self._credentials,
                        connect_timeout=self._connect_timeout,
                        io_timeout=self._io_timeout,
                    )
                except NotProtocolV2:
                    pass
            try:
                return _advertised(self._remote(), self.ref, self._callbacks())
            except pygit2.GitError as exc:
                raise self._convert(exc, "list the branches of") from exc

    def local_commit(self) -> str | None:
        """The commit of this branch as of the last fetch, or None before the first."""
        ref = self._repo.references.get(self.tracking_ref)
        return str(ref.target) if ref is not None else None

    def fetch(self, commit: str) -> dict[str, bytes]:
        """The publication files (:data:`BRANCH_FILES`) at ``commit`` of this cluster's branch.

        No network call if ``commit`` was already fetched; otherwise fetches this branch only.
        Raises GitUnavailableError (temporary; also when the branch moved past ``commit`` and
        ``commit`` is no longer on it), GitAuthError, BranchNotFoundError, BranchContentError,
        FetchTooLargeError (permanent), ValueError if ``commit`` is not a full hex commit id.
        """
        oid = _commit_id(commit)
        with self._lock:
            found = self._commit(oid)
            if found is None:
                self._fetch()
                if self._repo.references.get(self.tracking_ref) is None:
                    raise BranchNotFoundError(
                        f"{self.repo_url}: branch {self.ref} does not exist on the server"
                    )
                found = self._commit(oid)
            if found is None:
                raise GitUnavailableError(
                    f"{self.repo_url}: commit {commit} is no longer on {self.ref} "
                    f"(the branch moved to {self.local_commit()}); poll again",
                    delay=0.0,
                )
            return self._files(found)

    def _commit(self, oid: pygit2.Oid) -> pygit2.Commit | None:
        try:
            obj = self._repo.get(oid)
        except (ValueError, KeyError, pygit2.GitError):
            return None
        if obj is None:
            return None
        if not isinstance(obj, pygit2.Commit):
            raise BranchContentError(f"{oid} is a {type(obj).__name__}, not a commit")
        return obj

    def _fetch(self) -> None:
        if self._packs() >= self._recycle_packs:
            # Only the branch's tip matters: start the cache anew rather than keep every pack.
            self._repo.free()
            shutil.rmtree(self.path, ignore_errors=True)
            self._repo = self._open()
        self.fetches += 1
        try:
            self._remote().fetch([self.refspec], callbacks=self._callbacks())
        except pygit2.GitError as exc:
            raise self._convert(exc, f"fetch {self.ref} from") from exc

    def _packs(self) -> int:
        try:
            return sum(1 for p in (self.path / "objects" / "pack").iterdir() if p.suffix == ".pack")
        except OSError:
            return 0

    def _files(self, commit: pygit2.Commit) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        tree = commit.tree
        for name in BRANCH_FILES:
            try:
                entry = tree[name]
            except KeyError:
                raise BranchContentError(
                    f"{self.ref}@{commit.id}: the publication file {name} is missing"
                ) from None
            blob = self._repo.get(entry.id)
            if not isinstance(blob, pygit2.Blob):
                raise BranchContentError(f"{self.ref}@{commit.id}: {name} is not a file")
            files[name] = bytes(blob.data)
        return files

    def _convert(self, exc: pygit2.GitError, doing: str) -> Exception:
        text = str(exc)
        lowered = text.lower()
        if "401" in text or "403" in text or "authentication" in lowered:
            return GitAuthError(f"{self.repo_url}: cannot {doing} the repository: {text}")
        if any(m in lowered for m in _LOCAL_STORAGE_MESSAGES):
            # libgit2 could not write the fetched objects here: our disk, not the server.
            return LocalStorageError(
                f"cannot {doing} the repository into {self.path}: {text}", source=self.repo_url
            )
        return GitUnavailableError(f"{self.repo_url}: cannot {doing} the repository: {text}")


def _advertised(remote: pygit2.Remote, ref: str, callbacks: GitCallbacks) -> str | None:
    """The commit the server advertises for ``ref`` (one connection, the ref listing only).

    ``Remote.list_heads`` turns every advertised ref into Python objects: with thousands of
    cluster branches that is most of the client's CPU per poll. The same libgit2 listing
    (``git_remote_ls``) is scanned here in place, through pygit2's own cffi handle; if that
    handle is not there (another pygit2), ``list_heads`` does the same job, only slower.
    Raises pygit2.GitError and whatever ``callbacks`` raise.
    """
    try:
        from pygit2 import C, ffi
        from pygit2.errors import check_error

        handle = remote._remote
    except (ImportError, AttributeError):  # pragma: no cover - depends on the pygit2 build
        heads = remote.list_heads(callbacks=callbacks)
        return next((str(h.oid) for h in heads if h.name == ref), None)
    remote.connect(callbacks=callbacks)
    heads_ptr = ffi.new("git_remote_head ***")
    size_ptr = ffi.new("size_t *")
    check_error(C.git_remote_ls(heads_ptr, size_ptr, handle))
    wanted = ref.encode()
    heads = heads_ptr[0]
    for i in range(int(size_ptr[0])):
        # The listing stays valid while ``remote`` (connected, referenced here) lives.
        head = heads[i]
        if head.name != ffi.NULL and ffi.string(head.name) == wanted:
            return bytes(ffi.buffer(head.oid.id)[:]).hex()
    return None


def _commit_id(commit: str) -> pygit2.Oid:
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        raise ValueError(f"{commit!r} is not a full commit id (40 lowercase hex digits)")
    return pygit2.Oid(hex=commit)
