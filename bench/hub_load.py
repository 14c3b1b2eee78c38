"""The hub under load: ``hub serve`` over 10,000 clusters, loaded from this process on loopback.

Starts a local ``git daemon`` (the test environment's) with the status branches of
``--clusters`` clusters of ``--bundles`` bundles each, written by the fleet generator of
``bench/hub_status.py`` (one pack and ``packed-refs`` per shard; agents' summaries in the
commit messages, so the hub fetches documents when a page asks for them), and a fleet repo
with the clusters' labels. Then ``python -m hub.serve`` on a free loopback port, and clients
(threads of this process, each with its own keep-alive connection):

- ``pages``: ``/api/v1/installations`` at random offsets (100 a page);
- ``matrix``: the dashboard's matrix, a random page of 100 clusters, every other request with
  a label filter;
- ``cluster``: one cluster's page (``/clusters/{c}`` and ``/installations?cluster=c``);
- ``dashboard``: the dashboard's first load (the shell, its script, the matrix's first page);

each at 1, 10, 50 and 200 clients, first idle, then while ``--moved`` percent of the clusters
push a new document every ``--every`` seconds (and the hub refreshes every 10 s). Last, one
normal client (the matrix) alone and alongside ``--costly`` clients asking the costliest
requests the API accepts (pages of 500 installations, the longest label selector). Each cell
runs ``--seconds`` seconds or ``--max-requests`` requests per client, whichever comes first.

Reports requests/s, p50/p99 latency, errors (503s, deliberate, with Retry-After, apart) and
the hub's resident memory, prints a markdown table and writes the section "Hub under load" of
``docs/benchmarks.md``. Loopback only. Run from the repository root::

    python -m bench.hub_load [--clusters 10000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._docs import write_section
from bench.hub_status import Fleet
from hub.api.tokens import write_clear_tokens
from tests.realenv.gitserver import GitDaemon
from tests.realenv.hubserver import serving_hub
from tests.statusfleet import write_fleet_dir

SECTION = "## Hub under load"
TOKEN = "bench-load-token-0123456789"
CLIENTS = (1, 10, 50, 200)
ENDPOINTS = ("pages", "matrix", "cluster", "dashboard")
REGIONS = ("eu", "us", "ap")


@dataclass
class Cell:
    """What the clients of one measurement saw."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # no answer at all
    rss_mb: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    def row(self, name: str) -> str:
        errors = self.requests - self.statuses[200] - self.statuses[503]
        errors += sum(self.failures.values())
        return (
            f"| {name} | {self.requests} | {self.requests / self.seconds:.0f} | "
            f"{self.pct(0.5):.0f} | {self.pct(0.99):.0f} | {self.statuses[503]} | {errors} | "
            f"{self.rss_mb:.0f} |"
        )


class Hub:
    """Requests to the hub on one keep-alive connection (one per client thread)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def get(self, path: str) -> tuple[int, float]:
        began = time.perf_counter()
        for attempt in (1, 2):
            try:
                self.conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
                response = self.conn.getresponse()
                response.read()
                if response.getheader("connection", "").lower() == "close":
                    self.conn.close()
                return response.status, time.perf_counter() - began
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server closed while idle: once more, anew.
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def requests_for(endpoint: str, names: list[str], rng: random.Random) -> list[str]:
    """The requests of one step of ``endpoint`` (a page load may be several)."""
    if endpoint == "pages":
        return [f"/api/v1/installations?offset={rng.randrange(len(names) * 10)}&limit=100"]
    if endpoint == "matrix":
        label = f"&label=region%3D{rng.choice(REGIONS)}" if rng.random() < 0.5 else ""
        return [f"/api/v1/matrix?offset={rng.randrange(len(names))}&limit=100{label}"]
    if endpoint == "cluster":
        name = rng.choice(names)
        return [f"/api/v1/clusters/{name}", f"/api/v1/installations?cluster={name}"]
    if endpoint == "dashboard":
        return ["/", "/ui/static/matrix.js", "/api/v1/matrix?offset=0&limit=100"]
    if endpoint == "costly":
        selector = ",".join(f"k{i}%20notin%20(a,b,c)" for i in range(20))
        return [
            f"/api/v1/installations?offset={rng.randrange(len(names) * 10)}&limit=500",
            f"/api/v1/matrix?limit=500&label={selector}",
            "/api/v1/installations",
        ]
    raise ValueError(endpoint)


def resident_mb(pid: int) -> float:
    """The resident memory of ``pid`` and its children (worker processes), in MB."""
    total = 0
    for proc in [pid, *children(pid)]:
        try:
            for line in Path(f"/proc/{proc}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def hub_pid(port: int) -> int:
    """The process serving ``port`` (found by its command line)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"hub.serve" in command and f"127.0.0.1:{port}".encode() in command:
                return int(entry.name)
    raise RuntimeError(f"no hub process listening on {port}")


