"""The dashboard with 10,000 clusters × 20 bundles: first paint of the matrix in headless chromium.

Builds a synthetic fleet (``tests/statusfleet.py``: stores across three regions, labels from a
fleet repo, mostly Ready, canaries Progressing or RolledBack, about 3% stale), writes every
cluster's status branch as one pack plus ``packed-refs`` (as ``bench/hub_status.py`` does)
on a local ``git daemon``, starts ``python -m hub.serve --fleet ...`` over it, and measures:

- in Debian's chromium (headless, Playwright): the time from navigation start to the first
  paint of the matrix (the page's ``fleetlet:matrix-painted`` performance mark: the first
  page of rows in the DOM, then the next frame), ``--repeat`` times, each in a fresh browser
  context; unfiltered, filtered (label and state) and a page deep in the fleet;
- over HTTP: the response time of the page's first data call (``/api/v1/matrix``).

Baselines in the same run: what a dashboard without the matrix endpoint would do, i.e. fetch
``/api/v1/installations`` and ``/api/v1/clusters`` (everything) and render one full table of
every cluster; timed in the same browser from the start of its script (so without the
page's own load, which the matrix figure includes), and the API call alone. Prints a markdown
table and writes the section "Dashboard" of ``docs/benchmarks.md``. From the repository root::

    python -m bench.dashboard

With ``--screenshot PATH`` it builds a small realistic fleet instead (36 stores × 5 bundles
unless ``--clusters``/``--bundles`` say otherwise), and saves a screenshot of the matrix
(``docs/dashboard.png`` is made this way)::

    python -m bench.dashboard --screenshot docs/dashboard.png
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
from datetime import timedelta
from pathlib import Path
from typing import Any

import requests
import rfc8785
from playwright.sync_api import Browser

from bench._docs import write_section
from hub.api.tokens import write_clear_tokens
from hub.serve import fleet_labels
from hub.status import FleetStatus
from hub.status.queries import StatusQueries
from tests.realenv.browser import chromium
from tests.realenv.gitserver import GitDaemon
from tests.realenv.hubserver import serving_hub
from tests.statusfleet import (
    cluster_document,
    synthetic_fleet,
    write_fleet_dir,
    write_status_repo,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Dashboard"
TOKEN = "bench-read-token-0123456789"
PAGE = 100

# The naive dashboard: everything fetched, one row per cluster, one cell per bundle.
BASELINE_SCRIPT = """async (token) => {
    const began = performance.now();
    const get = async (path) => {
        const r = await fetch(path, {headers: {Authorization: `Bearer ${token}`}});
        return r.json();
    };
    const [installations, clusters] = await Promise.all(
        [get('/api/v1/installations'), get('/api/v1/clusters')]);
    const fetched = performance.now();
    const cells = new Map();
    const bundles = new Set();
    for (const i of installations.items) {
        bundles.add(i.bundle);
        if (!cells.has(i.cluster)) cells.set(i.cluster, {});
        cells.get(i.cluster)[i.bundle] = i.state;
    }
    const columns = [...bundles].sort();
    const table = document.createElement('table');
    const head = table.createTHead().insertRow();
    for (const title of ['Cluster', 'Heartbeat', ...columns]) {
        head.appendChild(document.createElement('th')).textContent = title;
    }
    const body = table.createTBody();
    for (const c of clusters.items) {
        const row = body.insertRow();
        row.insertCell().textContent = c.name;
        row.insertCell().textContent = `${Math.round(c.heartbeatAgeSeconds)}s ago`;
        const states = cells.get(c.name) || {};
        for (const b of columns) {
            const cell = row.insertCell();
            cell.textContent = states[b] || '';
            cell.className = states[b] || 'none';
        }
    }
    document.body.replaceChildren(table);
    await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
    return {total: performance.now() - began, fetch: fetched - began,
            rows: body.rows.length, cells: installations.items.length};
}"""


def build(
    tmp: Path, daemon: GitDaemon, clusters: int, bundles: int, *, history: bool
) -> tuple[str, Path, int]:
    """The status repository and fleet repo; returns (repo URL, fleet dir, document bytes)."""
    fleet = synthetic_fleet(clusters, bundles)
    documents = {
        c.name: cluster_document(c.name, c.states, stale=c.stale, history=history) for c in fleet
    }
    repo = daemon.root / "status.git"
    daemon.create_bare("status.git")
    write_status_repo(repo, documents)
    # As a git server keeps its repositories: packed, with deltas.
    subprocess.run(["git", "-C", str(repo), "repack", "-a", "-d", "-q"], check=True, timeout=1800)
    fleet_dir = write_fleet_dir(tmp / "fleet", {c.name: c.labels for c in fleet})
    size = len(rfc8785.dumps(documents[fleet[0].name]))
    return daemon.url_for("status.git"), fleet_dir, size


def first_paint(browser: Browser, url: str, query: str = "") -> dict[str, float]:
    """Open the matrix in a fresh context; milliseconds from navigation start to its marks."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(f"{url}/{query}#token={TOKEN}")
        page.wait_for_selector("html[data-matrix-painted]", timeout=120_000)
        marks: dict[str, float] = page.evaluate(
            """() => {
            const at = (name) => performance.getEntriesByName(name)[0].startTime;
            const call = performance.getEntriesByType('resource')
                .find((r) => r.name.includes('/api/v1/matrix'));
            return {painted: at('fleetlet:matrix-painted'),
                    rendered: at('fleetlet:matrix-rendered'),
                    fcp: at('first-contentful-paint'),
                    call: call.responseEnd - call.startTime,
                    rows: document.querySelectorAll('#matrix tbody tr[data-cluster]').length};
        }"""
        )
        return marks
    finally:
        context.close()


