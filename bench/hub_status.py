"""Hub status aggregation: 10,000 clusters' status branches, cold and after 1% moved.

Starts a local ``git daemon`` (the test environment's), writes a bare repository with
``--clusters`` branches ``fleetlet/status/<cluster>`` (each a commit holding one
``status.json`` of ``--bundles`` bundles with ``--runs`` runs each, as agents push them),
written as one pack plus ``packed-refs`` (no 10,000 pushes), then times
:meth:`hub.status.FleetStatus.refresh`:

- cold: an empty cache directory (one ref listing, one fetch of every branch, every document
  parsed), ``--repeat`` times;
- incremental: a warm hub after ``--moved`` percent of the clusters pushed a new document,
  ``--repeat`` times (a different set of clusters each round).

With ``--shards N`` the branches are spread over N repositories (each cluster in the shard
the fleet's stable hash gives it) and the hub reads them all (in parallel).

Baselines in the same run: ``git clone --mirror`` of the same repository (the transfer alone,
by the git CLI) and ``git ls-remote`` (one listing). Also measured: the API's answers in the
hub (the dashboard's matrix page, filtered and not, a cluster page, an installation) and the
hub's resident memory. Prints a markdown table and writes the section "Hub status
aggregation" of ``docs/benchmarks.md``. Run from the repository root::

    python -m bench.hub_status [--clusters 10000] [--shards N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pygit2
import rfc8785

from agent.api.status import summary_message
from bench._docs import write_section
from hub.fleet.jump import shard_of_name
from hub.publish.pack import PackWriter
from hub.status import FleetStatus
from hub.status.queries import StatusQueries
from tests.realenv.gitserver import GitDaemon

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Hub status aggregation"
AUTHOR = "fleetlet agent <agent@fleetlet.invalid>"
PREFIX = "refs/heads/fleetlet/status/"


def document(cluster: str, *, sequence: int, bundles: int, runs: int) -> bytes:
    """A status document as an agent writes it: bundles with runs, conditions, outputs."""
    now = datetime.now(UTC)
    beat = now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def run(bundle: str, serial: int) -> dict[str, Any]:
        return {
            "id": f"{cluster}.{bundle}.{serial}.1",
            "operation": "upgrade" if serial > 1 else "install",
            "serial": serial,
            "sourceDigests": [f"sha256:{os.urandom(32).hex()}"],
            "startedAt": beat,
            "finishedAt": beat,
            "result": "Succeeded",
            "message": "applied and healthy",
            "counts": {"created": 1, "configured": 2, "unchanged": 12, "pruned": 0},
            "outputs": {"endpoint": {"value": f"10.0.{serial % 256}.1"}},
        }

    body: dict[str, Any] = {
        f"bundle-{b}": {
            "group": "apps",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Healthy",
                    "message": "all objects Current",
                    "lastTransitionTime": beat,
                    "observedGeneration": sequence,
                }
            ],
            "appliedRevision": {"serial": sequence + runs, "sources": ["sha256:" + "ab" * 32]},
            "health": {"status": "Current", "message": ""},
            "runs": [run(f"bundle-{b}", sequence + runs - i) for i in range(runs)],
        }
        for b in range(bundles)
    }
    return rfc8785.dumps(
        {
            "apiVersion": "fleetlet.io/v1alpha1",
            "kind": "ClusterStatus",
            "schemaVersion": 1,
            "cluster": cluster,
            "agentVersion": "0.1.0",
            "heartbeat": beat,
            "sequence": sequence,
            "lastAcceptedSerial": sequence + runs,
            "bundles": body,
        }
    )


class Fleet:
    """The status repositories (one per shard): commits written as one pack per shard and the
    refs as ``packed-refs``."""

    def __init__(self, paths: list[Path], *, clusters: int, bundles: int, runs: int) -> None:
        self.paths = paths
        self.bundles = bundles
        self.runs = runs
        self.names = [f"cluster-{i:05d}" for i in range(clusters)]
        self.shard = {n: shard_of_name(n, len(paths)) for n in self.names}
        self.tips: dict[str, str] = {}
        self.sequence: dict[str, int] = {}
        for path in paths:
            pygit2.init_repository(str(path), bare=True)
        self.bytes = 0
        self.message_bytes = 0

    def push(self, names: list[str]) -> None:
        """New documents for ``names``, as if each agent pushed once."""
        packs = [PackWriter() for _ in self.paths]
        stamp = int(time.time())
        for name in names:
            pack = packs[self.shard[name]]
            seq = self.sequence.get(name, 0) + 1
            data = document(name, sequence=seq, bundles=self.bundles, runs=self.runs)
            self.bytes = len(data)
            tree = pack.tree({"status.json": pack.blob(data)})
            parents = [self.tips[name]] if name in self.tips else []
            # As agents write it: the document's summary in the message.
            message = summary_message(json.loads(data))
            self.message_bytes = len(message)
            self.tips[name] = pack.commit(
                tree=tree, parents=parents, author=AUTHOR, timestamp=stamp, message=message
            )
            self.sequence[name] = seq
        for shard, path in enumerate(self.paths):
            packs[shard].write(path)
            lines = ["# pack-refs with: peeled fully-peeled sorted"]
            lines += [
                f"{self.tips[n]} {PREFIX}{n}" for n in sorted(self.tips) if self.shard[n] == shard
            ]
            # In one step: a git server may be listing the refs meanwhile (bench/hub_load.py).
            (path / "packed-refs.new").write_text("\n".join(lines) + "\n")
            os.replace(path / "packed-refs.new", path / "packed-refs")


def timed(action: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True, timeout=600)


def hub_child(urls: list[str], cache: Path, repeat: int) -> dict[str, Any]:
    """A hub of its own (a child process) restarted from ``cache``: the API's answers and
    its resident memory, as ``hub serve`` holds the fleet."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.hub_status", "--hub-child", str(cache), str(repeat), *urls],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_hub_child(cache: Path, repeat: int, urls: list[str]) -> int:
    status = FleetStatus(repo_url=urls, cache_dir=cache)
    status.refresh()
    pages = api_pages(status, repeat)
    print(json.dumps({"pages": pages, "rss_mb": resident_mb()}))
    return 0


