"""Hostile-input-safe extraction of tar and tar+gzip archives.

Everything in an archive is assumed hostile. A member is refused, and the whole archive with
it, when its name is absolute or climbs out with ``..``, when a symlink or a hardlink points
outside the tree, when it is a device file, a fifo or another special file, or when it would be
written through a symlink. Sizes are capped while streaming (before bytes reach the disk): the
file count, each file's size, the total size, and the gzip expansion ratio (a gzip bomb is
refused after reading a bounded amount). Hardlinks inside the tree become copies and file modes
are reduced to 0644/0755, so nothing extracted aliases or elevates anything.
"""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from agent.source.content import ContentRefusedError, FetchError

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 64 * 1024


class UnsafeArchiveError(ContentRefusedError):
    """An archive was refused: a member or the archive as a whole broke a rule (``rule``)."""

    reason = "UnsafeArchive"


@dataclass(frozen=True, kw_only=True)
class ArchiveLimits:
    """Caps on what one archive may unpack to.

    ``max_ratio`` bounds decompressed/compressed bytes once more than ``ratio_floor`` bytes
    came out (small archives of zero-padded tar headers compress very well).
    """

    max_files: int = 10_000
    max_file_bytes: int = 16 * 1024 * 1024
    max_total_bytes: int = 128 * 1024 * 1024
    max_ratio: float = 200.0
    ratio_floor: int = 1024 * 1024
    max_path_length: int = 1024
    max_depth: int = 32


@dataclass(frozen=True)
class ExtractStats:
    """What an extraction produced."""

    files: int
    bytes: int


class _Meter(io.RawIOBase):
    """A reader counting the bytes it passes on; ``check`` may refuse after each read."""

    def __init__(self, inner: BinaryIO, check: object | None = None) -> None:
        self._inner = inner
        self.count = 0
        self._check = check

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        if callable(self._check):
            self._check()
        return n


class _Extractor:
    def __init__(self, dest: Path, *, source: str, archive: str, limits: ArchiveLimits) -> None:
        self.dest = dest
        self.source = source
        self.archive = archive
        self.limits = limits
        self.files = 0
        self.bytes = 0
        self.regular: set[str] = set()
        self.symlinks: list[str] = []

    def refuse(self, message: str, *, member: str = "", rule: str) -> UnsafeArchiveError:
        file = f"{self.archive}!{member}" if member else self.archive
        return UnsafeArchiveError(message, source=self.source, file=file, rule=rule)

    def clean_name(self, raw: str, *, what: str = "member") -> str:
        """Return the member's normalised relative path; raises UnsafeArchiveError."""
        if "\x00" in raw or "\\" in raw:
            raise self.refuse(f"{what} name has a NUL or backslash", member=raw, rule="BadName")
        if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
            raise self.refuse(f"{what} has an absolute path", member=raw, rule="AbsolutePath")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self.refuse(
                f"{what} path leaves the tree with '..'", member=raw, rule="PathTraversal"
            )
        if len(raw) > self.limits.max_path_length or len(parts) > self.limits.max_depth:
            raise self.refuse(
                f"{what} path longer than {self.limits.max_path_length} characters or deeper "
                f"than {self.limits.max_depth} levels",
                member=raw[:200],
                rule="PathTooLong",
            )
        return "/".join(parts)

    def parent_dir(self, name: str, member: str) -> Path:
        """Create the parents of ``name`` as real directories; refuse going through a link."""
        current = self.dest
        for part in name.split("/")[:-1]:
            current = current / part
            try:
                info = os.lstat(current)
            except FileNotFoundError:
                current.mkdir(mode=0o755)
                continue
            if stat.S_ISLNK(info.st_mode):
                raise self.refuse(
                    f"would write through the symlink {current.relative_to(self.dest)}",
                    member=member,
                    rule="PathThroughSymlink",
                )
            if not stat.S_ISDIR(info.st_mode):
                raise self.refuse(
                    f"{current.relative_to(self.dest)} is a file and a directory",
                    member=member,
                    rule="PathConflict",
                )
        return current

    def clear(self, target: Path, member: str) -> None:
        """Remove an earlier non-directory member of the same name (a later entry wins)."""
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            raise self.refuse("a file replaces a directory", member=member, rule="PathConflict")
        target.unlink()
        self.regular.discard(target.relative_to(self.dest).as_posix())

    def count(self, member: str, size: int) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise self.refuse(
                f"more than {self.limits.max_files} entries", member=member, rule="TooManyFiles"
            )
        if size > self.limits.max_file_bytes:
            raise self.refuse(
                f"file of {size} bytes exceeds the limit of {self.limits.max_file_bytes}",
                member=member,
                rule="FileTooLarge",
            )
        if self.bytes + size > self.limits.max_total_bytes:
            raise self.refuse(
                f"archive unpacks to more than {self.limits.max_total_bytes} bytes",
                member=member,
                rule="TooManyBytes",
            )
        self.bytes += size

    def write(self, name: str, member: str, data: IO[bytes], size: int, mode: int) -> None:
        self.parent_dir(name, member)
        target = self.dest / name
        self.clear(target, member)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(target, flags, 0o755 if mode & 0o111 else 0o644)
        written = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := data.read(_CHUNK):
                written += len(chunk)
                if written > size:
                    raise self.refuse(
                        "member is longer than its header says",
                        member=member,
                        rule="CorruptArchive",
                    )
                out.write(chunk)
        if written != size:
            raise self.refuse(
                "member is shorter than its header says", member=member, rule="CorruptArchive"
            )
        self.regular.add(name)

    def member(self, tar: tarfile.TarFile, info: tarfile.TarInfo) -> None:
        raw = info.name
        if info.ischr() or info.isblk():
            raise self.refuse("device files are not allowed", member=raw, rule="DeviceFile")
        if info.isfifo():
            raise self.refuse("fifos are not allowed", member=raw, rule="FifoFile")
        name = self.clean_name(raw)
        if info.isdir():
            self.count(raw, 0)
            if name:
                self.parent_dir(name + "/x", raw)
            return
        if not name:
            raise self.refuse("member names the tree's root", member=raw, rule="BadName")
        if info.issym():
            self.count(raw, 0)
            link = info.linkname
            if link.startswith("/") or "\x00" in link:
                raise self.refuse(
                    f"symlink points to the absolute path {link!r}",
                    member=raw,
                    rule="SymlinkEscapes",
                )
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
            if resolved == ".." or resolved.startswith("../"):
                raise self.refuse(
                    f"symlink points outside the tree ({link!r})", member=raw, rule="SymlinkEscapes"
                )
            self.parent_dir(name, raw)
            target = self.dest / name
            self.clear(target, raw)
            os.symlink(link, target)
            self.symlinks.append(name)
            return
        if info.islnk():
            link = info.linkname
            try:
                origin = self.clean_name(link, what="hardlink target")
            except UnsafeArchiveError as exc:
                raise self.refuse(
                    f"hardlink points outside the tree ({link!r})",
                    member=raw,
                    rule="HardlinkEscapes",
                ) from exc
            if origin not in self.regular:
                raise self.refuse(
                    f"hardlink target {link!r} is not a regular file extracted before it",
                    member=raw,
                    rule="HardlinkEscapes",
                )
            size = (self.dest / origin).stat().st_size
            self.count(raw, size)
            with open(self.dest / origin, "rb") as data:
                self.write(name, raw, data, size, 0o644)
            return
        if not info.isreg():
            raise self.refuse(
                f"unsupported member type {info.type!r}", member=raw, rule="SpecialFile"
            )
        self.count(raw, info.size)
        content = tar.extractfile(info)
        if content is None:
            raise self.refuse("member has no data", member=raw, rule="CorruptArchive")
        self.write(name, raw, content, info.size, info.mode)

    def check_symlinks(self) -> None:
        """Refuse symlinks whose real resolution (through other links) leaves the tree."""
        root = os.path.realpath(self.dest)
        for name in self.symlinks:
            real = os.path.realpath(self.dest / name)
            if real != root and not real.startswith(root + os.sep):
                raise self.refuse(
                    "symlink chain resolves outside the tree", member=name, rule="SymlinkEscapes"
                )


