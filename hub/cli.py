"""The hub's subcommands: ``hub render|publish|diff|serve|shards|agent-key|tokens`` and
``installations`` (``hub rollout`` lives in :mod:`hub.rollout.command`, which builds on this
module's helpers; ``fleetlet.cli`` adds it under ``hub``).

Progress goes to stderr, results (a summary table, or ``-o json|yaml``) to stdout. Every
failure is raised as a :class:`~agent.errors.FleetletError`; ``fleetlet.cli`` prints it as one
line and exits 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from agent.errors import PermanentError
from agent.options import add_logging_arguments, add_output_option
from agent.output import OUTPUT_FORMATS
from agent.output import render as render_output
from hub import installations as inst_handlers
from hub.serve import add_serve_arguments

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


# --- render ---------------------------------------------------------------------------------


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


# --- publish --------------------------------------------------------------------------------


def signer_from_args(args: argparse.Namespace) -> tuple[Any, Any]:
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
    token = _identity_token(args.identity_token)
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


def _identity_token(path: str | None) -> str:
    """The OIDC identity token to sign with: ``--identity-token FILE``, else
    ``$SIGSTORE_ID_TOKEN``, else the CI system's ambient credential, found the way
    sigstore-python finds it (``sigstore.oidc.detect_credential``: GitHub Actions with
    ``permissions: id-token: write``, GitLab CI, Google Cloud, Buildkite, CircleCI).

    The token is masked in every log line from then on. Raises UsageError when there is none
    or the CI system refused one.
    """
    from agent.report.logs import mask

    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--identity-token {path}: {exc.strerror}") from exc
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token and not path:
        from sigstore.oidc import IdentityError, detect_credential

        try:
            token = (detect_credential() or "").strip()
        except IdentityError as exc:
            raise UsageError(f"ambient OIDC credential of this CI job: {exc}") from exc
    if not token:
        raise UsageError(
            f"no OIDC identity token: give --identity-token FILE, set {TOKEN_ENV}, or run in a "
            "CI job with an ambient OIDC credential (GitHub Actions: permissions: id-token: "
            "write); or --no-sign, UNSAFE, for local experiments"
        )
    mask(token)
    return token


def agents_trust_policy(fleet: Any, trust: Any) -> Any:
    """The agents' trust policy when fleet.yaml names the signing identity, else None."""
    settings = fleet.settings
    if trust is None or not settings.identity or not settings.issuer:
        return None
    from agent.verify import IdentityPolicy, TrustPolicy

    return TrustPolicy(
        trusted_root=trust.trusted_root,
        identity=IdentityPolicy(issuer=settings.issuer, subject=settings.identity),
    )


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


# --- tokens ---------------------------------------------------------------------------------


def _tokens_add(args: argparse.Namespace) -> int:
    from hub.api.tokens import add_token

    token = add_token(Path(args.file), name=args.name, role=args.role)
    print(token)
    print(
        f"token {args.name!r} ({args.role}) added to {args.file} (only its SHA-256 is kept): "
        "copy it now, it is not shown again",
        file=sys.stderr,
    )
    return 0


def _channel_token_add(args: argparse.Namespace) -> int:
    from hub.channel import add_channel_token

    print(add_channel_token(Path(args.file), args.cluster))
    print(
        f"channel token of {args.cluster} added to {args.file} (only its SHA-256 is kept): give "
        "it to that cluster's agent (--notify-token-file); it is not shown again",
        file=sys.stderr,
    )
    return 0


def _tokens_migrate(args: argparse.Namespace) -> int:
    from hub.api.tokens import migrate_tokens

    count = migrate_tokens(Path(args.file))
    if count:
        print(f"{args.file}: {count} tokens now stored as SHA-256 hashes (still valid)")
    else:
        print(f"{args.file}: already hashed, nothing to do")
    return 0


# --- diff -----------------------------------------------------------------------------------


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
    refused = prepared.signatures.refusal() if prepared.signatures is not None else None
    if refused is not None:
        print(f"{refused}\nhub publish would refuse them")
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


# --- shards ---------------------------------------------------------------------------------


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


# --- the command tree -----------------------------------------------------------------------


