"""Keeping a status document under its size bound whatever the fleet does: history trimmed
oldest-first, messages cut with :data:`TRUNCATION_MARKER`, ``truncated`` set.

Part of :mod:`agent.api.status`; used by :mod:`agent.report.push` before each push.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from agent.api.status._document import (
    DEFAULT_MAX_MESSAGE,
    DEFAULT_MAX_RUNS,
    MAX_STATUS_BYTES,
    TRUNCATION_MARKER,
    BundleStatusReport,
    ClusterStatus,
)
from agent.api.status._wire import _wire_size

# --- bounding the size ----------------------------------------------------------------------


def truncate_message(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, ending with the marker when cut."""
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - len(TRUNCATION_MARKER))
    return text[:keep] + TRUNCATION_MARKER


def _cut_messages(s: ClusterStatus, max_chars: int) -> ClusterStatus:
    """``s`` with every message cut to ``max_chars``; unchanged objects are kept as they are."""

    def cut(obj: Any) -> Any:
        text = getattr(obj, "message", "")
        if len(text) <= max_chars:
            return obj
        return dataclasses.replace(obj, message=truncate_message(text, max_chars))

    def cut_all(items: tuple[Any, ...]) -> tuple[Any, ...]:
        new = tuple(cut(item) for item in items)
        return items if all(a is b for a, b in zip(new, items, strict=True)) else new

    bundles = []
    for b in s.bundles:
        conditions = cut_all(b.conditions)
        runs = cut_all(b.runs)
        health = cut(b.health) if b.health is not None else None
        if conditions is b.conditions and runs is b.runs and health is b.health:
            bundles.append(b)
        else:
            bundles.append(dataclasses.replace(b, conditions=conditions, health=health, runs=runs))
    refusal = cut(s.last_refusal) if s.last_refusal is not None else None
    return dataclasses.replace(s, bundles=tuple(bundles), last_refusal=refusal)


def _size(s: ClusterStatus) -> int:
    return _wire_size(s)


def _drop_oldest_runs(s: ClusterStatus, max_bytes: int, *, keep_newest: bool) -> ClusterStatus:
    """Drop runs oldest first (by start time) until the document fits; with ``keep_newest``
    each bundle keeps its newest run."""
    over = _size(s) - max_bytes
    if over <= 0:
        return s
    candidates: list[tuple[datetime, int, int, int]] = []  # (startedAt, bundle, position, size)
    for b_index, b in enumerate(s.bundles):
        start = 1 if keep_newest else 0
        for position in range(start, len(b.runs)):
            run = b.runs[position]
            size = _wire_size(run) + 1
            candidates.append((run.started_at, b_index, position, size))
    candidates.sort(key=lambda c: (c[0], -c[2]))
    dropped: set[tuple[int, int]] = set()
    for _, b_index, position, size in candidates:
        if over <= 0:
            break
        dropped.add((b_index, position))
        over -= size
    touched = {b_index for b_index, _ in dropped}
    bundles = tuple(
        dataclasses.replace(b, runs=tuple(r for p, r in enumerate(b.runs) if (i, p) not in dropped))
        if i in touched
        else b
        for i, b in enumerate(s.bundles)
    )
    return dataclasses.replace(s, bundles=bundles)


def bound_status(
    s: ClusterStatus,
    *,
    max_bytes: int = MAX_STATUS_BYTES,
    max_runs: int = DEFAULT_MAX_RUNS,
    max_message: int = DEFAULT_MAX_MESSAGE,
) -> ClusterStatus:
    """``s`` cut to fit ``max_bytes`` of canonical bytes; ``truncated`` set when anything was cut.

    In order, until it fits: at most ``max_runs`` runs per bundle and messages of at most
    ``max_message`` characters (always); older runs dropped oldest first (each bundle keeping its
    newest); messages cut to 200 characters; every run dropped oldest first; finally bundles
    dropped from the end. Raises ValueError if ``max_bytes`` cannot hold even an empty document.
    """
    original = s
    bundles = tuple(
        dataclasses.replace(b, runs=b.runs[:max_runs]) if len(b.runs) > max_runs else b
        for b in s.bundles
    )
    s = _cut_messages(dataclasses.replace(s, bundles=bundles, truncated=True), max_message)
    for _ in range(3):
        s = _drop_oldest_runs(s, max_bytes, keep_newest=True)
    if _size(s) > max_bytes:
        s = _cut_messages(s, min(max_message, 200))
    for _ in range(3):
        s = _drop_oldest_runs(s, max_bytes, keep_newest=False)
    if _size(s) > max_bytes:
        # Bundles alone exceed the bound: keep as many as fit (sizes are additive).
        empty = dataclasses.replace(s, bundles=())
        budget = max_bytes - _size(empty) - len(',"bundles":{}')
        kept: list[BundleStatusReport] = []
        for b in s.bundles:
            cost = _wire_size(b) + len(b.name) + 4
            if cost > budget:
                break
            kept.append(b)
            budget -= cost
        s = dataclasses.replace(s, bundles=tuple(kept))
    if _size(s) > max_bytes:
        raise ValueError(f"a status document cannot fit in {max_bytes} bytes")
    # Every step keeps the objects it did not change: all the same objects means nothing cut.
    unchanged = (
        len(s.bundles) == len(original.bundles)
        and all(a is b for a, b in zip(s.bundles, original.bundles, strict=True))
        and s.last_refusal is original.last_refusal
    )
    return original if unchanged else s
