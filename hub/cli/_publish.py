"""The bodies of ``hub render`` and ``hub publish``: prepare the fleet, write its sets to a
directory or sign and push them, print the summary. Registered by :mod:`hub.cli._parser`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hub.cli._context import Progress, UsageError, _check_formats, _emit, _prepare, branch_stores
from hub.cli._signing import agents_trust_policy, signer_from_args

if TYPE_CHECKING:
    from datetime import datetime


def _render(args: argparse.Namespace) -> int:
    from agent.api import parse_time
    from hub.publish.flow import render

    progress = Progress(args.quiet)
    issued_at: datetime | None = None
    if args.issued_at:
        issued_at = parse_time(args.issued_at)
        if issued_at is None:
            raise UsageError(
                f"--issued-at: expected a time like 2026-11-22T22:00:00Z, got {args.issued_at!r}"
            )
    prepared = _prepare(args, progress)
    written = render(prepared, Path(args.out), issued_at=issued_at)
    source = prepared.source
    if args.output == "table":
        state = "" if source.committed else " (uncommitted files: digest of the fleet files)"
        print(
            f"rendered {len(written)} sets to {args.out} from {source.repo}@{source.commit}{state}"
        )
        for path in written:
            print(f"  {path}")
    else:
        _emit(
            {
                "sets": [str(p) for p in written],
                "source": {
                    "repo": source.repo,
                    "commit": source.commit,
                    "committed": source.committed,
                },
            },
            args.output,
        )
    return 0


def _publish(args: argparse.Namespace) -> int:
    from agent.report.logs import setup_logging
    from hub.api.metrics import HubMetrics
    from hub.publish.git import BranchStore
    from hub.publish.shards import ShardedStore
    from hub.rollout.controller import Controller

    setup_logging(level=args.log_level, format=args.log_format)
    progress = Progress(args.quiet, json_logs=args.log_format == "json")
    metrics = HubMetrics() if args.metrics_file else None
    started = time.perf_counter()
    try:
        signer, trust = signer_from_args(args)
        prepared = _prepare(args, progress)
        check = agents_trust_policy(prepared.fleet, trust)
        _check_formats(args, progress, prepared)
        with branch_stores(args, progress, prepared.fleet) as store:
            controller = Controller(
                sharded=ShardedStore.of(store) if isinstance(store, BranchStore) else store,
                check=check,
                progress=progress,
            )
            result = controller.publish(prepared, signer=signer, partial=bool(args.cluster))
            assert result.publication is not None
            report = result.publication
    except BaseException:
        if metrics is not None:
            metrics.published(time.perf_counter() - started, ok=False)
            _write_metrics(metrics, args.metrics_file)
        raise
    seconds = time.perf_counter() - started
    data = report.to_dict(bundles=len(prepared.fleet.bundles), references=prepared.references)
    if metrics is not None:
        metrics.published(seconds, ok=True, clusters=data["clusters"])
        _write_metrics(metrics, args.metrics_file)
    data["seconds"]["total"] = round(seconds, 3)
    data["source"] = {"repo": prepared.source.repo, "commit": prepared.source.commit}
    if prepared.commit is not None:
        data["source"]["signedBy"] = prepared.commit.signed_by()
    data["repo"] = args.repo or prepared.fleet.settings.shards.repo
    data["rollouts"] = [{"rollout": rid, **event.to_dict()} for rid, event in result.events]
    if args.output != "table":
        _emit(data, args.output)
        return 0
    counts = data["clusters"]
    print(
        f"{len(report.pushed)} cluster branches pushed to {data['repo']} in one publication"
        if report.pushed
        else f"nothing to publish: {data['repo']} is up to date"
    )
    print(
        "clusters: "
        + ", ".join(f"{counts[k]} {k}" for k in ("added", "changed", "refreshed", "unchanged"))
        + (f", {counts['orphaned']} orphaned (not in the fleet)" if counts["orphaned"] else "")
    )
    print(f"bundles: {data['bundles']}, references pinned: {data['references']}")
    if report.pushed:
        print(
            f"publication: {'signed (one Sigstore signing event)' if report.signed else 'UNSIGNED'}"
            f", statement sha256 {report.statement_sha256}, expires {data['expiresAt']}"
        )
    timing = ", ".join(f"{k} {v:.2f}" for k, v in data["seconds"].items() if k != "total")
    print(f"time: {seconds:.2f} s ({timing})")
    for rid, event in result.events:
        print(f"rollout {rid}: {event.action}: {event.message}")
    for c in data["changes"]:
        before = c["serialBefore"] if c["serialBefore"] is not None else "-"
        after = c["serialAfter"] if c["serialAfter"] is not None else "-"
        print(f"  {c['cluster']:<40} {c['status']:<10} serial {before} -> {after}")
    return 0


def _write_metrics(metrics: Any, path: str) -> None:
    try:
        metrics.write(Path(path))
    except OSError as exc:
        raise UsageError(f"--metrics-file {path}: {exc.strerror}") from exc
