"""Pushing ref updates with a pack the hub wrote itself: the git ``receive-pack`` protocol.

libgit2's push builds its own pack from the local object database: it reads back every object
the hub just wrote, searches deltas between them and compresses them again (most of a publish
of 100,000 clusters), and it takes each ref's old value from the server's advertisement at push
time. This client sends the pack :mod:`hub.publish.pack` already wrote (small: sets of one
shape are deltas of each other) and, for each ref, the old value the hub's diff was made
against, which the server checks before it moves the ref: a ref that moved meanwhile is
refused, never overwritten (a compare-and-swap per ref).

Protocol: git's ``Documentation/gitprotocol-pack.txt`` (receive-pack, protocol v0 with the
``report-status`` capability) over ``git://`` (one connection) and smart HTTP(S) (the
advertisement, then one POST), basic credentials sent up front, no redirect followed.
"""

from __future__ import annotations

import base64
import http.client
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from agent.source.pktline import PktReader, pkt
from hub.errors import GitTransportError

ZERO = "0" * 40
SCHEMES = ("git", "http", "https")
_EMPTY_PACK = b"PACK\x00\x00\x00\x02\x00\x00\x00\x00" + bytes.fromhex(
    "029d08823bd8a8eab510ad6ac75c823cfd3ed31e"
)


class AtomicUnsupportedError(GitTransportError):
    """The server does not offer atomic pushes (all refs move or none)."""


@dataclass(frozen=True, slots=True)
class RefUpdate:
    """Move ``ref`` from ``old`` to ``new`` (40 hex; :data:`ZERO` creates or deletes)."""

    ref: str
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class PushOutcome:
    """The server's answer: ``refused`` maps each ref it did not move to its reason."""

    refused: Mapping[str, str]


def supported(url: str) -> bool:
    """Whether this client speaks to ``url`` (git://, http://, https:// without user info)."""
    parts = urlsplit(url)
    return parts.scheme in SCHEMES and parts.username is None and parts.password is None


def capabilities(first: bytes | None) -> set[str]:
    """The capabilities on the first line of a receive-pack advertisement (the refs that
    follow are not needed: each update names its own old value). Raises GitTransportError for
    a line that is no advertisement."""
    if not first:
        raise GitTransportError("the git server sent no ref advertisement")
    body, nul, extra = first.rstrip(b"\n").partition(b"\0")
    oid, _, name = body.partition(b" ")
    if not nul or len(oid) != 40 or not name:
        raise GitTransportError(f"the git server advertised {first[:80]!r}")
    return set(extra.decode(errors="replace").split())


def _commands(updates: Sequence[RefUpdate], caps: set[str], atomic: bool) -> bytes:
    if "report-status" not in caps:
        raise GitTransportError("the git server does not report push results (report-status)")
    wanted = ["report-status", "agent=fleetlet"]
    if atomic:
        wanted.append("atomic")
    if any(u.new == ZERO for u in updates) and "delete-refs" not in caps:
        raise GitTransportError("the git server does not allow deleting refs (delete-refs)")
    if atomic and "atomic" not in caps:
        raise AtomicUnsupportedError("the git server does not offer atomic pushes")
    chunks = []
    for i, u in enumerate(updates):
        line = f"{u.old} {u.new} {u.ref}".encode()
        if i == 0:
            line += b"\0" + " ".join(wanted).encode()
        chunks.append(pkt(line + b"\n"))
    chunks.append(b"0000")
    return b"".join(chunks)


def _report(reader: PktReader, updates: Sequence[RefUpdate]) -> PushOutcome:
    lines = reader.section()
    if not lines or not lines[0].startswith(b"unpack "):
        raise GitTransportError("the git server sent no push report")
    unpack = lines[0][len(b"unpack ") :].decode(errors="replace").strip()
    if unpack != "ok":
        raise GitTransportError(f"the git server could not store the pack: {unpack}")
    refused: dict[str, str] = {}
    answered: set[str] = set()
    for line in lines[1:]:
        text = line.decode(errors="replace").rstrip("\n")
        status, _, rest = text.partition(" ")
        ref, _, reason = rest.partition(" ")
        answered.add(ref)
        if status == "ng":
            refused[ref] = reason or "refused"
    for u in updates:
        if u.ref not in answered:
            refused[u.ref] = "the server reported no status"
    return PushOutcome(refused=refused)


