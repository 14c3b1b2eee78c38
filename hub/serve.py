"""``fleetlet hub serve``: the hub API and dashboard under uvicorn, with a status refresh loop.

The first refresh runs before the server listens (a warm cache makes it cheap); after that a
daemon thread refreshes every ``--refresh`` interval. A failed refresh is reported on stderr
and retried at the next tick: the view stays, and clusters go Stale by the clock. With
``--fleet`` the fleet repo is loaded once at start for the clusters' labels (restart to pick up
new labels). With ``--fleet`` and the cluster-branch repositories the hub serves the fleet's
rollouts, and with ``--trust-config`` and ``--identity-token`` it runs the rollout controller in
a thread of its own (:mod:`hub.rollout.service`, docs/rollouts.md).
"""

from __future__ import annotations

import argparse
import json
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
from typing import TYPE_CHECKING, Any

from agent.errors import FleetletError, PermanentError
from hub.serve_options import add_serve_arguments

if TYPE_CHECKING:
    from hub.api.metrics import HubMetrics
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
    from hub.fleet.load import load_fleet

    return {c.name: dict(c.labels) for c in load_fleet(fleet_dir).clusters}


def load_fleet_for_serve(fleet_dir: Path) -> Any:
    """The fleet repo at ``fleet_dir`` (labels, shards). Raises FleetRepoError."""
    from hub.fleet.load import load_fleet

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


SERVE_ENV = "FLEETLET_HUB_SERVE"
"""The options of ``hub serve`` (JSON) for its worker processes (``--workers``)."""
FOLLOW_EVERY = timedelta(seconds=1)
"""How often a worker process reads what the refreshing process wrote into the shared view."""


def serve(args: argparse.Namespace) -> int:
    """Handler of ``fleetlet hub serve``.

    With ``--workers N`` (more than 1) this process refreshes the status from git into the
    shared view file (SQLite, WAL), runs the rollout controller, and supervises N uvicorn
    worker processes on the same socket (uvicorn's own supervisor: a dead worker is
    replaced); each worker serves the API from the view file (:func:`worker_app`).

    Raises FleetletError on bad settings (ServeUsageError, HubConfigError, FleetRepoError for
    a bad ``--fleet`` repo, StatusCacheError).
    """
    # The web framework is the hub extra: imported only when serving.
    import uvicorn

    from agent.report.logs import setup_logging
    from hub.channel import channel_from_args

    setup_logging(
        level=getattr(args, "log_level", None) or "info",
        format=getattr(args, "log_format", None) or "text",
    )
    host, port = parse_listen(args.listen)
    tls = tls_files(getattr(args, "tls_cert", None), getattr(args, "tls_key", None))
    _, header_timeout = load_bounds(args)
    workers = getattr(args, "workers", None) or 1
    if workers < 1:
        raise ServeUsageError("--workers must be at least 1")
    parts = _Parts(args, follow=False, app=workers == 1)
    loop = parts.loop
    loop.tick()
    if parts.app is not None:
        # The matrix's cells before the first request, and again after each refresh that moved.
        parts.app.state.queries.warm()
    from hub.notify import notifier_from_args

    notifier = notifier_from_args(args, rollouts=parts.rollouts, queries=lambda: parts.queries)
    # The agents' channel sits in front of the API app: outside its middleware (timeouts).
    # With --workers each worker process puts its own in front of its app (worker_app).
    served, watcher = (
        channel_from_args(args, parts.app, parts.fleet, git_credentials())
        if parts.app is not None
        else (None, None)
    )
    if watcher is not None and parts.rollouts is not None:
        parts.rollouts.published = watcher.poke  # a step's publish told at once
    loop.start()
    if parts.rollouts is not None:
        parts.rollouts.start()
    if notifier is not None:
        notifier.start()
    if watcher is not None:
        watcher.start()
    try:
        config = uvicorn.Config(
            served if served is not None else "hub.serve:worker_app",
            factory=served is None,
            workers=workers,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            # log_config=None: uvicorn's records go through our handler (format, masking).
            log_config=None,
            # SIGTERM: open connections get a few seconds, then the process exits.
            timeout_graceful_shutdown=5,
            # A request's headers within --header-timeout (slow clients cut off); an idle
            # keep-alive connection closed after 5 s. By name: the workers import it.
            http="hub.api.http:HeaderTimeoutProtocol",
            timeout_keep_alive=5,
            ssl_certfile=str(tls[0]) if tls else None,
            ssl_keyfile=str(tls[1]) if tls else None,
        )
        from hub.api.http import HeaderTimeoutProtocol

        HeaderTimeoutProtocol.header_timeout = header_timeout
        shown = f"[{host}]" if ":" in host else host
        scheme = "https" if tls else "http"
        log.info(
            "fleetlet hub serving on %s://%s:%s/ (dashboard; API at %s://%s:%s/api/v1; "
            "metrics at /metrics)%s",
            scheme, shown, port, scheme, shown, port,
            f" with {workers} worker processes" if workers > 1 else "",
        )  # fmt: skip
        if workers == 1:
            uvicorn.Server(config).run()
        else:
            from uvicorn.supervisors import Multiprocess

            options = {k: v for k, v in vars(args).items() if _plain(v)}
            os.environ[SERVE_ENV] = json.dumps(options)
            Multiprocess(config, sockets=[config.bind_socket()]).run()
    finally:
        loop.stop()
        if parts.rollouts is not None:
            parts.rollouts.stop()
        if notifier is not None:
            notifier.stop()
        if watcher is not None:
            watcher.stop()
    return 0


