"""Format plugins: what running a plugin in its bounded child process costs, and the cache.

The same jsonnet bundle (a Deployment and a ConfigMap, an import from ``lib/``) rendered three
ways, ``--repeat`` times each after a warm-up, taking turns in every round:

- the baseline: the example plugin (``examples/fleetlet-jsonnet``) called in-process, as
  fleetlet called plugins before they got a child process;
- fleetlet cold: ``render_bundle`` with the plugin in its child process (process start,
  imports, the job and the result as JSON, validation, finishing), confined;
- the same with the child unconfined (what the confinement costs);
- fleetlet cached: the agent's path through the render cache for the same pinned sources.

Prints medians and ratios; ``--write`` puts them in the section "Render: plugins" of
``docs/benchmarks.md``. Run from the repository root (the example plugin installed)::

    python -m bench.render_plugin --repeat 30 --write
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from agent.render.cache import RenderCache, sources_digest
from agent.render.formats import render_bundle
from agent.render.plain import RenderRequest
from bench._confine import unconfined
from bench._docs import write_section

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Render: plugins"
TREE = {
    "lib/app.libsonnet": """
        { deployment(name, image):: { apiVersion: 'apps/v1', kind: 'Deployment',
            metadata: { name: name }, spec: { selector: { matchLabels: { app: name } },
            template: { metadata: { labels: { app: name } },
                        spec: { containers: [{ name: 'main', image: image }] } } } } }
    """,
    "main.jsonnet": """
        local app = import 'app.libsonnet';
        local v = std.extVar('values');
        [app.deployment('web', 'example/web:' + v.tag),
         { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'web' }, data: v }]
    """,
}


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _unconfined(render: Callable[[], object]) -> object:
    with unconfined():
        return render()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from fleetlet_jsonnet import JsonnetFormat

    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "bundle"
        for name, text in TREE.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(textwrap.dedent(text))
        request = RenderRequest(source="web", namespace="web", options={"values": {"tag": "1"}})
        cache = RenderCache()
        content = sources_digest(
            [{"kind": "image", "uri": "r/web", "digest": "sha256:" + "a" * 64}]
        )
        ways: dict[str, Callable[[], object]] = {
            "in-process (baseline)": lambda: JsonnetFormat().render(tree, request),
            "child process (cold)": lambda: render_bundle(tree, format="jsonnet", request=request),
            "child process, unconfined (cold)": lambda: _unconfined(
                lambda: render_bundle(tree, format="jsonnet", request=request)
            ),
            "cached": lambda: cache.render(
                format="jsonnet", content=content, request=request, tree=lambda: tree
            ),
        }
        for way in ways.values():
            way()  # warm-up (and the cache's first render)
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeat):
            for name, way in ways.items():
                started = time.perf_counter()
                way()
                samples[name].append(time.perf_counter() - started)
    base = _median_ms(samples["in-process (baseline)"])
    confined = _median_ms(samples["child process (cold)"])
    open_ = _median_ms(samples["child process, unconfined (cold)"])
    rows = [
        f"| {name} | {_median_ms(s):.2f} ms | {_median_ms(s) / base:.3g}x |"
        for name, s in samples.items()
    ]
    text = "\n".join(
        [
            SECTION,
            "",
            "The example jsonnet plugin rendering a two-object bundle, medians of "
            f"{args.repeat} rounds ({platform.python_implementation()} "
            f"{platform.python_version()}, `python -m bench.render_plugin --repeat "
            f"{args.repeat} --write`). The child process (start, imports, JSON both ways) is "
            "the price of an agent that survives a plugin that hangs or eats memory; the "
            "render cache pays it once per bundle revision. Its confinement (Landlock and the "
            "socket filter; both children run the isolated interpreter) costs "
            f"{confined - open_:+.2f} ms ({confined / open_:.3f}x the unconfined child), within "
            "the noise of this shared machine (the set-up alone: see Render: helm).",
            "",
            "| render | median | vs in-process |",
            "| --- | --- | --- |",
            *rows,
            "",
        ]
    )
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
