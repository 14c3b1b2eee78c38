"""``fleetlet hub rollout list | status | promote | pause | resume | abort | step``.

The reads and actions have two sources, like ``fleetlet installations``: ``--hub URL`` (the
hub API; the actor of an action is the name of the token, which the hub authenticates), or
``--repo GIT_URL`` / ``--fleet FLEET_DIR`` (the rollout state in git, shard 0's repository;
the actor is ``--actor``, default the local user: the git server's access control is what
stands behind it). ``status`` judges each cluster from the agents' reports with the hub's
view, or with ``--status-repo`` in git mode. ``step`` is one controller step (judge, advance,
publish), for CI or cron when no ``hub serve`` runs the controller.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.parse
from pathlib import Path
from typing import Any

from agent.errors import PermanentError, TemporaryError
from agent.options import add_output_option
from agent.output import render
from hub.rollout.names import ACTIONS, VERDICTS

TOKEN_ENV = "FLEETLET_HUB_TOKEN"
API_PREFIX = "/api/v1"


class RolloutCommandError(PermanentError):
    """A rollout command that cannot be answered (bad arguments, unknown rollout, 4xx)."""


class HubUnavailableError(TemporaryError):
    """The hub did not answer (connection refused, timeout, 5xx)."""


# --- sources --------------------------------------------------------------------------------


def _hub_call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    # Here, not at the top: http.client, email and ssl (about 20 ms) are not loaded to build
    # the command line's parser.
    import urllib.error
    import urllib.request

    token = None
    if getattr(args, "token_file", None):
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            raise RolloutCommandError(f"--token-file {args.token_file}: {exc.strerror}") from exc
    token = token or os.environ.get(TOKEN_ENV)
    base = str(args.hub).rstrip("/")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + API_PREFIX + path,
        data=data,
        method=method,
        headers={"Accept": "application/json", "Content-Type": "application/json"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        if exc.code >= 500:
            raise HubUnavailableError(f"hub {base}: {exc.code} {message}") from exc
        raise RolloutCommandError(f"hub {base}: {exc.code} {message}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HubUnavailableError(f"hub {base} did not answer: {exc}") from exc


def _git_controller(args: argparse.Namespace, *, judge: bool) -> Any:
    """A controller over shard 0 (and the status repositories when ``judge`` and given).

    Raises RolloutCommandError, FleetRepoError.
    """
    from hub.fleet.load import load_fleet
    from hub.publish.git import BranchStore
    from hub.publish.shards import ShardedStore
    from hub.rollout.controller import Controller
    from hub.serve import default_cache_dir, git_credentials, parse_duration
    from hub.status.aggregate import FleetStatus

    fleet = load_fleet(args.fleet) if getattr(args, "fleet", None) else None
    template = args.repo or (fleet.settings.shards.repo if fleet is not None else None)
    if not template:
        raise RolloutCommandError("give --hub URL, or --repo GIT_URL (or --fleet FLEET_DIR)")
    url = template.replace("{shard}", "0")
    cache = Path(args.cache_dir) if getattr(args, "cache_dir", None) else default_cache_dir(url)
    store = BranchStore(url=url, cache_dir=cache / "rollouts.git", credentials=git_credentials())
    status = None
    status_template = getattr(args, "status_repo", None) or (
        fleet.settings.shards.status_repo if fleet is not None else None
    )
    if judge and status_template:
        count = fleet.settings.shards.count if fleet is not None else 1
        urls = [status_template.replace("{shard}", str(i)) for i in range(count)]
        status = FleetStatus(
            repo_url=urls,
            credentials=git_credentials(),
            cache_dir=cache / "status",
            stale_after=parse_duration(getattr(args, "stale_after", None) or "5m"),
        )
        status.refresh()
    return Controller(sharded=ShardedStore.of(store), status=status)


def _source_check(args: argparse.Namespace) -> None:
    hub = getattr(args, "hub", None)
    git = getattr(args, "repo", None) or getattr(args, "fleet", None)
    if bool(hub) == bool(git):
        raise RolloutCommandError("give exactly one of --hub URL or --repo GIT_URL / --fleet DIR")


# --- list and status ------------------------------------------------------------------------


def rollouts_list(args: argparse.Namespace) -> int:
    _source_check(args)
    if args.hub:
        data = _hub_call(args, "GET", "/rollouts")
    else:
        from hub.rollout.report import summary

        controller = _git_controller(args, judge=True)
        state = controller.read()
        judged = controller.judge(state)
        data = {
            "items": [summary(r, judged.get(r.id)) for r in reversed(list(state.rollouts.values()))]
        }
    print(render(data, args.output, table=_list_table))
    return 0


def rollout_status(args: argparse.Namespace) -> int:
    _source_check(args)
    page = {"offset": args.offset, "limit": args.limit}
    if args.wave:
        page["wave"] = args.wave
    if args.verdict:
        page["verdict"] = args.verdict
    if args.hub:
        query = urllib.parse.urlencode(page)
        data = _hub_call(args, "GET", f"/rollouts/{urllib.parse.quote(args.rollout)}?{query}")
    else:
        from hub.rollout.report import detail

        controller = _git_controller(args, judge=True)
        state = controller.read()
        rollout = state.rollouts.get(args.rollout)
        if rollout is None:
            raise RolloutCommandError(
                f"no rollout {args.rollout!r} (see fleetlet hub rollout list)"
            )
        data = detail(rollout, controller.judge(state).get(rollout.id), **page)
    print(render(data, args.output, table=_status_table))
    return 0


def rollout_action(args: argparse.Namespace) -> int:
    _source_check(args)
    action = args.rollout_command
    if args.hub:
        path = f"/rollouts/{urllib.parse.quote(args.rollout)}/{action}"
        data = _hub_call(args, "POST", path, {"reason": args.reason or ""})
    else:
        import getpass

        from hub.rollout.report import summary

        controller = _git_controller(args, judge=False)
        actor = args.actor or getpass.getuser()
        rollout = controller.act(args.rollout, action, actor=actor, reason=args.reason or "")
        data = {"rollout": summary(rollout, None), "event": rollout.events[-1].to_dict()}
    print(render(data, args.output, table=_action_table))
    return 0


# --- step -----------------------------------------------------------------------------------


def rollout_step(args: argparse.Namespace) -> int:
    """One controller step with the fleet at FLEET_DIR (settings and cluster names only)."""
    from hub import cli as edge
    from hub.fleet.load import load_fleet
    from hub.publish.git import BranchStore
    from hub.publish.shards import ShardedStore
    from hub.rollout.controller import Controller
    from hub.rollout.report import summary
    from hub.serve import default_cache_dir, git_credentials, parse_duration
    from hub.status.aggregate import FleetStatus

    progress = edge.Progress(args.quiet)
    fleet = load_fleet(args.fleet_dir)
    signer, trust = edge.signer_from_args(args)
    settings = fleet.settings.shards
    template = args.status_repo or settings.status_repo
    if not template:
        raise RolloutCommandError(
            "--status-repo is required (or shards.statusRepo in fleet.yaml): the step reads "
            "what the agents report"
        )
    urls = [template.replace("{shard}", str(i)) for i in range(settings.count)]
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir(" ".join(urls))
    status = FleetStatus(
        repo_url=urls,
        credentials=git_credentials(),
        cache_dir=cache / "status",
        stale_after=parse_duration(args.stale_after),
    )
    branches = argparse.Namespace(**{**vars(args), "cache_dir": str(cache / "branches")})
    with edge.branch_stores(branches, progress, fleet) as store:
        controller = Controller(
            sharded=ShardedStore.of(store) if isinstance(store, BranchStore) else store,
            status=status,
            check=edge.agents_trust_policy(fleet, trust),
            progress=progress,
        )
        report = controller.step(fleet, signer=signer)
    publication = report.publication
    data = {
        "events": [{"rollout": rid, **e.to_dict()} for rid, e in report.events],
        "publication": publication.publication if publication else None,
        "pushed": len(publication.pushed) if publication else 0,
        "rollouts": [summary(r, None) for r in report.rollouts],
    }
    print(render(data, args.output, table=_step_table))
    return 0


# --- tables ---------------------------------------------------------------------------------


def _columns(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "-"


def _list_table(data: Any) -> str:
    rows: list[tuple[str, ...]] = [
        ("ID", "GROUP", "STATUS", "WAVE", "CLUSTERS", "FAILED", "CLUSTERS BY STATE")
    ]
    for item in data["items"]:
        failures = item["failures"]
        failed = (
            f"{failures['count'] if failures['count'] is not None else '?'}/{failures['budget']}"
        )
        rows.append(
            (
                item["id"],
                item["group"],
                item["status"],
                item["currentWave"] or "-",
                str(item["clusters"]),
                failed,
                _counts_text(item["counts"]),
            )
        )
    if len(rows) == 1:
        return "no rollouts"
    return _columns(rows)


def _status_table(data: Any) -> str:
    lines = [
        f"rollout {data['id']}: {data['status']} (group {data['group']}, created by "
        f"{data['createdBy']} at {data['createdAt']}, from {data['source']['repo']}@"
        f"{data['source']['commit'][:12]})"
    ]
    s = data["strategy"]
    lines.append(
        f"strategy: maxUnavailable {s['maxUnavailable']}, maxFailures {s['maxFailures']} "
        f"(budget {data['failures']['budget']}), soakTime {s['soakTime']}, progressDeadline "
        f"{s['progressDeadline']}, onFailure {s['onFailure']}"
    )
    if data.get("halt"):
        halt = data["halt"]
        lines.append(f"halted at {halt['at']}: {halt['reason']}")
        for cluster, reason in list(halt["failures"].items())[:20]:
            lines.append(f"  {cluster}: {reason}")
    rows: list[tuple[str, ...]] = [("WAVE", "GATE", "STARTED", "SETTLED", "CLUSTERS", "BY STATE")]
    for wave in data["waves"]:
        gate = "-"
        if wave["pauseBefore"]:
            gate = f"promoted by {wave['promotedBy']}" if wave["promotedBy"] else "pauseBefore"
        rows.append(
            (
                wave["name"],
                gate,
                wave["startedAt"] or "-",
                wave["settledAt"] or "-",
                str(wave["clusters"]),
                _counts_text(wave["counts"]),
            )
        )
    lines += ["", _columns(rows), "", "events:"]
    for event in data["events"][-20:]:
        wave = f" [{event['wave']}]" if event.get("wave") else ""
        lines.append(f"  {event['at']}  {event['by']}  {event['action']}{wave}: {event['message']}")
    members = data["members"]
    if members["items"]:
        shown = f"{members['offset'] + 1}-{members['offset'] + len(members['items'])}"
        lines += ["", f"clusters ({shown} of {members['total']}):"]
        rows = [("CLUSTER", "WAVE", "PHASE", "SERIAL", "VERDICT", "REASON")]
        for m in members["items"]:
            rows.append(
                (
                    m["cluster"],
                    m["wave"],
                    m["phase"],
                    str(m["serial"] or "-"),
                    m["verdict"] or "-",
                    m["reason"][:100],
                )
            )
        lines.append(_columns(rows))
    return "\n".join(lines)


def _action_table(data: Any) -> str:
    event = data["event"]
    rollout = data["rollout"]
    return f"rollout {rollout['id']}: {event['action']} by {event['by']}: {event['message']} (now {rollout['status']})"


def _step_table(data: Any) -> str:
    lines = [f"rollout {e['rollout']}: {e['action']}: {e['message']}" for e in data["events"]]
    if data["publication"]:
        lines.append(
            f"published {data['pushed']} cluster branches (publication {data['publication']})"
        )
    else:
        lines.append("nothing to publish")
    for item in data["rollouts"]:
        lines.append(f"  {item['id']}: {item['status']}, wave {item['currentWave'] or '-'}")
    return "\n".join(lines)


# --- the command tree -----------------------------------------------------------------------


def _add_source(parser: argparse.ArgumentParser, *, status: bool) -> None:
    parser.add_argument(
        "--hub", metavar="URL", help="the hub API (token: --token-file or $FLEETLET_HUB_TOKEN)"
    )
    parser.add_argument("--token-file", metavar="FILE", help="the hub API token")
    parser.add_argument(
        "--repo",
        metavar="GIT_URL",
        help="instead of --hub: the cluster-branch repository (shard 0's; {shard} is 0)",
    )
    parser.add_argument("--fleet", metavar="FLEET_DIR", help="instead of --repo: its shards.repo")
    parser.add_argument("--cache-dir", metavar="DIR", help="local git cache (default: per user)")
    if status:
        parser.add_argument(
            "--status-repo",
            metavar="GIT_URL",
            help="with --repo: the status repository (a template with {shard} with --fleet), "
            "to judge each cluster",
        )
        parser.add_argument("--stale-after", default="5m", metavar="DURATION")
    add_output_option(parser)


def register(hub_sub: Any) -> None:
    """``fleetlet hub rollout ...`` under the ``hub`` command."""
    from hub import cli as edge

    rollout = hub_sub.add_parser(
        "rollout",
        help="progressive rollouts: waves gated on reported status (docs/rollouts.md)",
        description="A group with a rollout strategy (rollout: in the fleet repo) moves to a new "
        "revision wave by wave: `hub publish` starts its rollout, the controller (`hub serve` "
        "with signing, or `hub rollout step`) advances it as the agents report the new revision "
        "Ready, and halts (or reverts) it when too many fail. See docs/rollouts.md.",
    )
    sub = rollout.add_subparsers(dest="rollout_command", metavar="COMMAND", required=True)
    lst = sub.add_parser("list", help="every rollout, newest first")
    _add_source(lst, status=True)
    lst.set_defaults(handler=rollouts_list)
    status = sub.add_parser("status", help="one rollout: waves, clusters per state, events")
    status.add_argument("rollout", metavar="ROLLOUT")
    status.add_argument("--wave", metavar="NAME", help="only the clusters of this wave")
    status.add_argument("--verdict", choices=VERDICTS, help="only the clusters with this verdict")
    status.add_argument("--offset", type=int, default=0, metavar="N")
    status.add_argument("--limit", type=int, default=100, metavar="N")
    _add_source(status, status=True)
    status.set_defaults(handler=rollout_status)
    helps = {
        "promote": "approve the next wave: it starts now (a pauseBefore gate, or without waiting for the soak)",
        "pause": "no new cluster gets the new revision until resume",
        "resume": "go on after a pause, or after a halt (its failures no longer count)",
        "abort": "stop, and send every cluster that got the new revision back to the previous one",
    }
    for action in ACTIONS:
        p = sub.add_parser(action, help=helps[action], description=helps[action].capitalize() + ".")
        p.add_argument("rollout", metavar="ROLLOUT")
        p.add_argument("--reason", metavar="TEXT", help="recorded with the action")
        p.add_argument(
            "--actor", metavar="NAME", help="with --repo: who acts (default: the local user)"
        )
        _add_source(p, status=False)
        p.set_defaults(handler=rollout_action)
    step = sub.add_parser(
        "step",
        help="one controller step: judge, advance, publish (CI, cron)",
        description="Read the rollout state and what the agents report, advance every rollout, "
        "and publish what that implies, signed, with the state in the same atomic push. Takes "
        "only settings and cluster names from FLEET_DIR; content comes from the branches.",
    )
    step.add_argument("fleet_dir", metavar="FLEET_DIR")
    step.add_argument("--repo", metavar="GIT_URL", help="as for hub publish")
    step.add_argument(
        "--status-repo", metavar="GIT_URL", help="status repositories (default: shards.statusRepo)"
    )
    step.add_argument("--stale-after", default="5m", metavar="DURATION")
    step.add_argument("--cache-dir", metavar="DIR", help="local git cache reused between runs")
    step.add_argument(
        "--trust-config",
        metavar="FILE",
        default=os.environ.get(edge.TRUST_CONFIG_ENV) or None,
        help="Sigstore client trust config (as for hub publish)",
    )
    step.add_argument(
        "--identity-token", metavar="FILE", help="OIDC identity token (as for hub publish)"
    )
    step.add_argument("--no-sign", action="store_true", help="UNSAFE: publish without a signature")
    step.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    add_output_option(step)
    step.set_defaults(handler=rollout_step)


__all__ = ["register"]
