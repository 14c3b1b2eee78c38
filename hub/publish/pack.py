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
import zlib
from pathlib import Path

_TYPES = {"commit": 1, "tree": 2, "blob": 3}


class PackWriter:
    """Collects objects (deduplicated by id) and writes them as one pack with :meth:`write`."""

    def __init__(self) -> None:
        self._objects: dict[bytes, tuple[int, bytes]] = {}  # raw id -> (type, body)

    def __len__(self) -> int:
        return len(self._objects)

    def add(self, kind: str, body: bytes) -> str:
        """Add an object of ``kind`` (blob, tree, commit); return its hex id."""
        raw = hashlib.sha1(f"{kind} {len(body)}\0".encode() + body, usedforsecurity=False).digest()
        self._objects.setdefault(raw, (_TYPES[kind], body))
        return raw.hex()

    def blob(self, data: bytes) -> str:
        return self.add("blob", data)

    def tree(self, files: dict[str, str]) -> str:
        """A tree of regular files: name -> blob hex id (names without '/')."""
        # Git sorts tree entries by name bytes (a directory sorts as "name/"; none here).
        body = b"".join(
            b"100644 " + name.encode() + b"\0" + bytes.fromhex(files[name])
            for name in sorted(files, key=lambda n: n.encode())
        )
        return self.add("tree", body)

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

        Nothing is written when no object was added. Raises OSError if the files cannot be
        written (temporary files are removed).
        """
        if not self._objects:
            return None
        pack_dir = Path(repo_path) / "objects" / "pack"
        pack_dir.mkdir(parents=True, exist_ok=True)
        ids = sorted(self._objects)
        pack_sha = hashlib.sha1(usedforsecurity=False)
        offsets: dict[bytes, int] = {}
        crcs: dict[bytes, int] = {}
        tmp_pack = pack_dir / f"tmp_pack_{os.getpid()}"
        tmp_idx = pack_dir / f"tmp_idx_{os.getpid()}"
        try:
            with open(tmp_pack, "wb") as out:
                header = b"PACK" + struct.pack(">II", 2, len(ids))
                out.write(header)
                pack_sha.update(header)
                offset = len(header)
                for raw in ids:
                    kind, body = self._objects[raw]
                    entry = _entry_header(kind, len(body)) + zlib.compress(body, 1)
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