def baseline(browser: Browser, url: str) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.set_default_timeout(600_000)
        # A document of the hub's origin that loads nothing else (the stylesheet, as text).
        page.goto(f"{url}/ui/static/style.css")
        result: dict[str, float] = page.evaluate(BASELINE_SCRIPT, TOKEN)
        return result
    finally:
        context.close()


def api_time(url: str, path: str, **params: Any) -> float:
    began = time.perf_counter()
    answer = requests.get(
        f"{url}{path}", params=params, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600
    )
    answer.raise_for_status()
    answer.json()
    return time.perf_counter() - began


def in_process(
    url: str, tmp: Path, fleet_dir: Path, repeat: int
) -> tuple[list[float], list[float]]:
    """What the hub does besides serving: the matrix rows of every cluster computed from cold
    (as after its first refresh), and an unfiltered matrix query, in this process."""
    status = FleetStatus(repo_url=url, cache_dir=tmp / "in-process", stale_after=timedelta(hours=1))
    status.refresh()
    labels = fleet_labels(fleet_dir)
    cold, query = [], []
    for _ in range(max(1, min(repeat, 3))):
        queries = StatusQueries(status, labels=labels)
        began = time.perf_counter()
        queries.warm()
        cold.append(time.perf_counter() - began)
        for _ in range(10):
            began = time.perf_counter()
            queries.matrix(limit=PAGE)
            query.append(time.perf_counter() - began)
    return cold, query


