"""Hostile-input-safe extraction of tar and tar+gzip archives.

Everything in an archive is assumed hostile. A member is refused, and the whole archive with
it, when its name is absolute, climbs out with ``..`` or has a component longer than the
file system allows, when a symlink or a hardlink points outside the tree, when it is a device
file, a fifo, a sparse file or another special file, or when it would be written through a
symlink (writes never follow one: each file is created with ``O_NOFOLLOW | O_EXCL``). Sizes
are capped while streaming (before bytes reach the disk): the file count, each file's size,
the total size, the gzip expansion ratio (a gzip bomb is refused after reading a bounded
amount), and tar's own extended headers (PAX and GNU long names: their size, their total and
how many may precede one member), which the tarfile module would otherwise read whole.
Hardlinks inside the tree become copies and file modes are reduced to 0644/0755, so nothing
extracted aliases or elevates anything.

Several archives may be unpacked into one tree (the layers of an image): pass them one
:class:`TreeBudget`, and the file and byte caps hold for the tree, not for each archive, and
every link of the tree is judged again (:func:`agent.source.tree.resolve_inside`) once each
archive is in, against everything unpacked so far.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import posixpath
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from agent.source.content import ContentRefusedError, LocalStorageError
from agent.source.tree import NAME_MAX, LinkEscapeError, resolve_inside

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 64 * 1024
# tar's extended headers: PAX (per member, global, Solaris) and GNU long names and links.
_EXTENDED = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
# Local failures that come from what the archive names, not from our disk: a refusal.
_CONTENT_ERRNOS = {errno.ENAMETOOLONG, errno.ELOOP, errno.EEXIST, errno.EISDIR, errno.ENOTDIR}


class UnsafeArchiveError(ContentRefusedError):
    """An archive was refused: a member or the archive as a whole broke a rule (``rule``)."""

    reason = "UnsafeArchive"


@dataclass(frozen=True, kw_only=True)
class ArchiveLimits:
    """Caps on what one tree may unpack to (one archive, or every layer of an image).

    ``max_ratio`` bounds decompressed/compressed bytes once more than ``ratio_floor`` bytes
    came out (small archives of zero-padded tar headers compress very well).
    ``max_header_bytes`` bounds one extended header (PAX records, a GNU long name),
    ``max_extended_bytes`` all of them in one archive, and ``max_header_chain`` how many may
    precede one member (tar writes at most a PAX header and two GNU long-name headers).
    """

    max_files: int = 10_000
    max_file_bytes: int = 16 * 1024 * 1024
    max_total_bytes: int = 128 * 1024 * 1024
    max_ratio: float = 200.0
    ratio_floor: int = 1024 * 1024
    max_path_length: int = 1024
    max_depth: int = 32
    max_header_bytes: int = 64 * 1024
    max_extended_bytes: int = 1024 * 1024
    max_header_chain: int = 4


@dataclass(frozen=True)
class ExtractStats:
    """What an extraction produced."""

    files: int
    bytes: int


class TreeBudget:
    """One tree being unpacked, from one archive or several (the layers of an image): its
    limits, the entries and bytes counted so far, and every symlink made in it."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.files = 0
        self.bytes = 0
        self.links: list[str] = []

    def take(self, size: int) -> tuple[str, str] | None:
        """Count one entry of ``size`` bytes; return the rule it breaks and why, or None
        (and count it) when it fits."""
        limits = self.limits
        if self.files + 1 > limits.max_files:
            return "TooManyFiles", f"more than {limits.max_files} entries"
        if size > limits.max_file_bytes:
            return (
                "FileTooLarge",
                f"file of {size} bytes exceeds the limit of {limits.max_file_bytes}",
            )
        if self.bytes + size > limits.max_total_bytes:
            return "TooManyBytes", f"the tree unpacks to more than {limits.max_total_bytes} bytes"
        self.files += 1
        self.bytes += size
        return None


class _HeaderGuard:
    """Bounds tar's extended headers before the tarfile module reads them (it reads each one
    whole, and follows a chain of them by recursion)."""

    def __init__(self, extractor: _Extractor) -> None:
        self.extractor = extractor
        self.chain = 0
        self.total = 0

    def check(self, info: tarfile.TarInfo) -> None:
        refuse = self.extractor.refuse
        limits = self.extractor.limits
        if info.type == tarfile.GNUTYPE_SPARSE:
            raise refuse("sparse files are not allowed", member=info.name, rule="SparseFile")
        if info.type not in _EXTENDED:
            self.chain = 0
            return
        self.chain += 1
        if self.chain > limits.max_header_chain:
            raise refuse(
                f"more than {limits.max_header_chain} extended headers before one member",
                rule="TooManyHeaders",
            )
        if info.size > limits.max_header_bytes:
            raise refuse(
                f"an extended header of {info.size} bytes, more than {limits.max_header_bytes}",
                rule="HeaderTooLarge",
            )
        self.total += info.size
        if self.total > limits.max_extended_bytes:
            raise refuse(
                f"extended headers exceed {limits.max_extended_bytes} bytes in total",
                rule="HeaderTooLarge",
            )


