"""The options of ``fleetlet hub serve``: its own, and the groups of the commit statuses and
alerts (:mod:`hub.notify`) and of the agents' notification channel (:mod:`hub.channel`).

Here, apart from the modules that act on them, so that building the command line's parser
(``fleetlet --help``, any ``fleetlet hub ...``) imports none of the server's code: asyncio and
PyYAML (the channel), dataclasses and urllib.request (the notifier), logging (the server).
:mod:`hub.serve`, :mod:`hub.notify` and :mod:`hub.channel` re-export what is theirs.
"""

from __future__ import annotations

import argparse

from agent.options import add_logging_arguments


def _serve(args: argparse.Namespace) -> int:
    """Handler of ``fleetlet hub serve`` (:func:`hub.serve.serve`, imported when it runs)."""
    from hub.serve import serve

    return serve(args)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hub serve`` (for a parser that does not have them yet)."""
    parser.add_argument(
        "--repo",
        action="append",
        metavar="GIT_URL",
        help="a status repository (repeatable: the fleet's status shards); a template with "
        "{shard} stands for every shard (default: shards.statusRepo of --fleet)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="how many shards a --repo template stands for (default: the --fleet's count)",
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:8080", metavar="ADDR", help="HOST:PORT (127.0.0.1:8080)"
    )
    parser.add_argument(
        "--tokens",
        metavar="FILE",
        help="bearer tokens, stored hashed (`fleetlet hub tokens add FILE` makes one)",
    )
    parser.add_argument(
        "--hub-key",
        metavar="FILE",
        help="the hub's X25519 private key (base64), to open sensitive outputs for admins",
    )
    parser.add_argument(
        "--stale-after",
        default="5m",
        metavar="DURATION",
        help="a cluster quiet for longer is Stale (5m)",
    )
    parser.add_argument(
        "--refresh", default="10s", metavar="DURATION", help="status refresh interval (10s)"
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="status cache, kept across restarts (default: under $XDG_CACHE_HOME/fleetlet)",
    )
    parser.add_argument(
        "--allow-anonymous", action="store_true", help="let requests without a token read"
    )
    parser.add_argument(
        "--fleet",
        metavar="FLEET_DIR",
        help="the fleet repo: cluster labels for the API and the dashboard's label filter "
        "(read at start)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate (PEM, the chain after it); with --tls-key",
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes serving the API (1); with more, this one refreshes the status into a "
        "view file they share (SQLite) and supervises them",
    )
    load = parser.add_argument_group(
        "load", 'bounds on the work taken on at once (docs/operations.md, "The hub under load")'
    )
    load.add_argument(
        "--concurrency",
        type=int,
        default=16,
        metavar="N",
        help="API requests worked on at once (16)",
    )
    load.add_argument(
        "--queue",
        type=int,
        default=64,
        metavar="N",
        help="API requests that may wait for one of those; past them: 503 with Retry-After (64)",
    )
    load.add_argument(
        "--request-timeout",
        default="30s",
        metavar="DURATION",
        help="an API request not answered by then gets 503 with Retry-After (30s)",
    )
    load.add_argument(
        "--header-timeout",
        default="10s",
        metavar="DURATION",
        help="a connection must send a request's headers within this; else 408 and closed (10s)",
    )
    parser.add_argument(
        "--enroll",
        metavar="ENROLL_DIR",
        help="accept enrollment requests (tokens.yaml, config.yaml; docs/operations.md)",
    )
    add_notify_arguments(parser)
    rollouts = parser.add_argument_group(
        "rollouts",
        "progressive rollouts (docs/rollouts.md): shown with --fleet, stepped when signing",
    )
    rollouts.add_argument(
        "--cluster-repo",
        metavar="GIT_URL",
        help="the cluster-branch repository, a template with {shard} for a sharded fleet "
        "(default: shards.repo of --fleet); where the rollout state is",
    )
    rollouts.add_argument(
        "--trust-config",
        metavar="FILE",
        help="Sigstore client trust config: with --identity-token, this hub runs the rollout "
        "controller and signs what it publishes",
    )
    rollouts.add_argument(
        "--identity-token",
        metavar="FILE",
        help="a file holding the OIDC identity token to sign with (read again at each step)",
    )
    rollouts.add_argument(
        "--rollout-interval",
        default="30s",
        metavar="DURATION",
        help="time between two controller steps (also after new reports and actions) (30s)",
    )
    add_channel_arguments(parser)
    add_logging_arguments(parser, default_level="info")
    parser.set_defaults(handler=_serve)


def add_notify_arguments(parser: argparse.ArgumentParser) -> None:
    """``hub serve``'s options for commit statuses and alerts."""
    notify = parser.add_argument_group(
        "commit statuses and alerts",
        "where a commit landed, said where operators look (docs/operations.md)",
    )
    notify.add_argument(
        "--commit-status",
        action="append",
        metavar="KIND:REPO",
        help="post each rollout's progress as a commit status on the fleet repo's commit: "
        "github:OWNER/NAME, gitea:OWNER/NAME or gitlab:GROUP/PROJECT (needs --fleet)",
    )
    notify.add_argument(
        "--commit-status-api",
        metavar="URL",
        help="the forge's API (default: https://api.github.com, https://gitlab.com/api/v4; "
        "Gitea: https://HOST/api/v1)",
    )
    notify.add_argument(
        "--commit-status-token-file", metavar="FILE", help="the token that posts statuses"
    )
    notify.add_argument(
        "--commit-status-url", metavar="URL", help="the link a status carries (the dashboard)"
    )
    notify.add_argument(
        "--alert-webhook",
        action="append",
        metavar="FORMAT:URL",
        help="send alerts (rollout halted, rolled back, approval requested, clusters stale) "
        "to URL as json, slack or teams (repeatable; FORMAT:@FILE reads the URL from FILE)",
    )
    notify.add_argument(
        "--alert-secret-file",
        metavar="FILE",
        help="sign json alerts with HMAC-SHA256 of this secret (header X-Fleetlet-Signature-256)",
    )


def add_channel_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hub serve`` for the agents' notification channel."""
    group = parser.add_argument_group(
        "notification channel",
        "agents hold GET /api/v1/clusters/NAME/events and poll when told (docs/operations.md)",
    )
    group.add_argument(
        "--channel-tokens",
        metavar="FILE",
        help="serve the channel to the clusters of this file (one hashed token per cluster: "
        "`fleetlet hub channel-token add FILE --cluster NAME`)",
    )
    group.add_argument(
        "--channel-repo",
        action="append",
        metavar="GIT_URL",
        help="the cluster-branch repository to watch (repeatable; a {shard} template stands "
        "for every shard; default: --cluster-repo, else shards.repo of --fleet)",
    )
    group.add_argument(
        "--channel-watch",
        default="1s",
        metavar="DURATION",
        help="how often the cluster branches are listed (one ls-refs per repository) (1s)",
    )
    group.add_argument(
        "--channel-keepalive",
        default="15s",
        metavar="DURATION",
        help="a comment sent on an idle channel this often, so both ends see it alive (15s)",
    )


__all__ = ["add_channel_arguments", "add_notify_arguments", "add_serve_arguments"]
