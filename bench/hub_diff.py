"""Benchmark: ``hub diff --base --head -o markdown`` of a pull request that changes one bundle
over a synthetic fleet (default 10,000 clusters x 20 bundles).

The fleet is :func:`bench.hub_publish.write_fleet`'s, committed to a local git repository;
its ``bundle-00`` is made a plain bundle whose content (a Deployment and a ClusterRole) sits
in a local registry (``docker-registry`` on loopback), with a rollout of two waves. The pull
request moves ``bundle-00`` to a new digest whose ClusterRole grants more, on every cluster.
Each run is the CLI as a CI job runs it (a process of its own, cold: no cache directory), so
the figure includes loading and planning the fleet twice, comparing, and rendering one cluster
at both revisions. Medians of ``--runs``; written to the "Hub diff of a pull request" section
of ``docs/benchmarks.md`` (``--no-docs`` to skip). Usage::

    python bench/hub_diff.py [--clusters 10000] [--bundles 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
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
from bench.hub_publish import write_fleet  # noqa: E402
from tests.fleetlab import deployment  # noqa: E402
from tests.realenv.oci import OciClient, push_bundle  # noqa: E402
from tests.realenv.registry import Registry  # noqa: E402

SECTION = "## Hub diff of a pull request"
TARGET_SECONDS = 10.0


def role(verbs: list[str]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "bundle-00"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}],
        }
    )


def push(registry: Registry, tmp: Path, version: int) -> str:
    directory = tmp / f"content-v{version}"
    directory.mkdir()
    (directory / "d.yaml").write_text(deployment("web", "ns-00", f"example/web:{version}.0"))
    (directory / "r.yaml").write_text(role(["get"] if version == 1 else ["get", "list", "*"]))
    pushed = push_bundle(OciClient(host=registry.host), "bench/bundle-00", directory)
    return pushed.digest


def bundle_00(registry: Registry, digest: str) -> dict[str, Any]:
    return {
        "name": "bundle-00",
        "sources": [{"kind": "image", "uri": f"{registry.host}/bench/bundle-00", "digest": digest}],
        "group": "group-00",
        "targets": [{"clusterSelector": {}}],
        "rollout": {
            "waves": [
                {"name": "canary", "size": "1%"},
                {"name": "rest", "pauseBefore": True},
            ]
        },
    }


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@example.com", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def one_diff(fleet: Path, base: str, head: str) -> dict[str, Any]:
    script = (
        "import resource, runpy, sys, time\n"
        "t = time.perf_counter()\n"
        "sys.argv = ['fleetlet', 'hub', 'diff', sys.argv[1], '--base', sys.argv[2],"
        " '--head', sys.argv[3], '-o', 'markdown', '-q']\n"
        "try:\n"
        "    runpy.run_module('fleetlet', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('SECONDS', time.perf_counter() - t, file=sys.stderr)\n"
        "print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    )
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, str(fleet), base, head],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"hub diff failed:\n{done.stderr}")
    rss = int(re.search(r"RSS (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
    return {"seconds": wall, "peak_rss_mb": rss / 1024, "markdown": done.stdout}


def docs_section(summary: dict[str, Any]) -> str:
    met = "met" if summary["median"] < TARGET_SECONDS else "NOT met"
    return f"""{SECTION}

`python bench/hub_diff.py --clusters {summary["clusters"]} --bundles {summary["bundles"]} --runs {summary["runs"]}`

`fleetlet hub diff FLEET --base main --head pr -o markdown`, as a CI job runs it (a process of
its own, no cache directory), on {summary["clusters"]:,} clusters x {summary["bundles"]} bundles
(`bench/hub_publish.py`'s fleet, one inventory file) where the pull request moves one plain
bundle, targeted at every cluster, to content whose ClusterRole grants more. The run loads,
pins and plans the fleet at both revisions (read from git objects), compares them (one change
on {summary["clusters"]:,} clusters), renders that bundle for one cluster at both revisions
from a local registry, and writes the comment. Median of {summary["runs"]} runs
({", ".join(f"{s:.2f}" for s in summary["all"])} s). Machine: {summary["machine"]}.

| clusters | bundles | clusters changing | median s | peak RSS MB |
|---:|---:|---:|---:|---:|
| {summary["clusters"]:,} | {summary["bundles"]} | {summary["clusters"]:,} (one entry) | {summary["median"]:.2f} | {summary["rss"]:.0f} |

Target: under {TARGET_SECONDS:.0f} s at 10,000 clusters: {met} ({summary["median"]:.2f} s).
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--bundles", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-diff-") as tmp_name:
        tmp = Path(tmp_name)
        with Registry(workdir=tmp / "registry") as registry:
            v1, v2 = push(registry, tmp, 1), push(registry, tmp, 2)
            fleet = tmp / "fleet"
            write_fleet(fleet, clusters=args.clusters, bundles=args.bundles, touched=None)
            path = fleet / "bundles" / "bundle-00.yaml"
            path.write_text(yaml.safe_dump(bundle_00(registry, v1)))
            git(fleet, "init", "-q", "-b", "main")
            git(fleet, "add", "-A")
            git(fleet, "commit", "-q", "-m", "base")
            git(fleet, "checkout", "-q", "-b", "pr")
            path.write_text(yaml.safe_dump(bundle_00(registry, v2)))
            git(fleet, "commit", "-q", "-am", "bundle-00: v2")
            results = []
            for run in range(args.runs):
                result = one_diff(fleet, "main", "pr")
                assert f"**{args.clusters:,} clusters change**" in result["markdown"], result
                assert "**RBAC**: ClusterRole bundle-00 (changed)" in result["markdown"]
                results.append(result)
                print(f"run {run + 1}: {result['seconds']:.2f} s, {result['peak_rss_mb']:.0f} MB")
    load = os.getloadavg()[0]
    summary = {
        "clusters": args.clusters,
        "bundles": args.bundles,
        "runs": args.runs,
        "all": [r["seconds"] for r in results],
        "median": statistics.median(r["seconds"] for r in results),
        "rss": statistics.median(r["peak_rss_mb"] for r in results),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work (load "
        f"average {load:.1f} when written), Python {platform.python_version()}",
    }
    print(docs_section(summary))
    if not args.no_docs:
        write_section(docs_section(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
