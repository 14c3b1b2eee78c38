"""The body of ``hub diff``: what each cluster branch would receive (with ``--cluster``, the
object preview, rendered with the facts its agent reported), or with ``--base/--head`` the
review of two revisions of the fleet repo (:mod:`hub.review`). Registered by
:mod:`hub.cli._parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hub.cli._context import (
    Progress,
    UsageError,
    _emit,
    _git_credentials,
    _prepare,
    _registry_credentials,
    branch_stores,
)


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    if value is None:
        text = "(unset)"
    return text if len(text) <= 60 else text[:57] + "..."


def _diff(args: argparse.Namespace) -> int:
    from agent.render.tools import ToolSettings
    from hub.publish.flow import diff
    from hub.serve import default_cache_dir

    progress = Progress(args.quiet)
    if args.base or args.head:
        return _review(args, progress)
    if args.output == "markdown":
        raise UsageError("-o markdown: only with --base and --head (a pull request's diff)")
    prepared = _prepare(args, progress)
    repo = args.repo or prepared.fleet.settings.shards.repo
    progress(f"fetching cluster branches from {repo}")
    previews: dict[str, Any] = {}
    with branch_stores(args, progress, prepared.fleet) as store:
        diffs = diff(prepared, store)
        if args.cluster and not args.no_preview:
            from hub.preview import preview_clusters

            cache = Path(args.cache_dir) / "preview" if args.cache_dir else None
            previews = preview_clusters(
                prepared,
                store,
                diffs,
                clusters=args.cluster,
                cache_dir=cache or default_cache_dir(repo) / "preview",
                tools=ToolSettings.from_env(),
                facts=_reported_facts(args, progress, prepared, args.cluster),
                progress=progress,
            )
    verdict = prepared.commit
    if args.output != "table":
        clusters = []
        for d in diffs:
            item = d.to_dict()
            if d.cluster in previews:
                item["preview"] = previews[d.cluster].to_dict()
            clusters.append(item)
        data: dict[str, Any] = {"clusters": clusters}
        if verdict is not None:
            data["commit"] = _verdict_dict(verdict)
        _emit(data, args.output)
        return 0
    if verdict is not None:
        print(
            f"fleet commit {verdict.commit}: {verdict.reason}"
            if verdict.ok
            else f"fleet commit: {verdict.refusal()}: hub publish would refuse it"
        )
    for line in prepared.signatures.refusals() if prepared.signatures is not None else ():
        print(f"source: {line}: hub publish would refuse it")
    for d in diffs:
        serial = f" (serial {d.serial_before})" if d.serial_before is not None else ""
        print(f"{d.cluster}: {d.status}{serial}")
        for b in d.bundles:
            mark = {"added": "+", "removed": "-", "changed": "~"}[b.change]
            print(f"  {mark} {b.name}")
            for path, before, after in b.fields:
                print(f"      {path}: {_short(before)} -> {_short(after)}")
        if d.groups_before != d.groups_after:
            print(
                f"  groups: {', '.join(d.groups_before) or '(none)'} -> "
                f"{', '.join(d.groups_after) or '(none)'}"
            )
        if d.cluster in previews:
            _print_preview(previews[d.cluster])
    return 0


def _verdict_dict(verdict: Any) -> dict[str, Any]:
    return {
        "commit": verdict.commit,
        "signed": verdict.ok,
        "signedBy": verdict.signed_by(),
        "reason": verdict.reason,
        "policy": verdict.policy,
        "wanted": verdict.wanted,
    }


def _review(args: argparse.Namespace, progress: Progress) -> int:
    """``hub diff --base REV --head REV``: the fleet at two revisions of its repository."""
    from hub.review import markdown, review

    if not (args.base and args.head):
        raise UsageError("--base and --head go together (two revisions of the fleet repo)")
    if args.cluster or args.repo or args.status_repo:
        raise UsageError(
            "--base/--head compare two revisions of the fleet repo: --cluster, --repo and "
            "--status-repo do not apply"
        )
    result = review(
        args.fleet_dir,
        base=args.base,
        head=args.head,
        render=not args.no_preview,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
        registry_credentials=_registry_credentials(args.registry_config),
        progress=progress,
    )
    if args.output in ("json", "yaml"):
        _emit(result.to_dict(), args.output)
    else:
        print(markdown(result), end="")
    return 0


def _reported_facts(
    args: argparse.Namespace, progress: Progress, prepared: Any, clusters: list[str]
) -> dict[str, Any]:
    """The cluster facts the agents of ``clusters`` reported, read from their status branches
    (``--status-repo``, else ``shards.statusRepo``, else the cluster-branch repositories).
    A repository that cannot be read is warned about: those clusters render without facts."""
    from hub.errors import GitTransportError
    from hub.facts import reported_facts

    settings = prepared.fleet.settings.shards
    template = args.status_repo or settings.status_repo or args.repo or settings.repo
    urls = prepared.shard_map.urls(template)
    by_shard: dict[int, list[str]] = {}
    for name in clusters:
        if name in prepared.shard_map.assignment:
            by_shard.setdefault(prepared.shard_map.shard_of(name), []).append(name)
    out: dict[str, Any] = {}
    for shard, names in sorted(by_shard.items()):
        progress(f"reading the cluster facts of {', '.join(names)} from {urls[shard]}")
        try:
            out.update(
                reported_facts(url=urls[shard], clusters=names, credentials=_git_credentials())
            )
        except GitTransportError as exc:
            # The preview still runs; its notes say which clusters were rendered without facts.
            print(f"warning: cluster facts not read: {exc}", file=sys.stderr)
    return out


def _print_preview(preview: Any) -> None:
    """A cluster's previews, group by group, as an approval request shows them."""
    from agent.approve.command import preview_lines

    for note in preview.notes:
        print(f"  note: {note}")
    for group in preview.groups:
        print(f"  group {group.group} (as an approval request would preview it):")
        for line in preview_lines(group.preview):
            print(f"    {line}")
        for change in group.preview.objects:
            if change.diff:
                name = f"{change.bundle}: {change.target}"
                text = group.full_diffs.get(name) or change.diff
                print(f"    === {name}")
                for line in text.rstrip("\n").splitlines():
                    print(f"    {line}")
