"""``fleetlet hub serve``: the hub API and dashboard under uvicorn, with a status refresh loop.

The first refresh runs before the server listens (a warm cache makes it cheap); after that a
daemon thread refreshes every ``--refresh`` interval. A failed refresh is reported on stderr
and retried at the next tick: the view stays, and clusters go Stale by the clock. With
``--fleet`` the fleet repo is loaded once at start for the clusters' labels (restart to pick up
new labels).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from agent.errors import FleetletError, PermanentError
from hub.api.metrics import HubMetrics  # prometheus-client only: no web framework
from hub.status.aggregate import FleetStatus

log = logging.getLogger(__name__)
OBSERVE_EVERY = 30.0
"""Seconds between two counts of the fleet's states for /metrics when nothing moved."""

GIT_USERNAME_ENV = "FLEETLET_GIT_USERNAME"
GIT_PASSWORD_ENV = "FLEETLET_GIT_PASSWORD"
_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ServeUsageError(PermanentError):
    """A ``hub serve`` setting that cannot work (bad duration, bad listen address)."""


def parse_duration(text: str) -> timedelta:
    """``500ms``, ``10s``, ``5m``, ``1h`` or plain seconds. Raises ServeUsageError."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ServeUsageError(f"bad duration {text!r}: use e.g. 10s, 5m, 1h")
    return timedelta(seconds=float(match["n"]) * _UNITS[match["unit"]])


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT`` for 127.0.0.1). Raises ServeUsageError."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ServeUsageError(f"bad listen address {text!r}: use HOST:PORT")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def dashboard_url(base: str, token: str | None = None) -> str:
    """The dashboard's address, with ``token`` in the fragment (``#token=...``).

    A fragment never reaches the server, its logs or a proxy; the page moves the token to its
    session storage and removes it from the address bar.
    """
    url = base.rstrip("/") + "/"
    return url + "#" + urllib.parse.urlencode({"token": token}) if token else url


def fleet_labels(fleet_dir: Path) -> dict[str, dict[str, str]]:
    """Cluster name -> labels, from the fleet repo at ``fleet_dir``.

    Raises FleetRepoError (every problem of the fleet repo, as ``hub publish`` would).
    """
    from hub.fleet.model import load_fleet

    return {c.name: dict(c.labels) for c in load_fleet(fleet_dir).clusters}


def load_fleet_for_serve(fleet_dir: Path) -> Any:
    """The fleet repo at ``fleet_dir`` (labels, shards). Raises FleetRepoError."""
    from hub.fleet.model import load_fleet

    return load_fleet(fleet_dir)


def status_urls(repos: list[str], *, shards: int | None, template: str | None) -> list[str]:
    """The status repositories: each ``--repo`` (``{shard}`` expanded over the fleet's
    shards), else the fleet's ``shards.statusRepo``. Raises ServeUsageError."""
    given = repos or ([template] if template else [])
    if not given:
        raise ServeUsageError("hub serve needs --repo (or --fleet with shards.statusRepo)")
    urls: list[str] = []
    for repo in given:
        if "{shard}" in repo:
            if not shards:
                raise ServeUsageError(
                    f"--repo {repo}: a template with {{shard}} needs --shards N or --fleet"
                )
            urls += [repo.replace("{shard}", str(i)) for i in range(shards)]
        else:
            urls.append(repo)
    return urls


def git_credentials() -> tuple[str, str] | None:
    from agent.report.logs import mask

    user, password = os.environ.get(GIT_USERNAME_ENV), os.environ.get(GIT_PASSWORD_ENV)
    mask(password)
    return (user, password) if user and password else None


def default_cache_dir(repo: str) -> Path:
    """A per-repository cache directory under ``$XDG_CACHE_HOME/fleetlet/hub-status``."""
    import hashlib

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fleetlet" / "hub-status" / hashlib.sha256(repo.encode()).hexdigest()[:16]


