"""The agents' notification channel (issue 33): how many channels one ``hub serve`` holds, what
each costs, and how long a publish takes to reach every connected agent.

A real ``git daemon`` serves a repository with one branch per cluster
(``refs/heads/fleetlet/clusters/bench-NNNNN``); a real ``hub serve --channel-tokens`` watches
it (one ``ls-refs`` of every cluster branch per ``--channel-watch``). This process is the
fleet: ``--agents`` simulated agents, each a real TCP connection holding
``GET /api/v1/clusters/{name}/events`` with its own token (asyncio, one process). Then:

- **held**: the hub's resident memory before and after the connections opened (per channel),
  and its CPU while they are idle (keepalive comments, the watch's listings);
- **fan-out**: every branch moved in one ref transaction (what a fleet-wide publish does), and
  the time from the move to each agent being told ``look``; the hub's CPU for the round
  divided by the agents told (CPU per notification, the listing included).

The baseline for the git host is computed, not simulated: N agents polling every P seconds
make N/P ``ls-refs`` a second; the hub's watch makes one per ``--channel-watch`` per replica.

    python bench/channel.py --agents 10000 --write-docs
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._docs import write_section  # noqa: E402
from hub.channel import write_channel_tokens  # noqa: E402
from tests.realenv.gitserver import GitDaemon, free_port  # noqa: E402

PREFIX = "refs/heads/fleetlet/clusters/"
TICK = os.sysconf("SC_CLK_TCK")


def _git(*args: str, input: str | None = None) -> str:
    return subprocess.run(
        ["git", *args], check=True, capture_output=True, text=True, input=input
    ).stdout.strip()


def _commit(bare: Path, message: str) -> str:
    tree = _git("--git-dir", str(bare), "mktree", input="")
    env = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    return _git(*env, "--git-dir", str(bare), "commit-tree", tree, "-m", message)


def _move_all(bare: Path, names: list[str], commit: str) -> None:
    lines = "".join(f"update {PREFIX}{n} {commit}\n" for n in names)
    _git("--git-dir", str(bare), "update-ref", "--stdin", input=lines)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Agent:
    """One simulated agent: a connection holding its channel, the times it was told."""

    def __init__(self, name: str, token: str) -> None:
        self.name, self.token = name, token
        self.up = asyncio.Event()
        self.told: list[float] = []
        self.writer: asyncio.StreamWriter | None = None

    async def hold(self, port: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
            self.writer.write(
                f"GET /api/v1/clusters/{self.name}/events HTTP/1.1\r\nHost: hub\r\n"
                f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{self.name}: {head[:60]!r}")
            self.up.set()
        tail = b""
        while chunk := await reader.read(4096):
            data = tail + chunk
            self.told += [time.monotonic()] * data.count(b"event: look")
            tail = data[-16:] if b"event: look" not in data[-16:] else b""


async def _fleet(args: argparse.Namespace, port: int, pid: int, bare: Path) -> dict[str, float]:
    names = [f"bench-{i:05d}" for i in range(args.agents)]
    agents = [Agent(n, f"token-{n}") for n in names]
    figures: dict[str, float] = {}
    await asyncio.sleep(3)  # the hub's first listing
    rss0, cpu0 = _rss(pid), _cpu(pid)
    gate = asyncio.Semaphore(256)
    started = time.monotonic()
    tasks = [asyncio.ensure_future(a.hold(port, gate)) for a in agents]
    await asyncio.wait_for(asyncio.gather(*(a.up.wait() for a in agents)), 600)
    figures["connect_s"] = time.monotonic() - started
    await asyncio.sleep(5)
    rss1 = _rss(pid)
    figures["rss_idle_mib"] = rss0 / 2**20
    figures["rss_held_mib"] = rss1 / 2**20
    figures["bytes_per_channel"] = (rss1 - rss0) / args.agents
    figures["connect_cpu_s"] = _cpu(pid) - cpu0
    cpu1, t1 = _cpu(pid), time.monotonic()
    await asyncio.sleep(args.idle)
    figures["idle_cpu_pct"] = 100 * (_cpu(pid) - cpu1) / (time.monotonic() - t1)
    lasts, per_told, p99s, pushes = [], [], [], []
    for round_ in range(args.rounds):
        before = [len(a.told) for a in agents]
        commit = _commit(bare, f"publish {round_}")
        cpu2 = _cpu(pid)
        pushed = time.monotonic()
        _move_all(bare, names, commit)
        # Told from the end of the ref transaction: the publish's push has returned.
        moved = time.monotonic()
        pushes.append(moved - pushed)
        deadline = moved + 120
        while any(len(a.told) == b for a, b in zip(agents, before, strict=True)):
            if time.monotonic() > deadline:
                raise RuntimeError("not every agent was told within 120 s")
            await asyncio.sleep(0.01)
        times = sorted(a.told[b] - moved for a, b in zip(agents, before, strict=True))
        await asyncio.sleep(1.5)  # the next listing, counted in the round's CPU
        lasts.append(times[-1])
        p99s.append(times[int(len(times) * 0.99) - 1])
        per_told.append((_cpu(pid) - cpu2) / args.agents)
        print(f"round {round_}: first {times[0]:.3f}s p50 {times[len(times) // 2]:.3f}s "
              f"p99 {p99s[-1]:.3f}s last {times[-1]:.3f}s", file=sys.stderr)  # fmt: skip
        await asyncio.sleep(2)
    figures["last_told_p50_s"] = statistics.median(lasts)
    figures["last_told_max_s"] = max(lasts)
    figures["p99_told_median_s"] = statistics.median(p99s)
    figures["cpu_per_notification_us"] = statistics.median(per_told) * 1e6
    figures["ref_update_s"] = statistics.median(pushes)
    for a in agents:
        if a.writer is not None:
            a.writer.close()
    for t in tasks:
        t.cancel()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU sampled")
    parser.add_argument("--watch", default="1s", help="hub serve --channel-watch")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fleetlet-channel-") as tmp:
        work = Path(tmp)
        with GitDaemon(workdir=work / "git") as git:
            bare = git.create_bare("branches.git")
            git.create_bare("status.git")
            first = _commit(bare, "first")
            names = [f"bench-{i:05d}" for i in range(args.agents)]
            lines = "".join(f"create {PREFIX}{n} {first}\n" for n in names)
            _git("--git-dir", str(bare), "update-ref", "--stdin", input=lines)
            _git("--git-dir", str(bare), "pack-refs", "--all")  # as the host's maintenance does
            write_channel_tokens(work / "channel.yaml", {n: f"token-{n}" for n in names})
            port = free_port()
            log = work / "hub.log"
            command = [sys.executable, "-m", "hub.serve", "--repo", git.url_for("status.git"),
                       "--listen", f"127.0.0.1:{port}", "--allow-anonymous", "--refresh", "1h",
                       "--cache-dir", str(work / "cache"), "--channel-tokens",
                       str(work / "channel.yaml"), "--channel-repo", git.url_for("branches.git"),
                       "--channel-watch", args.watch]  # fmt: skip
            with log.open("wb") as out:
                hub = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
            try:
                deadline = time.monotonic() + 60
                while b"serving on" not in log.read_bytes():
                    if hub.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"hub did not start: {log.read_text()}")
                    time.sleep(0.2)
                figures = asyncio.run(_fleet(args, port, hub.pid, bare))
                figures["load_start"], figures["load_end"] = load_start, os.getloadavg()[0]
            finally:
                hub.terminate()
                hub.wait(timeout=30)
    for key, value in figures.items():
        print(f"{key}: {value:.3f}")
    if args.write_docs:
        write_section(_section(args, figures))
    return 0


def _section(args: argparse.Namespace, f: dict[str, float]) -> str:
    n = args.agents
    return f"""## Notification channel

