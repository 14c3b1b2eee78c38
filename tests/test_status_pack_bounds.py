"""Issue 28 item 9: a status push built to inflate (a zlib bomb) cannot exhaust the hub's memory.

A cluster's status credential lets its agent push anything on its status branch. A document of
64 MiB of zeros travels as about 64 KiB (git compresses it, the real git daemon serves it so):
the hub must refuse it from the entry's declared size, before inflating, name the cluster
branch in that cluster's view, and keep reading every other cluster's status. A delta that
copies a small base thousands of times is bounded the same way.
"""

from __future__ import annotations

import tempfile
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest

from hub.publish.pack import PackWriter
from hub.status import FleetStatus
from hub.status.fetch import MAX_OBJECT_BYTES, PackBoundError, parse_pack
from tests.realenv.gitserver import GitDaemon
from tests.test_hub_status import StatusPusher, make_status, new_repo

BOMB = 64 * 1024 * 1024


def test_a_status_push_that_inflates_past_the_bound_is_refused_and_named(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    url = new_repo(git_daemon, "status-bomb")
    pusher = StatusPusher(url, tmp_path / "agents")
    pusher.push({"edge-a": make_status("edge-a"), "edge-b": make_status("edge-b")})
    pusher.push({"edge-bomb": b"\0" * BOMB})  # what a compromised agent can push
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub", stale_after=timedelta(hours=1))
    tracemalloc.start()
    try:
        status.refresh()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Refused from the declared size: the bomb was never inflated (the peak is far below it).
    assert peak < BOMB // 4, peak
    clusters = {c["name"]: c for c in status.clusters()}
    assert clusters["edge-a"]["error"] is None and clusters["edge-b"]["error"] is None
    error = clusters["edge-bomb"]["error"]
    assert error.startswith("refs/heads/fleetlet/status/edge-bomb: status refused:"), error
    assert f"inflates to {BOMB} bytes, past the bound of {MAX_OBJECT_BYTES} per object" in error
    # The next push of a sane document is read as usual.
    pusher.push({"edge-bomb": make_status("edge-bomb")})
    status.refresh()
    assert status.view("edge-bomb") is not None and status.view("edge-bomb").error is None


def test_a_delta_that_copies_its_base_past_the_bound_is_refused() -> None:
    """A 64 KiB base and a delta of a few KiB that copies it 400 times (25 MiB)."""
    base = bytes(range(256)) * 256
    pack = PackWriter()
    base_id = pack.blob(base)
    copies = 400
    pack.blob_delta(base * copies, base=base_id, base_size=len(base),
                    ops=[(0, len(base))] * copies)  # fmt: skip
    data = _pack_bytes(pack)
    assert len(data) < 64 * 1024
    with pytest.raises(PackBoundError, match=r"the delta at offset \d+ inflates to 26214400"):
        parse_pack(data)


def _pack_bytes(pack: PackWriter) -> bytes:
    with tempfile.TemporaryDirectory() as directory:
        path = pack.write(Path(directory))
        assert path is not None
        return path.read_bytes()
