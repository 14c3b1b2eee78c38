"""One repository of cluster branches (a shard): list them, know what each holds, write
commits without a work tree, push ref updates with the hub's own pack.

Branches are ``fleetlet/clusters/<cluster>`` on the remote. A local bare repository (a cache
directory, reused between runs) holds the objects this hub wrote and those it fetched. Beside
it, the facts cache (:mod:`hub.publish.facts`) remembers what each branch tip holds (content
digest, serial, expiry, signed), as the trailers of the hub's commits say: a branch whose tip
has not moved since costs a lookup, not a fetch nor a commit read. Only tips this hub does not
know (another hub published, a cold cache) are fetched, and then only their commits' trailers
are read.

Commits are built from blobs and trees directly (:mod:`hub.publish.pack`, one pack per push)
and pushed with :mod:`hub.publish.sendpack`: each ref update carries the old value the diff was
made against, and the server refuses an update whose ref moved meanwhile. Servers spoken to
only through libgit2 (ssh, local paths) get the same updates forced after a fresh listing
showed every old value unchanged.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pygit2

from hub.errors import GitTransportError, PublishError
from hub.publish.facts import BranchFacts, FactsCache, Key
from hub.publish.pack import DeltaOp, PackWriter
from hub.publish.sendpack import (
    ZERO,
    AtomicUnsupportedError,
    PushOutcome,
    ReceivePack,
    RefUpdate,
    supported,
)

BRANCH_PREFIX = "refs/heads/fleetlet/clusters/"
STATUS_PREFIX = "refs/heads/fleetlet/status/"
_TRACK_PREFIX = "refs/fleetlet/remote/"
_EXPLICIT_REFSPECS = 64
AUTHOR = "fleetlet hub <hub@fleetlet.invalid>"


class Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    """libgit2's callbacks for the hub's git traffic: user and password (or token) when given,
    else whatever the URL carries; ``updates`` collects a push's ref results."""

    def __init__(self, credentials: tuple[str, str] | None) -> None:
        super().__init__()
        self._creds = credentials
        self.updates: dict[str, str | None] = {}

    def credentials(self, url: str, username_from_url: str | None, allowed_types: Any) -> Any:
        if self._creds is None:
            # libgit2 then uses credentials embedded in the URL, if any.
            raise pygit2.Passthrough
        return pygit2.UserPass(*self._creds)

    def push_update_reference(self, refname: str, message: str | None) -> None:
        self.updates[refname] = message