def screenshot(args: argparse.Namespace, tmp: Path, daemon: GitDaemon, out: Path) -> int:
    clusters, bundles = args.clusters or 36, args.bundles or 5
    url, fleet_dir, _ = build(tmp, daemon, clusters, bundles, history=True)
    tokens = tmp / "tokens.yaml"
    write_clear_tokens(tokens, {TOKEN: "read"})
    extra = ["--tokens", str(tokens), "--fleet", str(fleet_dir), "--stale-after", "1h"]
    with serving_hub(url, tmp, extra) as hub, chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        page.goto(f"{hub}/#token={TOKEN}")
        page.wait_for_selector("html[data-matrix-painted]")
        page.screenshot(path=str(out))
        context.close()
    print(f"wrote {out} ({clusters} clusters × {bundles} bundles)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clusters", type=int, help="clusters (10000; 36 with --screenshot)")
    parser.add_argument("--bundles", type=int, help="bundles (20; 5 with --screenshot)")
    parser.add_argument("--repeat", type=int, default=5, help="page loads per case (5)")
    parser.add_argument("--screenshot", metavar="PNG", help="save a screenshot; no benchmark")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fleetlet-bench-dashboard-") as tmp_text:
        tmp = Path(tmp_text)
        daemon = GitDaemon(workdir=tmp / "daemon")
        with daemon:
            if args.screenshot:
                return screenshot(args, tmp, daemon, Path(args.screenshot))
            return benchmark(args, tmp, daemon)