def measure(
    port: int,
    pid: int,
    endpoint: str,
    clients: int,
    names: list[str],
    *,
    seconds: float,
    max_requests: int,
    alongside: Callable[[threading.Event], None] | None = None,
) -> Cell:
    """``clients`` threads doing ``endpoint`` for ``seconds`` (or ``max_requests`` each)."""
    cell = Cell()
    lock = threading.Lock()
    stop = threading.Event()
    began = time.perf_counter()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        hub = Hub(port)
        done = 0
        while done < max_requests and not stop.is_set():
            for path in requests_for(endpoint, names, rng):
                try:
                    status, took = hub.get(path)
                except OSError as exc:
                    with lock:
                        cell.failures[type(exc).__name__] += 1
                    continue
                with lock:
                    cell.statuses[status] += 1
                    if status == 200:  # the latency of answers (a 503 comes at once)
                        cell.latencies.append(took)
                done += 1
            if time.perf_counter() - began > seconds:
                break
        hub.conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    side = threading.Thread(target=alongside, args=(stop,)) if alongside else None
    if side is not None:
        side.start()
    for thread in threads:
        thread.start()
    peak = 0.0
    while any(t.is_alive() for t in threads):
        peak = max(peak, resident_mb(pid))
        time.sleep(0.25)
    for thread in threads:
        thread.join()
    cell.seconds = time.perf_counter() - began
    stop.set()
    if side is not None:
        side.join()
    cell.rss_mb = max(peak, resident_mb(pid))
    return cell


class Pushes:
    """``moved`` percent of the clusters push a new document every ``every`` seconds."""

    def __init__(self, fleet: Fleet, moved: float, every: float) -> None:
        self.fleet = fleet
        self.count = max(1, round(len(fleet.names) * moved / 100))
        self.every = every
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(11)
        while not self.stop.is_set():
            self.fleet.push(rng.sample(self.fleet.names, self.count))
            self.rounds += 1
            self.stop.wait(self.every)

    def __enter__(self) -> Pushes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--bundles", type=int, default=20, help="bundles per cluster (20)")
    parser.add_argument("--runs", type=int, default=1, help="runs kept per bundle (1)")
    parser.add_argument("--shards", type=int, default=4, help="status repositories (4)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement (10)")
    parser.add_argument("--max-requests", type=int, default=2000, help="per client (2000)")
    parser.add_argument("--moved", type=float, default=1.0, help="percent moved (1)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between moves (10)")
    parser.add_argument("--costly", type=int, default=4, help="costly clients (4)")
    parser.add_argument(
        "--clients", default=",".join(map(str, CLIENTS)), help="client counts (1,10,50,200)"
    )
    parser.add_argument("--endpoints", default=",".join(ENDPOINTS))
    parser.add_argument("--serve-args", default="", help="more `hub serve` options")
    parser.add_argument("--label", default="", help="the section's heading ends with this")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    endpoints = args.endpoints.split(",")

    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-load-") as tmp_text:
        tmp = Path(tmp_text)
        with GitDaemon(workdir=tmp / "daemon") as daemon:
            paths = [daemon.root / f"status-{i}.git" for i in range(args.shards)]
            fleet = Fleet(paths, clusters=args.clusters, bundles=args.bundles, runs=args.runs)
            began = time.perf_counter()
            fleet.push(fleet.names)
            print(f"built {args.clusters} branches in {time.perf_counter() - began:.1f}s")
            labels = {
                n: {"region": REGIONS[i % 3], "tier": "flagship" if i % 7 == 0 else "store"}
                for i, n in enumerate(fleet.names)
            }
            fleet_dir = write_fleet_dir(tmp / "fleet", labels)
            tokens = tmp / "tokens.yaml"
            write_clear_tokens(tokens, {TOKEN: "read"})
            extra = [
                "--tokens", str(tokens), "--fleet", str(fleet_dir),
                "--shards", str(args.shards), *args.serve_args.split(),
            ]  # fmt: skip
            template = daemon.url_for("status-{shard}.git")
            results: list[tuple[str, str, int, Cell]] = []
            started = time.perf_counter()
            # --stale-after 1h: only the moving 1% heartbeat here; after 5 minutes every
            # other cluster would go stale in the middle of the run.
            with serving_hub(
                template, tmp, extra, refresh="10s", stale_after="1h", startup_timeout=900
            ) as url:
                port = int(url.rsplit(":", 1)[1])
                pid = hub_pid(port)
                cold = time.perf_counter() - started
                idle_mb = resident_mb(pid)
                print(f"hub listening after {cold:.1f}s, {idle_mb:.0f} MB", flush=True)

                def run(phase: str) -> None:
                    for endpoint in endpoints:
                        for clients in counts:
                            cell = measure(
                                port, pid, endpoint, clients, fleet.names,
                                seconds=args.seconds, max_requests=args.max_requests,
                            )  # fmt: skip
                            results.append((phase, endpoint, clients, cell))
                            print(cell.row(f"{phase} {endpoint} x{clients}"), flush=True)

                run("idle")
                with Pushes(fleet, args.moved, args.every) as pushes:
                    run("pushes")
                    alone = measure(
                        port, pid, "matrix", 1, fleet.names,
                        seconds=args.seconds, max_requests=args.max_requests,
                    )  # fmt: skip
                    print(alone.row("normal alone"), flush=True)
                    costly: list[Cell] = []

                    def costly_clients(stop: threading.Event) -> None:
                        costly.append(
                            measure(
                                port, pid, "costly", args.costly, fleet.names,
                                seconds=args.seconds, max_requests=args.max_requests,
                            )
                        )  # fmt: skip

                    beside = measure(
                        port, pid, "matrix", 1, fleet.names,
                        seconds=args.seconds, max_requests=args.max_requests,
                        alongside=costly_clients,
                    )  # fmt: skip
                    print(beside.row("normal beside costly"), flush=True)
                    print(costly[0].row("costly"), flush=True)
                    rounds = pushes.rounds
                end_mb = resident_mb(pid)
            log = (tmp / "hub.log").read_text()
    crashed = "Traceback" in log or "Segmentation" in log
    section = report(
        args, results, alone, beside, costly[0], cold, idle_mb, end_mb, rounds, crashed
    )
    print(section)
    if not args.no_docs:
        write_section(section)
    return 0


