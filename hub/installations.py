"""``fleetlet installations list | show | runs list | outputs list``: Porter-style, two sources.

With ``--hub URL`` the data comes from the hub API (bearer token from ``--token-file`` or
``$FLEETLET_HUB_TOKEN``); with ``--repo GIT_URL`` it is aggregated here from the status
branches (:class:`~hub.status.FleetStatus`), so an operator sees the fleet without a hub. Both
produce the same documents; tables by default, ``-o json|yaml`` for the documents themselves.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import PermanentError, TemporaryError
from agent.output import render
from agent.output import table as columns

# The status code (git, the aggregate, the hub's server helpers) is imported by the commands
# that read a repository, and urllib.request (http.client, email, ssl: about 20 ms) by those
# that ask a hub, when they run: ``fleetlet --help`` never loads them.

TOKEN_ENV = "FLEETLET_HUB_TOKEN"
API_PREFIX = "/api/v1"  # hub.api.openapi.API_PREFIX, without importing the API modules
PAGE = "500"  # hub.status.queries.MAX_PAGE: installations asked of the hub at a time


class InstallationsError(PermanentError):
    """The request cannot be answered: unknown installation or run, bad arguments, 4xx."""


class HubUnavailableError(TemporaryError):
    """The hub did not answer (connection refused, timeout, 5xx)."""


Fetch = Callable[[str, dict[str, str]], dict[str, Any]]


def _split(installation: str) -> tuple[str, str]:
    cluster, sep, bundle = installation.partition("/")
    if not sep or not cluster or not bundle or "/" in bundle:
        raise InstallationsError(f"installation must be CLUSTER/BUNDLE, got {installation!r}")
    return cluster, bundle


def _hub_fetch(args: argparse.Namespace) -> Fetch:
    import urllib.error
    import urllib.parse
    import urllib.request

    token = None
    token_file = getattr(args, "token_file", None)
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise InstallationsError(f"token file {token_file}: {exc}") from exc
    token = token or os.environ.get(TOKEN_ENV)
    base = str(args.hub).rstrip("/")

    def fetch(path: str, query: dict[str, str]) -> dict[str, Any]:
        quoted = "/".join(urllib.parse.quote(part, safe="") for part in path.split("/"))
        url = f"{base}{API_PREFIX}{quoted}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except ValueError:
                message = exc.reason
            if exc.code >= 500:
                raise HubUnavailableError(f"hub {base}: {exc.code} {message}") from exc
            if exc.code == 401:
                how = (
                    "the token given was refused (is it in the hub's --tokens file?)"
                    if token
                    else f"give a token of the hub's --tokens file with --token-file FILE "
                    f"or ${TOKEN_ENV}"
                )
                raise InstallationsError(f"hub {base}: {exc.code} {message}: {how}") from exc
            raise InstallationsError(f"hub {base}: {exc.code} {message}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise HubUnavailableError(
                f"hub {base} did not answer ({reason}): is `fleetlet hub serve` running there?"
            ) from exc

    return fetch


def _repo_fetch(args: argparse.Namespace) -> Fetch:
    from hub.serve import default_cache_dir, git_credentials, parse_duration
    from hub.status.aggregate import FleetStatus
    from hub.status.queries import QueryError, StatusQueries, load_private_key, sealed_opener

    cache = getattr(args, "cache_dir", None)
    # The per-user cache by default: the next command fetches only what moved meanwhile.
    cache_dir = Path(cache) if cache else default_cache_dir(args.repo)
    status = FleetStatus(
        repo_url=args.repo,
        credentials=git_credentials(),
        cache_dir=cache_dir,
        stale_after=parse_duration(getattr(args, "stale_after", None) or "5m"),
    )
    status.refresh()
    key_file = getattr(args, "hub_key", None)
    opener = sealed_opener(load_private_key(Path(key_file))) if key_file else None
    queries = StatusQueries(status, opener=opener)
    admin = opener is not None

    def fetch(path: str, query: dict[str, str]) -> dict[str, Any]:
        parts = path.strip("/").split("/")
        try:
            if parts[0] == "explain":
                from hub.explain import answer

                rollouts, published = _cluster_repo_readers(args)
                return answer(queries, parts[1], query.get("bundle"), rollouts, published)
            if parts == ["installations"]:
                return queries.installations(
                    cluster=query.get("cluster"),
                    bundle=query.get("bundle"),
                    state=query.get("state"),
                )
            if len(parts) == 3:
                return queries.installation(parts[1], parts[2], admin=admin)
            if len(parts) == 4:
                return queries.runs(parts[1], parts[2], admin=admin)
            return queries.outputs(parts[1], parts[2], parts[4], admin=admin)
        except QueryError as exc:
            raise InstallationsError(f"{args.repo}: {exc.message}") from exc

    return fetch


def _cluster_repo_readers(
    args: argparse.Namespace,
) -> tuple[Callable[[], Any] | None, Callable[[str], Any] | None]:
    """Readers of ``--cluster-repo``: the rollout state (in shard 0's repository, where it
    lives) and what a cluster's branch carries (a repository of one shard only: with
    ``{shard}`` the cluster's shard is not known here); (None, None) without one."""
    template = getattr(args, "cluster_repo", None)
    if not template:
        return None, None
    from hub.explain import Published
    from hub.publish.git import BranchStore
    from hub.rollout.state import RolloutStore
    from hub.serve import default_cache_dir, git_credentials

    url = template.replace("{shard}", "0")
    cache = Path(args.cache_dir) if getattr(args, "cache_dir", None) else default_cache_dir(url)
    store = BranchStore(url=url, cache_dir=cache / "rollouts.git", credentials=git_credentials())

    def published(cluster: str) -> Published | None:
        if cluster not in store.list():
            return None
        store.ensure([cluster])
        facts = store.facts(cluster)
        if facts is None:
            return None
        return Published(serial=facts.serial, expires_at=facts.expires_at, repo=url)

    return RolloutStore(store).read, (None if "{shard}" in template else published)


