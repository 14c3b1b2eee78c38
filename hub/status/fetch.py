"""Listing status branches and fetching the moved ones with git protocol v2, in one connection.

A warm hub refreshing a shard of 6,250 status branches, of which 60 moved, pays with libgit2
(protocol v0 only) a full ref advertisement, a match of every refspec against every ref, a walk
of its local refs for "have" lines and a tracking ref per branch: most of the refresh. Protocol
v2 asks ``ls-refs`` for the status branches only, then ``fetch`` for exactly the moved tips,
telling the server the previous tip of each (the new commit's parent, so only the new objects
travel). The pack that comes back is small (a commit, a tree and a document per moved branch):
it is read here and written into the local cache repository as a pack of the hub's own
(:mod:`hub.publish.pack`).

git:// and http(s):// only (``supported``); other URLs, and servers that do not speak v2, use
libgit2 (:class:`NotProtocolV2`). Protocol: git's ``Documentation/gitprotocol-v2.txt`` and
``gitformat-pack.txt``. Bounded: at most :data:`MAX_PACK_BYTES` of pack, no thin packs.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import socket
import zlib
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from agent.source.pktline import PktReader, pkt
from hub.errors import GitTransportError

MAX_PACK_BYTES = 512 * 1024 * 1024
MAX_OBJECT_BYTES = 16 * 1024 * 1024
"""What one object of a fetched pack may inflate to (a delta's result too): a status document
is a few KiB, its commit and tree less."""
MAX_INFLATED_BYTES = 512 * 1024 * 1024
"""What all objects of one fetched pack may inflate to, together."""


class PackBoundError(ValueError):
    """A fetched pack inflates past :data:`MAX_OBJECT_BYTES` or :data:`MAX_INFLATED_BYTES`
    (a zlib bomb: a few KiB on the wire, gigabytes in memory)."""


class PackRefusedError(GitTransportError):
    """A fetch whose pack was refused for its inflated size (:class:`PackBoundError`)."""


_TYPES = {1: "commit", 2: "tree", 3: "blob", 4: "tag"}
_OFS_DELTA, _REF_DELTA = 6, 7


class NotProtocolV2(Exception):
    """The URL's scheme or the server does not speak protocol v2 here."""


def supported(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("git", "http", "https") and parts.username is None


def _ls_refs(prefix: str) -> bytes:
    return (
        pkt(b"command=ls-refs\n")
        + b"0001"
        + pkt(b"ref-prefix " + prefix.encode() + b"\n")
        + b"0000"
    )


def _fetch(
    wants: Iterable[str], haves: Iterable[str], *, depth: int | None, only: str | None
) -> bytes:
    lines = [pkt(b"command=fetch\n"), b"0001", pkt(b"no-progress\n")]
    if depth is not None:
        lines.append(pkt(f"deepen {depth}\n".encode()))
    if only is not None:
        lines.append(pkt(f"filter {only}\n".encode()))
    lines += [pkt(f"want {w}\n".encode()) for w in wants]
    lines += [pkt(f"have {h}\n".encode()) for h in haves]
    lines += [pkt(b"done\n"), b"0000"]
    return b"".join(lines)


def _refs(lines: list[bytes], prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    cut = len(prefix)
    for line in lines:
        oid, _, rest = line.rstrip(b"\n").partition(b" ")
        name = rest.split(b" ", 1)[0].decode(errors="replace")
        if name.startswith(prefix) and len(oid) == 40:
            out[name[cut:]] = oid.decode()
    return out


def _packfile(reader: PktReader) -> bytes:
    """The pack of a v2 ``fetch`` response (side-band multiplexed)."""
    data: list[bytes] = []
    size = 0
    in_pack = False
    while (line := reader.line()) is not None:
        if not in_pack:
            if line == b"packfile\n":
                in_pack = True
            continue  # acknowledgments, shallow-info: not asked for
        if not line:
            continue
        band, payload = line[0], line[1:]
        if band == 1:
            size += len(payload)
            if size > MAX_PACK_BYTES:
                raise GitTransportError(f"the git server sent more than {MAX_PACK_BYTES} bytes")
            data.append(payload)
        elif band == 3:
            raise GitTransportError(
                "the git server says: " + payload.decode(errors="replace").strip()
            )
    return b"".join(data)


class Session:
    """One listing and one fetch of a repository's refs under ``prefix`` (see module)."""

    def __init__(
        self,
        url: str,
        *,
        credentials: tuple[str, str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        if not supported(url):
            raise NotProtocolV2(url)
        self.url = url
        self.credentials = credentials
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._reader: PktReader | None = None
        self.capabilities: list[bytes] = []

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def refs(self, prefix: str, *, what: str = "the branches") -> dict[str, str]:
        """Ref name (without ``prefix``) -> oid. Raises GitTransportError ("cannot list
        ``what`` of ..."), NotProtocolV2."""
        try:
            return _refs(self._command(_ls_refs(prefix)).section(), prefix)
        except (OSError, ValueError, http.client.HTTPException, GitTransportError) as exc:
            raise GitTransportError(f"cannot list {what} of {self.url}: {exc}") from exc

    @property
    def filters(self) -> bool:
        """Whether the server filters what a fetch sends (``filter tree:0``: commits only;
        ``uploadpack.allowFilter``, as GitHub, GitLab and Gitea serve). Known once connected."""
        return any(
            line.startswith(b"fetch=") and b"filter" in line.split(b"=", 1)[1].split()
            for line in self.capabilities
        )

    def fetch_pack(
        self,
        wants: list[str],
        haves: list[str],
        *,
        depth: int | None = None,
        commits_only: bool = False,
    ) -> tuple[bytes, list[tuple[str, bytes, bytes, int, int]]]:
        """The pack the server sends for ``wants`` when it knows we have ``haves``, and its
        objects as :func:`parse_pack` gives them. ``depth``: history that deep only (1: the
        commits wanted, not their ancestors); ``commits_only``: no trees nor blobs (needs
        :attr:`filters`). Raises GitTransportError."""
        if not wants:
            return b"", []
        request = _fetch(wants, haves, depth=depth, only="tree:0" if commits_only else None)
        try:
            pack = _packfile(self._command(request))
            return pack, parse_pack(pack)
        except PackBoundError as exc:
            raise PackRefusedError(f"a pack from {self.url} is refused: {exc}") from exc
        except (OSError, ValueError, zlib.error, http.client.HTTPException) as exc:
            raise GitTransportError(f"fetching from {self.url} failed: {exc}") from exc

    def _command(self, request: bytes) -> PktReader:
        """Send one v2 command; the reader of its answer."""
        parts = urlsplit(self.url)
        if parts.scheme == "git":
            reader = self._git(parts.hostname or "", parts.port or 9418, parts.path)
            assert self._sock is not None
            self._sock.sendall(request)
            return reader
        return self._http(request)

    def _git(self, host: str, port: int, path: str) -> PktReader:
        if self._reader is not None:
            return self._reader
        sock = socket.create_connection((host, port), timeout=self.timeout)
        self._sock = sock
        sock.sendall(pkt(f"git-upload-pack {path}\0host={host}\0\0version=2\0".encode()))
        stream = sock.makefile("rb", buffering=1 << 16)
        reader = PktReader(stream.read)
        capabilities = reader.section()
        if not capabilities or capabilities[0] != b"version 2\n":
            raise NotProtocolV2(self.url)
        self.capabilities = [line.rstrip(b"\n") for line in capabilities]
        self._reader = reader
        return reader

    def _http(self, request: bytes) -> PktReader:
        parts = urlsplit(self.url)
        path = parts.path.rstrip("/")
        if self._reader is None:
            # The capability advertisement first: a server answering in v0 is not asked more.
            capabilities = PktReader(
                self._request("GET", f"{path}/info/refs?service=git-upload-pack")
            )
            lines = [line for line in capabilities.section() if not line.startswith(b"# service")]
            if not lines:
                lines = capabilities.section()
            if not lines or lines[0] != b"version 2\n":
                raise NotProtocolV2(self.url)
            self.capabilities = [line.rstrip(b"\n") for line in lines]
            self._reader = capabilities
        return PktReader(self._request("POST", f"{path}/git-upload-pack", request))

    def _request(self, method: str, path: str, body: bytes | None = None) -> Callable[[int], bytes]:
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname or "", parts.port, timeout=self.timeout)
        headers = {"Git-Protocol": "version=2", "User-Agent": "git/fleetlet"}
        if body is not None:
            headers["Content-Type"] = "application/x-git-upload-pack-request"
        if self.credentials is not None:
            token = base64.b64encode(":".join(self.credentials).encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        if response.status in (401, 403):
            raise GitTransportError(f"HTTP {response.status}: credentials refused or missing")
        if response.status != 200:
            raise NotProtocolV2(f"{self.url}: HTTP {response.status}")
        return response.read


def parse_pack(pack: bytes) -> list[tuple[str, bytes, bytes, int, int]]:
    """Every object of a (non-thin) pack: (kind, data, raw id, offset, crc32 of its entry), in
    the pack's order, deltas resolved (what an index of the pack needs).

    Raises ValueError for a malformed pack (bad header or checksum, a delta whose base is not
    in the pack), PackBoundError (a ValueError) for one inflating past the bounds, and
    zlib.error for a damaged entry. Nothing is inflated past an entry's declared size, nor past
    the bounds: a bomb costs the bound, not what it would inflate to.
    """
    if len(pack) < 32 or pack[:4] != b"PACK":
        raise ValueError("not a pack")
    if hashlib.sha1(pack[:-20], usedforsecurity=False).digest() != pack[-20:]:
        raise ValueError("the pack's checksum does not match")
    count = int.from_bytes(pack[8:12], "big")
    view = memoryview(pack)
    at = 12
    # offset -> (kind, data, -1) for whole objects, (delta kind, delta, base offset or id)
    entries: dict[int, tuple[int, bytes, int | bytes]] = {}
    crcs: dict[int, int] = {}
    inflated = 0
    for _ in range(count):
        start = at
        byte = pack[at]
        at += 1
        kind, size, shift = (byte >> 4) & 7, byte & 0x0F, 4
        while byte & 0x80:
            byte = pack[at]
            at += 1
            size |= (byte & 0x7F) << shift
            shift += 7
        base: int | bytes = -1
        if kind == _OFS_DELTA:
            byte = pack[at]
            at += 1
            distance = byte & 0x7F
            while byte & 0x80:
                byte = pack[at]
                at += 1
                distance = ((distance + 1) << 7) | (byte & 0x7F)
            base = start - distance
        elif kind == _REF_DELTA:
            base = bytes(pack[at : at + 20])
            at += 20
        elif kind not in _TYPES:
            raise ValueError(f"unknown pack entry type {kind}")
        inflated += size
        _bound(size, inflated, f"the entry at offset {start}")
        data, at = _inflate(view, at, size)
        entries[start] = (kind, data, base)
        crcs[start] = zlib.crc32(view[start:at])
    return [
        (_TYPES[kind], data, oid, offset, crcs[offset])
        for offset, (kind, data, oid) in sorted(_resolve(entries, inflated).items())
    ]


def _bound(size: int, total: int, what: str) -> None:
    """Raises PackBoundError when one object of ``size`` bytes, or ``total`` for the pack, is
    past the bounds."""
    if size > MAX_OBJECT_BYTES:
        raise PackBoundError(
            f"{what} inflates to {size} bytes, past the bound of {MAX_OBJECT_BYTES} per object"
        )
    if total > MAX_INFLATED_BYTES:
        raise PackBoundError(
            f"its objects inflate to more than {MAX_INFLATED_BYTES} bytes (the bound per pack)"
        )


def _inflate(view: memoryview, at: int, size: int) -> tuple[bytes, int]:
    """The ``size`` bytes of the zlib stream at ``at`` and where the stream ends; never more
    than ``size + 1`` bytes are inflated. Raises ValueError, zlib.error."""
    limit = len(view) - 20
    inflater = zlib.decompressobj()
    end = min(limit, at + size + 1024)  # a stream rarely outgrows its data
    chunk: bytes | memoryview = view[at:end]
    data = bytearray()
    while True:
        data += inflater.decompress(chunk, size + 1 - len(data))
        if len(data) > size:
            raise ValueError("an entry of the pack inflates past its declared size")
        if inflater.eof:
            break
        if inflater.unconsumed_tail:
            chunk = inflater.unconsumed_tail
            continue
        if end >= limit:
            raise ValueError("an entry of the pack is truncated")
        more = min(limit, end + max(size, 1 << 16))
        chunk, end = view[end:more], more
    if len(data) != size:
        raise ValueError("an entry of the pack has the wrong size")
    return bytes(data), end - len(inflater.unused_data)


def _resolve(
    entries: dict[int, tuple[int, bytes, int | bytes]], inflated: int = 0
) -> dict[int, tuple[int, bytes, bytes]]:
    """offset -> (kind, data, raw id) of every entry, deltas applied: from each whole object
    down to the deltas on it (by offset or by id), in any order of the pack, each once and
    without recursion (chains can be long). Raises ValueError for a delta whose base is not
    in the pack."""
    on_offset: dict[int, list[int]] = {}
    on_id: dict[bytes, list[int]] = {}
    todo: list[tuple[int, int, bytes]] = []  # (offset, kind, data) ready to finish
    for offset, (kind, data, base) in entries.items():
        if kind in _TYPES:
            todo.append((offset, kind, data))
        elif isinstance(base, int):
            on_offset.setdefault(base, []).append(offset)
        else:
            on_id.setdefault(base, []).append(offset)
    resolved: dict[int, tuple[int, bytes, bytes]] = {}
    while todo:
        offset, kind, data = todo.pop()
        header = f"{_TYPES[kind]} {len(data)}\0".encode()
        oid = hashlib.sha1(header + data, usedforsecurity=False).digest()
        resolved[offset] = (kind, data, oid)
        for child in (*on_offset.pop(offset, ()), *on_id.pop(oid, ())):
            delta = entries[child][1]
            size = delta_size(delta)
            inflated += size
            _bound(size, inflated, f"the delta at offset {child}")
            todo.append((child, kind, apply_delta(data, delta)))
    if len(resolved) != len(entries):
        raise ValueError("a delta of the pack has no base in it")
    return resolved


def delta_size(delta: bytes) -> int:
    """The size of what ``delta`` makes (its second varint), read before making it."""
    at, value = 0, 0
    for _ in range(2):
        value, shift = 0, 0
        while True:
            if at >= len(delta):
                raise ValueError("a delta is truncated")
            byte = delta[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
    return value


def apply_delta(base: bytes, delta: bytes) -> bytes:
    """git's delta format (see :func:`hub.publish.pack._delta`). Raises ValueError."""
    at = 0

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = delta[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    if varint() != len(base):
        raise ValueError("a delta's base has the wrong size")
    size = varint()
    out = bytearray()
    while at < len(delta):
        command = delta[at]
        at += 1
        if command & 0x80:
            offset = length = 0
            for i in range(4):
                if command & (1 << i):
                    offset |= delta[at] << (8 * i)
                    at += 1
            for i in range(3):
                if command & (0x10 << i):
                    length |= delta[at] << (8 * i)
                    at += 1
            length = length or 0x10000
            if offset + length > len(base):
                raise ValueError("a delta copies past its base")
            out += base[offset : offset + length]
        elif command:
            out += delta[at : at + command]
            at += command
        else:
            raise ValueError("a delta has a reserved instruction")
        if len(out) > size:
            raise ValueError("a delta makes more than its declared size")
    if len(out) != size:
        raise ValueError("a delta gives the wrong size")
    return bytes(out)