`python bench/channel.py --agents {n} --rounds {args.rounds} --watch {args.watch} --write-docs` on {platform.machine()}, {os.cpu_count()}
cores shared with other work (load average {f["load_start"]:.1f} at the start,
{f["load_end"]:.1f} at the end), Python {platform.python_version()}: one `hub serve` process, a
real `git daemon` with {n:,} cluster branches, {n:,} simulated agents in one asyncio process,
each holding `GET /api/v1/clusters/NAME/events` over its own connection with its own token.
The hub lists the cluster branches every {args.watch} (`--channel-watch`).

| | measured |
|---|---|
| channels held by one hub process | {n:,} (all open at once, in {f["connect_s"]:.1f} s) |
| hub resident memory, idle / holding them | {f["rss_idle_mib"]:.0f} MiB / {f["rss_held_mib"]:.0f} MiB |
| memory per channel | {f["bytes_per_channel"] / 1024:.1f} KiB |
| hub CPU while they are idle (keepalives, the watch's listings) | {f["idle_cpu_pct"]:.1f} % of a core |
| publish to every agent told, the last one (median / worst of {args.rounds}) | {f["last_told_p50_s"]:.2f} s / {f["last_told_max_s"]:.2f} s |
| publish to 99 % of the agents told (median of the rounds) | {f["p99_told_median_s"]:.2f} s |
| hub CPU per notification (the round's CPU / agents told, the listing included) | {f["cpu_per_notification_us"]:.0f} µs |
| (the git server's ref transaction moving the {n:,} branches, not counted above) | {f["ref_update_s"]:.1f} s |

The time to be told includes waiting for the next listing: up to one `--channel-watch`
interval (here {args.watch}), then one `ls-refs` of {n:,} branches and the wake-ups. The git
host serves the hub one `ls-refs` per `--channel-watch` per replica, whatever the fleet's size,
where agents polling every P seconds make N/P: {n:,} agents at 30 s make {n / 30:.0f} a second,
at 10 s {n / 10:.0f}. With the channel up the agents poll every `--notify-poll-interval`
(600 s by default): {n / 600:.1f} a second for {n:,} agents, plus one per publication each.
"""


if __name__ == "__main__":
    sys.exit(main())
