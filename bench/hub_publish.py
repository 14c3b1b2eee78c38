"""Benchmark: ``hub publish`` of a synthetic fleet (default 10,000 clusters x 20 bundles).

Starts a real ``git daemon`` and a mini Sigstore on loopback, generates a fleet whose sources
are already pinned (so the registry is not what is measured), then measures:

- **full**: render + sign + push of every cluster to an empty repository (one signing event,
  one push);
- **incremental**: the same fleet with a change that touches 1% of the clusters (an override
  naming them), published over the full publication.

Each is repeated ``--runs`` times; medians and the ratio incremental/full are printed, written
as JSON with ``--json FILE``, and written to the "Hub publish" section of
``docs/benchmarks.md`` (other sections are left as they are; ``--no-docs`` to skip). Usage::

    python bench/hub_publish.py [--clusters 10000] [--bundles 20] [--runs 3] [--shards N]
    python bench/hub_publish.py --from-json results.json   # only rewrite the docs section
    python bench/hub_publish.py --signatures [--clusters 10000]  # policies on against off

With ``--shards N`` the fleet has ``shards: {count: N}`` and N repositories on the same
``git daemon``. Each publish runs in a child process of its own, so its peak resident memory
(``VmHWM``) is its own; the hub's cache directory (parsed fleet files, branch facts, objects)
is kept from the full publish to the incremental one, as a hub keeps it between runs.

With ``--signatures`` (:mod:`bench.hub_publish_signatures`) every bundle's source is a real
Helm chart in a registry on loopback, signed with ``cosign`` (a key pair), and the same full
and incremental publishes run with the fleet's source signature policy off, then on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._docs import write_section  # noqa: E402
from hub.publish.flow import prepare, publish  # noqa: E402
from hub.publish.sign import PublicationSigner  # noqa: E402
from tests.realenv.gitserver import GitDaemon  # noqa: E402
from tests.realenv.sigstore import MiniSigstore  # noqa: E402

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Hub publish"
REGIONS = ["eu", "us", "ap", "sa", "af"]
TIERS = ["edge", "core", "lab"]


def write_fleet(
    root: Path,
    *,
    clusters: int,
    bundles: int,
    touched: list[str] | None,
    shards: int = 1,
    sources: list[tuple[str, str]] | None = None,
    signing: dict[str, Any] | None = None,
) -> None:
    """A fleet of ``clusters`` clusters (one inventory file) and ``bundles`` pinned bundles.

    Most bundles go to every cluster; some are label-selected; every bundle has a region
    override. ``touched`` clusters get an extra named override on bundle 0 (the 1% change).
    ``sources``: each bundle's (uri, digest) instead of an unreachable one; ``signing``:
    fleet.yaml's ``sourceSigning``.
    """
    (root / "clusters").mkdir(parents=True, exist_ok=True)
    (root / "bundles").mkdir(exist_ok=True)
    (root / "fleet.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "repo": "https://fleet.example.invalid/bench.git",
                "publication": {"expiresAfter": "7d", "refreshBefore": "1d"},
                **({"shards": {"count": shards}} if shards > 1 else {}),
                **({"sourceSigning": signing} if signing else {}),
            }
        )
    )
    inventory = [
        {
            "name": f"cluster-{i:05d}",
            "labels": {"region": REGIONS[i % len(REGIONS)], "tier": TIERS[i % len(TIERS)]},
        }
        for i in range(clusters)
    ]
    # A fleet file holds at most 16 MiB (hub.fleet.model): beyond 100,000 clusters the
    # inventory is split into files of 100,000, as a large fleet keeps it.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    for old in (root / "clusters").glob("*.yaml"):
        old.unlink()
    if clusters <= 100_000:
        (root / "clusters" / "inventory.yaml").write_text(
            yaml.dump({"clusters": inventory}, Dumper=dumper)
        )
    else:
        for part, start in enumerate(range(0, clusters, 100_000)):
            (root / "clusters" / f"inventory-{part:03d}.yaml").write_text(
                yaml.dump({"clusters": inventory[start : start + 100_000]}, Dumper=dumper)
            )
    for old in (root / "bundles").glob("*.yaml"):
        old.unlink()
    for b in range(bundles):
        doc: dict[str, Any] = {
            "name": f"bundle-{b:02d}",
            "sources": [
                {
                    "kind": "image",
                    # A loopback port nothing listens on: a publish's look at each pinned
                    # chart (its dependencies) is refused at once, so that neither a
                    # registry nor DNS is measured.
                    "uri": sources[b][0] if sources else f"127.0.0.1:9/fleet/bundle-{b:02d}",
                    "digest": sources[b][1] if sources else "sha256:" + f"{b:02x}" * 32,
                }
            ],
            "format": "helm",
            "formatOptions": {
                "targetNamespace": f"ns-{b:02d}",
                "values": {
                    "replicas": 2,
                    "image": {"tag": f"1.{b}.0"},
                    "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
                },
            },
            "group": f"group-{b // 2:02d}",  # lockstep pairs
            "dependsOn": [f"group-{(b // 2) - 1:02d}"] if b >= 2 else [],
            "targets": [{"clusterSelector": {}}],
            "overrides": [
                {
                    "clusterSelector": {"matchLabels": {"region": "eu"}},
                    "values": {"replicas": 3},
                }
            ],
        }
        if b == 0 and touched:
            doc["overrides"].append({"clusters": touched, "values": {"replicas": 9}})
        (root / "bundles" / f"bundle-{b:02d}.yaml").write_text(yaml.safe_dump(doc))


def one_publish(fleet: Path, url: str, cache: Path, token: str, trust: Path) -> dict[str, Any]:
    """One ``hub publish`` in a child process (its own peak memory); its figures."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(Path(__file__)), "--child", str(fleet), url, str(cache), str(trust)],
        input=token,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"publish failed: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = round(time.perf_counter() - started, 2)
    return result


