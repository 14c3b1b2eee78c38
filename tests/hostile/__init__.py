"""The hostile-input corpus: archives and manifests an attacker could put in a bundle.

Each case is built in code (no binary files committed) and carries the rule it must be refused
with. Also here: the small builders the source tests share (``Src``, ``commit_files``). ``archives.CASES`` feed the safe extractor and the real registry; ``manifests.CASES`` feed
the manifest parser and the ``plain`` format.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


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