class BranchStore:
    """One repository's cluster branches, through a local bare cache repository.

    ``credentials`` (user, password) serve smart-HTTP basic auth; ``cache_dir`` (the bare
    repository itself) None uses a temporary directory removed by :meth:`close`.
    Raises PublishError if the cache repository cannot be opened or created.
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
        self.refs: dict[str, str] = {}  # every advertised ref -> oid, as of the last listing
        self.tips: dict[str, str] = {}  # cluster -> tip of its branch
        self._assumed = False  # tips taken from the facts cache (assume_listed), not listed
        self._cache = FactsCache(self.cache_dir, url, BranchFacts)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> BranchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading ---------------------------------------------------------------------------

    def _remote(self) -> pygit2.Remote:
        return self.repo.remotes.create_anonymous(self.url)

    def list(self) -> dict[str, str]:
        """List every ref of the remote (one connection); return cluster -> branch tip.

        Raises GitTransportError if the server cannot be reached.
        """
        try:
            heads = self._remote().list_heads(callbacks=Callbacks(self.credentials))
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(
                f"cannot list branches of {self.url}: {_first_line(exc)}"
            ) from exc
        refs: dict[str, str] = {}
        tips: dict[str, str] = {}
        cut = len(BRANCH_PREFIX)
        for head in heads:
            name = str(head.name)
            oid = getattr(head, "oid", None)
            if oid is None:
                continue
            refs[name] = str(oid)
            if name.startswith(BRANCH_PREFIX):
                tips[name[cut:]] = refs[name]
        self.refs, self.tips = refs, tips
        self._assumed = False
        self._cache.learnt()  # the listing is what save_facts records
        return dict(tips)

    def assume_listed(self) -> bool:
        """Take the branches the facts cache recorded at its last save as the remote's, without
        listing them (see :mod:`hub.publish.known`); False when there is no such record."""
        if not self._cache.loaded:
            return False
        self.tips = self._cache.tips()
        self.tips.update(self._cache.others)
        self.refs = {}  # (not listed: nothing reads them unless the shards are listed)
        self._assumed = True
        return True

    def fetch(self) -> dict[str, str]:
        """:meth:`list`, then fetch the tips whose facts are unknown; return cluster -> tip.

        Raises GitTransportError.
        """
        tips = self.list()
        self.ensure([c for c, tip in tips.items() if self._known(c, tip) is None])
        return tips

    def ensure(self, clusters: Sequence[str]) -> None:
        """Fetch the listed tips of ``clusters`` that are not in the cache repository.

        Raises GitTransportError (also when the branches moved since the listing).
        """
        missing = sorted(c for c in clusters if pygit2.Oid(hex=self.tips[c]) not in self.repo)
        if not missing:
            return
        if len(missing) <= _EXPLICIT_REFSPECS:
            specs = [f"+{BRANCH_PREFIX}{c}:{_TRACK_PREFIX}{c}" for c in missing]
        else:
            specs = [f"+{BRANCH_PREFIX}*:{_TRACK_PREFIX}*"]
        try:
            self._remote().fetch(specs, callbacks=Callbacks(self.credentials))
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(
                f"git fetch from {self.url} failed: {_first_line(exc)}"
            ) from exc
        still = [c for c in missing if pygit2.Oid(hex=self.tips[c]) not in self.repo]
        if still:
            raise GitTransportError(
                f"git fetch from {self.url} did not bring the tips of {', '.join(still[:5])} "
                "(branches moved meanwhile?); rerun"
            )

    def fetch_ref(self, ref: str, oid: str | None = None) -> str | None:
        """Fetch one ref (any namespace) into the cache repository; its oid or None.

        ``oid``: the ref's value the caller listed (default: the last :meth:`list`'s).
        Raises GitTransportError.
        """
        oid = oid or self.refs.get(ref)
        if oid is None or oid == ZERO:
            return None
        if pygit2.Oid(hex=oid) not in self.repo:
            try:
                self._remote().fetch(
                    [f"+{ref}:refs/fleetlet/fetched/{ref.rsplit('/', 1)[-1]}"],
                    callbacks=Callbacks(self.credentials),
                )
            except (pygit2.GitError, OSError) as exc:
                raise GitTransportError(
                    f"git fetch of {ref} from {self.url} failed: {_first_line(exc)}"
                ) from exc
        return oid

    def _known(self, cluster: str, tip: str) -> BranchFacts | None:
        facts = self._cache.get(cluster)
        return facts if facts is not None and facts.tip == tip else None

    def fact_groups(self) -> dict[Key, AbstractSet[str]]:
        """The branches whose facts are known for their listed tip, by group of shared facts
        (:mod:`hub.publish.facts`): set-like, for the diff's set operations."""
        members = self._cache.members()
        if self._assumed:
            return dict(members)  # the tips are the facts' own
        tips = self.tips
        return {
            key: {n for n in names if tips.get(n) == self._cache.groups[key][n][0]}
            for key, names in members.items()
        }

    def facts(self, cluster: str) -> BranchFacts | None:
        """What the listed tip of ``cluster``'s branch holds (None: no branch).

        The tip must have been fetched (:meth:`fetch`) unless its facts are remembered.
        """
        tip = self.tips.get(cluster)
        if tip is None:
            return None
        known = self._known(cluster, tip)
        if known is None:
            message = self.repo[pygit2.Oid(hex=tip)].peel(pygit2.Commit).message
            known = BranchFacts.of(tip, str(message))
            self._cache.learnt(cluster, known)
        return known

    def read_file(self, cluster: str, name: str) -> bytes | None:
        """A file at the listed tip of ``cluster``'s branch (fetched on demand)."""
        tip = self.tips.get(cluster)
        if tip is None:
            return None
        self.ensure([cluster])
        tree = self.repo[pygit2.Oid(hex=tip)].peel(pygit2.Tree)
        if name not in tree:
            return None
        data: bytes = self.repo[tree[name].id].peel(pygit2.Blob).data
        return data

    def read_blob(self, oid: str, name: str) -> bytes | None:
        """File ``name`` of the tree of commit ``oid`` (in the cache repository)."""
        tree = self.repo[pygit2.Oid(hex=oid)].peel(pygit2.Tree)
        if name not in tree:
            return None
        data: bytes = self.repo[tree[name].id].peel(pygit2.Blob).data
        return data

    # --- the facts cache ----------------------------------------------------------------

    def remember(self, cluster: str, facts: BranchFacts | None) -> None:
        """Record what ``cluster``'s branch now holds (None: the branch is gone)."""
        self._cache.changed(cluster, facts)
        if facts is None:
            self.tips.pop(cluster, None)
        else:
            self.tips[cluster] = facts.tip

    def save_facts(self) -> None:
        """Keep the facts of the current branches for the next run (:mod:`hub.publish.facts`:
        what changed since the last save; a failure costs a cold read)."""
        self._cache.save(self.tips)

    # --- writing ----------------------------------------------------------------------------

    def push(
        self, updates: Sequence[RefUpdate], *, pack: Path | None, atomic: bool = False
    ) -> PushOutcome:
        """Send ``updates`` (with ``pack`` written into this cache repository by
        :class:`CommitBatch`); ``atomic``: every ref moves or none. Raises GitTransportError
        when the transfer fails, AtomicUnsupportedError when ``atomic`` cannot be had."""
        if not updates:
            return PushOutcome(refused={})
        if supported(self.url):
            receiver = ReceivePack(self.url, credentials=self.credentials)
            return receiver.push(updates, pack=pack, atomic=atomic)
        if atomic:
            raise AtomicUnsupportedError(f"{self.url}: atomic pushes need git:// or http(s)://")
        return self._push_libgit2(updates)

    def _push_libgit2(self, updates: Sequence[RefUpdate]) -> PushOutcome:
        # libgit2 takes old values from the advertisement: check them first, then force.
        current = self.list_refs()
        refused = {
            u.ref: f"is at {current.get(u.ref, ZERO)}, expected {u.old}"
            for u in updates
            if current.get(u.ref, ZERO) != u.old
        }
        specs = [
            f"+{u.new}:{u.ref}" if u.new != ZERO else f":{u.ref}"
            for u in updates
            if u.ref not in refused
        ]
        callbacks = Callbacks(self.credentials)
        if specs:
            try:
                self._remote().push(specs, callbacks=callbacks)
            except (pygit2.GitError, OSError) as exc:
                raise GitTransportError(
                    f"git push to {self.url} failed: {_first_line(exc)}"
                ) from exc
        for u in updates:
            if u.ref in refused:
                continue
            if u.ref not in callbacks.updates:
                refused[u.ref] = "the server reported no status"
            elif callbacks.updates[u.ref] is not None:
                refused[u.ref] = str(callbacks.updates[u.ref])
        return PushOutcome(refused=refused)

    def list_refs(self) -> dict[str, str]:
        """Every ref of the remote now (one listing), without touching :attr:`tips`."""
        try:
            heads = self._remote().list_heads(callbacks=Callbacks(self.credentials))
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(f"cannot list {self.url}: {_first_line(exc)}") from exc
        return {str(h.name): str(h.oid) for h in heads if getattr(h, "oid", None) is not None}


