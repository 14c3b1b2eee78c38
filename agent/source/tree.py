"""A content tree judged as a whole: what may be in it, and where its symlinks may lead.

Links are judged on the tree as it finally is (after every layer of an image and every source
of a bundle was laid out), never one archive at a time: a link that is harmless alone can
escape once another layer or source adds a link it goes through (``x -> d/s/s/../../..`` is
inside until ``d/s -> .`` arrives). Resolution follows the kernel's rules (one component at a
time, each link expanded where it is met, at most :data:`MAX_LINK_HOPS` of them) but never
goes above the tree's root, not even on the way: a path that climbs out and comes back in is
refused too, since where it lands would depend on where the tree happens to sit on disk.

Only directories, regular files and such links may be in a tree: a device, a fifo or a socket
is refused wherever it came from.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from agent.source.content import ContentRefusedError

MAX_LINK_HOPS = 40
"""Links followed while resolving one path (Linux's own limit)."""

NAME_MAX = 255
"""Bytes in one path component (Linux's ``NAME_MAX``): a longer name is content, not a disk
failure, and is refused as such."""


class UnsafeTreeError(ContentRefusedError):
    """A tree was refused as a whole: a link leads outside it, or it holds a special file."""

    reason = "UnsafeContent"


class LinkEscapeError(Exception):
    """Internal: why a path does not stay inside its tree (callers raise their own error)."""


@dataclass(frozen=True)
class TreeStats:
    """What a tree holds: regular files, their bytes, symlinks, directories."""

    files: int
    bytes: int
    links: int
    directories: int


def resolve_inside(root: Path, relative: str) -> str:
    """Where ``relative`` (a POSIX path inside ``root``) leads, as a path relative to ``root``
    (``""`` for the root itself), following symlinks one component at a time.

    A component that does not exist ends link following (the rest is taken as written).
    Raises LinkEscapeError when a link is absolute, when any step climbs above ``root``, or
    after more than :data:`MAX_LINK_HOPS` links (a loop).
    """
    done: list[str] = []
    todo = list(reversed(relative.split("/")))
    hops = 0
    missing = False
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                raise LinkEscapeError("it climbs above the tree's root")
            done.pop()
            continue
        if missing:
            done.append(part)
            continue
        path = os.path.join(root, *done, part)
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            missing = True
            done.append(part)
            continue
        if not stat.S_ISLNK(info.st_mode):
            done.append(part)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise LinkEscapeError(f"more than {MAX_LINK_HOPS} links on the way (a loop)")
        target = os.readlink(path)
        if target.startswith("/"):
            raise LinkEscapeError(f"it reaches the absolute path {target!r}")
        todo.extend(reversed(target.split("/")))
    return "/".join(done)


def check_tree(root: Path, *, source: str) -> TreeStats:
    """Check the tree under ``root`` as a whole (without following any link while walking):
    every entry is a directory, a regular file or a symlink that resolves inside ``root``
    (:func:`resolve_inside`).

    Raises UnsafeTreeError naming the entry (rules ``SymlinkEscapes``, ``SpecialFile``).
    """
    files = size = links = directories = 0
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(root / rel_dir if rel_dir else root) as entries:
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    links += 1
                    try:
                        resolve_inside(root, rel)
                    except LinkEscapeError as exc:
                        raise UnsafeTreeError(
                            f"symlink to {os.readlink(entry.path)!r} leads outside the tree: {exc}",
                            source=source,
                            file=rel,
                            rule="SymlinkEscapes",
                        ) from None
                elif stat.S_ISDIR(info.st_mode):
                    directories += 1
                    pending.append(rel)
                elif stat.S_ISREG(info.st_mode):
                    files += 1
                    size += info.st_size
                else:
                    raise UnsafeTreeError(
                        "not a regular file, a directory or a symlink",
                        source=source,
                        file=rel,
                        rule="SpecialFile",
                    )
    return TreeStats(files=files, bytes=size, links=links, directories=directories)
