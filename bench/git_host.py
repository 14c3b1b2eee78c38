"""The git host's CPU for a fleet's idle polls: agents polling every 30 s against agents that hold
the notification channel and poll every 10 minutes as a fallback (issue 33).

A real ``git daemon`` (the test environment's) serves one repository with ``--agents`` cluster
branches (``refs/heads/fleetlet/clusters/bench-NNNNN``). Two fleets are simulated, one after
the other, against the same server; each request is a real protocol v2 ``ls-refs`` over its
own connection, made with the agent's and the hub's own code:

- **polling**: every agent polls its branch every ``--poll`` seconds
  (:func:`agent.source.lsrefs.ls_ref_v2`, what ``BranchWatcher.poll`` sends);
- **channel**: every agent polls every ``--fallback`` seconds, and each of ``--replicas``
  ``hub serve`` processes lists every cluster branch each ``--watch`` seconds
  (:meth:`hub.channel.BranchWatcher.tick`, what the channel's watch sends).

The fleet's requests are those of a window of ``--window`` seconds out of the ``--minutes``
measured (a fleet whose polls are spread evenly is in a steady state: each window of the same
length sends the same requests), sent as fast as ``--clients`` connections at once allow
(the daemon forks one ``git upload-pack`` per request), and the git host's CPU (the daemon's
and its reaped children's, from ``/proc``) is multiplied by ``minutes * 60 / window``. With
no publication in the window both fleets fetch nothing; a publication costs both the same
fetch, plus, with the channel, the one ``ls-refs`` the notification asks for (counted per
publication below).

    python bench/git_host.py --agents 10000 --window 60 --write-docs
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.source.lsrefs import ls_ref_v2  # noqa: E402
from bench._docs import write_section  # noqa: E402
from hub.channel import BranchWatcher  # noqa: E402
from tests.realenv.gitserver import GitDaemon  # noqa: E402

PREFIX = "refs/heads/fleetlet/clusters/"
TICK = os.sysconf("SC_CLK_TCK")
SECTION = "## Git host CPU: channel against polling"


def _git(*args: str, input: str | None = None) -> str:
    return subprocess.run(
        ["git", *args], check=True, capture_output=True, text=True, input=input
    ).stdout.strip()


def build(bare: Path, names: list[str]) -> None:
    """A bare repository with one branch per cluster (all at one empty commit: an idle
    ``ls-refs`` reads refs, not trees)."""
    _git("init", "-q", "--bare", str(bare))
    _git("--git-dir", str(bare), "config", "uploadpack.allowFilter", "true")
    tree = _git("--git-dir", str(bare), "mktree", input="")
    env = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    commit = _git(*env, "--git-dir", str(bare), "commit-tree", tree, "-m", "publish")
    lines = "".join(f"create {PREFIX}{n} {commit}\n" for n in names)
    _git("--git-dir", str(bare), "update-ref", "--stdin", input=lines)
    # As a git host keeps them: packed refs (one file read per listing, not 10,000).
    _git("--git-dir", str(bare), "pack-refs", "--all")


def host_cpu(pid: int) -> float:
    """CPU seconds of the daemon and of the children it reaped (one upload-pack each)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


def run(daemon: GitDaemon, pid: int, requests: list[tuple[str, str]], clients: int) -> dict:
    """Send ``requests`` (("agent", cluster) or ("hub", "")); the git host's CPU and wall."""
    url = daemon.url_for("fleet-state.git")

    def one(request: tuple[str, str]) -> None:
        kind, cluster = request
        if kind == "agent":
            ls_ref_v2(url, PREFIX + cluster, None, connect_timeout=10, io_timeout=30)
        else:
            BranchWatcher(urls=[url], moved=lambda _: None).tick()

    cpu, began = host_cpu(pid), time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        for _ in pool.map(one, requests):
            pass
    time.sleep(0.5)  # the last upload-packs reaped
    return {"cpu": host_cpu(pid) - cpu, "wall": time.monotonic() - began, "n": len(requests)}


