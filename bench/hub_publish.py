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

    python bench/hub_publish.py [--clusters 10000] [--bundles 20] [--runs 3]
    python bench/hub_publish.py --from-json results.json   # only rewrite the docs section
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hub.publish.flow import prepare, publish  # noqa: E402
from hub.publish.git import BranchStore  # noqa: E402
from hub.publish.sign import PublicationSigner  # noqa: E402
from tests.realenv.gitserver import GitDaemon  # noqa: E402
from tests.realenv.sigstore import MiniSigstore  # noqa: E402

DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Hub publish"
REGIONS = ["eu", "us", "ap", "sa", "af"]
TIERS = ["edge", "core", "lab"]


def write_fleet(root: Path, *, clusters: int, bundles: int, touched: list[str] | None) -> None:
    """A fleet of ``clusters`` clusters (one inventory file) and ``bundles`` pinned bundles.

    Most bundles go to every cluster; some are label-selected; every bundle has a region
    override. ``touched`` clusters get an extra named override on bundle 0 (the 1% change).
    """
    (root / "clusters").mkdir(parents=True, exist_ok=True)
    (root / "bundles").mkdir(exist_ok=True)
    (root / "fleet.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "repo": "https://fleet.example.invalid/bench.git",
                "publication": {"expiresAfter": "7d", "refreshBefore": "1d"},
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
    (root / "clusters" / "inventory.yaml").write_text(
        yaml.dump({"clusters": inventory}, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))
    )
    for old in (root / "bundles").glob("*.yaml"):
        old.unlink()
    for b in range(bundles):
        doc: dict[str, Any] = {
            "name": f"bundle-{b:02d}",
            "sources": [
                {
                    "kind": "image",
                    "uri": f"registry.example.invalid/fleet/bundle-{b:02d}",
                    "digest": "sha256:" + f"{b:02x}" * 32,
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


def one_publish(fleet: Path, url: str, cache: Path, signer: PublicationSigner) -> dict[str, Any]:
    started = time.perf_counter()
    prepared = prepare(fleet)
    with BranchStore(url=url, cache_dir=cache) as store:
        report = publish(prepared, store, signer=signer)
    total = time.perf_counter() - started
    return {
        "seconds": total,
        "pushed": len(report.pushed),
        "phases": {k: round(v, 2) for k, v in report.timings.items()},
    }


def docs_section(summary: dict[str, Any]) -> str:
    """The markdown of the "Hub publish" section for ``summary`` (see main)."""
    import pygit2

    def phases(runs: list[dict[str, Any]]) -> str:
        names = list(runs[0]["phases"])
        return ", ".join(
            f"{n} {statistics.median(r['phases'][n] for r in runs):.2f}" for n in names
        )

    full_med = summary["full_median_seconds"]
    inc_med = summary["incremental_median_seconds"]
    verdict = "met" if full_med < 60 else "**NOT met**"
    return f"""{SECTION}

`python bench/hub_publish.py --clusters {summary["clusters"]} --bundles {summary["bundles"]} \
--runs {summary["runs"]}`

A synthetic fleet of {summary["clusters"]} clusters (one inventory file, labels region/tier) and
{summary["bundles"]} helm bundles (lockstep pairs, each after the previous pair, a region
override on each; sources already pinned so that no registry is measured) is published to a
local `git daemon` through a local mini Sigstore (one signing event per publish). **Full**:
every cluster to an empty repository (render, one signature, one commit per cluster written
as one pack, one push of {summary["clusters"]} branches). **Incremental**: then a change that
touches 1% of the clusters ({summary["incremental_clusters"]}: a named override on one bundle),
published over the full publication with the same local cache. Medians of {summary["runs"]}
runs; the baseline is the full publish of the same run. Machine: {platform.machine()},
2 CPUs shared with other work, Python {platform.python_version()}, pygit2 {pygit2.__version__}
(libgit2 {pygit2.LIBGIT2_VERSION}).

| publish | clusters pushed | median s | vs full |
|---|---:|---:|---:|
| full (render + sign + push all) | {summary["clusters"]} | {full_med:.1f} | 1.0x |
| incremental (1% changed) | {summary["incremental_clusters"]} | {inc_med:.1f} | \
{summary["ratio_incremental_over_full"]:.3f}x |

Median seconds per phase. Full: {phases(summary["full"])}. Incremental:
{phases(summary["incremental"])}.

Target (full publish of 10,000 clusters x 20 bundles under 60 s): {verdict}
({full_med:.1f} s). The incremental publish signs and pushes only the changed clusters; what
remains proportional to the whole fleet is reading the fleet itself (`load`, `plan`), one ref
listing (`fetch`: nothing is downloaded when the cache already holds the tips), and one
commit read per cluster (`compare`: the hub's commit trailers record each branch's content
digest, so an unchanged cluster's set is not parsed).
"""


def write_docs(section: str, path: Path = DOCS) -> None:
    """Replace (or append) the "Hub publish" section of ``path``; leave other sections alone."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--bundles", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--from-json", metavar="FILE", help="rewrite the docs from saved results")
    args = parser.parse_args()
    if args.from_json:
        write_docs(docs_section(json.loads(Path(args.from_json).read_text())))
        return 0
    touched_count = max(1, args.clusters // 100)

    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-hub-") as tmp_name:
        tmp = Path(tmp_name)
        with GitDaemon(workdir=tmp / "git") as git, MiniSigstore(workdir=tmp / "sigstore") as sig:
            full: list[dict[str, Any]] = []
            incremental: list[dict[str, Any]] = []
            for run in range(args.runs):
                fleet = tmp / f"fleet-{run}"
                write_fleet(fleet, clusters=args.clusters, bundles=args.bundles, touched=None)
                name = f"bench-{run}.git"
                git.create_bare(name)
                cache = tmp / f"cache-{run}.git"
                signer = PublicationSigner.from_trust_config(
                    trust_config=sig.trust_config_path, token=sig.mint_token()
                )
                result = one_publish(fleet, git.url_for(name), cache, signer)
                assert result["pushed"] == args.clusters, result
                full.append(result)
                print(
                    f"full run {run + 1}: {result['seconds']:.1f} s {result['phases']}", flush=True
                )
                # 1% of the clusters change (a named override), spread over the fleet.
                touched = [f"cluster-{i:05d}" for i in range(0, args.clusters, 100)]
                write_fleet(fleet, clusters=args.clusters, bundles=args.bundles, touched=touched)
                signer = PublicationSigner.from_trust_config(
                    trust_config=sig.trust_config_path, token=sig.mint_token()
                )
                result = one_publish(fleet, git.url_for(name), cache, signer)
                assert result["pushed"] == touched_count, result
                incremental.append(result)
                print(
                    f"incremental run {run + 1}: {result['seconds']:.1f} s {result['phases']}",
                    flush=True,
                )
    full_median = statistics.median(r["seconds"] for r in full)
    inc_median = statistics.median(r["seconds"] for r in incremental)
    summary = {
        "clusters": args.clusters,
        "bundles": args.bundles,
        "runs": args.runs,
        "full_median_seconds": round(full_median, 2),
        "incremental_median_seconds": round(inc_median, 2),
        "incremental_clusters": touched_count,
        "ratio_incremental_over_full": round(inc_median / full_median, 3),
        "full": full,
        "incremental": incremental,
    }
    print(
        f"\nhub publish, {args.clusters} clusters x {args.bundles} bundles, {args.runs} runs:\n"
        f"  full (render + sign + push all):   median {full_median:.1f} s\n"
        f"  incremental ({touched_count} clusters, 1%): median {inc_median:.1f} s\n"
        f"  ratio incremental/full: {inc_median / full_median:.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if not args.no_docs:
        write_docs(docs_section(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