def extract_archive(
    archive: Path,
    dest: Path,
    *,
    source: str,
    name: str | None = None,
    limits: ArchiveLimits | None = None,
) -> ExtractStats:
    """Extract the tar or tar+gzip file ``archive`` into the empty directory ``dest``.

    ``source`` and ``name`` (default: the file name) are used in error messages. On a refusal
    ``dest`` may hold a partial tree: extract into a staging directory and drop it.
    Raises UnsafeArchiveError (a PermanentError) naming the member and the rule broken;
    FetchError (temporary) when the local disk fails.
    """
    limits = limits or ArchiveLimits()
    label = name or archive.name
    extractor = _Extractor(dest, source=source, archive=label, limits=limits)
    dest.mkdir(parents=True, exist_ok=True)
    with open(archive, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream: BinaryIO
        if compressed:
            packed = _Meter(raw)  # type: ignore[arg-type]
            inflated: _Meter

            def ratio() -> None:
                out = inflated.count
                if out > limits.ratio_floor and out > limits.max_ratio * max(packed.count, 1):
                    raise extractor.refuse(
                        f"gzip expands more than {limits.max_ratio:g} times "
                        f"({packed.count} bytes read gave {out})",
                        rule="CompressionRatio",
                    )
                # Tar headers and padding also come out of the stream: bound them too.
                if out > 2 * limits.max_total_bytes + 1024 * limits.max_files:
                    raise extractor.refuse(
                        f"archive stream exceeds {2 * limits.max_total_bytes} bytes",
                        rule="TooManyBytes",
                    )

            gz = gzip.GzipFile(fileobj=io.BufferedReader(packed), mode="rb")  # type: ignore[arg-type]
            inflated = _Meter(gz, ratio)  # type: ignore[arg-type]
            stream = io.BufferedReader(inflated)  # type: ignore[assignment]
        else:
            stream = raw
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for info in tar:
                    extractor.member(tar, info)
        except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise extractor.refuse(
                f"not a valid tar archive: {exc}", rule="CorruptArchive"
            ) from exc
        except OSError as exc:
            # Our own disk (full, read-only): not the archive's fault, and may pass.
            raise FetchError(
                f"cannot unpack {label} on local storage: {exc}", source=source
            ) from exc
    extractor.check_symlinks()
    return ExtractStats(files=extractor.files, bytes=extractor.bytes)


def is_archive(path: Path) -> bool:
    """True if ``path`` starts like gzip data or a tar file (the ``ustar`` magic)."""
    with open(path, "rb") as f:
        head = f.read(512)
    return head[:2] == _GZIP_MAGIC or head[257:262] == b"ustar"
