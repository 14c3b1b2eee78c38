"""Where the time from ``hub publish`` to Ready goes: the stages of ``FLEETLET_TRACE``
(:mod:`agent.report.trace`) read back, per sample and cluster, as offsets from the publish.

For each sample (its wall-clock start) and each cluster, the first line of each stage after
the start and before the cluster was seen Ready is taken; the table gives the median offset
of each stage over samples and clusters, and the median step from the stage before it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

# In the order a move goes through them (a stage that did not happen is left out).
STAGES = (
    ("bench:pushed", "the publish pushed (resolve, render, sign, push)"),
    ("hub:noticed", "hub: the move noticed (its listing, or its own publish)"),
    ("hub:told", "hub: `look` sent on the channel"),
    ("agent:told", "agent: `look` received"),
    ("agent:poll", "agent: poll started"),
    ("agent:ls-refs", "agent: `ls-refs` answered"),
    ("agent:tick-worker", "agent: worker launched"),
    ("worker:started", "worker: process up (imports)"),
    ("worker:first-fetched", "worker: first step polled and fetched"),
    ("worker:trust-loaded", "worker: trust policy loaded"),
    ("worker:signature-checked", "worker: signature checked (first step)"),
    ("worker:second-step", "worker: second step up (exec, imports)"),
    ("worker:agent-built", "worker: agent built"),
    ("polled", "worker: polled again"),
    ("fetched", "worker: fetched"),
    ("verified", "worker: verified"),
    ("rendered", "worker: rendered"),
    ("intent", "worker: intent written"),
    ("applied", "worker: applied"),
    ("healthy", "worker: healthy"),
    ("finished", "worker: group finished"),
    ("worker:result-written", "worker: result written (status document built)"),
    ("agent:tick-worker-done", "agent: worker reaped"),
    ("agent:status-pushed", "agent: status pushed"),
    ("ready", "bench: Ready seen on the status branch"),
)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue  # a line cut by a killed process
    return lines


def offsets(samples: list[dict[str, float]], lines: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Stage -> its offsets (s) from each sample's start, one per sample and cluster."""
    found: dict[str, list[float]] = {stage: [] for stage, _ in STAGES}
    for sample in samples:
        began = sample["began"]
        clusters = [k for k in sample if k not in ("all", "publish", "began")]
        for cluster in clusters:
            ready = began + sample[cluster]
            seen = {"bench:pushed": sample["publish"], "ready": sample[cluster]}
            for line in sorted(lines, key=lambda x: x["t"]):
                if line.get("cluster") != cluster or not began <= line["t"] <= ready:
                    continue
                seen.setdefault(line["stage"], line["t"] - began)
            for stage, _ in STAGES:
                if stage in seen:
                    found[stage].append(seen[stage])
    return found


def table(samples: list[dict[str, float]], lines: list[dict[str, Any]], title: str) -> list[str]:
    """Markdown rows: stage, median offset, median step from the stage before."""
    found = offsets(samples, lines)
    rows = [f"| {title} | at (p50 s) | step (s) |", "|---|---:|---:|"]
    before = 0.0
    for stage, label in STAGES:
        values = found[stage]
        if not values:
            continue
        at = statistics.median(values)
        rows.append(f"| {label} | {at:.2f} | {at - before:+.2f} |")
        before = at
    return rows


__all__ = ["STAGES", "offsets", "read", "table"]
