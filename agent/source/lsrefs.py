"""Protocol v2 ``ls-refs`` over git:// and http(s)://: ask the server for ONE ref.

libgit2 speaks protocol v0 only, whose ref advertisement lists every branch of the repository:
with 10,000 cluster branches an idle poll would move ~860 KiB. A v2 ``ls-refs`` with
``ref-prefix`` returns just the one branch, so the agent's idle poll costs the same whatever the
size of the fleet (see docs/benchmarks.md, "Idle poll"). dulwich speaks protocol v2 too, but
pulling in a second git implementation beside pygit2 for one request costs more than these
few lines.
"""

from __future__ import annotations

import base64
import http.client
import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from agent.errors import TemporaryError
from agent.source.credentials import DEFAULT_TOKEN_USER, GitAuthError, GitCredentials
from agent.source.pktline import PktReader, pkt


class GitUnavailableError(TemporaryError):
    """The git server could not be reached or did not answer in time (retry later)."""

    reason = "GitUnavailable"


# --- protocol v2 ls-refs: one ref asked for, one ref received -------------------------------


class NotProtocolV2(Exception):
    """The scheme or the server does not speak protocol v2 (use the libgit2 listing)."""


_MAX_LISTING_BYTES = 1 << 20


def ls_ref_v2(
    url: str,
    ref: str,
    credentials: GitCredentials | None,
    *,
    connect_timeout: float,
    io_timeout: float,
) -> str | None:
    """The commit of ``ref`` on the server at ``url`` by a protocol v2 ``ls-refs`` with
    ``ref-prefix ref``: the server sends this one ref, not every branch (libgit2 speaks
    protocol v0 only, whose advertisement lists all refs: about 90 bytes per branch, per poll).

    git:// is one connection; http(s):// is two requests (capabilities, then ``ls-refs``),
    with basic credentials sent up front, no redirect followed (credentials stay with the
    configured server) and no proxy. Returns the commit id, or None if the ref does not exist.
    Raises NotProtocolV2 for other schemes, URLs with credentials in them and servers that
    answer in protocol v0,
    GitUnavailableError (temporary), GitAuthError (permanent).
    """
    for line in _listing(url, ref, credentials, connect_timeout, io_timeout):
        oid, _, rest = line.partition(b" ")
        name = rest.split(b" ", 1)[0].rstrip(b"\n")
        if name == ref.encode():
            return _commit(url, ref, oid)
    return None


def ls_refs_v2(
    url: str,
    prefix: str,
    credentials: GitCredentials | None,
    *,
    connect_timeout: float,
    io_timeout: float,
) -> dict[str, str]:
    """Every ref under ``prefix`` (name -> commit) by one protocol v2 ``ls-refs``: the hub's
    notification channel watches the cluster branches this way. Raises as :func:`ls_ref_v2`."""
    found: dict[str, str] = {}
    for line in _listing(url, prefix, credentials, connect_timeout, io_timeout):
        oid, _, rest = line.partition(b" ")
        name = rest.split(b" ", 1)[0].rstrip(b"\n").decode("utf-8", errors="replace")
        if name.startswith(prefix):
            found[name] = _commit(url, name, oid)
    return found


def _commit(url: str, ref: str, oid: bytes) -> str:
    commit = oid.decode("ascii", errors="replace")
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        raise GitUnavailableError(f"{url}: the server listed {ref} at {commit!r}")
    return commit


def _listing(
    url: str,
    ref: str,
    credentials: GitCredentials | None,
    connect_timeout: float,
    io_timeout: float,
) -> list[bytes]:
    """The pkt-lines of an ``ls-refs`` with ``ref-prefix ref``. Raises as :func:`ls_ref_v2`."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        # Credentials inside the URL: libgit2 knows how to use them, this client does not.
        raise NotProtocolV2(f"{parts.scheme} URL with credentials")
    try:
        if parts.scheme == "git":
            listing = _ls_refs_git(
                parts.hostname or "",
                parts.port or 9418,
                parts.path,
                ref,
                (connect_timeout, io_timeout),
            )
        elif parts.scheme in ("http", "https"):
            listing = _ls_refs_http(url, ref, credentials, io_timeout)
        else:
            raise NotProtocolV2(parts.scheme)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise GitUnavailableError(
            f"{url}: cannot list the branches of the repository: {exc}"
        ) from exc
    if listing is None:
        raise NotProtocolV2(url)
    return listing


_LS_REFS = b"command=ls-refs\n"


def _ls_refs_command(ref: str) -> bytes:
    return pkt(_LS_REFS) + b"0001" + pkt(b"ref-prefix " + ref.encode() + b"\n") + b"0000"


def _ls_refs_git(
    host: str, port: int, path: str, ref: str, timeouts: tuple[float, float]
) -> list[bytes] | None:
    connect_timeout, io_timeout = timeouts
    with socket.create_connection((host, port), timeout=connect_timeout) as sock:
        sock.settimeout(io_timeout)
        request = f"git-upload-pack {path}\0host={host}\0\0version=2\0".encode()
        sock.sendall(pkt(request))
        reader = PktReader(sock.recv, limit=_MAX_LISTING_BYTES)
        capabilities = reader.section()
        if not capabilities or capabilities[0] != b"version 2\n":
            return None
        # One write: the server answers at once (several small writes can wait on delayed
        # acknowledgements).
        sock.sendall(_ls_refs_command(ref) + b"0000")
        return reader.section()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a redirect is answered as the error it is; credentials stay here


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def _ls_refs_http(
    url: str, ref: str, credentials: GitCredentials | None, timeout: float
) -> list[bytes] | None:
    base = url.rstrip("/")
    headers = {"Git-Protocol": "version=2", "User-Agent": "git/fleetlet"}
    if credentials is not None and credentials.kind in ("basic", "token"):
        secret = credentials.password if credentials.password is not None else credentials.token
        user = credentials.username or DEFAULT_TOKEN_USER
        token = base64.b64encode(f"{user}:{secret}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"

    def call(request: urllib.request.Request) -> list[bytes]:
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                body = response.read(_MAX_LISTING_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                if credentials is None or "Authorization" not in headers:
                    raise GitAuthError(
                        f"{url}: HTTP {exc.code}: the server asks for credentials and none are "
                        "configured for HTTPS"
                    ) from exc
                raise GitAuthError(
                    f"{url}: HTTP {exc.code}: the server refused the {credentials.kind} "
                    f"credentials of {credentials.username or DEFAULT_TOKEN_USER}"
                ) from exc
            raise ValueError(f"HTTP {exc.code} from {request.full_url}") from exc
        if len(body) > _MAX_LISTING_BYTES:
            raise ValueError("the server's ref listing is too large")
        source = _BytesSource(body)
        reader = PktReader(source.read, limit=_MAX_LISTING_BYTES)
        lines: list[bytes] = []
        while source.left:
            lines.extend(reader.section())
        return lines

    advertised = call(
        urllib.request.Request(f"{base}/info/refs?service=git-upload-pack", headers=headers)
    )
    advertised = [line for line in advertised if not line.startswith(b"# service=")]
    if not advertised or advertised[0] != b"version 2\n":
        return None
    return call(
        urllib.request.Request(
            f"{base}/git-upload-pack",
            data=_ls_refs_command(ref),
            headers={**headers, "Content-Type": "application/x-git-upload-pack-request"},
            method="POST",
        )
    )


class _BytesSource:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def read(self, size: int) -> bytes:
        chunk = self._data[self._at : self._at + size]
        self._at += len(chunk)
        return chunk

    @property
    def left(self) -> int:
        return len(self._data) - self._at