def enrollment_from_args(args: argparse.Namespace, labels: dict[str, Any] | None) -> Any:
    """The enrollment service of ``--enroll DIR`` (None: not given). Raises HubConfigError."""
    directory = getattr(args, "enroll", None)
    if not directory:
        return None
    from hub.enroll.service import Enrollment

    return Enrollment(Path(directory), known=labels)


def _plain(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, str | int | float | bool)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    )


def worker_app() -> Any:
    """The app of one worker process of ``hub serve --workers``: the API over the shared view
    file, read again every :data:`FOLLOW_EVERY` (uvicorn calls this in the worker)."""
    from agent.report.logs import setup_logging
    from hub.api.http import HeaderTimeoutProtocol

    args = argparse.Namespace(**json.loads(os.environ[SERVE_ENV]))
    setup_logging(
        level=getattr(args, "log_level", None) or "info",
        format=getattr(args, "log_format", None) or "text",
    )
    HeaderTimeoutProtocol.header_timeout = load_bounds(args)[1]
    parts = _Parts(args, follow=True, app=True)
    assert parts.app is not None
    parts.loop.tick()
    parts.app.state.queries.warm()
    parts.loop.start()
    from hub.channel import channel_from_args

    served, watcher = channel_from_args(args, parts.app, parts.fleet, git_credentials())
    if watcher is not None:
        watcher.start()  # this worker's own: one listing a second per worker
    return served


class _Parts:
    """What ``hub serve`` assembles from its options: the status view (refreshed from git,
    or following the shared view file), its refresh loop, the rollouts, the app (``app``)."""

    def __init__(self, args: argparse.Namespace, *, follow: bool, app: bool) -> None:
        from hub.api.app import create_app, load_private_key
        from hub.api.tokens import Tokens, load_tokens

        bounds, _ = load_bounds(args)
        tokens = load_tokens(Path(args.tokens)) if getattr(args, "tokens", None) else Tokens(())
        anonymous = bool(getattr(args, "allow_anonymous", False))
        if not tokens and not anonymous:
            raise ServeUsageError("hub serve needs --tokens FILE (or --allow-anonymous)")
        key_file = getattr(args, "hub_key", None)
        private_key = load_private_key(Path(key_file)) if key_file else None
        fleet_dir = getattr(args, "fleet", None)
        self.fleet = fleet = load_fleet_for_serve(Path(fleet_dir)) if fleet_dir else None
        labels = {c.name: dict(c.labels) for c in fleet.clusters} if fleet is not None else None
        urls = status_urls(
            list(args.repo or []),
            shards=getattr(args, "shards", None)
            or (fleet.settings.shards.count if fleet else None),
            template=fleet.settings.shards.status_repo if fleet is not None else None,
        )
        # Imported here: ``fleetlet --help`` (which registers serve's flags) never loads them.
        from hub.api.metrics import HubMetrics  # prometheus-client only: no web framework
        from hub.status.aggregate import FleetStatus

        cache = getattr(args, "cache_dir", None)
        self.status = status = FleetStatus(
            repo_url=urls,
            credentials=git_credentials(),
            cache_dir=Path(cache) if cache else default_cache_dir(" ".join(urls)),
            stale_after=parse_duration(getattr(args, "stale_after", None) or "5m"),
            follow=follow,
        )
        metrics = HubMetrics()
        self.loop = loop = RefreshLoop(
            status=status,
            interval=FOLLOW_EVERY
            if follow
            else parse_duration(getattr(args, "refresh", None) or "10s"),
            # A process that serves no /metrics (the refreshing one of --workers) does not
            # count the fleet's states after each refresh: a pass over every installation.
            metrics=metrics if app else None,
        )
        self.rollouts = (
            rollout_service(args, Path(fleet_dir), fleet, status, status.cache_dir)
            if fleet is not None and fleet_dir
            else None
        )
        self.app = (
            create_app(
                status=status,
                tokens=tokens,
                private_key=private_key,
                allow_anonymous=anonymous,
                labels=labels,
                metrics=metrics,
                rollouts=self.rollouts,
                bounds=bounds,
                # Enrollment state sits behind a file lock in its directory: safe in every
                # worker process.
                enrollment=enrollment_from_args(args, labels),
            )
            if app
            else None
        )
        rollouts, served = self.rollouts, self.app
        self._labels = labels

        def changed() -> None:
            if served is not None:
                served.state.queries.warm()
            if rollouts is not None and not follow:
                rollouts.poke()  # new reports: a rollout may move

        loop.on_change = changed

    @property
    def queries(self) -> Any:
        """What the alerts read (``--alert-webhook``): the app's, or (``--workers``) the
        refreshing process's own over the same view."""
        if self.app is not None:
            return self.app.state.queries
        from hub.status.queries import StatusQueries

        return StatusQueries(self.status, opener=None, labels=self._labels)


