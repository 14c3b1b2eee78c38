"""Where an accepted cluster goes: the inventory file the hub owns, written one of three ways
(``config.yaml``'s ``commit``, the operator's choice):

- ``false``: the file in the fleet checkout is rewritten (the operator commits it);
- ``true``: the file is rewritten and committed on the checkout's branch;
- ``branch``: the fleet branch is left alone (a protected repository): a branch
  ``<branchPrefix><cluster>`` (``enroll/shop-1``) is made from the head of ``baseBranch`` (the
  checkout's ``HEAD`` by default) with the one entry added, and pushed to ``pushRemote`` when
  one is set. The request says ``pendingMerge`` until the base branch's inventory names the
  cluster (the operator merged it, or a pull request did); the next publication then gives the
  cluster its set. The working tree, the index and the base branch are never touched: the
  commit is made with git's plumbing and a temporary index.

Each entry is one block appended to the file's text (no parse, no sort): label keys and values
are checked label strings, so a JSON flow mapping is their YAML.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hub.enroll.refused import EnrollRefused

TEMPLATE = (
    "# written by the fleetlet hub (enrollment): every accepted cluster; do not edit\nclusters:\n"
)
Mode = Literal["file", "commit", "branch"]
_AUTHOR = {
    "GIT_AUTHOR_NAME": "fleetlet hub",
    "GIT_AUTHOR_EMAIL": "hub@fleetlet.invalid",
    "GIT_COMMITTER_NAME": "fleetlet hub",
    "GIT_COMMITTER_EMAIL": "hub@fleetlet.invalid",
}


def entry(cluster: str, labels: Mapping[str, str]) -> str:
    return f"- name: {cluster}\n  labels: {json.dumps(dict(labels), sort_keys=True)}\n"


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """The inventory file and how an acceptance lands in it (see the module docstring)."""

    path: Path
    mode: Mode = "file"
    branch_prefix: str = "enroll/"
    base: str = "HEAD"
    push_remote: str | None = None

    def add(self, cluster: str, labels: Mapping[str, str]) -> str | None:
        """Add ``cluster``; returns the branch made (``branch`` mode), else None. Raises
        EnrollRefused (500: git failed, 502: the push was refused)."""
        if self.mode == "branch":
            return self._branch(cluster, labels)
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = TEMPLATE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text + entry(cluster, labels))
        os.replace(tmp, path)
        if self.mode == "commit":
            self._git("add", path.name)
            self._git("commit", "-q", "-m", f"fleetlet: enroll cluster {cluster}", "--", path.name)
        return None

    def merged(self, cluster: str, *, base_text: str | None = None) -> bool:
        """Whether the base branch's inventory names ``cluster`` (``base_text``: that file's
        text, read once by :meth:`base_text` for many clusters)."""
        text = self.base_text() if base_text is None else base_text
        return f"\n- name: {cluster}\n" in "\n" + text

    def base_text(self) -> str:
        """The inventory file as the head of the base branch has it ("" when it has none)."""
        done = self._run("show", f"{self.base}:{self._relative()}", check=False)
        return done.stdout if done.returncode == 0 else ""

    # --- the branch of one acceptance ------------------------------------------------------

    def _branch(self, cluster: str, labels: Mapping[str, str]) -> str:
        branch = f"{self.branch_prefix}{cluster}"
        relative = self._relative()
        base = self._git("rev-parse", "--verify", f"{self.base}^{{commit}}").strip()
        shown = self._run("show", f"{base}:{relative}", check=False)
        text = shown.stdout if shown.returncode == 0 else TEMPLATE
        blob = self._git("hash-object", "-w", "--stdin", stdin=text + entry(cluster, labels))
        with tempfile.TemporaryDirectory(prefix="fleetlet-enroll-") as scratch:
            index = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
            self._git("read-tree", base, env=index)
            self._git(
                "update-index", "--add", "--cacheinfo", f"100644,{blob.strip()},{relative}",
                env=index,
            )  # fmt: skip
            tree = self._git("write-tree", env=index).strip()
        message = f"fleetlet: enroll cluster {cluster}\n\nLabels: {json.dumps(dict(labels))}\n"
        commit = self._git("commit-tree", tree, "-p", base, "-m", message).strip()
        self._git("update-ref", f"refs/heads/{branch}", commit)
        if self.push_remote:
            pushed = self._run(
                "push", "-q", self.push_remote, f"refs/heads/{branch}:refs/heads/{branch}",
                check=False,
            )  # fmt: skip
            if pushed.returncode != 0:
                raise EnrollRefused(
                    502,
                    f"inventory branch {branch}: git push to {self.push_remote} failed: "
                    f"{pushed.stderr.strip()[:300]}",
                )
        return branch

    def _relative(self) -> str:
        top = Path(self._git("rev-parse", "--show-toplevel").strip()).resolve()
        try:
            return self.path.resolve().relative_to(top).as_posix()
        except ValueError:
            raise EnrollRefused(
                500, f"inventory {self.path}: not inside the fleet repository {top}"
            ) from None

    def _git(self, *args: str, stdin: str | None = None, env: Mapping[str, str] = {}) -> str:
        return self._run(*args, stdin=stdin, env=env).stdout

    def _run(
        self,
        *args: str,
        stdin: str | None = None,
        env: Mapping[str, str] = {},
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["git", "-C", str(self.path.parent), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, **_AUTHOR, **env},
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise EnrollRefused(
                500, f"inventory {self.path}: git {args[0]} failed: {done.stderr.strip()[:300]}"
            )
        return done


__all__ = ["TEMPLATE", "Inventory", "Mode", "entry"]