def child(fleet: Path, url: str, cache: Path, trust: Path) -> int:
    """The child of :func:`one_publish`: prints one JSON line."""
    from hub.publish.shards import ShardedStore

    signer = PublicationSigner.from_trust_config(trust_config=trust, token=sys.stdin.read().strip())
    started = time.perf_counter()
    prepared = prepare(fleet, cache_dir=cache / "fleet", signature_cache=cache / "signatures")
    urls = prepared.shard_map.urls(url)
    with ShardedStore(urls=urls, cache_dir=cache) as store:
        report = publish(prepared, store, signer=signer)
    total = time.perf_counter() - started
    peak = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    # The pack-writing worker processes (forked: most of their pages are shared).
    writers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "seconds": total,
                "pushed": len(report.pushed),
                "shards_pushed": len(report.shards_pushed),
                "peak_rss_mb": round(peak, 1),
                "peak_rss_writer_mb": round(writers, 1),
                "phases": {k: round(v, 2) for k, v in report.timings.items()},
            }
        )
    )
    return 0


def docs_section(summary: dict[str, Any]) -> str:
    """The markdown of the "Hub publish" section for ``summary`` (see main)."""
    import pygit2

    def phases(runs: list[dict[str, Any]]) -> str:
        names = list(runs[0]["phases"])
        return ", ".join(
            f"{n} {statistics.median(r['phases'][n] for r in runs):.2f}" for n in names
        )

    clusters = summary["clusters"]
    shards = summary.get("shards", 1)
    full_med = summary["full_median_seconds"]
    inc_med = summary["incremental_median_seconds"]
    ratio = summary["ratio_incremental_over_full"]
    maintenance = {
        "gc": "`git gc` in each repository (objects repacked, refs packed, a commit-graph written)",
        "pack-refs": "`git pack-refs` in each repository (the refs packed alone)",
    }[summary.get("maintenance", "pack-refs")]
    full_ok = "met" if full_med < 60 else "**NOT met**"
    inc_ok = "met" if ratio <= 0.05 else "**NOT met**"
    return f"""{SECTION}

`python bench/hub_publish.py --clusters {clusters} --bundles {summary["bundles"]} \
--runs {summary["runs"]} --shards {shards} --maintenance {summary.get("maintenance", "pack-refs")}`

A synthetic fleet of {clusters:,} clusters (one inventory file, labels region/tier) and
{summary["bundles"]} helm bundles (lockstep pairs, each after the previous pair, a region
override on each; sources already pinned, at a loopback port that refuses connections, so
that neither a registry nor DNS is measured), sharded over
{shards} repositor{"y" if shards == 1 else "ies"} on a local `git daemon`, published through a
local mini Sigstore (one signing event per publish). Each publish runs in a process of its own
(its peak resident memory is its own) with the hub's cache directory kept between runs, as a
hub keeps it. **Full**: every cluster to empty repositories, from a cold cache (the inventory
parsed, every set rendered and signed, one pack per shard, the two-phase commit across
shards). **Incremental**: then, after {maintenance} (as a git host's maintenance does after
pushes), a change that touches 1% of the clusters spread over the fleet
({summary["incremental_clusters"]:,}: a named override on one bundle). Medians of
{summary["runs"]} runs; the baseline is the full publish of the same run. Machine:
{platform.machine()}, 2 CPUs shared with other work (load average {os.getloadavg()[0]:.1f} when
written), Python {platform.python_version()}, pygit2 {pygit2.__version__} (libgit2
{pygit2.LIBGIT2_VERSION}).

| publish | clusters pushed | median s | vs full | peak RSS MB |
|---|---:|---:|---:|---:|
| full (load, plan, render, sign, write, push all) | {clusters:,} | {full_med:.1f} | 1.0x | \
{summary["full_peak_rss_mb"]:.0f} |
| incremental (1% changed) | {summary["incremental_clusters"]:,} | {inc_med:.1f} | {ratio:.3f}x | \
{summary["incremental_peak_rss_mb"]:.0f} |

Median seconds per stage (stages done per shard in parallel, `write` and `push`, are summed
over shards; `write+stage`, `commit` and `apply` are wall time). Full: {phases(summary["full"])}.
Incremental: {phases(summary["incremental"])}.

Targets at 100,000 clusters × 20 bundles: full publish under 60 s: {full_ok} ({full_med:.1f} s);
a 1% change at most 5% of a full publish: {inc_ok} ({ratio * 100:.1f}%).
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--bundles", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shards", type=int, default=1, help="repositories (fleet shards)")
    parser.add_argument(
        "--maintenance",
        choices=["gc", "pack-refs"],
        default="gc",
        help="what the git server does between the full and the incremental publish (gc)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--from-json", metavar="FILE", help="rewrite the docs from saved results")
    parser.add_argument(
        "--signatures",
        action="store_true",
        help="compare publishes with source signature policies on against off",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.signatures:
        from bench.hub_publish_signatures import compare

        return compare(args, write_fleet=write_fleet, one_publish=one_publish)
    if args.child:
        fleet_dir, url, cache, trust = args.child
        return child(Path(fleet_dir), url, Path(cache), Path(trust))
    if args.from_json:
        write_section(docs_section(json.loads(Path(args.from_json).read_text())))
        return 0
    touched_count = max(1, args.clusters // 100)

    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-hub-") as tmp_name:
        tmp = Path(tmp_name)
        with GitDaemon(workdir=tmp / "git") as git, MiniSigstore(workdir=tmp / "sigstore") as sig:
            full: list[dict[str, Any]] = []
            incremental: list[dict[str, Any]] = []
            for run in range(args.runs):
                fleet = tmp / f"fleet-{run}"
                started = time.perf_counter()
                write_fleet(
                    fleet,
                    clusters=args.clusters,
                    bundles=args.bundles,
                    touched=None,
                    shards=args.shards,
                )
                print(f"fleet written in {time.perf_counter() - started:.1f} s", flush=True)
                for shard in range(args.shards):
                    git.create_bare(f"bench-{run}-{shard}.git")
                url = git.url_for(f"bench-{run}-{{shard}}.git")
                if args.shards == 1:
                    url = git.url_for(f"bench-{run}-0.git")
                cache = tmp / f"cache-{run}"
                trust = sig.trust_config_path
                result = one_publish(fleet, url, cache, sig.mint_token(), trust)
                assert result["pushed"] == args.clusters, result
                full.append(result)
                print(
                    f"full run {run + 1}: {result['seconds']:.1f} s, peak "
                    f"{result['peak_rss_mb']:.0f} MB (writers {result['peak_rss_writer_mb']:.0f}"
                    f" MB) {result['phases']}",
                    flush=True,
                )
                # As a git server keeps its repositories (GitHub, GitLab and Gitea run git's
                # maintenance after pushes): objects repacked, refs packed, a commit-graph
                # written (git gc); or, with --maintenance pack-refs, the refs packed alone.
                for shard in range(args.shards):
                    where = str(git.root / f"bench-{run}-{shard}.git")
                    task = ["gc", "--quiet"] if args.maintenance == "gc" else ["pack-refs", "--all"]
                    subprocess.run(["git", "--git-dir", where, *task], check=True)
                # 1% of the clusters change (a named override), spread over the fleet.
                touched = [f"cluster-{i:05d}" for i in range(0, args.clusters, 100)]
                write_fleet(
                    fleet,
                    clusters=args.clusters,
                    bundles=args.bundles,
                    touched=touched,
                    shards=args.shards,
                )
                result = one_publish(fleet, url, cache, sig.mint_token(), trust)
                assert result["pushed"] == touched_count, result
                incremental.append(result)
                print(
                    f"incremental run {run + 1}: {result['seconds']:.1f} s, peak "
                    f"{result['peak_rss_mb']:.0f} MB {result['phases']}",
                    flush=True,
                )
    full_median = statistics.median(r["seconds"] for r in full)
    inc_median = statistics.median(r["seconds"] for r in incremental)
    summary = {
        "clusters": args.clusters,
        "bundles": args.bundles,
        "runs": args.runs,
        "shards": args.shards,
        "maintenance": args.maintenance,
        "full_median_seconds": round(full_median, 2),
        "incremental_median_seconds": round(inc_median, 2),
        "full_peak_rss_mb": max(r["peak_rss_mb"] for r in full),
        "incremental_peak_rss_mb": max(r["peak_rss_mb"] for r in incremental),
        "incremental_clusters": touched_count,
        "ratio_incremental_over_full": round(inc_median / full_median, 3),
        "full": full,
        "incremental": incremental,
    }
    print(
        f"\nhub publish, {args.clusters} clusters x {args.bundles} bundles, "
        f"{args.shards} shard(s), {args.runs} runs:\n"
        f"  full (render + sign + push all):   median {full_median:.1f} s\n"
        f"  incremental ({touched_count} clusters, 1%): median {inc_median:.1f} s\n"
        f"  ratio incremental/full: {inc_median / full_median:.3f}\n"
        f"  peak RSS: full {summary['full_peak_rss_mb']:.0f} MB, "
        f"incremental {summary['incremental_peak_rss_mb']:.0f} MB"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if not args.no_docs:
        write_section(docs_section(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