def schedule(names: list[str], *, every: float, window: float, rng: random.Random) -> list[str]:
    """The clusters that poll within ``window`` seconds when each polls every ``every`` s, at
    a random phase (a cluster polls several times when ``every < window``)."""
    polls = []
    for name in names:
        t = rng.uniform(0, every)
        while t < window:
            polls.append(name)
            t += every
    return polls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=10.0, help="the period measured (10)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of it sent (60)")
    parser.add_argument("--poll", type=float, default=30.0, help="polling fleet's interval")
    parser.add_argument("--fallback", type=float, default=600.0, help="channel fleet's poll")
    parser.add_argument("--watch", type=float, default=1.0, help="hub's --channel-watch")
    parser.add_argument("--replicas", type=int, default=2, help="hub serve replicas")
    parser.add_argument("--clients", type=int, default=8, help="requests at once")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    rng = random.Random(33)
    names = [f"bench-{i:05d}" for i in range(args.agents)]
    scale = args.minutes * 60 / args.window
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fleetlet-githost-") as tmp:
        daemon = GitDaemon(workdir=Path(tmp))
        daemon.start()
        try:
            bare = daemon.root / "fleet-state.git"
            build(bare, names)
            assert daemon._process is not None
            pid = daemon._process.pid
            polling = [("agent", n) for n in schedule(names, every=args.poll, window=args.window,
                                                      rng=rng)]  # fmt: skip
            listings = int(args.window / args.watch) * args.replicas
            channel = [("agent", n) for n in schedule(names, every=args.fallback,
                                                      window=args.window, rng=rng)]  # fmt: skip
            channel += [("hub", "")] * listings
            rng.shuffle(channel)
            run(daemon, pid, polling[:200], args.clients)  # warm the page cache
            measured = {
                "polling": run(daemon, pid, polling, args.clients),
                "channel": run(daemon, pid, channel, args.clients),
            }
            hub_only = run(daemon, pid, [("hub", "")] * min(listings, 100), args.clients)
            one_poll = run(daemon, pid, [("agent", n) for n in names[:1000]], args.clients)
        finally:
            daemon.stop()
    per_listing = hub_only["cpu"] / hub_only["n"]
    per_poll = one_poll["cpu"] / one_poll["n"]
    f = {
        "polling_cpu": measured["polling"]["cpu"] * scale,
        "channel_cpu": measured["channel"]["cpu"] * scale,
        "polling_requests": measured["polling"]["n"] * scale,
        "channel_requests": measured["channel"]["n"] * scale,
        "channel_listings": listings * scale,
        "per_listing_ms": per_listing * 1000,
        "per_poll_ms": per_poll * 1000,
        "wall_polling": measured["polling"]["wall"],
        "wall_channel": measured["channel"]["wall"],
    }
    f["ratio"] = f["channel_cpu"] / f["polling_cpu"]
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work (load average "
        f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end), git {_git('--version')[12:]}"
    )
    text = section(args, f, machine)
    print(text)
    if args.write_docs:
        write_section(text)
    return 0


def section(args: argparse.Namespace, f: dict[str, float], machine: str) -> str:
    per_pub = args.agents * f["per_poll_ms"] / 1000
    return f"""{SECTION}

`python bench/git_host.py --agents {args.agents} --window {args.window:g} --write-docs` on
{machine}. A real `git daemon` serves {args.agents:,} cluster branches (packed refs); every
request is a real protocol v2 `ls-refs` on its own connection, made with the agent's code
(`ls_ref_v2`, one branch) or the hub's (`BranchWatcher.tick`, every cluster branch). The git
host's CPU is the daemon's and its `upload-pack` children's. Scaled in time: the requests of
{args.window:g} s out of {args.minutes:g} minutes were sent (as fast as {args.clients}
connections at once allow: {f["wall_polling"]:.0f} s and {f["wall_channel"]:.0f} s), and the
CPU multiplied by {args.minutes * 60 / args.window:g}; the polls' phases are random, so each
window of a steady fleet sends the same requests.

| {args.agents:,} agents, {args.minutes:g} minutes, nothing published | `ls-refs` | git host CPU s |
|---|---:|---:|
| polling every {args.poll:g} s (baseline) | {f["polling_requests"]:,.0f} | {f["polling_cpu"]:.1f} |
| channel: fallback poll every {args.fallback:g} s + {args.replicas} hub replicas listing every {args.watch:g} s | {f["channel_requests"]:,.0f} | {f["channel_cpu"]:.1f} |
| ratio channel / polling | | {f["ratio"]:.3f} (1/{1 / f["ratio"]:.0f}) |

One agent's `ls-refs` costs the host {f["per_poll_ms"]:.1f} ms of CPU; one hub listing of all
{args.agents:,} branches {f["per_listing_ms"]:.1f} ms ({f["channel_listings"]:,.0f} of them in
the channel's total). A publication to every cluster adds, with the channel, one `ls-refs`
per notified agent (about {per_pub:.0f} s of host CPU for {args.agents:,}), which the polling
fleet makes anyway at its next poll; the fetch that follows is the same in both. Target:
1/10 or less."""


if __name__ == "__main__":
    raise SystemExit(main())
