"""The hub's subcommands: ``hub render|publish|diff|serve``, ``installations``, ``approve|deny``.

Progress goes to stderr, results (a summary table, or ``-o json|yaml``) to stdout. Every
failure is raised as a :class:`~agent.errors.FleetletError`; ``fleetlet.cli`` prints it as one
line and exits 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from agent.errors import NotImplementedYetError, PermanentError
from hub import installations as inst_handlers
from hub.serve import add_serve_arguments

_OUTPUTS = ["table", "json", "yaml"]
TOKEN_ENV = "SIGSTORE_ID_TOKEN"
GIT_USERNAME_ENV = "FLEETLET_GIT_USERNAME"
GIT_PASSWORD_ENV = "FLEETLET_GIT_PASSWORD"


class UsageError(PermanentError):
    """A command line that cannot work (missing token, bad time...)."""


def _not_yet(what: str, issue: str) -> Any:
    def handler(args: argparse.Namespace) -> int:
        raise NotImplementedYetError(f"{what} is not implemented yet ({issue})")

    return handler


class _Progress:
    """Progress lines on stderr, stamped with the seconds since the command started."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            elapsed = time.perf_counter() - self.started
            print(f"[{elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def _emit(data: Any, output: str) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(yaml.safe_dump(data, sort_keys=True, default_flow_style=False), end="")


def _git_credentials() -> tuple[str, str] | None:
    user, password = os.environ.get(GIT_USERNAME_ENV), os.environ.get(GIT_PASSWORD_ENV)
    return (user, password) if user and password else None


def _store(args: argparse.Namespace, progress: _Progress, prepared: Any) -> Any:
    """The fleet's cluster-branch repositories: ``--repo`` (a template with ``{shard}`` for
    a sharded fleet), else ``shards.repo`` of fleet.yaml. Raises UsageError, FleetRepoError."""
    from hub.publish.git import BranchStore
    from hub.publish.shards import ShardedStore

    template = args.repo or prepared.fleet.settings.shards.repo
    if not template:
        raise UsageError("--repo is required (or shards.repo in fleet.yaml)")
    cache = Path(args.cache_dir) if args.cache_dir else None
    shard_map = prepared.shard_map
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


def _registry_credentials(path: str | None) -> dict[str, tuple[str, str]] | None:
    """host -> (user, password) from a docker config JSON. Raises UsageError."""
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
            out[host] = (user, password)
    except OSError as exc:
        raise UsageError(f"--registry-config {path}: {exc.strerror}") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(
            f"--registry-config {path}: not a docker config JSON with auths ({exc})"
        ) from exc
    return out


def _prepare(args: argparse.Namespace, progress: _Progress) -> Any:
    from hub.publish.flow import prepare

    progress(f"loading fleet {args.fleet_dir}")
    cache = getattr(args, "cache_dir", None)
    prepared = prepare(
        args.fleet_dir,
        only=args.cluster or None,
        registry_credentials=_registry_credentials(args.registry_config),
        progress=progress,
        # Parsed fleet files are kept with the git cache: an unchanged inventory is not
        # parsed again.
        cache_dir=Path(cache) / "fleet-files" if cache else None,
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


# --- render ---------------------------------------------------------------------------------


def _render(args: argparse.Namespace) -> int:
    from agent.api import parse_time
    from hub.publish.flow import render

    progress = _Progress(args.quiet)
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


# --- publish --------------------------------------------------------------------------------


def _signer(args: argparse.Namespace) -> tuple[Any, Any]:
    """(PublicationSigner, ClientTrustConfig) from the flags ((None, None) with --no-sign).

    Raises UsageError or PublishError.
    """
    if args.no_sign:
        if args.identity_token or args.trust_config:
            raise UsageError("--no-sign cannot be combined with --identity-token/--trust-config")
        print(
            "fleetlet: WARNING: --no-sign publishes UNSIGNED sets; agents refuse them. "
            "Use it only for local experiments.",
            file=sys.stderr,
        )
        return None, None
    if args.identity_token:
        try:
            token = Path(args.identity_token).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--identity-token {args.identity_token}: {exc.strerror}") from exc
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise UsageError(
            f"no OIDC identity token: give --identity-token FILE or set {TOKEN_ENV} "
            "(or --no-sign, UNSAFE, for local experiments)"
        )
    from sigstore.models import ClientTrustConfig

    from hub.errors import PublishError
    from hub.publish.sign import PublicationSigner

    try:
        if args.trust_config:
            trust = ClientTrustConfig.from_json(Path(args.trust_config).read_text())
        else:
            trust = ClientTrustConfig.production()
    except OSError as exc:
        raise UsageError(f"--trust-config {args.trust_config}: {exc.strerror}") from exc
    except Exception as exc:  # sigstore/pydantic parse errors, TUF refresh failures
        raise PublishError(f"signing trust config: unusable: {exc}") from exc
    return PublicationSigner.from_trust_config(trust_config=trust, token=token), trust


def _self_check(prepared: Any, trust: Any) -> Any:
    """The agents' trust policy when fleet.yaml names the signing identity, else None."""
    settings = prepared.fleet.settings
    if trust is None or not settings.identity or not settings.issuer:
        return None
    from agent.verify import IdentityPolicy, TrustPolicy

    return TrustPolicy(
        trusted_root=trust.trusted_root,
        identity=IdentityPolicy(issuer=settings.issuer, subject=settings.identity),
    )


def _publish(args: argparse.Namespace) -> int:
    from hub.publish.flow import publish

    progress = _Progress(args.quiet)
    started = time.perf_counter()
    signer, trust = _signer(args)
    prepared = _prepare(args, progress)
    check = _self_check(prepared, trust)
    with _store(args, progress, prepared) as store:
        report = publish(prepared, store, signer=signer, progress=progress, check=check)
    seconds = time.perf_counter() - started
    data = report.to_dict(bundles=len(prepared.fleet.bundles), references=prepared.references)
    data["seconds"]["total"] = round(seconds, 3)
    data["source"] = {"repo": prepared.source.repo, "commit": prepared.source.commit}
    data["repo"] = args.repo or prepared.fleet.settings.shards.repo
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
    for c in data["changes"]:
        before = c["serialBefore"] if c["serialBefore"] is not None else "-"
        after = c["serialAfter"] if c["serialAfter"] is not None else "-"
        print(f"  {c['cluster']:<40} {c['status']:<10} serial {before} -> {after}")
    return 0


# --- diff -----------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    if value is None:
        text = "(unset)"
    return text if len(text) <= 60 else text[:57] + "..."


def _diff(args: argparse.Namespace) -> int:
    from hub.publish.flow import diff

    progress = _Progress(args.quiet)
    prepared = _prepare(args, progress)
    progress(f"fetching cluster branches from {args.repo or prepared.fleet.settings.shards.repo}")
    with _store(args, progress, prepared) as store:
        diffs = diff(prepared, store)
    if args.output != "table":
        _emit({"clusters": [d.to_dict() for d in diffs]}, args.output)
        return 0
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
    return 0


# --- shards ---------------------------------------------------------------------------------


def _shards(args: argparse.Namespace) -> int:
    """Each cluster's shard and the repositories its agent is told (``--repo``,
    ``--status-repo`` of ``fleetlet agent run``)."""
    from hub.fleet.model import load_fleet
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


# --- the command tree -----------------------------------------------------------------------


def register(sub: Any) -> None:
    hub = sub.add_parser(
        "hub",
        help="publish a fleet repo and serve fleet status",
        description="Turn a fleet repo into signed per-cluster sets in git; serve what agents "
        "report. The fleet repo format is described in docs/fleet-repo.md.",
    )
    hub_sub = hub.add_subparsers(dest="hub_command", metavar="COMMAND", required=True)

    render = hub_sub.add_parser(
        "render",
        help="write per-cluster sets to a directory, unsigned",
        description="Load FLEET_DIR, pin every source (tags, branches, URLs) and write one "
        "canonical set per cluster to DIR/<cluster>.yaml (serial 1, issued at the fleet "
        "commit's time, so the same commit renders the same bytes). No signing, no push.",
    )
    render.add_argument("fleet_dir", metavar="FLEET_DIR")
    render.add_argument("--out", required=True, metavar="DIR")
    render.add_argument(
        "--cluster", action="append", metavar="NAME", help="only this cluster (repeatable)"
    )
    render.add_argument(
        "--issued-at",
        metavar="TIME",
        help="issuedAt of the sets (default: the fleet commit's time)",
    )
    render.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
    render.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    render.add_argument(
        "--registry-config",
        metavar="FILE",
        help="docker config JSON with registry credentials for resolving tags",
    )
    render.set_defaults(handler=_render)

    publish = hub_sub.add_parser(
        "publish",
        help="resolve, render, sign and push",
        description="Publish FLEET_DIR to GIT_URL: pin sources, render every cluster's set, "
        "and for the clusters whose set changed (or whose publication expires within the "
        "refresh window) bump the serial, sign ONE publication with Sigstore and push every "
        "changed branch fleetlet/clusters/<cluster> in ONE push. Nothing is pushed if "
        "anything fails before. Git credentials for smart HTTP: "
        f"{GIT_USERNAME_ENV}/{GIT_PASSWORD_ENV}.",
    )
    publish.add_argument("fleet_dir", metavar="FLEET_DIR")
    publish.add_argument(
        "--repo",
        metavar="GIT_URL",
        help="the cluster-branch repository; for a sharded fleet a template with {shard} "
        "(default: shards.repo of fleet.yaml)",
    )
    publish.add_argument(
        "--trust-config",
        metavar="FILE",
        help="Sigstore client trust config (default: the public-good instance)",
    )
    publish.add_argument(
        "--identity-token",
        metavar="FILE",
        help=f"file holding the OIDC identity token (default: ${TOKEN_ENV})",
    )
    publish.add_argument(
        "--no-sign",
        action="store_true",
        help="UNSAFE: publish without a signature (agents refuse it; local experiments only)",
    )
    publish.add_argument(
        "--cluster", action="append", metavar="NAME", help="only this cluster (repeatable)"
    )
    publish.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="local git cache reused between runs (default: a temporary one)",
    )
    publish.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
    publish.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    publish.add_argument(
        "--registry-config",
        metavar="FILE",
        help="docker config JSON with registry credentials for resolving tags",
    )
    publish.set_defaults(handler=_publish)

    diff = hub_sub.add_parser(
        "diff",
        help="show what each cluster would receive",
        description="Compare FLEET_DIR with what each cluster branch of GIT_URL holds: per "
        "cluster, the bundles added, removed or changed (with the fields that change: source "
        "digests, values...). Pushes nothing.",
    )
    diff.add_argument("fleet_dir", metavar="FLEET_DIR")
    diff.add_argument(
        "--repo",
        metavar="GIT_URL",
        help="as for hub publish: a template with {shard} for a sharded fleet",
    )
    diff.add_argument(
        "--cluster", action="append", metavar="NAME", help="only this cluster (repeatable)"
    )
    diff.add_argument("--cache-dir", metavar="DIR", help="local git cache reused between runs")
    diff.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
    diff.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    diff.add_argument(
        "--registry-config",
        metavar="FILE",
        help="docker config JSON with registry credentials for resolving tags",
    )
    diff.set_defaults(handler=_diff)

    shards = hub_sub.add_parser(
        "shards",
        help="each cluster's shard and the repositories its agent uses",
        description="For a fleet sharded over several repositories (fleet.yaml: shards), print "
        "each cluster's shard and the repositories its agent is told: fleetlet agent run "
        "--repo REPO --status-repo STATUS_REPO. See docs/scaling.md.",
    )
    shards.add_argument("fleet_dir", metavar="FLEET_DIR")
    shards.add_argument(
        "--repo", metavar="GIT_URL", help="cluster-branch repository template with {shard}"
    )
    shards.add_argument(
        "--status-repo", metavar="GIT_URL", help="status repository template with {shard}"
    )
    shards.add_argument(
        "--cluster", action="append", metavar="NAME", help="only this cluster (repeatable)"
    )
    shards.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
    shards.set_defaults(handler=_shards)

    serve = hub_sub.add_parser(
        "serve",
        help="API, dashboard and status aggregation",
        description="Aggregate the agents' status branches (one listing, fetch what moved) "
        "and serve them over HTTP/JSON with bearer tokens (OpenAPI at /api/v1/openapi.json) "
        "and as a dashboard at / (see docs/dashboard.md).",
    )
    add_serve_arguments(serve)


def register_installations(sub: Any) -> None:
    inst = sub.add_parser(
        "installations",
        help="installations (cluster x bundle), their runs and outputs",
        description="Porter-style view of what each cluster runs, from the hub API or git.",
    )
    inst_sub = inst.add_subparsers(dest="inst_command", metavar="COMMAND", required=True)
    handlers = {"list": inst_handlers.installations_list, "show": inst_handlers.installations_show}
    for name, helptext in [("list", "list installations"), ("show", "show one installation")]:
        p = inst_sub.add_parser(name, help=helptext)
        if name == "show":
            p.add_argument("installation", metavar="CLUSTER/BUNDLE")
        else:
            p.add_argument("--cluster", metavar="NAME", help="only this cluster")
            p.add_argument("--bundle", metavar="NAME", help="only this bundle")
            p.add_argument("--state", metavar="STATE", help="Ready, Progressing, Degraded, ...")
        p.add_argument("--hub", metavar="URL")
        p.add_argument("--repo", metavar="GIT_URL")
        p.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
        inst_handlers.add_source_arguments(p)
        p.set_defaults(handler=handlers[name])
    for group in ("runs", "outputs"):
        g = inst_sub.add_parser(group, help=f"{group} of an installation")
        g_sub = g.add_subparsers(dest=f"{group}_command", metavar="COMMAND", required=True)
        lst = g_sub.add_parser("list", help=f"list {group} of an installation")
        lst.add_argument("installation", metavar="CLUSTER/BUNDLE")
        if group == "outputs":
            lst.add_argument("--run", default="latest", metavar="ID|latest")
        lst.add_argument("--hub", metavar="URL")
        lst.add_argument("--repo", metavar="GIT_URL")
        lst.add_argument("-o", "--output", choices=_OUTPUTS, default="table")
        inst_handlers.add_source_arguments(lst)
        lst.set_defaults(
            handler=inst_handlers.runs_list if group == "runs" else inst_handlers.outputs_list
        )

    for verb in ("approve", "deny"):
        p = sub.add_parser(verb, help=f"{verb} a BundleDeploymentRequest")
        p.add_argument("request", metavar="REQUEST")
        p.add_argument("--kubeconfig", metavar="FILE")
        p.set_defaults(handler=_not_yet(f"fleetlet {verb}", "the approvals issue"))


__all__ = ["register", "register_installations"]