def _source(args: argparse.Namespace) -> Fetch:
    hub, repo = getattr(args, "hub", None), getattr(args, "repo", None)
    if bool(hub) == bool(repo):
        raise InstallationsError(
            "give exactly one of --hub URL (a running `fleetlet hub serve`, with --token-file) "
            "or --repo GIT_URL (the status repository, read directly)"
        )
    return _hub_fetch(args) if hub else _repo_fetch(args)


def _print(data: dict[str, Any], output: str, table: Callable[[dict[str, Any]], str]) -> int:
    print(render(data, output, table=table))
    return 0


def installations_list(args: argparse.Namespace) -> int:
    """Handler of ``installations list [--cluster C] [--bundle B] [--state S]``."""
    query = {
        k: str(v)
        for k in ("cluster", "bundle", "state")
        if (v := getattr(args, k, None)) is not None
    }
    fetch = _source(args)
    data = fetch("/installations", {**query, "limit": PAGE})
    items = list(data["items"])
    # The hub answers a page at a time (``total`` says how many there are): read them all.
    while "total" in data and data["items"] and len(items) < data["total"]:
        data = fetch("/installations", {**query, "offset": str(len(items)), "limit": PAGE})
        items += data["items"]
    data = {"items": items}

    def table(d: dict[str, Any]) -> str:
        rows = [
            (
                i["name"],
                i.get("group"),
                i["state"],
                i.get("appliedSerial"),
                (i.get("lastRun") or {}).get("id"),
                (i.get("lastRun") or {}).get("result"),
                i.get("notifyChannel") or "poll only",
            )
            for i in d["items"]
        ]
        return columns(
            rows, ["INSTALLATION", "GROUP", "STATE", "SERIAL", "LAST RUN", "RESULT", "CHANNEL"]
        )

    return _print(data, args.output, table)