def api_pages(status: FleetStatus, repeat: int) -> dict[str, list[float]]:
    """Seconds per answer of the API in the hub, warm (the matrix's rows computed after the
    refresh, as ``hub serve`` does): what the dashboard's pages ask for."""
    regions = [{"region": r} for r in ("eu", "us", "ap")]
    labels = {n: regions[i % 3] for i, n in enumerate(status.names())}
    queries = StatusQueries(status, labels=labels)
    queries.warm()
    some = status.names()[len(status.names()) // 2]
    calls = {
        "matrix, first page of 100 (`/api/v1/matrix`)": lambda: queries.matrix(),
        "matrix, filtered `label=region=eu` `state=Ready`": lambda: queries.matrix(
            label="region=eu", state="Ready"
        ),
        "matrix, page 500": lambda: queries.matrix(offset=500 * 100 % max(1, len(status.names()))),
        "a cluster's page (cluster + its installations)": lambda: (
            queries.cluster(some),
            queries.installations(cluster=some),
        ),
        "an installation with its runs": lambda: queries.installation(
            some, "bundle-0", admin=False
        ),
        "installations page `state=Ready&limit=100`": lambda: queries.installations(
            state="Ready", limit=100
        ),
    }
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            out[name].append(timed(call)[0])
    return out


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--bundles", type=int, default=3, help="bundles per cluster (3)")
    parser.add_argument("--runs", type=int, default=5, help="runs kept per bundle (5)")
    parser.add_argument("--moved", type=float, default=1.0, help="percent moved (1)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shards", type=int, default=1, help="status repositories (1)")
    parser.add_argument("--hub-child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.hub_child:
        cache, repeat, *urls = args.hub_child
        return run_hub_child(Path(cache), int(repeat), urls)

    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-status-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = GitDaemon(workdir=tmp / "daemon")
        with daemon:
            paths = [daemon.root / f"status-{i}.git" for i in range(args.shards)]
            fleet = Fleet(paths, clusters=args.clusters, bundles=args.bundles, runs=args.runs)
            built, _ = timed(lambda: fleet.push(fleet.names))
            # As a git server keeps its repositories: packed, with deltas (git gc).
            packed = 0.0
            for path in paths:
                seconds, _ = timed(lambda p=path: git("-C", str(p), "repack", "-a", "-d", "-q"))
                packed += seconds
            urls = [daemon.url_for(f"status-{i}.git") for i in range(args.shards)]
            print(f"built {args.clusters} branches in {built:.1f}s", file=sys.stderr)

            cold: list[float] = []
            listing: list[float] = []
            mirror: list[float] = []
            tips_only: list[float] = []
            for i in range(args.repeat):
                status = FleetStatus(
                    repo_url=urls, cache_dir=tmp / f"cold-{i}", stale_after=timedelta(minutes=5)
                )
                seconds, result = timed(status.refresh)
                assert len(result.moved) == args.clusters and not result.errors, result.errors
                cold.append(seconds)
                del status
                seconds, _ = timed(lambda: [git("ls-remote", u, f"{PREFIX}*") for u in urls])
                listing.append(seconds)
                seconds, _ = timed(
                    lambda i=i: [
                        git("clone", "--quiet", "--mirror", u, str(tmp / f"mirror-{i}-{n}"))
                        for n, u in enumerate(urls)
                    ]
                )
                mirror.append(seconds)
                seconds, _ = timed(
                    lambda i=i: [
                        git(
                            "clone",
                            "--quiet",
                            "--bare",
                            "--no-single-branch",
                            "--depth=1",
                            "--filter=tree:0",
                            u,
                            str(tmp / f"tips-{i}-{n}"),
                        )
                        for n, u in enumerate(urls)
                    ]
                )
                tips_only.append(seconds)
                print(f"cold round {i + 1}: {cold[-1]:.2f}s", file=sys.stderr)

            warm = FleetStatus(repo_url=urls, cache_dir=tmp / "cold-0")
            assert len(warm.names()) == args.clusters
            moved_count = max(1, round(args.clusters * args.moved / 100))
            incremental: list[float] = []
            idle: list[float] = []
            restart: list[float] = []
            for i in range(args.repeat):
                chosen = fleet.names[i * moved_count :: max(1, args.clusters // moved_count)]
                chosen = chosen[:moved_count]
                fleet.push(chosen)
                seconds, result = timed(warm.refresh)
                assert sorted(result.moved) == sorted(chosen), len(result.moved)
                incremental.append(seconds)
                seconds, result = timed(warm.refresh)
                assert not result.moved
                idle.append(seconds)
                seconds, _ = timed(lambda: FleetStatus(repo_url=urls, cache_dir=tmp / "cold-0"))
                restart.append(seconds)
                print(f"incremental round {i + 1}: {incremental[-1]:.2f}s", file=sys.stderr)
            del warm
            hub = hub_child(urls, tmp / "cold-0", args.repeat * 5)
            pages, rss = hub["pages"], hub["rss_mb"]

    med = statistics.median
    rows = [
        (f"cold aggregation, {args.clusters:,} clusters (`FleetStatus.refresh`)", cold),
        (f"incremental refresh, {moved_count:,} moved ({args.moved:g}%)", incremental),
        ("idle refresh, nothing moved", idle),
        ("hub restart: load the cached view (no git traffic)", restart),
        (
            "baseline: `git clone --mirror` of the same repositories, one after the other (CLI)",
            mirror,
        ),
        (
            "baseline: the tips' commits alone, `git clone --bare --no-single-branch "
            "--depth=1 --filter=tree:0`, one repository after the other (CLI)",
            tips_only,
        ),
        ("baseline: `git ls-remote` of the status branches of each repository (CLI)", listing),
    ]
    table = "\n".join(
        [
            "| what | median s | min s | runs |",
            "|---|---:|---:|---:|",
            *[f"| {name} | {med(v):.2f} | {min(v):.2f} | {len(v)} |" for name, v in rows],
        ]
    )
    page_table = "\n".join(
        [
            "| answer in the hub (`StatusQueries`) | median ms | max ms | runs |",
            "|---|---:|---:|---:|",
            *[
                f"| {name} | {med(v) * 1000:.1f} | {max(v) * 1000:.1f} | {len(v)} |"
                for name, v in pages.items()
            ],
        ]
    )
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"Python {platform.python_version()}, pygit2 {getattr(pygit2, '__version__', '?')} "
        f"(libgit2 {pygit2.LIBGIT2_VERSION})"
    )
    command = (
        f"python -m bench.hub_status --clusters {args.clusters} --bundles {args.bundles} "
        f"--runs {args.runs} --moved {args.moved:g} --repeat {args.repeat} --shards {args.shards}"
    )
    limit = 10 if args.clusters <= 10_000 else 15
    verdict = "met" if med(cold) < limit else "NOT met"
    slowest = max(med(v) for v in pages.values())

    def ok(met: bool) -> str:
        return "met" if met else "NOT met"

    section = f"""{SECTION}

Reproduce: `{command}` (it starts its own `git daemon` on loopback).

- Repositories: {args.shards} (shards; a cluster's by the fleet's stable hash), holding
  {args.clusters:,} branches `fleetlet/status/<cluster>`, each one commit with a
  `status.json` of {fleet.bytes:,} bytes ({args.bundles} bundles × {args.runs} runs with
  outputs) and, as agents write it, the document's summary in its message
  ({fleet.message_bytes:,} bytes), written as one pack plus `packed-refs` in {built:.1f} s,
  then repacked with deltas by `git repack -a -d` ({packed:.1f} s) as a server keeps its
  repositories. The `git daemon` filters fetches (`uploadpack.allowFilter`), as GitHub,
  GitLab and Gitea do.
- Cold: a new cache directory each round: per shard one protocol v2 connection, listing the
  status branches (`ls-refs`) and fetching the tips' commits alone (`deepen 1`,
  `filter tree:0`), each summary read from its commit's message, checked and summarised.
  Incremental: the warm hub after {moved_count:,} clusters pushed a new document (a
  different set each round): the same, for the moved tips only. A restarted hub reads its
  cached view (SQLite) and nothing else. The API's answers are timed in a hub process of its
  own, restarted from that cache, with labels for every cluster (3 regions).
- Machine: {machine}.

{table}

{page_table}

Hub resident memory (a hub of its own, restarted from the cache, after a refresh and the
answers above, labels for every cluster): {rss:.0f} MB.

Targets ({args.clusters:,} clusters): cold aggregation under {limit} s: **{verdict}**
({med(cold):.2f} s); a 1% refresh under 1 s: **{ok(med(incremental) < 1)}**
({med(incremental):.2f} s); a restart from the cache under 3 s: **{ok(med(restart) < 3)}**
({med(restart):.2f} s); an idle refresh under 0.5 s: **{ok(med(idle) < 0.5)}**
({med(idle):.2f} s); the API's answers under 300 ms: **{ok(slowest < 0.3)}** (slowest median
{slowest * 1000:.0f} ms).

How: a cold start reads the shards in worker processes (2 at a time on this machine); every
refresh lists each shard with protocol v2 (`ls-refs` of the status branches) and fetches the
moved tips' commits alone in the same connection (`hub/status/fetch.py`), the pack stored as
it came; the view is a compact summary per cluster, read from the summaries the commits
carry, kept in SQLite (a restart reads it, no document); documents are fetched and read on
demand for the pages of one cluster; the matrix's rows are reused until the view changes or
a cluster goes stale.
"""
    print(table)
    print(page_table)
    print(f"hub RSS {rss:.0f} MB")
    if not args.no_docs:
        write_section(section)
        print(f"wrote the section {SECTION!r} of {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
