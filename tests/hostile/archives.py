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


# --- tar's own headers: bounded before tarfile reads them (issue 15, items 3, 4 and 8) -------


def _pax(records: dict[str, str]) -> bytes:
    """One PAX extended header ('x') carrying ``records``, as tar writes it."""
    return tarfile.TarInfo._create_pax_generic_header(records, tarfile.XHDTYPE, "utf-8")  # type: ignore[attr-defined,no-any-return]


def _member(name: str, data: bytes) -> bytes:
    info, _ = entry(name, data=data)
    padding = (-len(data)) % tarfile.BLOCKSIZE
    return info.tobuf(tarfile.USTAR_FORMAT) + data + b"\0" * padding


_END = b"\0" * (2 * tarfile.BLOCKSIZE)


def _pax_header_bomb() -> bytes:
    # 4 MiB of tiny records with distinct keys: tarfile reads the header whole, then builds a
    # dict of every record (hundreds of MiB). The gzip stays small.
    records = b"".join(b"%d k%07d=v\n" % (len(b" k0000000=v\n") + 2, i) for i in range(350_000))
    info, _ = entry("PaxHeaders/bomb", kind=tarfile.XHDTYPE, size=len(records))
    padding = (-len(records)) % tarfile.BLOCKSIZE
    raw = info.tobuf(tarfile.USTAR_FORMAT) + records + b"\0" * padding
    return gzip.compress(raw + _member("ok.yaml", GOOD_YAML) + _END, mtime=0)


def _pax_chain() -> bytes:
    # 400 extended headers before one member: tarfile follows them by recursion
    # (RecursionError); a 1.8 KB tar.gz.
    raw = _pax({"comment": "x"}) * 400 + _member("ok.yaml", GOOD_YAML) + _END
    return gzip.compress(raw, mtime=0)


def _pax_headers_in_total() -> bytes:
    # Each header under the per-header cap, together over the archive's total.
    members = b"".join(
        _pax({"comment": os.urandom(30_000).hex()}) + _member(f"m{i}.yaml", GOOD_YAML)
        for i in range(20)
    )
    return gzip.compress(members + _END, mtime=0)


def _gnu_long_name_bomb() -> bytes:
    name = b"n" * (2 * MiB)
    info, _ = entry("././@LongLink", kind=tarfile.GNUTYPE_LONGNAME, size=len(name) + 1)
    raw = info.tobuf(tarfile.GNU_FORMAT) + name + b"\0" * (-len(name) % tarfile.BLOCKSIZE or 512)
    return gzip.compress(raw + _member("ok.yaml", GOOD_YAML) + _END, mtime=0)


def _sparse() -> bytes:
    info, _ = entry("sparse.yaml", kind=tarfile.GNUTYPE_SPARSE)
    return gzip.compress(info.tobuf(tarfile.GNU_FORMAT) + _END, mtime=0)


LONG_NAME = "n" * 300 + ".yaml"

CASES += [
    ArchiveCase("pax-header-bomb", _pax_header_bomb, "HeaderTooLarge"),
    ArchiveCase("pax-header-chain", _pax_chain, "TooManyHeaders"),
    ArchiveCase("pax-headers-in-total", _pax_headers_in_total, "HeaderTooLarge"),
    ArchiveCase("gnu-long-name-bomb", _gnu_long_name_bomb, "HeaderTooLarge"),
    ArchiveCase("sparse-file", _sparse, "SparseFile", "sparse.yaml"),
    # One component longer than the file system takes (255 bytes): a refusal, not a
    # temporary disk error retried forever.
    ArchiveCase(
        "over-long-file-name",
        lambda: tar(entry(LONG_NAME, data=GOOD_YAML)),
        "NameTooLong",
        LONG_NAME[:200],
    ),
]


# --- several archives into one tree (the layers of one image) --------------------------------


@dataclass(frozen=True)
class LayeredCase:
    """An image of several layers: each harmless alone, refused together (``member`` is the
    entry named, in the layer named by ``layer``, its index)."""

    name: str
    build: Callable[[], list[bytes]]
    rule: str
    member: str
    limits: ArchiveLimits = field(default_factory=ArchiveLimits)


def escaping_link(levels: int, rest: str) -> str:
    """``d/s/s/.../../../<rest>``: inside the tree as written (and as long as ``d/s`` does
    not exist), ``levels`` directories above ``d``'s parent once ``d/s -> .`` exists."""
    return "d/" + "s/" * (levels - 1) + "../" * levels + rest


def loop_dir() -> bytes:
    """The second half: a real directory ``d`` and ``d/s -> .``."""
    return tar(entry("d/", kind=tarfile.DIRTYPE), entry("d/s", kind=tarfile.SYMTYPE, link="."))


LAYERED: list[LayeredCase] = [
    LayeredCase(
        # realpath(tree/.x) == /etc once both layers are in.
        "symlink-across-layers",
        lambda: [tar(entry(".x", kind=tarfile.SYMTYPE, link=escaping_link(30, "etc"))), loop_dir()],
        "SymlinkEscapes",
        ".x",
    ),
    LayeredCase(
        "write-through-an-earlier-layers-link",
        lambda: [
            tar(entry("sub/", kind=tarfile.DIRTYPE), entry("d", kind=tarfile.SYMTYPE, link="sub")),
            tar(entry("d/evil.yaml", data=GOOD_YAML)),
        ],
        "PathThroughSymlink",
        "d/evil.yaml",
    ),
    LayeredCase(
        "files-across-layers",
        lambda: [tar(*(entry(f"l{n}/f{i}.yaml") for i in range(3))) for n in range(5)],
        "TooManyFiles",
        "l3/f1.yaml",
        ArchiveLimits(max_files=10),
    ),
    LayeredCase(
        "bytes-across-layers",
        lambda: [tar(entry(f"part{n}.bin", data=os.urandom(300 * 1024))) for n in range(5)],
        "TooManyBytes",
        "part3.bin",
        ArchiveLimits(max_total_bytes=1 * MiB),
    ),
]
