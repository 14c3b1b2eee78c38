"""Where a fleet directory comes from: the repo URL and commit recorded in every set.

When the fleet directory is inside a git work tree and has no uncommitted change, the commit is
``HEAD`` and the time is its commit time. Otherwise (not in git, or edited) the "commit" is a
sha1 over the fleet files' paths and bytes, so the same files always give the same value, and
the time is the newest modification time of those files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pygit2


@dataclass(frozen=True, slots=True)
class FleetSource:
    repo: str
    commit: str
    time: datetime
    committed: bool  # False: commit is a digest of uncommitted files


def fleet_source(root: Path, files: tuple[str, ...], *, repo_url: str | None) -> FleetSource:
    """Describe the fleet at ``root`` (``files`` relative to it). ``repo_url`` wins if given."""
    root = root.resolve()
    found = pygit2.discover_repository(str(root))
    if found is not None:
        try:
            repo = pygit2.Repository(found)
            if not repo.is_bare and not repo.head_is_unborn:
                workdir = Path(repo.workdir).resolve()
                prefix = root.relative_to(workdir).as_posix()
                prefix = "" if prefix == "." else prefix + "/"
                dirty = any(
                    path.startswith(prefix)
                    and flags
                    not in (pygit2.enums.FileStatus.CURRENT, pygit2.enums.FileStatus.IGNORED)
                    for path, flags in repo.status().items()
                )
                if not dirty:
                    head = repo.head.peel(pygit2.Commit)
                    url = repo_url or _origin(repo) or root.as_uri()
                    return FleetSource(
                        repo=url,
                        commit=str(head.id),
                        time=datetime.fromtimestamp(head.commit_time, UTC),
                        committed=True,
                    )
                repo_url = repo_url or _origin(repo)
        except (pygit2.GitError, ValueError, KeyError):
            pass  # fall back to a digest of the files
    digest = hashlib.sha1(usedforsecurity=False)
    newest = 0.0
    for rel in files:
        path = root / rel
        data = path.read_bytes()
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
        newest = max(newest, path.stat().st_mtime)
    return FleetSource(
        repo=repo_url or root.as_uri(),
        commit=digest.hexdigest(),
        time=datetime.fromtimestamp(int(newest), UTC),
        committed=False,
    )


def _origin(repo: pygit2.Repository) -> str | None:
    try:
        url = repo.remotes["origin"].url
    except (KeyError, pygit2.GitError):
        return None
    return str(url) if url else None