class CommitBatch:
    """Commits for one push, collected in one pack (see :mod:`hub.publish.pack`)."""

    def __init__(
        self,
        store: BranchStore,
        *,
        entries: dict[bytes, bytes] | None = None,
        compress: bool = True,
    ) -> None:
        self.store = store
        self.pack = PackWriter(entries=entries, compress=compress)

    def __len__(self) -> int:
        return len(self.pack)

    def blob(self, data: bytes) -> str:
        return self.pack.blob(data)

    def blob_delta(self, data: bytes, *, base: str, base_size: int, ops: list[DeltaOp]) -> str:
        return self.pack.blob_delta(data, base=base, base_size=base_size, ops=ops)

    def commit(
        self,
        files: Mapping[str, str],
        *,
        parents: Iterable[str],
        message: str,
        when: datetime,
        dirs: Mapping[str, str] | None = None,
    ) -> str:
        """A commit of a tree of ``files`` (name -> blob id) and ``dirs`` (name -> tree id);
        returns its id."""
        tree = self.pack.tree(dict(files), dict(dirs or {}))
        return self.pack.commit(
            tree=tree,
            parents=list(parents),
            author=AUTHOR,
            timestamp=int(when.astimezone(UTC).timestamp()),
            message=message,
        )

    def write(self) -> Path | None:
        """Write the pack into the cache repository; its path (None when empty).

        Raises PublishError if it cannot be written.
        """
        try:
            return self.pack.write(self.store.cache_dir)
        except OSError as exc:
            raise PublishError(f"hub cache repository {self.store.cache_dir}: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