def rollout_service(
    args: argparse.Namespace, fleet_dir: Path, fleet: Any, status: FleetStatus, cache: Path
) -> Any:
    """The rollouts of the fleet for the API, and the controller's loop when the hub can sign
    (``--trust-config`` and ``--identity-token``); None when the cluster-branch repositories
    are unknown (no ``--cluster-repo``, no ``shards.repo``).

    Raises ServeUsageError, PublishError (an unusable trust config).
    """
    from hub.fleet.load import load_fleet
    from hub.fleet.shards import fleet_shards
    from hub.publish.git import BranchStore
    from hub.publish.shards import ShardedStore
    from hub.publish.sign import PublicationSigner
    from hub.rollout.controller import Controller
    from hub.rollout.service import RolloutService

    template = getattr(args, "cluster_repo", None) or fleet.settings.shards.repo
    if not template:
        return None
    shard_map = fleet_shards(fleet)
    if shard_map.count == 1 and "{shard}" not in template:
        urls = {0: template}
    else:
        urls = shard_map.urls(template)
    credentials = git_credentials()
    where = cache / "rollouts"
    sharded = ShardedStore(urls=urls, cache_dir=where / "branches", credentials=credentials)
    reader = BranchStore(url=urls[0], cache_dir=where / "reader.git", credentials=credentials)
    trust_file, token_file = (
        getattr(args, "trust_config", None),
        getattr(args, "identity_token", None),
    )
    if bool(trust_file) != bool(token_file):
        raise ServeUsageError(
            "--trust-config and --identity-token go together: the rollout controller signs "
            "what it publishes"
        )
    signer: Callable[[], PublicationSigner | None] | None = None
    check = None
    if trust_file and token_file:
        from sigstore.models import ClientTrustConfig

        from agent.verify import IdentityPolicy, TrustPolicy

        try:
            trust = ClientTrustConfig.from_json(Path(trust_file).read_text())
        except OSError as exc:
            raise ServeUsageError(f"--trust-config {trust_file}: {exc.strerror}") from exc
        except Exception as exc:  # sigstore/pydantic parse errors
            raise ServeUsageError(f"--trust-config {trust_file}: unusable: {exc}") from exc
        settings = fleet.settings
        if settings.identity and settings.issuer:
            check = TrustPolicy(
                trusted_root=trust.trusted_root,
                identity=IdentityPolicy(issuer=settings.issuer, subject=settings.identity),
            )

        def signer() -> PublicationSigner | None:
            # Read at each step: a projected service-account token is rotated on disk.
            try:
                token = Path(token_file).read_text().strip()
            except OSError as exc:
                raise ServeUsageError(f"--identity-token {token_file}: {exc.strerror}") from exc
            return PublicationSigner.from_trust_config(trust_config=trust, token=token)

    controller = Controller(sharded=sharded, status=status, check=check, progress=log.info)
    return RolloutService(
        controller=controller,
        reader=reader,
        fleet=lambda: load_fleet(fleet_dir),
        signer=signer,
        interval=parse_duration(getattr(args, "rollout_interval", None) or "30s"),
        report=log.info,
    )


def load_bounds(args: argparse.Namespace) -> tuple[Any, float]:
    """(the API's :class:`~hub.api.app.Bounds`, the header timeout in seconds) of ``hub
    serve``'s options. Raises ServeUsageError."""
    from hub.api.app import Bounds

    concurrency = getattr(args, "concurrency", None) or 16
    queue = getattr(args, "queue", None)
    queue = 64 if queue is None else queue
    if concurrency < 1 or queue < 0:
        raise ServeUsageError("--concurrency must be at least 1 and --queue at least 0")
    timeouts = []
    for flag, default in (("request_timeout", "30s"), ("header_timeout", "10s")):
        seconds = parse_duration(getattr(args, flag, None) or default).total_seconds()
        if seconds <= 0:
            raise ServeUsageError(f"--{flag.replace('_', '-')} must be more than 0")
        timeouts.append(seconds)
    return Bounds(concurrency=concurrency, queue=queue, request_timeout=timeouts[0]), timeouts[1]


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
