"""The hub's command tree: the arguments of every ``fleetlet hub ...`` subcommand and of
``fleetlet installations``, each bound to its body in the sibling modules. Called by
``fleetlet.cli`` through :func:`hub.cli.register` and :func:`hub.cli.register_installations`.
"""

from __future__ import annotations

import os
from typing import Any

from agent.options import add_logging_arguments, add_output_option
from agent.output import OUTPUT_FORMATS
from hub import installations as inst_handlers
from hub.cli._clusters import _recipients, _shards
from hub.cli._context import (
    COMMIT_POLICY_ENV,
    GIT_PASSWORD_ENV,
    GIT_USERNAME_ENV,
    TOKEN_ENV,
    TRUST_CONFIG_ENV,
)
from hub.cli._diff import _diff
from hub.cli._keys import _agent_key, _channel_token_add, _tokens_add, _tokens_migrate
from hub.cli._publish import _publish, _render
from hub.serve_options import add_serve_arguments


def register(sub: Any) -> Any:
    """``fleetlet hub ...`` under ``sub``; returns the hub's subparsers, where ``fleetlet.cli``
    adds ``hub rollout`` (:func:`hub.rollout.command.register`, which builds on :mod:`hub.cli`)."""
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