def register(sub: Any) -> Any:
    """``fleetlet hub ...`` under ``sub``; returns the hub's subparsers, where ``fleetlet.cli``
    adds ``hub rollout`` (:func:`hub.rollout.command.register`, which builds on this module)."""
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
    add_output_option(render)
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
        default=os.environ.get(TRUST_CONFIG_ENV) or None,
        help=f"Sigstore client trust config, for a private Sigstore (${TRUST_CONFIG_ENV}; "
        "default: the public-good instance)",
    )
    publish.add_argument(
        "--identity-token",
        metavar="FILE",
        help=f"file holding the OIDC identity token (default: ${TOKEN_ENV}, else the CI "
        "job's ambient credential, e.g. GitHub Actions with id-token: write)",
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
        "--status-repo",
        metavar="GIT_URL",
        help="where agents push their status (default: --repo): read to check that each "
        "cluster's agent can render the formats of its bundles",
    )
    publish.add_argument(
        "--force",
        action="store_true",
        help="publish even to clusters whose agents reported they cannot render a bundle's format",
    )
    publish.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="local git cache reused between runs (default: a temporary one)",
    )
    add_output_option(publish)
    publish.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    publish.add_argument(
        "--registry-config",
        metavar="FILE",
        help="docker config JSON with registry credentials for resolving tags",
    )
    publish.add_argument(
        "--metrics-file",
        metavar="FILE",
        help="write this publication's Prometheus metrics to FILE (for node-exporter's "
        "textfile collector: name it *.prom)",
    )
    publish.add_argument(
        "--commit-policy",
        metavar="FILE",
        default=os.environ.get(COMMIT_POLICY_ENV) or None,
        help="the hub's trusted commit policy (YAML: signers: [{principal, key, validAfter, "
        "validBefore}]; $" + COMMIT_POLICY_ENV + "): the fleet commit must be signed by one of "
        "them (fleet.yaml: commitSigning must be the same policy; docs/fleet-repo.md)",
    )
    add_logging_arguments(publish, default_level="warning")
    publish.set_defaults(handler=_publish)

    diff = hub_sub.add_parser(
        "diff",
        help="show what each cluster would receive",
        description="With --base and --head: what going from one revision of FLEET_DIR's git "
        "repository to another does to the fleet, per bundle, clusters grouped by identical "
        "change, with objects, security findings, rollout waves and approvals (docs/"
        "operations.md). Otherwise: compare FLEET_DIR with what each cluster branch of GIT_URL holds: per "
        "cluster, the bundles added, removed or changed (with the fields that change: source "
        "digests, values...). With --cluster, also each changed group's preview, object by "
        "object, in the shape of an approval request (rendered from the published and the new "
        "content, not a live dry run; see docs/approvals.md). Pushes nothing.",
    )
    diff.add_argument(
        "--no-preview",
        action="store_true",
        help="with --cluster: skip fetching and rendering content for the object preview",
    )
    diff.add_argument("fleet_dir", metavar="FLEET_DIR")
    diff.add_argument(
        "--base",
        metavar="REV",
        help="with --head: compare two revisions of FLEET_DIR's git repository instead of the "
        "cluster branches (a pull request's check: -o markdown writes the comment to post)",
    )
    diff.add_argument("--head", metavar="REV", help="see --base")
    diff.add_argument(
        "--repo",
        metavar="GIT_URL",
        help="as for hub publish: a template with {shard} for a sharded fleet",
    )
    diff.add_argument(
        "--cluster", action="append", metavar="NAME", help="only this cluster (repeatable)"
    )
    diff.add_argument("--cache-dir", metavar="DIR", help="local git cache reused between runs")
    diff.add_argument(
        "--status-repo",
        metavar="GIT_URL",
        help="with --cluster: where agents push their status (default: shards.statusRepo, else "
        "--repo): each cluster's reported facts (Kubernetes version, served APIs, installed "
        "bundles) are read there so that the preview renders as its agent does",
    )
    diff.add_argument(
        "-o",
        "--output",
        choices=(*OUTPUT_FORMATS, "markdown"),
        default="table",
        help="how to print the result (table; markdown: with --base/--head, a pull request "
        "comment)",
    )
    diff.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    diff.add_argument(
        "--registry-config",
        metavar="FILE",
        help="docker config JSON with registry credentials for resolving tags",
    )
    diff.add_argument(
        "--commit-policy",
        metavar="FILE",
        default=os.environ.get(COMMIT_POLICY_ENV) or None,
        help="the hub's trusted commit policy (YAML: signers: [{principal, key, validAfter, "
        "validBefore}]; $" + COMMIT_POLICY_ENV + "): the fleet commit must be signed by one of "
        "them (fleet.yaml: commitSigning must be the same policy; docs/fleet-repo.md)",
    )
    diff.set_defaults(handler=_diff)

    recipients = hub_sub.add_parser(
        "recipients",
        help="print the age recipients of the fleet's clusters (for sops --age)",
        description="The age public key each selected cluster's agent reported (made in the "
        "cluster; the hub holds no private key), read from the status repository: by default "
        "a comma-separated list for `sops --encrypt --age`, or a table, or JSON. Fails when a "
        "selected cluster has not reported one yet. See docs/secrets.md.",
    )
    recipients.add_argument(
        "fleet_dir",
        metavar="FLEET_DIR",
        nargs="?",
        default=".",
        help="the fleet repo (default: the current directory)",
    )
    recipients.add_argument(
        "--selector",
        "-l",
        metavar="SELECTOR",
        help="a label selector (region=eu,tier!=edge; default: every cluster)",
    )
    recipients.add_argument(
        "--status-repo",
        metavar="GIT_URL",
        help="where agents push their status (default: shards.statusRepo, else --repo)",
    )
    recipients.add_argument("--repo", metavar="GIT_URL", help="as for hub publish")
    add_output_option(recipients, default=None)
    recipients.set_defaults(handler=_recipients)

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
    add_output_option(shards)
    shards.set_defaults(handler=_shards)

    serve = hub_sub.add_parser(
        "serve",
        help="API, dashboard and status aggregation",
        description="Aggregate the agents' status branches (one listing, fetch what moved) "
        "and serve them over HTTP/JSON with bearer tokens (OpenAPI at /api/v1/openapi.json) "
        "and as a dashboard at / (see docs/dashboard.md).",
    )
    add_serve_arguments(serve)

    agent_key = hub_sub.add_parser(
        "agent-key",
        help="issue a cluster's sealing key for its agent",
        description="Derive CLUSTER's sealing key from the hub's private key and write it to "
        "FILE (mode 0600). Give it to that cluster's agent (--agent-sealing-key): the hub then "
        "knows which sealed outputs that agent produced. The hub stores nothing: it derives the "
        "key again when it opens outputs. See docs/operations.md.",
    )
    agent_key.add_argument("--hub-key", required=True, metavar="FILE", help="hub private key")
    agent_key.add_argument("--cluster", required=True, metavar="NAME")
    agent_key.add_argument("--out", required=True, metavar="FILE", help="new file, mode 0600")
    agent_key.set_defaults(handler=_agent_key)
    tokens = hub_sub.add_parser(
        "tokens",
        help="bearer tokens of the hub API (stored hashed)",
        description="The tokens file of `hub serve --tokens` holds the SHA-256 of each token, "
        "never a token: `add` makes a random token and prints it once; `migrate` converts a "
        "file of the old clear-text format in place.",
    )
    tokens_sub = tokens.add_subparsers(dest="tokens_command", metavar="COMMAND", required=True)
    add = tokens_sub.add_parser("add", help="make a token, store its hash, print it once")
    add.add_argument("file", metavar="FILE", help="the tokens file (created if missing)")
    add.add_argument("--name", required=True, help="who holds it (shown instead of the token)")
    add.add_argument("--role", required=True, choices=["admin", "read"])
    add.set_defaults(handler=_tokens_add)
    migrate = tokens_sub.add_parser(
        "migrate", help="rewrite a clear-text tokens file with hashes (tokens stay valid)"
    )
    migrate.add_argument("file", metavar="FILE")
    migrate.set_defaults(handler=_tokens_migrate)
    channel = hub_sub.add_parser(
        "channel-token",
        help="tokens of the agents' notification channel (one per cluster, stored hashed)",
        description="The file of `hub serve --channel-tokens`: a channel token opens its "
        "cluster's notification channel and nothing else.",
    )
    channel_sub = channel.add_subparsers(dest="channel_command", metavar="COMMAND", required=True)
    channel_add = channel_sub.add_parser("add", help="make a cluster's token, print it once")
    channel_add.add_argument("file", metavar="FILE", help="the channel tokens file")
    channel_add.add_argument("--cluster", required=True, metavar="NAME")
    channel_add.set_defaults(handler=_channel_token_add)
    return hub_sub


def _agent_key(args: argparse.Namespace) -> int:
    from agent.report.seal import agent_sealing_key, key_text, read_private_key

    key = agent_sealing_key(read_private_key(Path(args.hub_key)), args.cluster)
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(key_text(key) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write the sealing key to {args.out}: {exc}") from exc
    print(f"sealing key of cluster {args.cluster} written to {args.out}", file=sys.stderr)
    return 0


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
            p.add_argument(
                "--state",
                metavar="STATE",
                help="Ready, Progressing, AwaitingApproval, Denied, Degraded, RolledBack, "
                "Paused or Stale",
            )
        p.add_argument("--hub", metavar="URL")
        p.add_argument("--repo", metavar="GIT_URL")
        add_output_option(p)
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
        add_output_option(lst)
        inst_handlers.add_source_arguments(lst)
        lst.set_defaults(
            handler=inst_handlers.runs_list if group == "runs" else inst_handlers.outputs_list
        )
    inst_handlers.register_explain(sub)


__all__ = ["register", "register_installations"]
