"""Stage timestamps for the latency benchmark (``FLEETLET_TRACE=FILE``); nothing when unset.

``bench/e2e_latency.py`` sets ``FLEETLET_TRACE`` for the hub and the agents it starts; each
stage of a move then appends one JSON line to that file::

    {"t": 1795771234.12, "stage": "worker:started", "cluster": "store-eu-1", "pid": 4242}

and the bench reads them to say where the time between ``hub publish`` and Ready goes: the hub
noticing the move and telling the channel, the agent's ``ls-refs``, the worker's start, fetch,
verify, render, apply, health, the status pushed. ``t`` is wall-clock time (the processes
share one clock on one machine). Each line is one ``write`` on a file opened for appending, so
the processes' lines never interleave.

``FLEETLET_TRACE_CLUSTER`` names the cluster the lines are about (an agent sets it for itself
and its workers); a hub's lines name the cluster in the call.
"""

from __future__ import annotations

import json
import os
import time

TRACE = "FLEETLET_TRACE"
CLUSTER = "FLEETLET_TRACE_CLUSTER"


def enabled() -> bool:
    return bool(os.environ.get(TRACE))


def mark(stage: str, cluster: str | None = None) -> None:
    """Append ``stage`` now to the trace file, if there is one (errors are ignored: a trace
    never stops the work it watches)."""
    path = os.environ.get(TRACE)
    if not path:
        return
    line = {
        "t": time.time(),
        "stage": stage,
        "cluster": cluster or os.environ.get(CLUSTER, ""),
        "pid": os.getpid(),
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def for_cluster(cluster: str) -> None:
    """This process's lines (and its children's) are about ``cluster``."""
    if enabled():
        os.environ[CLUSTER] = cluster


__all__ = ["CLUSTER", "TRACE", "enabled", "for_cluster", "mark"]
