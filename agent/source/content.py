"""What every content source shares: the source shape it reads, pins, and the errors it raises.

A source is read through :class:`SourceLike` (the attributes of ``agent.api.Source``), so this
package does not depend on how the API types are built. Errors come in two families:
:class:`FetchError` (a :class:`~agent.errors.TemporaryError`: a server down, a timeout, refused
credentials that an operator may fix) and :class:`ContentRefusedError` (a
:class:`~agent.errors.PermanentError`: the bytes are not what the pin says, or are hostile).
Every error names the source; refusals also name the file and the rule that was broken.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Protocol

from agent.api.pins import is_commit, is_digest, is_sha256_hex
from agent.errors import PermanentError, TemporaryError


class SourceLike(Protocol):
    """The attributes of ``agent.api.Source`` a fetcher reads."""

    @property
    def kind(self) -> str: ...
    @property
    def uri(self) -> str: ...
    @property
    def digest(self) -> str | None: ...
    @property
    def commit(self) -> str | None: ...
    @property
    def sha256(self) -> str | None: ...
    @property
    def directory(self) -> str | None: ...
    @property
    def destination(self) -> str | None: ...
    @property
    def auth(self) -> object:
        """``agent.api.SourceAuth`` (``.secret_ref.name``), a Secret name, or None."""
        ...


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """Credentials for one source, read from its Secret by the caller (never from the set).

    ``username``/``password`` serve basic auth (registries, git and http over HTTPS); a registry
    token exchange uses them too. ``token`` is a bearer token (http sources, git over HTTPS
    as the password of user ``x-access-token`` when no username is given).
    """

    username: str | None = None
    password: str | None = None
    token: str | None = None
    hosts: frozenset[str] = frozenset()
    """The hosts (``host`` or ``host:port``, lower case) these credentials were made for:
    they are sent to no other, not after a redirect, not to a token service elsewhere. Empty:
    no restriction (the agent's own repository, the hub's resolver)."""
    secret: str = ""
    """The Secret they were read from, for messages."""

    def allows(self, host: str) -> bool:
        """Whether these credentials may be sent to ``host`` (``host[:port]``)."""
        if not self.hosts:
            return True
        host = host.lower()
        return host in self.hosts or host.rsplit(":", 1)[0] in self.hosts

    def __repr__(self) -> str:
        # Never print a secret, not even in a traceback.
        return (
            f"Credentials(username={self.username!r}, password=***, token=***, "
            f"hosts={sorted(self.hosts)!r})"
        )


def url_host(url: str) -> str:
    """``host[:port]`` of a URL (or of ``host/path`` without a scheme), lower case, no user."""
    rest = url.split("://", 1)[1] if "://" in url else url
    return rest.split("/", 1)[0].rsplit("@", 1)[-1].lower()


class FetchError(TemporaryError):
    """Content could not be fetched now (server down, timeout, refused credentials).

    ``reason`` is the CamelCase condition reason; ``source`` names the source.
    """

    reason = "FetchFailed"

    def __init__(self, message: str, *, source: str, delay: float | None = None) -> None:
        super().__init__(f"{source}: {message}", delay=delay)
        self.source = source


class LocalStorageError(FetchError):
    """The agent's own disk refused a write (full, read-only, out of quota): nothing is wrong
    with the content, and the same fetch may pass once there is room. ``source`` names what
    was being written."""

    reason = "LocalStorageUnavailable"

    @classmethod
    def of(cls, exc: OSError, *, doing: str, source: str) -> LocalStorageError:
        """The error for ``exc`` met while ``doing`` (``"cache"``...): names the path and why."""
        where = f" ({os.fsdecode(exc.filename)})" if exc.filename else ""
        return cls(
            f"cannot {doing} on the agent's local storage{where}: {exc.strerror or exc}",
            source=source,
        )


LOCAL_STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)
"""What the agent's own disk says when it is full, read-only or failing (not the content's
fault: a name too long or a path conflict are refusals of the content)."""


class AuthenticationError(FetchError):
    """The server refused the credentials (or their absence); retried once someone fixes them."""

    reason = "AuthenticationFailed"


class ContentRefusedError(PermanentError):
    """Content was refused: ``source`` (where), ``file`` (which file, or ``""``), ``rule``.

    ``rule`` is a CamelCase name of the rule broken (``PathTraversal``, ``AliasBomb``...);
    ``reason`` is the condition reason of the family (``UnsafeArchive``, ``InvalidManifest``...).
    """

    reason = "ContentRefused"

    def __init__(self, message: str, *, source: str, file: str = "", rule: str) -> None:
        where = f"{source}: {file}" if file else source
        super().__init__(f"{where}: {message} (rule {rule})")
        self.source = source
        self.file = file
        self.rule = rule
        self.detail = message


class DigestMismatchError(ContentRefusedError):
    """Bytes do not hash to their pin (manifest digest, layer descriptor, http sha256)."""

    reason = "DigestMismatch"


class InvalidSourceError(ContentRefusedError):
    """The source itself is unusable (unknown kind, malformed pin or destination)."""

    reason = "InvalidSource"


def auth_secret_name(source: SourceLike) -> str | None:
    """The name of the Secret holding the source's credentials, or None."""
    auth = source.auth
    if auth is None or isinstance(auth, str):
        return auth or None
    ref = getattr(auth, "secret_ref", None)
    name = getattr(ref, "name", None) if ref is not None else getattr(auth, "name", None)
    return name if isinstance(name, str) and name else None


def describe(source: SourceLike) -> str:
    """A short name for a source in messages: ``image 127.0.0.1:5000/x@sha256:ab12...``."""
    pin = source.digest or source.commit or source.sha256 or "unpinned"
    where = f"{source.uri}@{pin}" if source.kind != "http" else f"{source.uri} (sha256 {pin})"
    if source.kind == "helm":
        chart, version = getattr(source, "chart", None), getattr(source, "version", None)
        where = f"{source.uri} {chart} {version} (sha256 {pin})"
    if source.kind == "git" and source.directory:
        where += f":{source.directory}"
    return f"{source.kind} {where}"


def check_sha256_digest(value: str | None, *, source: str) -> str:
    """Return ``value`` if it is ``sha256:<64 hex>``; raises InvalidSourceError otherwise."""
    if value is None or not is_digest(value):
        raise InvalidSourceError(
            f"expected a digest sha256:<64 hex>, got {value!r}", source=source, rule="PinMalformed"
        )
    return value


def check_hex_sha256(value: str | None, *, source: str) -> str:
    """Return the 64-hex sha256 of ``value`` (``sha256:`` prefix allowed).

    Raises InvalidSourceError when it is not one.
    """
    bare = value.removeprefix("sha256:") if value else ""
    if not is_sha256_hex(bare):
        raise InvalidSourceError(
            f"expected a sha256 of 64 hex digits, got {value!r}", source=source, rule="PinMalformed"
        )
    return bare


def check_commit(value: str | None, *, source: str) -> str:
    """Return ``value`` if it is a full 40-hex commit id; raises InvalidSourceError otherwise."""
    if value is None or not is_commit(value):
        raise InvalidSourceError(
            f"expected a full 40-hex commit id, got {value!r}", source=source, rule="PinMalformed"
        )
    return value


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    import hashlib  # here: a render never hashes (OpenSSL's library takes 2 ms to load)

    return "sha256:" + hashlib.sha256(data).hexdigest()
