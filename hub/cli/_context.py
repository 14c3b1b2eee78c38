"""What every ``hub`` command starts from: the environment variables it reads, its usage error,
its progress lines, the fleet prepared for publishing and the credentials of its git and
registry servers. Called by the command bodies of :mod:`hub.cli` and by
:mod:`hub.rollout.command` (through :mod:`hub.cli`). Cheap to import, as the command tree
imports it: :mod:`logging` and :mod:`base64` are imported where they are used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agent.errors import PermanentError
from agent.output import render as render_output

TOKEN_ENV = "SIGSTORE_ID_TOKEN"
TRUST_CONFIG_ENV = "FLEETLET_TRUST_CONFIG"
COMMIT_POLICY_ENV = "FLEETLET_COMMIT_POLICY"
GIT_USERNAME_ENV = "FLEETLET_GIT_USERNAME"
GIT_PASSWORD_ENV = "FLEETLET_GIT_PASSWORD"


class UsageError(PermanentError):
    """A command line that cannot work (missing token, bad time...)."""


class Progress:
    """Progress lines on stderr, stamped with the seconds since the command started; log
    records instead (``hub.progress``, level info) when the command logs JSON."""

    def __init__(self, quiet: bool, *, json_logs: bool = False) -> None:
        self.quiet = quiet
        self.json_logs = json_logs
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.started
        if self.json_logs:
            import logging

            logging.getLogger("hub.progress").info(message, extra={"elapsed": round(elapsed, 3)})
        else:
            print(f"[{elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def _emit(data: Any, output: str) -> None:
    """``-o json|yaml`` (the table of each command is printed by the command itself)."""
    print(render_output(data, output, table=str))


def _git_credentials() -> tuple[str, str] | None:
    from agent.report.logs import mask

    user, password = os.environ.get(GIT_USERNAME_ENV), os.environ.get(GIT_PASSWORD_ENV)
    mask(password)
    return (user, password) if user and password else None


def branch_stores(args: argparse.Namespace, progress: Progress, fleet: Any) -> Any:
    """The fleet's cluster-branch repositories: ``--repo`` (a template with ``{shard}`` for
    a sharded fleet), else ``shards.repo`` of fleet.yaml. Raises UsageError, FleetRepoError."""
    from hub.fleet.shards import fleet_shards
    from hub.publish.git import BranchStore
    from hub.publish.shards import ShardedStore

    template = args.repo or fleet.settings.shards.repo
    if not template:
        raise UsageError("--repo is required (or shards.repo in fleet.yaml)")
    cache = Path(args.cache_dir) if args.cache_dir else None
    shard_map = fleet_shards(fleet)
    if shard_map.count == 1 and "{shard}" not in template:
        return BranchStore(
            url=template, cache_dir=cache, credentials=_git_credentials(), progress=progress
        )
    return ShardedStore(
        urls=shard_map.urls(template),
        cache_dir=cache,
        credentials=_git_credentials(),
        progress=progress,
    )


def _check_formats(args: argparse.Namespace, progress: Progress, prepared: Any) -> None:
    """Refuse to publish a format an agent did not report it renders, reading each shard's
    status branches (``--status-repo``, else ``shards.statusRepo``, else the cluster-branch
    repositories). Raises FormatsUnavailableError, UsageError."""
    from hub.publish.formats import check_formats

    settings = prepared.fleet.settings.shards
    template = args.status_repo or settings.status_repo or args.repo or settings.repo
    if not template:
        raise UsageError("--repo is required (or shards.repo in fleet.yaml)")
    members = prepared.shard_map.members()
    for shard, url in prepared.shard_map.urls(template).items():
        wanted = set(members[shard])
        check_formats(
            {name: plan for name, plan in prepared.plans.items() if name in wanted},
            status_url=url,
            credentials=_git_credentials(),
            force=args.force,
            progress=progress,
        )


def _registry_credentials(path: str | None) -> dict[str, tuple[str, str]] | None:
    """host -> (user, password) from a docker config JSON. Raises UsageError."""
    import base64

    from agent.report.logs import mask

    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        out: dict[str, tuple[str, str]] = {}
        for key, entry in data["auths"].items():
            host = str(key).removeprefix("https://").removeprefix("http://").split("/")[0]
            if entry.get("auth"):
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            else:
                user, password = entry["username"], entry["password"]
            mask(password)
            out[host] = (user, password)
    except OSError as exc:
        raise UsageError(f"--registry-config {path}: {exc.strerror}") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"--registry-config {path}: not a docker config JSON with auths ({exc})"
        ) from exc
    return out


def _prepare(args: argparse.Namespace, progress: Progress) -> Any:
    from hub.publish.flow import prepare

    progress(f"loading fleet {args.fleet_dir}")
    cache = getattr(args, "cache_dir", None)
    policy_file = getattr(args, "commit_policy", None)
    commit_policy = None
    if policy_file:
        from hub.fleet.commits import load_commit_policy

        commit_policy = load_commit_policy(Path(policy_file))
    prepared = prepare(
        args.fleet_dir,
        only=args.cluster or None,
        registry_credentials=_registry_credentials(args.registry_config),
        progress=progress,
        # Parsed fleet files are kept with the git cache: an unchanged inventory is not
        # parsed again.
        cache_dir=Path(cache) / "fleet-files" if cache else None,
        commit_policy=commit_policy,
        # Sources whose signatures passed are not read again (hub/resolve/signatures.py).
        signature_cache=Path(cache) / "signatures" if cache else None,
    )
    if prepared.commit is not None:
        verdict = prepared.commit
        progress(
            f"fleet commit {verdict.commit[:12]}: {verdict.reason}"
            if verdict.ok
            else f"fleet commit {verdict.commit[:12]} REFUSED by the commit policy: {verdict.reason}"
        )
    if not prepared.source.committed:
        progress(
            "note: the fleet directory is not a clean git checkout; source.commit is a digest "
            f"of its files ({prepared.source.commit})"
        )
    progress(
        f"planned {len(prepared.plans)} clusters, {len(prepared.fleet.bundles)} bundles, "
        f"{prepared.references} references pinned"
    )
    return prepared