class RefreshLoop:
    """Calls ``status.refresh()`` every ``interval`` in a daemon thread until stopped."""

    def __init__(
        self,
        *,
        status: FleetStatus,
        interval: timedelta,
        report: Callable[[str], None] | None = None,
        on_change: Callable[[], None] | None = None,
        metrics: HubMetrics | None = None,
    ) -> None:
        self.status = status
        self.interval = interval.total_seconds()
        self.report = report or log.info
        self.metrics = metrics
        self._observed = float("-inf")
        # Called after a refresh in which clusters moved or went away (the matrix's warm-up).
        self.on_change = on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-refresh", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def tick(self) -> None:
        started = time.perf_counter()
        try:
            result = self.status.refresh()
        except FleetletError as exc:
            if self.metrics is not None:
                self.metrics.refreshed(time.perf_counter() - started, ok=False)
            self.report(f"status refresh failed: {exc}")
            return
        if self.metrics is not None:
            self.metrics.refreshed(time.perf_counter() - started, ok=True)
            # One pass over every installation: after a change, and otherwise now and then
            # (clusters go Stale by the clock alone).
            now = time.monotonic()
            if result.moved or result.removed or now - self._observed >= OBSERVE_EVERY:
                self.metrics.observe_fleet(self.status)
                self._observed = now
        if result.moved or result.removed:
            if self.on_change is not None:
                self.on_change()
            self.report(
                f"status: {result.listed} clusters, {len(result.moved)} moved, "
                f"{len(result.removed)} removed, {len(result.errors)} with errors "
                f"({result.seconds:.2f}s)"
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()


def serve(args: argparse.Namespace) -> int:
    """Handler of ``fleetlet hub serve``.

    Raises FleetletError on bad settings (ServeUsageError, HubConfigError, FleetRepoError for
    a bad ``--fleet`` repo, StatusCacheError).
    """
    # The web framework is the hub extra: imported only when serving.
    import uvicorn

    from agent.report.logs import setup_logging
    from hub.api.app import create_app, load_private_key
    from hub.api.tokens import Tokens, load_tokens

    setup_logging(
        level=getattr(args, "log_level", None) or "info",
        format=getattr(args, "log_format", None) or "text",
    )
    host, port = parse_listen(args.listen)
    tls = tls_files(getattr(args, "tls_cert", None), getattr(args, "tls_key", None))
    tokens = load_tokens(Path(args.tokens)) if getattr(args, "tokens", None) else Tokens(())
    anonymous = bool(getattr(args, "allow_anonymous", False))
    if not tokens and not anonymous:
        raise ServeUsageError("hub serve needs --tokens FILE (or --allow-anonymous)")
    key_file = getattr(args, "hub_key", None)
    private_key = load_private_key(Path(key_file)) if key_file else None
    fleet_dir = getattr(args, "fleet", None)
    fleet = load_fleet_for_serve(Path(fleet_dir)) if fleet_dir else None
    labels = {c.name: dict(c.labels) for c in fleet.clusters} if fleet is not None else None
    urls = status_urls(
        list(args.repo or []),
        shards=getattr(args, "shards", None) or (fleet.settings.shards.count if fleet else None),
        template=fleet.settings.shards.status_repo if fleet is not None else None,
    )
    cache = getattr(args, "cache_dir", None)
    status = FleetStatus(
        repo_url=urls,
        credentials=git_credentials(),
        cache_dir=Path(cache) if cache else default_cache_dir(" ".join(urls)),
        stale_after=parse_duration(getattr(args, "stale_after", None) or "5m"),
    )
    metrics = HubMetrics()
    loop = RefreshLoop(
        status=status,
        interval=parse_duration(getattr(args, "refresh", None) or "10s"),
        metrics=metrics,
    )
    app = create_app(
        status=status,
        tokens=tokens,
        private_key=private_key,
        allow_anonymous=anonymous,
        labels=labels,
        metrics=metrics,
    )
    loop.tick()
    # The matrix's cells before the first request, and again after each refresh that moved.
    app.state.queries.warm()
    loop.on_change = app.state.queries.warm
    loop.start()
    try:
        # log_config=None: uvicorn's records go through our handler (format, masking).
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            log_config=None,
            # SIGTERM: open connections get a few seconds, then the process exits.
            timeout_graceful_shutdown=5,
            ssl_certfile=str(tls[0]) if tls else None,
            ssl_keyfile=str(tls[1]) if tls else None,
        )
        shown = f"[{host}]" if ":" in host else host
        scheme = "https" if tls else "http"
        log.info(
            "fleetlet hub serving on %s://%s:%s/ (dashboard; API at %s://%s:%s/api/v1; "
            "metrics at /metrics)",
            scheme, shown, port, scheme, shown, port,
        )  # fmt: skip
        uvicorn.Server(config).run()
    finally:
        loop.stop()
    return 0


def tls_files(cert: str | None, key: str | None) -> tuple[Path, Path] | None:
    """The TLS certificate and key files, both or neither. Raises ServeUsageError."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise ServeUsageError("--tls-cert and --tls-key go together: give both or neither")
    for flag, name in (("--tls-cert", cert), ("--tls-key", key)):
        if not Path(name).is_file():
            raise ServeUsageError(f"{flag} {name}: no such file")
    return Path(cert), Path(key)


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
    from agent.options import add_logging_arguments

    add_logging_arguments(parser, default_level="info")
    parser.set_defaults(handler=serve)


def main(argv: list[str] | None = None) -> int:
    """``python -m hub.serve``: the same as ``fleetlet hub serve``."""
    parser = argparse.ArgumentParser(prog="fleetlet hub serve")
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return serve(args)
    except FleetletError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