class _GuardedTarInfo(tarfile.TarInfo):
    """A TarInfo whose extended headers are checked by ``guard`` before they are read."""

    guard: _HeaderGuard

    def _proc_member(self, tarfile: tarfile.TarFile) -> Any:
        self.guard.check(self)
        return super()._proc_member(tarfile)  # type: ignore[misc]

    def _refuse_sparse(self, *args: object) -> None:
        raise self.guard.extractor.refuse(
            "sparse files are not allowed", member=self.name, rule="SparseFile"
        )

    # PAX sparse maps are read (unbounded) by these: a bundle has no use for sparse files.
    _proc_gnusparse_00 = _refuse_sparse
    _proc_gnusparse_01 = _refuse_sparse
    _proc_gnusparse_10 = _refuse_sparse


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
    def __init__(self, dest: Path, *, source: str, archive: str, budget: TreeBudget) -> None:
        self.dest = dest
        self.source = source
        self.archive = archive
        self.budget = budget
        self.limits = budget.limits
        self.regular: set[str] = set()

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
        if any(len(os.fsencode(p)) > NAME_MAX for p in parts):
            raise self.refuse(
                f"{what} has a name longer than {NAME_MAX} bytes",
                member=raw[:200],
                rule="NameTooLong",
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
        name = target.relative_to(self.dest).as_posix()
        self.regular.discard(name)
        if stat.S_ISLNK(info.st_mode) and name in self.budget.links:
            self.budget.links.remove(name)

    def count(self, member: str, size: int) -> None:
        broken = self.budget.take(size)
        if broken is not None:
            rule, message = broken
            raise self.refuse(message, member=member, rule=rule)

    def write(self, name: str, member: str, data: IO[bytes], size: int, mode: int) -> None:
        self.parent_dir(name, member)
        target = self.dest / name
        self.clear(target, member)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
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
        if info.issparse():
            raise self.refuse("sparse files are not allowed", member=raw, rule="SparseFile")
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
            if len(link) > self.limits.max_path_length:
                raise self.refuse(
                    f"symlink target longer than {self.limits.max_path_length} characters",
                    member=raw,
                    rule="PathTooLong",
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
            self.budget.links.append(name)
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
            flags = os.O_RDONLY | os.O_NOFOLLOW
            with os.fdopen(os.open(self.dest / origin, flags), "rb") as data:
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
        """Refuse a link of the tree (this archive's or an earlier one's) that now leads
        outside it, through other links or not."""
        for name in self.budget.links:
            try:
                resolve_inside(self.dest, name)
            except LinkEscapeError as exc:
                raise self.refuse(
                    f"symlink chain resolves outside the tree: {exc}",
                    member=name,
                    rule="SymlinkEscapes",
                ) from None


def extract_archive(
    archive: Path,
    dest: Path,
    *,
    source: str,
    name: str | None = None,
    limits: ArchiveLimits | None = None,
    budget: TreeBudget | None = None,
) -> ExtractStats:
    """Extract the tar or tar+gzip file ``archive`` into the directory ``dest``.

    ``budget`` is shared by every archive unpacked into the same ``dest`` (image layers): the
    caps then hold for the tree, and its links are judged together (default: a budget of
    ``limits`` for this archive alone). ``source`` and ``name`` (default: the file name) are
    used in error messages. On a refusal ``dest`` may hold a partial tree: extract into a
    staging directory and drop it. Returns what this archive added.
    Raises UnsafeArchiveError (a PermanentError) naming the member and the rule broken;
    FetchError (temporary) when the local disk fails.
    """
    budget = budget or TreeBudget(limits or ArchiveLimits())
    limits = budget.limits
    label = name or archive.name
    extractor = _Extractor(dest, source=source, archive=label, budget=budget)
    files_before, bytes_before = budget.files, budget.bytes
    guarded = type("_Guarded", (_GuardedTarInfo,), {"guard": _HeaderGuard(extractor)})
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
            _unpack(stream, extractor, guarded)
        except OSError as exc:
            if exc.errno in _CONTENT_ERRNOS:
                raise extractor.refuse(
                    f"cannot be written: {exc.strerror}",
                    member=os.fsdecode(exc.filename or "")[-200:],
                    rule="NameTooLong" if exc.errno == errno.ENAMETOOLONG else "PathConflict",
                ) from exc
            # Our own disk (full, read-only): not the archive's fault, and may pass.
            raise LocalStorageError.of(exc, doing=f"unpack {label}", source=source) from exc
    extractor.check_symlinks()
    return ExtractStats(files=budget.files - files_before, bytes=budget.bytes - bytes_before)


# What the tarfile module raises on malformed input (a recursion of chained headers, numbers
# in headers that do not parse, bad encodings), besides its own TarError.
_MALFORMED = (
    tarfile.TarError,
    EOFError,
    gzip.BadGzipFile,
    zlib.error,
    ValueError,
    OverflowError,
    RecursionError,
)


def _unpack(stream: BinaryIO, extractor: _Extractor, tarinfo: type[tarfile.TarInfo]) -> None:
    """Read members one by one from ``stream`` and hand each to ``extractor``."""
    try:
        # Closed by the ``with`` below; opening already reads (and may refuse) a header.
        tar = tarfile.open(fileobj=stream, mode="r|", tarinfo=tarinfo)  # noqa: SIM115
    except _MALFORMED as exc:
        raise extractor.refuse(f"not a valid tar archive: {exc}", rule="CorruptArchive") from exc
    with tar:
        while True:
            try:
                info = tar.next()
            except _MALFORMED as exc:
                raise extractor.refuse(
                    f"not a valid tar archive: {exc}", rule="CorruptArchive"
                ) from exc
            if info is None:
                return
            # A stream keeps every member it read; nothing here needs them again.
            cast(Any, tar).members.clear()
            try:
                extractor.member(tar, info)
            except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
                raise extractor.refuse(
                    f"not a valid tar archive: {exc}", member=info.name, rule="CorruptArchive"
                ) from exc


def is_archive(path: Path) -> bool:
    """True if ``path`` starts like gzip data or a tar file (the ``ustar`` magic)."""
    with open(path, "rb") as f:
        head = f.read(512)
    return head[:2] == _GZIP_MAGIC or head[257:262] == b"ustar"
