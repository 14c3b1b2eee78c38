"""The candidate agent's check of the set the cluster runs, in a process of its own.

A candidate (:mod:`agent.upgrade.process`) proves it can verify the publication its cluster
runs (signature, identity, inclusion proof) with its own code before it may act. Verifying
loads sigstore (about 20 MB), which ``agent run``'s supervisor never keeps: the candidate
becomes the acting agent's supervisor, so it runs the check as ``python -m
agent.upgrade.selfcheck`` (the candidate's own code: its ``PYTHONPATH``), settings on stdin,
and reads the one JSON line it answers. :func:`check` raises :class:`SelfCheckError` with the
child's reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from agent.errors import FleetletError

TIMEOUT = 120.0


class SelfCheckError(FleetletError):
    """The candidate's check failed; ``reason`` is the failure's own (e.g. a verification's)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check(settings: Any, *, timeout: float = TIMEOUT) -> None:
    """Verify the set the cluster runs in a child process. Raises SelfCheckError."""
    from agent.settings import settings_to_dict

    try:
        done = subprocess.run(
            [sys.executable, "-m", "agent.upgrade.selfcheck"],
            input=json.dumps(settings_to_dict(settings)).encode(),
            capture_output=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SelfCheckError("SelfCheckFailed", f"the check did not finish: {exc}") from exc
    if done.returncode == 0:
        return
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        said = json.loads(lines[-1])
        reason, message = str(said["reason"]), str(said["message"])
    except (IndexError, ValueError, KeyError, TypeError):
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        reason, message = "SelfCheckFailed", f"the check exited {done.returncode}: {tail[0]}"
    raise SelfCheckError(reason, message)


def _verify(settings: Any) -> None:
    from agent.assemble import branch_watcher, git_credentials, trust_policy
    from agent.verify import verify_publication

    watcher = branch_watcher(settings, git_credentials())
    commit = watcher.poll()
    if commit is None:
        raise SelfCheckError("SelfCheckFailed", "the cluster's branch is missing")
    verify_publication(
        files=watcher.fetch(commit),
        cluster=settings.repo.cluster,
        last_serial=None,
        trust=trust_policy(settings),
        now=datetime.now(UTC),
        clock_skew=settings.trust.clock_skew,
    )


def main() -> int:
    """The child: settings on stdin; exit 0, or 1 with ``{"reason", "message"}`` on stdout."""
    from agent.settings import settings_from_dict

    try:
        _verify(settings_from_dict(json.loads(sys.stdin.buffer.read())))
    except Exception as exc:
        reason = exc.reason if isinstance(exc, FleetletError) else "SelfCheckFailed"
        message = str(exc) if isinstance(exc, FleetletError) else f"{type(exc).__name__}: {exc}"
        print(json.dumps({"reason": reason, "message": message}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["SelfCheckError", "check"]
