"""The hub as users run it: ``python -m hub.serve`` (``fleetlet hub serve``) on a free loopback port.

Shared by the API tests, the dashboard's browser tests and ``bench/dashboard.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests

from tests.realenv.gitserver import free_port

ROOT = Path(__file__).resolve().parent.parent.parent


@contextlib.contextmanager
def serving_hub(
    repo: str,
    workdir: Path,
    extra: Sequence[str],
    *,
    refresh: str = "300ms",
    stale_after: str = "5m",
    startup_timeout: float = 60,
    port: int | None = None,
) -> Iterator[str]:
    """``python -m hub.serve`` over the status repository ``repo``; yields its base URL
    (``port``: listen there, e.g. to restart a hub where its clients expect it).

    Its output goes to ``workdir/hub.log``; it is stopped (SIGTERM, then SIGKILL) at the end.
    Raises RuntimeError (with the log) if it exits or does not listen within the timeout.
    """
    port = port or free_port()
    log = workdir / "hub.log"
    command = [
        sys.executable,
        "-m",
        "hub.serve",
        "--repo",
        repo,
        "--listen",
        f"127.0.0.1:{port}",
        "--stale-after",
        stale_after,
        "--refresh",
        refresh,
        "--cache-dir",
        str(workdir / "cache"),
        *extra,
    ]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=out, start_new_session=True
        )
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            try:
                requests.get(f"http://127.0.0.1:{port}/api/v1/clusters", timeout=2)
                break
            except (requests.ConnectionError, requests.Timeout):
                # Timeout: the socket listens before the workers of --workers accept.
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"hub did not start: {log.read_text()}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
