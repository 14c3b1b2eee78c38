"""The bodies of ``hub shards`` (each cluster's shard and the repositories its agent is told)
and ``hub recipients`` (the age recipients the agents reported). Registered by
:mod:`hub.cli._parser`.
"""

from __future__ import annotations

import argparse
from typing import Any

from hub.cli._context import UsageError, _emit, _git_credentials


def _recipients(args: argparse.Namespace) -> int:
    from hub.facts import reported_facts
    from hub.fleet.shards import fleet_shards
    from hub.recipients import print_recipients, recipients

    def facts_of(fleet: Any, names: list[str]) -> dict[str, Any]:
        settings = fleet.settings.shards
        template = args.status_repo or settings.status_repo or args.repo or settings.repo
        if not template:
            raise UsageError("--status-repo is required (or shards.statusRepo in fleet.yaml)")
        shard_map = fleet_shards(fleet)
        urls = shard_map.urls(template)
        by_shard: dict[int, list[str]] = {}
        for name in names:
            by_shard.setdefault(shard_map.shard_of(name), []).append(name)
        out: dict[str, Any] = {}
        for shard, chosen in sorted(by_shard.items()):
            out.update(
                reported_facts(url=urls[shard], clusters=chosen, credentials=_git_credentials())
            )
        return out

    found = recipients(args.fleet_dir, selector=args.selector, facts_of=facts_of)
    print_recipients(found, args.output)
    return 0


def _shards(args: argparse.Namespace) -> int:
    """Each cluster's shard and the repositories its agent is told (``--repo``,
    ``--status-repo`` of ``fleetlet agent run``)."""
    from hub.fleet.load import load_fleet
    from hub.fleet.shards import fleet_shards, shard_url

    fleet = load_fleet(args.fleet_dir)
    shard_map = fleet_shards(fleet)
    repo = args.repo or fleet.settings.shards.repo
    status = args.status_repo or fleet.settings.shards.status_repo or repo
    wanted = set(args.cluster or shard_map.assignment)
    unknown = sorted(wanted - set(shard_map.assignment))
    if unknown:
        raise UsageError(f"--cluster: not a cluster of the fleet: {', '.join(unknown)}")
    rows = [
        {
            "cluster": name,
            "shard": shard_map.shard_of(name),
            "repo": shard_url(repo, shard_map.shard_of(name)) if repo else None,
            "statusRepo": shard_url(status, shard_map.shard_of(name)) if status else None,
        }
        for name in sorted(wanted)
    ]
    if args.output != "table":
        _emit({"shards": shard_map.count, "clusters": rows}, args.output)
        return 0
    print(f"{'CLUSTER':<40} {'SHARD':>5}  REPO")
    for row in rows:
        print(f"{row['cluster']:<40} {row['shard']:>5}  {row['repo'] or '-'}")
    return 0