def installations_show(args: argparse.Namespace) -> int:
    """Handler of ``installations show CLUSTER/BUNDLE``."""
    cluster, bundle = _split(args.installation)
    data = _source(args)(f"/installations/{cluster}/{bundle}", {})

    def table(d: dict[str, Any]) -> str:
        health = d.get("health") or {}
        lines = [
            f"Installation:   {d['name']}",
            f"Group:          {d.get('group') or '-'}",
            f"State:          {d['state']}",
            f"Applied serial: {d.get('appliedSerial') or '-'}",
            f"Health:         {health.get('status', '-')} {health.get('message', '')}".rstrip(),
            f"Drift count:    {d.get('driftCount', 0)}",
            "",
            columns(
                [
                    (c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                    for c in d.get("conditions", [])
                ],
                ["CONDITION", "STATUS", "REASON", "MESSAGE"],
            ),
            "",
            _runs_table(d.get("runs", [])),
        ]
        if d.get("requests"):
            lines += ["", _requests_table(d["requests"])]
        return "\n".join(lines)

    return _print(data, args.output, table)


def _requests_table(requests: list[dict[str, Any]]) -> str:
    """The group's approval requests: what each would do and who decided it."""
    rows = []
    for r in requests:
        p = r.get("preview") or {}
        rows.append(
            (
                r.get("name"),
                r.get("serial"),
                r.get("state"),
                f"{p.get('created', 0)}/{p.get('changed', 0)}/{p.get('deleted', 0)}",
                p.get("findings", 0),
                r.get("decidedBy"),
                r.get("decidedAt"),
                r.get("reason"),
            )
        )
    return columns(
        rows,
        ["REQUEST", "SERIAL", "STATE", "CREATED/CHANGED/DELETED", "FINDINGS", "BY", "AT", "REASON"],
    )


def _runs_table(runs: list[dict[str, Any]]) -> str:
    rows = [
        (
            r["id"],
            r.get("operation"),
            r.get("serial"),
            r.get("result"),
            r.get("startedAt"),
            r.get("finishedAt"),
            r.get("failedObject"),
        )
        for r in runs
    ]
    return columns(rows, ["RUN", "OPERATION", "SERIAL", "RESULT", "STARTED", "FINISHED", "FAILED"])


def runs_list(args: argparse.Namespace) -> int:
    """Handler of ``installations runs list CLUSTER/BUNDLE``."""
    cluster, bundle = _split(args.installation)
    data = _source(args)(f"/installations/{cluster}/{bundle}/runs", {})
    return _print(data, args.output, lambda d: _runs_table(d["items"]))


def outputs_list(args: argparse.Namespace) -> int:
    """Handler of ``installations outputs list CLUSTER/BUNDLE [--run ID|latest]``."""
    cluster, bundle = _split(args.installation)
    run = getattr(args, "run", None) or "latest"
    data = _source(args)(f"/installations/{cluster}/{bundle}/runs/{run}/outputs", {})

    def table(d: dict[str, Any]) -> str:
        rows = [
            (
                o["name"],
                "<omitted>" if o.get("omitted") else o["value"],
                o["sensitive"],
                o.get("sealedBy", ""),
            )
            for o in d["items"]
        ]
        return f"Run: {d['run']} ({d.get('result')})\n" + columns(
            rows, ["NAME", "VALUE", "SENSITIVE", "SEALED BY"]
        )

    return _print(data, args.output, table)


def explain(args: argparse.Namespace) -> int:
    """Handler of ``explain CLUSTER [BUNDLE]``: why it is not running the latest."""
    from hub.explain import lines

    if getattr(args, "hub", None) and getattr(args, "cluster_repo", None):
        raise InstallationsError(
            "--cluster-repo goes with --repo: a hub reads the rollouts of its own --fleet"
        )
    query = {"bundle": args.bundle} if args.bundle else {}
    data = _source(args)(f"/explain/{args.cluster}", query)
    return _print(data, args.output, lambda d: "\n".join(lines(d)))


def register_explain(sub: Any) -> None:
    """``fleetlet explain CLUSTER [BUNDLE]``."""
    from agent.options import add_output_option

    p = sub.add_parser(
        "explain",
        help="why a cluster (or one of its bundles) is not running the latest",
        description="Read across the rollout (waves, paused, halted), the approval request, "
        "dependsOn, the group's last failure and the agent's staleness, and say the first "
        "thing that blocks in one line, with the details and the command that would unblock "
        "it beneath (docs/operations.md). From the hub API (--hub) or the status repository "
        "(--repo; --cluster-repo adds the rollouts).",
    )
    p.add_argument("cluster", metavar="CLUSTER")
    p.add_argument("bundle", metavar="BUNDLE", nargs="?", help="only this bundle and its group")
    p.add_argument("--hub", metavar="URL")
    p.add_argument("--repo", metavar="GIT_URL", help="the status repository, read directly")
    p.add_argument(
        "--cluster-repo",
        metavar="GIT_URL",
        help="with --repo: the cluster-branch repository (shard 0 of a template with {shard}), "
        "where the rollout state lives",
    )
    add_output_option(p)
    add_source_arguments(p)
    p.set_defaults(handler=explain)


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every ``installations`` command takes besides ``--hub/--repo/-o``."""
    parser.add_argument("--token-file", metavar="FILE", help=f"hub bearer token (or ${TOKEN_ENV})")
    parser.add_argument(
        "--cache-dir", metavar="DIR", help="status cache for --repo (default: per user)"
    )
    parser.add_argument(
        "--hub-key", metavar="FILE", help="with --repo: the hub's private key, opens sealed outputs"
    )
    parser.add_argument(
        "--stale-after", default="5m", metavar="DURATION", help="with --repo: Stale after (5m)"
    )
