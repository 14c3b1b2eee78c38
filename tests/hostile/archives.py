"""Hostile tar and tar+gzip archives, each with the rule that must refuse it."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.source.archive import ArchiveLimits

MiB = 1024 * 1024


@dataclass(frozen=True)
class ArchiveCase:
    name: str
    build: Callable[[], bytes]
    rule: str
    member: str = ""  # the member named in the refusal ("" when the archive as a whole)
    limits: ArchiveLimits = field(default_factory=ArchiveLimits)


def entry(
    name: str,
    *,
    kind: bytes = tarfile.REGTYPE,
    data: bytes = b"",
    link: str = "",
    size: int | None = None,
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    info.size = len(data) if size is None else size
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, data


def tar(*entries: tuple[tarfile.TarInfo, bytes], compress: bool = True) -> bytes:
    """A tar (gzip-compressed by default) of the given entries, in order."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as out:
        for info, data in entries:
            out.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(raw.getvalue(), mtime=0) if compress else raw.getvalue()


GOOD_YAML = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n"


def _oversized_header() -> bytes:
    # Only the header and a little data: the size in the header is refused before reading on.
    info, _ = entry("big.yaml", size=17 * MiB)
    return gzip.compress(info.tobuf(tarfile.GNU_FORMAT) + b"x" * 1024, mtime=0)


def _gzip_bomb() -> bytes:
    # 15 MiB of zeros in one file (under the per-file cap) compress about 1000 times.
    return tar(entry("zeros.yaml", data=bytes(15 * MiB)))


def _too_many_files() -> bytes:
    return tar(*(entry(f"f{i}.yaml") for i in range(1_050)))


def _too_many_bytes() -> bytes:
    # Random bytes do not compress: this is about the total, not the ratio.
    return tar(*(entry(f"part{i}.bin", data=os.urandom(400 * 1024)) for i in range(4)))


CASES: list[ArchiveCase] = [
    ArchiveCase(
        "path-traversal",
        lambda: tar(entry("../evil.yaml", data=GOOD_YAML)),
        "PathTraversal",
        "../evil.yaml",
    ),
    ArchiveCase(
        "nested-traversal",
        lambda: tar(entry("a/b/../../../evil.yaml", data=GOOD_YAML)),
        "PathTraversal",
        "a/b/../../../evil.yaml",
    ),
    ArchiveCase(
        "absolute-path",
        lambda: tar(entry("/etc/evil.yaml", data=GOOD_YAML)),
        "AbsolutePath",
        "/etc/evil.yaml",
    ),
    ArchiveCase(
        "escaping-symlink",
        lambda: tar(entry("link", kind=tarfile.SYMTYPE, link="../../etc")),
        "SymlinkEscapes",
        "link",
    ),
    ArchiveCase(
        "absolute-symlink",
        lambda: tar(entry("passwd", kind=tarfile.SYMTYPE, link="/etc/passwd")),
        "SymlinkEscapes",
        "passwd",
    ),
    ArchiveCase(
        "symlink-chain",
        lambda: tar(
            entry("x/s", kind=tarfile.SYMTYPE, link=".."),
            entry("x/l", kind=tarfile.SYMTYPE, link="s/.."),
        ),
        "SymlinkEscapes",
        "x/l",
    ),
    ArchiveCase(
        "write-through-symlink",
        lambda: tar(
            entry("sub/", kind=tarfile.DIRTYPE),
            entry("d", kind=tarfile.SYMTYPE, link="sub"),
            entry("d/evil.yaml", data=GOOD_YAML),
        ),
        "PathThroughSymlink",
        "d/evil.yaml",
    ),
    ArchiveCase(
        "escaping-hardlink",
        lambda: tar(entry("h", kind=tarfile.LNKTYPE, link="../../etc/passwd")),
        "HardlinkEscapes",
        "h",
    ),
    ArchiveCase(
        "absolute-hardlink",
        lambda: tar(entry("h", kind=tarfile.LNKTYPE, link="/etc/passwd")),
        "HardlinkEscapes",
        "h",
    ),
    ArchiveCase(
        "hardlink-to-nothing",
        lambda: tar(entry("h", kind=tarfile.LNKTYPE, link="missing.yaml")),
        "HardlinkEscapes",
        "h",
    ),
    ArchiveCase(
        "char-device", lambda: tar(entry("null", kind=tarfile.CHRTYPE)), "DeviceFile", "null"
    ),
    ArchiveCase(
        "block-device", lambda: tar(entry("sda", kind=tarfile.BLKTYPE)), "DeviceFile", "sda"
    ),
    ArchiveCase("fifo", lambda: tar(entry("pipe", kind=tarfile.FIFOTYPE)), "FifoFile", "pipe"),
    ArchiveCase(
        "too-many-files",
        _too_many_files,
        "TooManyFiles",
        "f1000.yaml",
        ArchiveLimits(max_files=1_000),
    ),
    ArchiveCase(
        "too-many-bytes",
        _too_many_bytes,
        "TooManyBytes",
        "part2.bin",
        ArchiveLimits(max_total_bytes=1 * MiB),
    ),
    ArchiveCase("gzip-bomb", _gzip_bomb, "CompressionRatio"),
    ArchiveCase("oversized-file", _oversized_header, "FileTooLarge", "big.yaml"),
    ArchiveCase(
        "not-an-archive", lambda: gzip.compress(b"\x00garbage" * 100, mtime=0), "CorruptArchive"
    ),
]
