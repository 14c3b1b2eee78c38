"""One bundle's tree from its sources: each fetched once (through the cache), composed at its
``destination``.

:class:`ContentStore` is what the agent uses: ``tree(source)`` returns the cached, verified
tree of one source (fetching it only on a cache miss), ``compose(sources, dest)`` lays several
sources out in one directory. Two sources writing the same file is refused: a bundle's content
must not depend on the order of its sources.

The bundle tree is judged as a whole, structurally, because each source alone proves little
(a link harmless in one source may escape through a link of another):

- every tree a fetcher fills is checked whole (:func:`agent.source.tree.check_tree`) before
  it is cached, and the cache hands out only trees that still hash to what was stored;
- composing never follows a link: each directory is opened component by component with
  ``O_NOFOLLOW`` relative to its parent's descriptor, each file and link is created with
  ``O_EXCL`` in its directory, so a link laid out by one source cannot carry another source's
  files anywhere (nor into another bundle's cached tree);
- the unpack limits (:class:`~agent.source.archive.ArchiveLimits`: entries, bytes per file and
  in total) hold for the composed tree, across all its sources;
- the composed tree is checked whole once every source is in: each link is resolved inside it,
  after composition, and one that leads out is refused.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import os
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import TemporaryError
from agent.source.archive import ArchiveLimits, TreeBudget
from agent.source.cache import ContentCache
from agent.source.content import (
    AuthenticationError,
    ContentRefusedError,
    Credentials,
    InvalidSourceError,
    LocalStorageError,
    SourceLike,
    auth_secret_name,
    check_commit,
    check_hex_sha256,
    check_sha256_digest,
    describe,
    url_host,
)
from agent.source.git import GitFetcher
from agent.source.http import HttpFetcher
from agent.source.oci import OciFetcher, credentials_from_docker_config
from agent.source.tree import check_tree

if TYPE_CHECKING:
    from agent.source.signed import SourceVerifier

CredentialsResolver = Callable[[str, str], Credentials | None]
"""Given the name of a source's ``auth`` Secret and the host the source is fetched from,
return the credentials for that host (or None)."""


def credentials_from_secret(
    data: Mapping[str, str | bytes],
    *,
    host: str | None = None,
    hosts: frozenset[str] = frozenset(),
    secret: str = "",
) -> Credentials:
    """Credentials from a Secret's decoded ``data`` (values as bytes or text).

    Understands ``username``/``password``, ``token``, and ``.dockerconfigjson`` (the entry for
    ``host``). Raises InvalidSourceError when none of them is there or the config is unusable.
    """

    def text(key: str) -> str | None:
        value = data.get(key)
        return value.decode() if isinstance(value, bytes) else value

    where = f"Secret for {host}" if host else "Secret"
    docker = text(".dockerconfigjson")
    if docker is not None and host is not None:
        try:
            found = credentials_from_docker_config(docker, host)
        except ValueError as exc:
            raise InvalidSourceError(
                f".dockerconfigjson unusable: {exc}", source=where, rule="BadCredentials"
            ) from exc
        if found is not None:
            # A docker config names the host of each entry: the entry is for that host alone.
            bound = hosts or frozenset({host.lower()})
            return dataclasses.replace(found, hosts=bound, secret=secret)
    username, password, token = text("username"), text("password"), text("token")
    if username is None and password is None and token is None:
        raise InvalidSourceError(
            "no username/password, token or .dockerconfigjson entry for this host",
            source=where,
            rule="BadCredentials",
        )
    return Credentials(
        username=username, password=password, token=token, hosts=hosts, secret=secret
    )


SOURCE_CREDENTIAL_LABEL = "fleetlet.io/source-credential"
"""The label (value ``"true"``) that marks a Secret of the agent's namespace as credentials a
bundle source may name. The agent's own Secrets (its git credentials, its trust) and the
Secrets of bundle outputs never carry it."""
SOURCE_HOSTS_ANNOTATION = "fleetlet.io/source-hosts"
"""The hosts (comma-separated ``host`` or ``host:port``) a source credential Secret is for;
required, except for a ``.dockerconfigjson`` whose entries name their hosts."""
_NEVER_SOURCE_LABELS = ("fleetlet.io/outputs-of",)


class CredentialNotForSourcesError(TemporaryError):
    """A source names a Secret not meant for source credentials (retried: a cluster admin may
    label it, but nothing is read from it meanwhile)."""

    reason = "CredentialNotForSources"


def source_credentials(secret: Mapping[str, object], *, host: str, where: str) -> Credentials:
    """The credentials in Secret ``secret`` (an API object, at ``where``) for a source fetched
    from ``host``. Raises CredentialNotForSourcesError when the Secret is not labelled for
    sources (or is an outputs Secret, or a ServiceAccount token), or names no host;
    InvalidSourceError when it holds no credentials."""
    meta = secret.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    if (
        labels.get(SOURCE_CREDENTIAL_LABEL) != "true"
        or any(key in labels for key in _NEVER_SOURCE_LABELS)
        or secret.get("type") == "kubernetes.io/service-account-token"
    ):
        raise CredentialNotForSourcesError(
            f"source credentials: Secret {where} is not meant for sources (label "
            f"{SOURCE_CREDENTIAL_LABEL}=true missing): a source may only name such Secrets, "
            "never the agent's own or a bundle's outputs",
            delay=60.0,
        )
    raw = secret.get("data")
    data = {
        str(k): base64.b64decode(str(v))
        for k, v in (raw.items() if isinstance(raw, Mapping) else ())
    }
    hosts = frozenset(
        h.strip().lower()
        for h in str(annotations.get(SOURCE_HOSTS_ANNOTATION) or "").split(",")
        if h.strip()
    )
    if not hosts and ".dockerconfigjson" not in data:
        raise CredentialNotForSourcesError(
            f"source credentials: Secret {where} names no host (annotation "
            f"{SOURCE_HOSTS_ANNOTATION}: the hosts it is for): not sent anywhere",
            delay=60.0,
        )
    return credentials_from_secret(data, host=host, hosts=hosts, secret=where)


def source_host(source: SourceLike) -> str:
    """The host (``host[:port]``) a source is fetched from."""
    return url_host(source.uri.removeprefix("oci://"))


class CredentialNotForHostError(AuthenticationError):
    """A source names credentials made for another host: they are not sent (an operator may
    fix the Secret's hosts, so it is retried)."""


class SourceConflictError(ContentRefusedError):
    """Two sources of one bundle put content at the same path, or one would be laid out
    through another's symlink (rule ``PathThroughSymlink``)."""

    reason = "SourceConflict"


class BundleTooLargeError(ContentRefusedError):
    """The sources of one bundle together exceed the unpack limits (rule ``TooManyFiles``,
    ``TooManyBytes``)."""

    reason = "BundleTooLarge"


def cache_key(source: SourceLike) -> str:
    """The content address of a source: what it names can never change.

    Raises InvalidSourceError for an unknown kind or a malformed pin.
    """
    label = describe(source)
    if source.kind == "image":
        return f"image:{check_sha256_digest(source.digest, source=label)}"
    if source.kind == "git":
        commit = check_commit(source.commit, source=label)
        return f"git:{commit}:{(source.directory or '').strip('/')}"
    if source.kind == "http":
        return f"http:sha256:{check_hex_sha256(source.sha256, source=label)}"
    if source.kind == "helm":
        return f"helm:sha256:{check_hex_sha256(source.sha256, source=label)}"
    raise InvalidSourceError(
        f"unknown source kind {source.kind!r} (image, git, http or helm)",
        source=label,
        rule="UnknownKind",
    )


def clean_destination(destination: str | None, *, source: str) -> str:
    """The normalised relative destination (``""`` for the root).

    Raises InvalidSourceError if it is absolute or climbs out with ``..``.
    """
    if not destination:
        return ""
    parts = [p for p in destination.split("/") if p not in ("", ".")]
    if destination.startswith("/") or ".." in parts or "\\" in destination:
        raise InvalidSourceError(
            f"destination {destination!r} must be a relative path inside the bundle",
            source=source,
            rule="PathTraversal",
        )
    return "/".join(parts)


class ContentStore:
    """Fetches sources through the cache and composes bundle trees.

    ``limits`` bound one composed bundle tree, all its sources together (default: the same
    :class:`~agent.source.archive.ArchiveLimits` each fetcher applies to one source).
    """

    def __init__(
        self,
        *,
        cache: ContentCache,
        oci: OciFetcher | None = None,
        git: GitFetcher | None = None,
        http: HttpFetcher | None = None,
        limits: ArchiveLimits | None = None,
        verifier: SourceVerifier | None = None,
    ) -> None:
        self.cache = cache
        self.verifier = verifier
        """The cluster's own source policy (``--verify-sources``): image sources are used
        only once it passed them (:mod:`agent.source.signed`)."""
        self.oci = oci or OciFetcher()
        self.git = git or GitFetcher(repos_dir=cache.root / "git")
        self.http = http or HttpFetcher()
        self.limits = limits or ArchiveLimits()

    def tree(self, source: SourceLike, *, credentials: Credentials | None = None) -> Path:
        """The verified tree of ``source``, from the cache or fetched now (then checked as a
        whole and cached, read-only).

        Raises what the fetchers raise (FetchError family: temporary; ContentRefusedError
        family: permanent) and UnsafeTreeError.
        """
        key = cache_key(source)
        label = describe(source)
        if self.verifier is not None and source.kind == "image":
            # Before the cache too: the cache holds what the bytes are, not who signed them.
            self.verifier.require(source, credentials=credentials, label=label)
        hit = self.cache.lookup(key)
        if hit is not None:
            return hit

        def fill(tree: Path) -> None:
            if source.kind == "image":
                self.oci.fetch(
                    uri=source.uri,
                    digest=source.digest or "",
                    dest=tree,
                    credentials=credentials,
                    source=label,
                )
            elif source.kind == "git":
                self.git.fetch(
                    uri=source.uri,
                    commit=source.commit or "",
                    directory=source.directory,
                    dest=tree,
                    credentials=credentials,
                    source=label,
                )
            elif source.kind == "helm":
                # The hub resolved the chart to one archive; the agent never reads the index.
                archive = getattr(source, "archive_url", None) or ""
                self.http.fetch(
                    uri=archive,
                    sha256=source.sha256 or "",
                    dest=tree,
                    credentials=credentials,
                    source=label,
                )
                _check_chart_archive(tree, source=label, archive=archive)
            else:
                self.http.fetch(
                    uri=source.uri,
                    sha256=source.sha256 or "",
                    dest=tree,
                    credentials=credentials,
                    source=label,
                )
            # Whatever the fetcher checked, nothing unconfined enters the cache.
            check_tree(tree, source=label)

        return self.cache.store(key, fill)

    def compose(
        self,
        sources: Sequence[SourceLike],
        dest: Path,
        *,
        credentials: CredentialsResolver | None = None,
    ) -> Path:
        """Lay out every source's tree at its destination under ``dest`` (created if needed;
        it must not be a symlink), then check the whole tree.

        Raises SourceConflictError when two sources write the same path or one would be laid
        out through another's link, BundleTooLargeError when the sources together exceed the
        limits, UnsafeTreeError when a link of the composed tree leads outside it,
        InvalidSourceError on a bad destination, FetchError when the local disk fails, and
        whatever :meth:`tree` raises.
        """
        bundle = f"bundle {dest.name}"
        try:
            dest.mkdir(parents=True, exist_ok=True)
            root_fd = os.open(dest, _DIR_FLAGS)
        except OSError as exc:
            raise LocalStorageError.of(exc, doing="lay out the bundle tree", source=bundle) from exc
        budget = TreeBudget(self.limits)
        try:
            for source in sources:
                label = describe(source)
                sub = clean_destination(source.destination, source=label)
                secret = auth_secret_name(source)
                creds = None
                if credentials and secret:
                    host = source_host(source)
                    creds = credentials(secret, host)
                    if creds is not None and not creds.allows(host):
                        raise CredentialNotForHostError(
                            f"Secret {secret} holds credentials for "
                            f"{', '.join(sorted(creds.hosts))}, not for {host}: not sent",
                            source=label,
                        )
                tree = self.tree(source, credentials=creds)
                copier = _Copier(source=label, budget=budget)
                try:
                    fd, where = copier.open_path(root_fd, sub)
                    try:
                        copier.copy(tree, fd, where)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    raise LocalStorageError.of(
                        exc, doing="lay out the bundle tree", source=label
                    ) from exc
        finally:
            os.close(root_fd)
        # Links are judged here, on the tree as it finally is.
        check_tree(dest, source=bundle)
        return dest


def _check_chart_archive(tree: Path, *, source: str, archive: str) -> None:
    """A Helm repository's archive unpacks to one chart directory (``<chart>/Chart.yaml``).

    Raises InvalidSourceError (NotAChart) otherwise.
    """
    entries = [e for e in tree.iterdir()] if tree.is_dir() else []
    if len(entries) != 1 or not (entries[0] / "Chart.yaml").is_file():
        raise InvalidSourceError(
            "not a chart archive (expected one directory holding a Chart.yaml)",
            source=source,
            file=archive,
            rule="NotAChart",
        )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _is_link(parent: int, name: str) -> bool:
    return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)