def report(
    args: argparse.Namespace,
    results: list[tuple[str, str, int, Cell]],
    alone: Cell,
    beside: Cell,
    costly: Cell,
    cold: float,
    idle_mb: float,
    end_mb: float,
    rounds: int,
    crashed: bool,
) -> str:
    header = (
        "| measurement | requests | req/s | p50 ms (200s) | p99 ms (200s) | 503 (Retry-After) | other "
        "errors | hub MB (peak) |\n|---|---|---|---|---|---|---|---|"
    )
    rows = [cell.row(f"{phase}, {endpoint}, {n} clients") for phase, endpoint, n, cell in results]
    peak = max([c.rss_mb for *_, c in results] + [beside.rss_mb, costly.rss_mb])
    other = sum(
        c.requests - c.statuses[200] - c.statuses[503] + sum(c.failures.values())
        for c in [*(c for *_, c in results), alone, beside, costly]
    )
    matrix50 = [c for phase, e, n, c in results if (phase, e, n) == ("pushes", "matrix", 50)]
    return f"""{SECTION}{": " + args.label if args.label else ""}

`python -m bench.hub_load --clusters {args.clusters} --bundles {args.bundles} --runs {args.runs}
--shards {args.shards} --seconds {args.seconds:g} --max-requests {args.max_requests} --moved
{args.moved:g} --every {args.every:g} --costly {args.costly}{
        " --serve-args '" + args.serve_args + "'" if args.serve_args else ""
    }` on {platform.machine()}, {os.cpu_count()} cores shared with
other work, Python {platform.python_version()}. `hub serve` (its defaults unless given
above: one process, `--concurrency 16 --queue 64 --request-timeout 30s --header-timeout 10s`;
`--refresh 10s`, `--stale-after 1h`: no cluster goes stale during the run; the labels from
`--fleet`)
over a local `git daemon`; the clients are threads of the bench's process on loopback, each
with its own keep-alive connection (so the clients share the 2 cores with the hub). A
measurement lasts {args.seconds:g} s or {args.max_requests} requests per client. "pushes": {
        args.moved:g}% of the clusters push a new document every {args.every:g} s ({rounds} rounds
during the run). "cluster" is a cluster page (2 requests), "dashboard" a first load of the
dashboard (3 requests).

- Hub ready (cold start, listening) after {cold:.1f} s; resident memory {idle_mb:.0f} MB idle,
  {peak:.0f} MB at the peak, {end_mb:.0f} MB at the end.
- Answers other than 200 and the deliberate 503s: {other}. Crash or traceback in the hub's
  log: {"yes" if crashed else "none"}.
- Matrix p99 at 50 clients with pushes: {matrix50[0].pct(0.99) if matrix50 else float("nan"):.0f}
  ms (target 500 ms). A normal client (the matrix) alone: p99 {alone.pct(0.99):.0f} ms;
  beside {args.costly} clients asking the costliest accepted requests (pages of 500
  installations, a 20-requirement selector on 500 rows, an unpaged list, capped at 100):
  p99 {beside.pct(0.99):.0f} ms (target 200 ms).

{header}
{chr(10).join(rows)}
{alone.row("normal client alone (matrix), with pushes")}
{beside.row("normal client beside costly ones, with pushes")}
{costly.row(f"the {args.costly} costly clients")}
"""


if __name__ == "__main__":
    sys.exit(main())
