"""Writing many small git objects at once, as one pack file instead of thousands of loose files.

A publish of 10,000 clusters creates about 40,000 objects (a set and a proof blob, a tree and a
commit per cluster). libgit2 writes each as a loose file (open, compress, rename): about a
millisecond apiece on a busy disk, most of a minute in all. :class:`PackWriter` computes the
object ids itself (sha1 of ``"<type> <size>\\0" + body``, as git does), compresses each object
once, and writes one version-2 pack and its version-2 index into ``objects/pack/`` of the
repository, where libgit2 (and git) read it like any other pack.

Formats: ``Documentation/gitformat-pack.txt`` of git.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import zlib
from pathlib import Path

_TYPES = {"commit": 1, "tree": 2, "blob": 3}
_REF_DELTA = 7
_MAX_COPY = 0x10000
_MAX_INSERT = 0x7F

DeltaOp = tuple[int, int] | bytes
"""A delta instruction: ``(offset, size)`` copies from the base, bytes are inserted."""


class PackWriter:
    """Collects objects (deduplicated by id) and writes them as one pack with :meth:`write`."""

    def __init__(self, *, entries: dict[bytes, bytes] | None = None, compress: bool = True) -> None:
        # raw id -> (pack type, body, raw id of the delta base or b"")
        self._objects: dict[bytes, tuple[int, bytes, bytes]] = {}
        # raw id -> its compressed entry, shared by writers whose packs hold the same objects
        # (a publication's carried commits: compressed once for two packs).
        self._entries = entries if entries is not None else {}
        # Small packs (a publication of a few clusters per shard) are stored uncompressed:
        # deflating costs 5x more than storing, for a few hundred bytes an object.
        self._deflate = _deflate if compress else _store

    def __len__(self) -> int:
        return len(self._objects)

    def add(self, kind: str, body: bytes) -> str:
        """Add an object of ``kind`` (blob, tree, commit); return its hex id."""
        raw = hashlib.sha1(f"{kind} {len(body)}\0".encode() + body, usedforsecurity=False).digest()
        self._objects.setdefault(raw, (_TYPES[kind], body, b""))
        return raw.hex()

    def blob(self, data: bytes) -> str:
        return self.add("blob", data)

    def blob_delta(self, data: bytes, *, base: str, base_size: int, ops: list[DeltaOp]) -> str:
        """Add blob ``data`` stored as a delta of blob ``base`` (hex id of a blob of this pack,
        ``base_size`` bytes): ``ops`` rebuild ``data`` from the base. Returns the blob's id.

        A set of 20 bundles is about 8 KB, of which the cluster's own lines are a few dozen
        bytes: as a delta of another set of its shape it costs the pack (and the server
        that indexes it) a few hundred bytes instead of a compressed copy.
        """
        raw = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).digest()
        if raw not in self._objects:
            delta = _delta(base_size, len(data), ops)
            self._objects[raw] = (_REF_DELTA, delta, bytes.fromhex(base))
        return raw.hex()

    def tree(self, files: dict[str, str], dirs: dict[str, str] | None = None) -> str:
        """A tree of regular files (name -> blob hex id) and of ``dirs`` (name -> tree hex
        id); names without '/'."""
        entries = [(name.encode(), b"100644 ", oid) for name, oid in files.items()]
        # Git sorts tree entries by name bytes, a directory as if its name ended with "/".
        entries += [(name.encode() + b"/", b"40000 ", oid) for name, oid in (dirs or {}).items()]
        entries.sort()
        body = b"".join(
            mode + name.rstrip(b"/") + b"\0" + bytes.fromhex(oid) for name, mode, oid in entries
        )
        return self.add("tree", body)

    def carry(self, other: PackWriter) -> dict[str, tuple[str, str]]:
        """Copy every tree and blob of ``other`` into this pack (deltas with their bases), and
        each of its commits as a blob of the commit's bytes; return commit id -> (that blob's
        id, the commit's tree id). What a commit needs can then travel in a pack of another
        repository, reachable from a tree, without the commit's history (see
        :mod:`hub.publish.ledger`)."""
        carried: dict[str, tuple[str, str]] = {}
        for raw, (kind, body, base) in other._objects.items():
            if kind == _TYPES["commit"]:
                # A commit's body starts with "tree <40 hex>".
                carried[raw.hex()] = (self.blob(body), body[5:45].decode())
            else:
                self._objects.setdefault(raw, (kind, body, base))
        return carried

    def commit(
        self, *, tree: str, parents: list[str], author: str, timestamp: int, message: str
    ) -> str:
        """A commit; ``author`` is ``"Name <email>"`` and also the committer, time in UTC."""
        lines = [f"tree {tree}"]
        lines += [f"parent {p}" for p in parents]
        lines.append(f"author {author} {timestamp} +0000")
        lines.append(f"committer {author} {timestamp} +0000")
        body = ("\n".join(lines) + "\n\n" + message).encode()
        return self.add("commit", body)

    def write(self, repo_path: Path) -> Path | None:
        """Write the pack and its index into ``repo_path/objects/pack``; return the pack path.

        The pack is self-contained (every delta's base is in it), so it can also be sent to a
        server as it is. Nothing is written when no object was added. Raises OSError if the
        files cannot be written (temporary files are removed).
        """
        if not self._objects:
            return None
        pack_dir = Path(repo_path) / "objects" / "pack"
        pack_dir.mkdir(parents=True, exist_ok=True)
        ids = sorted(self._objects)
        pack_sha = hashlib.sha1(usedforsecurity=False)
        offsets: dict[bytes, int] = {}
        crcs: dict[bytes, int] = {}
        tmp_pack = _temporary(pack_dir, "tmp_pack_")
        tmp_idx = _temporary(pack_dir, "tmp_idx_")
        try:
            with open(tmp_pack, "wb") as out:
                header = b"PACK" + struct.pack(">II", 2, len(ids))
                out.write(header)
                pack_sha.update(header)
                offset = len(header)
                entries = self._entries
                for raw in ids:
                    entry = entries.get(raw)
                    if entry is None:
                        kind, body, base = self._objects[raw]
                        entry = entries[raw] = (
                            _entry_header(kind, len(body)) + base + self._deflate(body)
                        )
                    out.write(entry)
                    pack_sha.update(entry)
                    offsets[raw] = offset
                    crcs[raw] = zlib.crc32(entry)
                    offset += len(entry)
                checksum = pack_sha.digest()
                out.write(checksum)
            index = _index(ids, offsets, crcs, checksum)
            tmp_idx.write_bytes(index)
            name = f"pack-{checksum.hex()}"
            # The index goes in place last: readers look for packs through their index.
            pack_path = pack_dir / f"{name}.pack"
            os.replace(tmp_pack, pack_path)
            os.replace(tmp_idx, pack_dir / f"{name}.idx")
        finally:
            for leftover in (tmp_pack, tmp_idx):
                if leftover.exists():
                    leftover.unlink()
        self._objects.clear()
        return pack_path


def store_received(pack: bytes, index: list[tuple[bytes, int, int]], repo_path: Path) -> Path:
    """Keep a pack a server sent, as it came, in ``repo_path/objects/pack`` with its index:
    ``index`` gives each object's raw id, offset and entry crc32 (the pack's own checksum ends
    it). No object is compressed again. Raises OSError if the files cannot be written."""
    pack_dir = Path(repo_path) / "objects" / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    checksum = pack[-20:]
    offsets: dict[bytes, int] = {}
    crcs: dict[bytes, int] = {}
    for raw, offset, crc in index:
        if raw not in offsets:  # an object sent twice is indexed once
            offsets[raw], crcs[raw] = offset, crc
    ids = sorted(offsets)
    name = f"pack-{checksum.hex()}"
    # Names of this call alone: several threads (and processes) of a hub store packs into one
    # cache at once, and two of them may be storing the same pack (the rename is atomic).
    tmp_pack = _temporary(pack_dir, "tmp_recv_")
    tmp_idx = _temporary(pack_dir, "tmp_recv_idx_")
    try:
        tmp_pack.write_bytes(pack)
        tmp_idx.write_bytes(_index(ids, offsets, crcs, checksum))
        pack_path = pack_dir / f"{name}.pack"
        os.replace(tmp_pack, pack_path)
        os.replace(tmp_idx, pack_dir / f"{name}.idx")  # the index last: readers go through it
    finally:
        for leftover in (tmp_pack, tmp_idx):
            if leftover.exists():
                leftover.unlink()
    return pack_path


def _temporary(directory: Path, prefix: str) -> Path:
    """A new empty file in ``directory`` that no other thread or process is given (mkstemp)."""
    fd, name = tempfile.mkstemp(prefix=prefix, dir=directory)
    os.close(fd)
    return Path(name)


def _deflate(body: bytes) -> bytes:
    """zlib of one pack entry. Most entries are a few hundred bytes (commits, trees, proofs,
    deltas), for which setting up zlib's default 32 KB window and 64 KB hash costs 3x more
    than compressing: a 4 KB window and a small hash compress them as well, 4x faster."""
    if len(body) > 4096:
        return zlib.compress(body, 1)
    deflater = zlib.compressobj(1, zlib.DEFLATED, 12, 2)
    return deflater.compress(body) + deflater.flush()


def _store(body: bytes) -> bytes:
    """A pack entry's zlib stream, stored (level 0): valid for every reader, and cheap."""
    return zlib.compress(body, 0)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _delta(base_size: int, size: int, ops: list[DeltaOp]) -> bytes:
    """git's delta format: both sizes, then copy and insert instructions."""
    out = bytearray(_varint(base_size) + _varint(size))
    for op in ops:
        if isinstance(op, bytes):
            for at in range(0, len(op), _MAX_INSERT):
                chunk = op[at : at + _MAX_INSERT]
                out.append(len(chunk))
                out += chunk
            continue
        offset, length = op
        while length > 0:
            step = min(length, _MAX_COPY)
            command = 0x80
            args = bytearray()
            for i in range(4):
                byte = (offset >> (8 * i)) & 0xFF
                if byte:
                    command |= 1 << i
                    args.append(byte)
            # A copy of 0x10000 bytes is written with no size byte (git reads 0 as 0x10000).
            encoded = 0 if step == _MAX_COPY else step
            for i in range(3):
                byte = (encoded >> (8 * i)) & 0xFF
                if byte:
                    command |= 0x10 << i
                    args.append(byte)
            out.append(command)
            out += args
            offset += step
            length -= step
    return bytes(out)


def _entry_header(kind: int, size: int) -> bytes:
    out = bytearray()
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def _index(
    ids: list[bytes], offsets: dict[bytes, int], crcs: dict[bytes, int], pack_checksum: bytes
) -> bytes:
    fanout = [0] * 256
    for raw in ids:
        fanout[raw[0]] += 1
    total = 0
    for i in range(256):
        total += fanout[i]
        fanout[i] = total
    large: list[int] = []
    small: list[int] = []
    for raw in ids:
        off = offsets[raw]
        if off < 0x80000000:
            small.append(off)
        else:
            small.append(0x80000000 | len(large))
            large.append(off)
    parts = [
        b"\xfftOc",
        struct.pack(">I", 2),
        struct.pack(">256I", *fanout),
        b"".join(ids),
        struct.pack(f">{len(ids)}I", *(crcs[r] for r in ids)),
        struct.pack(f">{len(ids)}I", *small),
        struct.pack(f">{len(large)}Q", *large) if large else b"",
        pack_checksum,
    ]
    body = b"".join(parts)
    return body + hashlib.sha1(body, usedforsecurity=False).digest()
