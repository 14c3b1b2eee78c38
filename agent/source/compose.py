"""One bundle's tree from its sources: each fetched once (through the cache), composed at its
``destination``.

:class:`ContentStore` is what the agent uses: ``tree(source)`` returns the cached, verified
tree of one source (fetching it only on a cache miss), ``compose(sources, dest)`` lays several
sources out in one directory. Two sources writing the same file is refused: a bundle's content
must not depend on the order of its sources.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent.source.cache import ContentCache
from agent.source.content import (
    ContentRefusedError,
    Credentials,
    InvalidSourceError,
    SourceLike,
    auth_secret_name,
    check_commit,
    check_hex_sha256,
    check_sha256_digest,
    describe,
)
from agent.source.git import GitFetcher
from agent.source.http import HttpFetcher
from agent.source.oci import OciFetcher, credentials_from_docker_config

CredentialsResolver = Callable[[str], Credentials | None]
"""Given the name of a source's ``auth`` Secret, return its credentials (or None)."""


def credentials_from_secret(
    data: Mapping[str, str | bytes], *, host: str | None = None
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
            return found
    username, password, token = text("username"), text("password"), text("token")
    if username is None and password is None and token is None:
        raise InvalidSourceError(
            "no username/password, token or .dockerconfigjson entry for this host",
            source=where,
            rule="BadCredentials",
        )
    return Credentials(username=username, password=password, token=token)


class SourceConflictError(ContentRefusedError):
    """Two sources of one bundle put different content at the same path."""

    reason = "SourceConflict"


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
    """Fetches sources through the cache and composes bundle trees."""

    def __init__(
        self,
        *,
        cache: ContentCache,
        oci: OciFetcher | None = None,
        git: GitFetcher | None = None,
        http: HttpFetcher | None = None,
    ) -> None:
        self.cache = cache
        self.oci = oci or OciFetcher()
        self.git = git or GitFetcher(repos_dir=cache.root / "git")
        self.http = http or HttpFetcher()

    def tree(self, source: SourceLike, *, credentials: Credentials | None = None) -> Path:
        """The verified tree of ``source``, from the cache or fetched now (then cached).

        Raises what the fetchers raise (FetchError family: temporary; ContentRefusedError
        family: permanent).
        """
        key = cache_key(source)
        hit = self.cache.lookup(key)
        if hit is not None:
            return hit
        label = describe(source)

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

        return self.cache.store(key, fill)

    def compose(
        self,
        sources: Sequence[SourceLike],
        dest: Path,
        *,
        credentials: CredentialsResolver | None = None,
    ) -> Path:
        """Lay out every source's tree at its destination under ``dest`` (created if needed).

        Raises SourceConflictError when two sources write the same path, InvalidSourceError on
        a bad destination, and whatever :meth:`tree` raises.
        """
        dest.mkdir(parents=True, exist_ok=True)
        for source in sources:
            label = describe(source)
            sub = clean_destination(source.destination, source=label)
            secret = auth_secret_name(source)
            creds = credentials(secret) if (credentials and secret) else None
            tree = self.tree(source, credentials=creds)
            _copy_tree(tree, dest / sub if sub else dest, source=label, root=dest)
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


def _copy_tree(src: Path, dst: Path, *, source: str, root: Path) -> None:
    """Copy ``src`` into ``dst`` (files, dirs, in-tree symlinks as links); no overwrites."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target_dir = dst if rel == "." else dst / rel
        if target_dir.is_symlink() or (target_dir.exists() and not target_dir.is_dir()):
            raise SourceConflictError(
                "a directory of this source is a file or link of another",
                source=source,
                file=str(target_dir.relative_to(root)),
                rule="SourceConflict",
            )
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in [
            *filenames,
            *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))),
        ]:
            origin = Path(dirpath) / name
            target = target_dir / name
            if os.path.lexists(target):
                raise SourceConflictError(
                    "two sources provide this file",
                    source=source,
                    file=str(target.relative_to(root)),
                    rule="SourceConflict",
                )
            if origin.is_symlink():
                os.symlink(os.readlink(origin), target)
            else:
                shutil.copyfile(origin, target)
                shutil.copymode(origin, target)
