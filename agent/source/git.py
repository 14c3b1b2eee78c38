"""git sources: fetch a pinned commit into a bare cache repository and take one directory.

One bare repository per URI (under ``repos_dir``) keeps what was fetched: a commit already in
it costs no network call. Otherwise the remote's branches and tags are fetched (servers do not
generally serve unadvertised commits) and the commit must then be present. The directory is
written out of the commit's tree without a work tree, with the same rules as archives: names
that could escape (``..``, ``/``, ``.git``), entries named twice, NULs in link targets and
symlinks leaving the tree are refused, file count and sizes are capped, submodules are skipped.
Timeouts are libgit2's process-wide server timeouts; a fetch is bounded in bytes through the
transfer-progress callback.
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pygit2

from agent.source.archive import ArchiveLimits, TreeBudget, UnsafeArchiveError
from agent.source.content import (
    AuthenticationError,
    ContentRefusedError,
    Credentials,
    FetchError,
    InvalidSourceError,
    LocalStorageError,
    check_commit,
    url_host,
)
from agent.source.tree import NAME_MAX, LinkEscapeError, resolve_inside

_FILE_MODES = (pygit2.GIT_FILEMODE_BLOB, pygit2.GIT_FILEMODE_BLOB_EXECUTABLE)
_T = TypeVar("_T")
_REFSPECS = ["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"]


class CommitNotFoundError(FetchError):
    """The pinned commit is not on the remote's branches or tags (not pushed yet, or gone)."""

    reason = "CommitNotFound"


class GitContentError(ContentRefusedError):
    """The commit exists but the source's ``directory`` does not, or is not a directory."""

    reason = "InvalidSource"


@dataclass(frozen=True, kw_only=True)
class GitSettings:
    """Bounds of git sources. Timeouts are in seconds (libgit2 applies them process-wide)."""

    connect_timeout: float = 10.0
    io_timeout: float = 30.0
    max_fetch_bytes: int = 256 * 1024 * 1024
    limits: ArchiveLimits = field(default_factory=ArchiveLimits)


class _Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    """Credentials once (a second request means they were refused) and a byte cap."""

    def __init__(self, credentials: Credentials | None, *, source: str, max_bytes: int) -> None:
        super().__init__()
        self._creds = credentials
        self._source = source
        self._max_bytes = max_bytes
        self._asked = 0

    def credentials(
        self, url: str, username_from_url: str | None, allowed_types: pygit2.enums.CredentialType
    ) -> pygit2.UserPass:
        self._asked += 1
        creds = self._creds
        if creds is None:
            raise AuthenticationError(
                f"git server requires credentials for {url} and the source has none",
                source=self._source,
            )
        if self._asked > 1:
            raise AuthenticationError(
                f"git server refused the credentials for {url}", source=self._source
            )
        if not creds.allows(url_host(url)):
            # A redirect, or a remote elsewhere: the credentials are not for this host.
            raise AuthenticationError(
                f"git server {url_host(url)} asks for credentials; Secret {creds.secret} holds "
                f"them for {', '.join(sorted(creds.hosts))} only: not sent",
                source=self._source,
            )
        if not allowed_types & pygit2.enums.CredentialType.USERPASS_PLAINTEXT:
            raise AuthenticationError(
                f"git server at {url} wants {allowed_types!r}, only user/password is supported",
                source=self._source,
            )
        username = creds.username or username_from_url or "x-access-token"
        password = creds.password if creds.password is not None else (creds.token or "")
        return pygit2.UserPass(username, password)

    def transfer_progress(self, stats: pygit2.remotes.TransferProgress) -> None:
        if stats.received_bytes > self._max_bytes:
            raise ContentRefusedError(
                f"fetch exceeds {self._max_bytes} bytes",
                source=self._source,
                rule="FetchTooLarge",
            )