class ReceivePack:
    """One repository's ``receive-pack`` at ``url`` (git:// or http(s)://).

    ``credentials`` (user, password) are sent as HTTP basic auth. Timeouts in seconds.
    """

    def __init__(
        self,
        url: str,
        *,
        credentials: tuple[str, str] | None = None,
        connect_timeout: float = 10.0,
        io_timeout: float = 900.0,
    ) -> None:
        if not supported(url):
            raise GitTransportError(f"{url}: publishing speaks git:// and http(s):// only")
        self.url = url
        self.credentials = credentials
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout

    def push(
        self,
        updates: Sequence[RefUpdate],
        *,
        pack: Path | None = None,
        atomic: bool = False,
    ) -> PushOutcome:
        """Send ``updates`` with ``pack`` (a pack file holding every object they need that the
        server lacks; an empty pack when None). Raises GitTransportError when the transfer
        fails (then no ref moved, or the report was lost)."""
        if not updates:
            return PushOutcome(refused={})
        return self._call(updates, pack, atomic=atomic)

    def _call(
        self, updates: Sequence[RefUpdate], pack: Path | None, *, atomic: bool
    ) -> PushOutcome:
        parts = urlsplit(self.url)
        try:
            if parts.scheme == "git":
                return self._git(
                    parts.hostname or "", parts.port or 9418, parts.path, updates, pack, atomic
                )
            return self._http(updates, pack, atomic)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise GitTransportError(f"git push to {self.url} failed: {exc}") from exc

    def _git(
        self,
        host: str,
        port: int,
        path: str,
        updates: Sequence[RefUpdate],
        pack: Path | None,
        atomic: bool,
    ) -> PushOutcome:
        with socket.create_connection((host, port), timeout=self.connect_timeout) as sock:
            sock.settimeout(self.io_timeout)
            sock.sendall(pkt(f"git-receive-pack {path}\0host={host}\0".encode()))
            stream = sock.makefile("rb", buffering=1 << 16)
            reader = PktReader(stream.read)
            caps = capabilities(reader.line())
            reader.skip_section()
            sock.sendall(_commands(updates, caps, atomic))
            if any(u.new != ZERO for u in updates):
                _send_pack(sock.sendall, pack)
            return _report(reader, updates)

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": "git/fleetlet"}
        if self.credentials is not None:
            token = base64.b64encode(":".join(self.credentials).encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname or "", parts.port, timeout=self.connect_timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(self.io_timeout)
        return conn

    def _http(self, updates: Sequence[RefUpdate], pack: Path | None, atomic: bool) -> PushOutcome:
        path = urlsplit(self.url).path.rstrip("/")
        conn = self._connection()
        try:
            conn.request(
                "GET", f"{path}/info/refs?service=git-receive-pack", headers=self._headers()
            )
            response = conn.getresponse()
            _check_http(response, self.url)
            reader = PktReader(response.read)
            first = reader.line()
            if first is not None and first.startswith(b"# service="):
                reader.skip_section()  # the service line's own section
                first = reader.line()
            caps = capabilities(first)
            response.read()
        finally:
            conn.close()
        commands = _commands(updates, caps, atomic)
        body_pack = pack.stat().st_size if pack is not None else len(_EMPTY_PACK)
        sends_pack = any(u.new != ZERO for u in updates)
        length = len(commands) + (body_pack if sends_pack else 0)
        conn = self._connection()
        try:
            conn.putrequest("POST", f"{path}/git-receive-pack", skip_accept_encoding=True)
            headers = {
                **self._headers(),
                "Content-Type": "application/x-git-receive-pack-request",
                "Accept": "application/x-git-receive-pack-result",
                "Content-Length": str(length),
            }
            for key, value in headers.items():
                conn.putheader(key, value)
            conn.endheaders()
            conn.send(commands)
            if sends_pack:
                _send_pack(conn.send, pack)
            response = conn.getresponse()
            _check_http(response, self.url)
            return _report(PktReader(response.read), updates)
        finally:
            conn.close()


def _check_http(response: http.client.HTTPResponse, url: str) -> None:
    if response.status in (401, 403):
        raise GitTransportError(f"{url}: HTTP {response.status}: credentials refused or missing")
    if response.status != 200:
        raise GitTransportError(f"{url}: HTTP {response.status} {response.reason}")


def _send_pack(send: object, pack: Path | None) -> None:
    write = send  # a socket's sendall or a connection's send
    if pack is None:
        write(_EMPTY_PACK)  # type: ignore[operator]
        return
    with open(pack, "rb") as source:
        while chunk := source.read(1 << 20):
            write(chunk)  # type: ignore[operator]
