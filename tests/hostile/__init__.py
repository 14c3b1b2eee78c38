"""The hostile-input corpus: archives and manifests an attacker could put in a bundle.

Each case is built in code (no binary files committed) and carries the rule it must be refused
with. Also here: the small builders the source tests share (``Src``, ``commit_files``,
``commit_raw_tree``) and the hostile git trees (``GIT_TREES``). ``archives.CASES`` feed the
safe extractor and the real registry, ``archives.LAYERED`` images of several layers;
``manifests.CASES`` feed the manifest parser and the ``plain`` format.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pygit2


@dataclass(frozen=True)
class Src:
    """A source as the content store reads it (``agent.api.Source`` has these attributes)."""

    kind: str
    uri: str
    digest: str | None = None
    commit: str | None = None
    sha256: str | None = None
    directory: str | None = None
    destination: str | None = None
    auth: str | None = None


_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def commit_files(
    bare: Path, work: Path, files: dict[str, bytes], *, links: dict[str, str] | None = None
) -> str:
    """Commit ``files`` (and symlinks ``links``) on main of the bare repo; return the commit."""
    work.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
    for name, target in (links or {}).items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, work / name)
    git = ["git", f"--git-dir={bare}", f"--work-tree={work}"]
    subprocess.run([*git, "add", "-A"], check=True, env=_ENV)
    subprocess.run([*git, "commit", "-q", "-m", "content"], check=True, env=_ENV)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, env=_ENV, capture_output=True, text=True
    ).stdout.strip()


# A git tree object as an attacker writes it (git's own tools refuse to): entries in any order,
# names twice, NULs in link targets. Each entry: (mode, name, content); content is bytes for a
# blob or a list of entries for a subtree.
RawEntry = tuple[bytes, bytes, "bytes | list[RawEntry]"]


def _raw_tree(repo: pygit2.Repository, entries: list[RawEntry]) -> pygit2.Oid:
    raw = b""
    for mode, name, content in entries:
        blob = isinstance(content, bytes)
        oid = repo.create_blob(content) if blob else _raw_tree(repo, content)  # type: ignore[arg-type]
        raw += mode + b" " + name + b"\0" + oid.raw
    return repo.odb.write(pygit2.GIT_OBJECT_TREE, raw)


def commit_raw_tree(bare: Path, entries: list[RawEntry]) -> str:
    """Commit a hand-written tree on main of the bare repository; return the commit."""
    repo = pygit2.Repository(str(bare))
    tree = _raw_tree(repo, entries)
    who = pygit2.Signature("attacker", "attacker@example.invalid")
    parents = (
        [repo.references["refs/heads/main"].target] if "refs/heads/main" in repo.references else []
    )
    return str(repo.create_commit("refs/heads/main", who, who, "hostile", tree, parents))


GOOD = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ok\n"

# Hostile git trees, each with the rule that must refuse it (issue 15, items 3 and 8).
GIT_TREES: list[tuple[str, list[RawEntry], str, str]] = [
    ("nul-in-link-target", [(b"120000", b"link", b"a\0b")], "BadLink", "link"),
    (
        "entry-named-twice",
        [(b"100644", b"cm.yaml", GOOD), (b"100644", b"cm.yaml", GOOD)],
        "DuplicateEntry",
        "cm.yaml",
    ),
    (
        "file-and-directory-of-one-name",
        [(b"100644", b"a", GOOD), (b"40000", b"a", [(b"100644", b"cm.yaml", GOOD)])],
        "DuplicateEntry",
        "a",
    ),
    ("over-long-name", [(b"100644", b"n" * 300, GOOD)], "NameTooLong", "n" * 200),
]
