"""The cluster branches in git: read them with one fetch, write commits without a work tree,
push every changed branch in one push.

Branches are ``fleetlet/clusters/<cluster>`` on the remote. A local bare repository (a cache
directory, reused between runs so fetches are incremental) holds the remote tips as of the
last fetch (``refs/fleetlet/remote/<cluster>``) and the objects of the commits we push.
Commits are built from blobs and trees directly (no index, no checkout), written as ONE pack
(:mod:`hub.publish.pack`) and pushed by id, so no loose object and no local branch is written. The push is not forced: each new commit has the fetched tip as
parent, so a concurrent writer's update is refused instead of overwritten. pygit2's ``push()``
returns normally when the server refuses an update; refusals arrive in
``push_update_reference``, which we record.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pygit2

from hub.errors import GitTransportError, PublishError, PushRejectedError
from hub.publish.pack import PackWriter

BRANCH_PREFIX = "refs/heads/fleetlet/clusters/"
_TRACK_PREFIX = "refs/fleetlet/remote/"
_AUTHOR_NAME = "fleetlet hub"
_AUTHOR_EMAIL = "hub@fleetlet.invalid"


class _Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    def __init__(
        self,
        credentials: tuple[str, str] | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        super().__init__()
        self._creds = credentials
        self._progress = progress
        self.updates: dict[str, str | None] = {}
        self._last = 0

    def credentials(self, url: str, username_from_url: str | None, allowed_types: Any) -> Any:
        if self._creds is None:
            # libgit2 then uses credentials embedded in the URL, if any.
            raise pygit2.Passthrough
        return pygit2.UserPass(*self._creds)

    def push_update_reference(self, refname: str, message: str | None) -> None:
        self.updates[refname] = message

    def push_transfer_progress(self, objects_pushed: int, total_objects: int, bytes: int) -> None:
        if self._progress is not None and total_objects and objects_pushed - self._last >= 5000:
            self._last = objects_pushed
            self._progress(f"pushing objects {objects_pushed}/{total_objects}")


@dataclass(frozen=True, slots=True)
class PushResult:
    pushed: tuple[str, ...]  # cluster names whose branch was updated


class BranchStore:
    """The remote's cluster branches, through a local bare cache repository.

    ``credentials`` (user, password) serve smart-HTTP basic auth; ``cache_dir`` None uses a
    temporary directory removed by :meth:`close`.
    """

    def __init__(
        self,
        *,
        url: str,
        cache_dir: Path | None = None,
        credentials: tuple[str, str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.credentials = credentials
        self.progress = progress
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if cache_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fleetlet-hub-")
            cache_dir = Path(self._tmp.name) / "cache.git"
        self.cache_dir = Path(cache_dir)
        try:
            if (self.cache_dir / "HEAD").is_file():
                self.repo = pygit2.Repository(str(self.cache_dir))
            else:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                self.repo = pygit2.init_repository(str(self.cache_dir), bare=True)
        except (pygit2.GitError, OSError) as exc:
            raise PublishError(f"hub cache repository {self.cache_dir}: {exc}") from exc
        self.tips: dict[str, pygit2.Oid] = {}
        self._pack = PackWriter()
        self._pending: dict[str, str] = {}

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> BranchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _remote(self) -> pygit2.Remote:
        return self.repo.remotes.create_anonymous(self.url)

    def fetch(self) -> dict[str, pygit2.Oid]:
        """List the cluster branches and fetch the tips missing locally; return cluster -> tip.

        One ref listing, then at most one fetch: with a reused cache directory, commits this
        hub pushed itself are already local and cost nothing. Raises GitTransportError if the
        server cannot be reached.
        """
        remote = self._remote()
        callbacks = _Callbacks(self.credentials, None)
        try:
            heads = remote.list_heads(callbacks=callbacks)
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(
                f"cannot list branches of {self.url}: {_first_line(exc)}"
            ) from exc
        tips: dict[str, pygit2.Oid] = {}
        for head in heads:
            name = str(head.name)
            oid = getattr(head, "oid", None)
            if name.startswith(BRANCH_PREFIX) and oid is not None:
                tips[name[len(BRANCH_PREFIX) :]] = oid
        missing = sorted(c for c, oid in tips.items() if oid not in self.repo)
        if missing:
            if len(missing) * 2 > len(tips):
                specs = [f"+{BRANCH_PREFIX}*:{_TRACK_PREFIX}*"]
            else:
                specs = [f"+{BRANCH_PREFIX}{c}:{_TRACK_PREFIX}{c}" for c in missing]
            try:
                remote.fetch(specs, callbacks=_Callbacks(self.credentials, None))
            except (pygit2.GitError, OSError) as exc:
                raise GitTransportError(
                    f"git fetch from {self.url} failed: {_first_line(exc)}"
                ) from exc
            still = [c for c in missing if tips[c] not in self.repo]
            if still:
                raise GitTransportError(
                    f"git fetch from {self.url} did not bring the tips of {', '.join(still)} "
                    "(branches moved meanwhile?); rerun"
                )
        self.tips = tips
        return dict(tips)

    def message(self, cluster: str) -> str | None:
        """The commit message at the tip of ``cluster``'s branch (None if no branch)."""
        tip = self.tips.get(cluster)
        if tip is None:
            return None
        return str(self.repo[tip].peel(pygit2.Commit).message)

    def read(self, cluster: str) -> dict[str, bytes] | None:
        """The files at the fetched tip of ``cluster``'s branch (None if no branch)."""
        tip = self.tips.get(cluster)
        if tip is None:
            return None
        tree = self.repo[tip].peel(pygit2.Tree)
        out: dict[str, bytes] = {}
        for entry in tree:
            if entry.type_str == "blob" and entry.name is not None:
                out[entry.name] = self.repo[entry.id].peel(pygit2.Blob).data
        return out

    def read_file(self, cluster: str, name: str) -> bytes | None:
        tip = self.tips.get(cluster)
        if tip is None:
            return None
        tree = self.repo[tip].peel(pygit2.Tree)
        if name not in tree:
            return None
        data: bytes = self.repo[tree[name].id].peel(pygit2.Blob).data
        return data

    def commit(
        self, cluster: str, files: Mapping[str, bytes], *, message: str, when: datetime
    ) -> str:
        """Commit ``files`` (the whole tree) on top of the fetched tip of ``cluster``.

        The objects are collected for one pack written by :meth:`push`; returns the commit id.
        """
        blobs = {name: self._pack.blob(data) for name, data in files.items()}
        tree = self._pack.tree(blobs)
        parent = self.tips.get(cluster)
        oid = self._pack.commit(
            tree=tree,
            parents=[str(parent)] if parent is not None else [],
            author=f"{_AUTHOR_NAME} <{_AUTHOR_EMAIL}>",
            timestamp=int(when.astimezone(UTC).timestamp()),
            message=message,
        )
        # No local ref: the push names the commit itself (10,000 ref files cost seconds).
        self._pending[cluster] = oid
        return oid

    def push(self, clusters: Iterable[str]) -> PushResult:
        """Push the commits made for ``clusters`` (by :meth:`commit`) in one push.

        Raises GitTransportError if the transfer failed (nothing updated), PushRejectedError
        if the server refused some updates (the others were updated).
        """
        names = sorted(set(clusters))
        if not names:
            return PushResult(pushed=())
        missing = [c for c in names if c not in self._pending]
        if missing:
            raise PublishError(f"no commit to push for {', '.join(missing)}")
        try:
            self._pack.write(self.cache_dir)
        except OSError as exc:
            raise PublishError(f"hub cache repository {self.cache_dir}: {exc}") from exc
        specs = [f"{self._pending[c]}:{BRANCH_PREFIX}{c}" for c in names]
        callbacks = _Callbacks(self.credentials, self.progress)
        try:
            # threads=0: the packbuilder uses every core (its delta search dominates).
            self._remote().push(specs, callbacks=callbacks, threads=0)
        except (pygit2.GitError, OSError) as exc:
            if callbacks.updates:
                return self._settle(names, callbacks.updates, failure=_first_line(exc))
            raise GitTransportError(f"git push to {self.url} failed: {_first_line(exc)}") from exc
        return self._settle(names, callbacks.updates, failure="")

    def _settle(
        self, names: list[str], updates: Mapping[str, str | None], *, failure: str
    ) -> PushResult:
        pushed: list[str] = []
        rejected: dict[str, str] = {}
        for c in names:
            ref = f"{BRANCH_PREFIX}{c}"
            if ref not in updates:
                rejected[ref] = failure or "the server reported no status"
            elif updates[ref] is not None:
                rejected[ref] = str(updates[ref])
            else:
                pushed.append(c)
                # The next run's fetch moves the tracking ref; only memory is updated here.
                self.tips[c] = pygit2.Oid(hex=self._pending.pop(c))
        if rejected:
            raise PushRejectedError(rejected, pushed=[f"{BRANCH_PREFIX}{c}" for c in pushed])
        return PushResult(pushed=tuple(pushed))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