class _Copier:
    """Copies one source's tree into the bundle tree through directory descriptors: nothing
    it writes follows a link, nothing it writes replaces anything."""

    def __init__(self, *, source: str, budget: TreeBudget) -> None:
        self.source = source
        self.budget = budget

    def conflict(self, message: str, where: str, rule: str = "SourceConflict") -> Exception:
        return SourceConflictError(message, source=self.source, file=where, rule=rule)

    def count(self, where: str, size: int) -> None:
        broken = self.budget.take(size)
        if broken is not None:
            rule, message = broken
            raise BundleTooLargeError(
                f"the bundle's sources together: {message}",
                source=self.source,
                file=where,
                rule=rule,
            )

    def open_dir(self, parent: int, name: str, where: str) -> int:
        """The directory ``name`` in ``parent`` (created if missing), opened without following
        a link. Raises SourceConflictError when it is a link or a file."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            # A link gives ELOOP or ENOTDIR (O_DIRECTORY is checked first on some kernels).
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(parent, name):
                raise self.conflict(
                    "would be laid out through a symlink of another source",
                    where,
                    "PathThroughSymlink",
                ) from None
            if exc.errno == errno.ENOTDIR:
                raise self.conflict(
                    "a directory of this source is a file of another", where
                ) from None
            raise

    def open_path(self, root: int, sub: str) -> tuple[int, str]:
        """The directory ``sub`` (``""``: the root) of the bundle tree, each component opened
        with :meth:`open_dir`; the caller closes it."""
        fd = os.dup(root)
        where = ""
        for part in sub.split("/") if sub else []:
            where = f"{where}/{part}" if where else part
            try:
                child = self.open_dir(fd, part, where)
            finally:
                os.close(fd)
            fd = child
        return fd, where

    def copy(self, src: Path, dst: int, where: str) -> None:
        """Copy the directory ``src`` (a cached tree, links not followed) into ``dst``."""
        with os.scandir(src) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            name = entry.name
            path = f"{where}/{name}" if where else name
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                self.count(path, 0)
                child = self.open_dir(dst, name, path)
                try:
                    self.copy(Path(entry.path), child, path)
                finally:
                    os.close(child)
            elif stat.S_ISLNK(info.st_mode):
                self.count(path, 0)
                try:
                    os.symlink(os.readlink(entry.path), name, dir_fd=dst)
                except FileExistsError:
                    raise self.conflict("two sources provide this path", path) from None
            elif stat.S_ISREG(info.st_mode):
                self.count(path, info.st_size)
                mode = 0o755 if info.st_mode & 0o111 else 0o644
                try:
                    out = os.open(name, _FILE_FLAGS, mode, dir_fd=dst)
                except FileExistsError:
                    raise self.conflict("two sources provide this file", path) from None
                with (
                    os.fdopen(out, "wb") as sink,
                    os.fdopen(os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as data,
                ):
                    shutil.copyfileobj(data, sink, 1024 * 1024)
            else:
                raise self.conflict(
                    "not a regular file, a directory or a symlink", path, "SpecialFile"
                )