class GitFetcher:
    """Fetches pinned commits into bare repositories under ``repos_dir``."""

    def __init__(self, *, repos_dir: Path, settings: GitSettings | None = None) -> None:
        self.repos_dir = Path(repos_dir)
        self.settings = settings or GitSettings()
        self.fetches = 0  # network fetches made (for tests and metrics)
        self._lock = threading.Lock()
        pygit2.settings.server_connect_timeout = int(self.settings.connect_timeout * 1000)
        pygit2.settings.server_timeout = int(self.settings.io_timeout * 1000)

    def _repo(self, uri: str) -> pygit2.Repository:
        path = self.repos_dir / (hashlib.sha256(uri.encode()).hexdigest()[:32] + ".git")
        if path.exists():
            return pygit2.Repository(str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        return pygit2.init_repository(str(path), bare=True)

    def fetch(
        self,
        *,
        uri: str,
        commit: str,
        directory: str | None,
        dest: Path,
        credentials: Credentials | None = None,
        source: str | None = None,
    ) -> None:
        """Write ``directory`` (default: the root) of ``commit`` at ``uri`` into ``dest``.

        Raises InvalidSourceError, GitContentError, UnsafeArchiveError (permanent);
        AuthenticationError, CommitNotFoundError, FetchError (temporary).
        """
        label = source or f"git {uri}@{commit}"
        check_commit(commit, source=label)
        subdir = _clean_directory(directory, source=label)
        with self._lock:
            repo = self._repo(uri)
            obj = _lookup(repo, commit)
            if obj is None:
                self._fetch(repo, uri, credentials, label)
                obj = _lookup(repo, commit)
            if obj is None:
                raise CommitNotFoundError(
                    f"commit {commit} is not on any branch or tag of {uri}", source=label
                )
        if not isinstance(obj, pygit2.Commit):
            raise InvalidSourceError(
                f"{commit} is a {type(obj).__name__}, not a commit", source=label, rule="NotACommit"
            )
        tree = obj.tree
        if subdir:
            try:
                entry = tree[subdir]
            except KeyError:
                raise GitContentError(
                    f"directory {subdir!r} does not exist at {commit}",
                    source=label,
                    file=subdir,
                    rule="DirectoryNotFound",
                ) from None
            if not isinstance(entry, pygit2.Tree):
                raise GitContentError(
                    f"{subdir!r} is not a directory at {commit}",
                    source=label,
                    file=subdir,
                    rule="DirectoryNotFound",
                )
            tree = entry
        dest.mkdir(parents=True, exist_ok=True)
        _Writer(repo, dest, source=label, limits=self.settings.limits).write(tree)

    def _fetch(
        self, repo: pygit2.Repository, uri: str, credentials: Credentials | None, label: str
    ) -> None:
        callbacks = _Callbacks(credentials, source=label, max_bytes=self.settings.max_fetch_bytes)
        remote = repo.remotes.create_anonymous(uri)
        self.fetches += 1
        try:
            remote.fetch(_REFSPECS, callbacks=callbacks)
        except pygit2.GitError as exc:
            text = str(exc)
            if "401" in text or "authentication" in text.lower():
                raise AuthenticationError(
                    f"git server refused access: {text}", source=label
                ) from exc
            raise FetchError(f"git fetch from {uri} failed: {text}", source=label) from exc


def _lookup(repo: pygit2.Repository, commit: str) -> pygit2.Object | None:
    try:
        return repo.get(commit)
    except (ValueError, KeyError):
        return None


def _clean_directory(directory: str | None, *, source: str) -> str:
    if not directory or directory in (".", "/"):
        return ""
    parts = [p for p in directory.split("/") if p not in ("", ".")]
    if directory.startswith("/") or ".." in parts or "\\" in directory:
        raise InvalidSourceError(
            f"directory {directory!r} must be a relative path inside the repository",
            source=source,
            rule="PathTraversal",
        )
    return "/".join(parts)


class _Writer:
    """Writes a git tree to disk with the archive rules, under one budget.

    A git tree object is input like any other: it may name an entry twice, hold a file and a
    directory of one name, a NUL in a link target or names no file system takes. Each is
    refused as content (UnsafeArchiveError); only a failure of our own disk is temporary.
    """

    def __init__(
        self, repo: pygit2.Repository, dest: Path, *, source: str, limits: ArchiveLimits
    ) -> None:
        self.repo = repo
        self.dest = dest
        self.source = source
        self.limits = limits
        self.budget = TreeBudget(limits)

    def refuse(self, message: str, *, path: str, rule: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(message, source=self.source, file=path, rule=rule)

    def write(self, tree: pygit2.Tree) -> None:
        """Write ``tree`` into ``dest``, then judge its links on the whole tree.

        Raises UnsafeArchiveError; FetchError when our own disk fails.
        """
        try:
            self.tree(tree, "")
        except OSError as exc:
            if exc.errno in (errno.ENAMETOOLONG, errno.EEXIST, errno.ELOOP, errno.ENOTDIR):
                raise self.refuse(
                    f"cannot be written: {exc.strerror}",
                    path=os.fsdecode(exc.filename or "")[-200:],
                    rule="BadName",
                ) from exc
            raise LocalStorageError.of(exc, doing="write the tree", source=self.source) from exc
        except pygit2.GitError as exc:
            raise self.refuse(f"unreadable tree: {exc}", path="", rule="BadTree") from exc
        for path in self.budget.links:
            try:
                resolve_inside(self.dest, path)
            except LinkEscapeError as exc:
                raise self.refuse(
                    f"symlink chain resolves outside the tree: {exc}",
                    path=path,
                    rule="SymlinkEscapes",
                ) from None

    def _name(self, entry: pygit2.Object, prefix: str) -> str:
        raw: bytes = entry.raw_name or b""
        shown = prefix + raw.decode("utf-8", "replace")
        if raw in (b"", b".", b"..", b".git") or any(c in raw for c in (b"/", b"\x00", b"\\")):
            raise self.refuse(f"tree entry named {raw!r}", path=shown, rule="BadName")
        if len(raw) > NAME_MAX:
            raise self.refuse(
                f"a name longer than {NAME_MAX} bytes", path=shown[:200], rule="NameTooLong"
            )
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.refuse("a name that is not UTF-8", path=shown, rule="BadName") from None

    def tree(self, tree: pygit2.Tree, prefix: str) -> None:
        seen: set[str] = set()
        for entry in tree:
            name = self._name(entry, prefix)
            path = f"{prefix}{name}"
            if name in seen:
                raise self.refuse(
                    "the tree names this entry twice (or a file and a directory of one name)",
                    path=path,
                    rule="DuplicateEntry",
                )
            seen.add(name)
            if path.count("/") >= self.limits.max_depth or len(path) > self.limits.max_path_length:
                raise self.refuse("path too deep or too long", path=path[:200], rule="PathTooLong")
            target = self.dest / path
            if entry.filemode == pygit2.GIT_FILEMODE_TREE:
                self.count(path, 0)
                target.mkdir()
                self.tree(self._get(entry.id, pygit2.Tree, path), path + "/")
            elif entry.filemode in _FILE_MODES:
                blob = self._get(entry.id, pygit2.Blob, path)
                self.count(path, blob.size)
                mode = 0o755 if entry.filemode == pygit2.GIT_FILEMODE_BLOB_EXECUTABLE else 0o644
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                with os.fdopen(os.open(target, flags, mode), "wb") as out:
                    out.write(blob.data)
            elif entry.filemode == pygit2.GIT_FILEMODE_LINK:
                self.count(path, 0)
                self.link(path, target, self._get(entry.id, pygit2.Blob, path).data)
            # Submodules (GIT_FILEMODE_COMMIT) carry no content here: skipped.

    def link(self, path: str, target: Path, data: bytes) -> None:
        if b"\x00" in data or not data:
            raise self.refuse("symlink target is empty or has a NUL", path=path, rule="BadLink")
        if len(data) > self.limits.max_path_length:
            raise self.refuse(
                f"symlink target longer than {self.limits.max_path_length} bytes",
                path=path,
                rule="PathTooLong",
            )
        try:
            link = data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.refuse("symlink target is not UTF-8", path=path, rule="BadLink") from None
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), link))
        if link.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise self.refuse(
                f"symlink points outside the tree ({link!r})", path=path, rule="SymlinkEscapes"
            )
        os.symlink(link, target)
        self.budget.links.append(path)

    def _get(self, oid: pygit2.Oid, kind: type[_T], path: str) -> _T:
        obj = self.repo.get(oid)
        if not isinstance(obj, kind):
            raise self.refuse(f"tree entry is not a {kind.__name__}", path=path, rule="BadTree")
        return obj

    def count(self, path: str, size: int) -> None:
        broken = self.budget.take(size)
        if broken is not None:
            rule, message = broken
            raise self.refuse(message, path=path, rule=rule)