def benchmark(args: argparse.Namespace, tmp: Path, daemon: GitDaemon) -> int:
    clusters, bundles = args.clusters or 10_000, args.bundles or 20
    whole = began = time.perf_counter()
    url, fleet_dir, doc_bytes = build(tmp, daemon, clusters, bundles, history=False)
    built = time.perf_counter() - began
    print(f"built {clusters} status branches in {built:.1f}s", file=sys.stderr)
    tokens = tmp / "tokens.yaml"
    write_clear_tokens(tokens, {TOKEN: "read"})
    # Stale after an hour: the fleet's heartbeats must not age into Stale during the run.
    extra = ["--tokens", str(tokens), "--fleet", str(fleet_dir), "--stale-after", "1h"]
    began = time.perf_counter()
    with serving_hub(url, tmp, extra, refresh="10s", startup_timeout=1800) as hub:
        started = time.perf_counter() - began
        print(f"hub serving after {started:.1f}s", file=sys.stderr)
        cases = {
            "unfiltered, first page": "",
            "filtered: `label=region=eu`, `state=Degraded`": "?label=region%3Deu&state=Degraded",
            "unfiltered, page 50": "?page=50",
        }
        paints: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
        naive: list[dict[str, float]] = []
        with chromium() as browser:
            version = browser.version
            first_paint(browser, hub)  # warm-up: the browser's own start
            for round_ in range(args.repeat):
                for name, query in cases.items():
                    paints[name].append(first_paint(browser, hub, query))
                print(
                    f"round {round_ + 1}: {paints['unfiltered, first page'][-1]}", file=sys.stderr
                )
            for round_ in range(max(1, min(args.repeat, 3))):
                naive.append(baseline(browser, hub))
                print(f"baseline {round_ + 1}: {naive[-1]}", file=sys.stderr)
        api_page = [api_time(hub, "/api/v1/matrix", limit=PAGE) for _ in range(args.repeat * 4)]
        api_filtered = [
            api_time(hub, "/api/v1/matrix", label="region=eu", state="Degraded", limit=PAGE)
            for _ in range(args.repeat * 4)
        ]
        api_all = [api_time(hub, "/api/v1/installations") for _ in range(max(1, args.repeat))]
        hub_log = (tmp / "hub.log").read_text()
    cold_rows, query_times = in_process(url, tmp, fleet_dir, args.repeat)

    med = statistics.median
    main_case = paints["unfiltered, first page"]
    paint = med(p["painted"] for p in main_case)
    naive_total = med(b["total"] for b in naive)
    rows = [
        (f"matrix first paint, {name} ({PAGE} rows)", [p["painted"] for p in values])
        for name, values in paints.items()
    ]
    rows.append(
        ("of which: the `/api/v1/matrix` call (unfiltered)", [p["call"] for p in main_case])
    )
    rows.append(("first contentful paint of the page (shell)", [p["fcp"] for p in main_case]))
    rows.append(
        (
            "baseline: fetch every installation and cluster, render the full table",
            [b["total"] for b in naive],
        )
    )
    rows.append(("of which: the two fetches", [b["fetch"] for b in naive]))
    table = "\n".join(
        [
            "| what | median ms | min ms | runs | vs matrix first paint |",
            "|---|---:|---:|---:|---:|",
            *[
                f"| {name} | {med(v):,.0f} | {min(v):,.0f} | {len(v)} | "
                f"{'' if name.startswith('of which') else f'{med(v) / paint:.1f}x'} |"
                for name, v in rows
            ],
        ]
    )
    api_rows = [
        (f"`GET /api/v1/matrix?limit={PAGE}` (the page's first data call)", api_page),
        ("`GET /api/v1/matrix?label=region=eu&state=Degraded&limit=100`", api_filtered),
        ("baseline: `GET /api/v1/installations` (everything)", api_all),
        ("in the hub: `StatusQueries.matrix()`, unfiltered (cached rows)", query_times),
        ("in the hub: every cluster's matrix row from cold (after a refresh)", cold_rows),
    ]
    first_call = med(api_page)
    api_table = "\n".join(
        [
            "| call | median ms | min ms | runs | vs the page's matrix call |",
            "|---|---:|---:|---:|---:|",
            *[
                f"| {name} | {med(v) * 1000:,.1f} | {min(v) * 1000:,.1f} | {len(v)} | "
                f"{'' if name.startswith('in the hub') else f'{med(v) / first_call:.1f}x'} |"
                for name, v in api_rows
            ],
        ]
    )
    refresh = re.search(r"status: (\d+) clusters.*\(([\d.]+)s\)", hub_log)
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"Python {platform.python_version()}, Chromium {version} (headless, Playwright)"
    )
    command = (
        f"python -m bench.dashboard --clusters {clusters} --bundles {bundles} "
        f"--repeat {args.repeat}"
    )
    verdict = "met" if paint < 1000 else "NOT met"
    cells = int(naive[0]["cells"])
    minutes = max(1, round((time.perf_counter() - whole) / 60))
    section = f"""{SECTION}

Reproduce: `{command}` (it starts its own `git daemon`, the hub and headless chromium on
loopback; about {minutes} minute{"s" if minutes > 1 else ""}).

- Fleet: {clusters:,} clusters × {bundles} bundles ({cells:,} installations: mostly Ready,
  canaries Progressing or RolledBack, some Degraded and Paused, about 3% of the clusters
  stale), labels from a fleet repo (`hub serve --fleet`), status documents of about
  {doc_bytes // 1024} KiB written as one pack ({built:.0f} s) and served by `git daemon`. The
  hub aggregated them cold in {refresh.group(2) if refresh else "?"} s before listening.
- Matrix first paint: navigation start to the page's `fleetlet:matrix-painted` mark (the
  first {PAGE} rows in the DOM, then the next frame), in a fresh browser context each time
  (no cache, the token from the URL fragment): the HTML, the stylesheet, six JS modules, one
  `/api/v1/matrix` call, the DOM. The filters run over all {clusters:,} clusters on the hub
  before paging.
- Baseline: the same browser on the hub's origin fetches `/api/v1/installations` and
  `/api/v1/clusters` (everything, as a dashboard on the installations API alone would) and
  renders one table of every cluster; timed from its script's start, so without the page
  load that the matrix figure includes.
- In the hub: each cluster's matrix row (its cells by bundle) is computed once per status
  document, after the refresh that fetched it (all of them after the first refresh, before
  the hub listens), and again when the cluster goes stale; a request reads cached rows.
- Machine: {machine}.

{table}

{api_table}

Target, first paint under 1 s with {clusters:,} clusters: **{verdict}** ({paint:,.0f} ms
median; the naive full table takes {naive_total / paint:.0f}x as long, and its API call alone
{med(api_all) / first_call:.0f}x as long as the matrix call). Each refresh of the page (every
5 s) is one more `/api/v1/matrix` call of the same cost and a patch of the rows that changed.
"""
    print(table)
    print(api_table)
    if not args.no_docs:
        write_section(section)
        print(f"wrote the section {SECTION!r} of {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
