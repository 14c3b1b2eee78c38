"""The agents' notification channel: ``GET /api/v1/clusters/{cluster}/events``, server-sent events.

An agent holds one long-lived request to the hub and is told ``look`` when its cluster branch
moved; it then polls git exactly as it would have anyway. The event carries nothing else: no
commit, no serial, nothing to trust. A forged, replayed or misdirected event costs at most one
extra ``ls-refs``; git stays the only source of truth. Without the channel (hub away, connection
dropped) the agent polls at its normal interval, so no publication is missed.

Why server-sent events rather than long polling or a WebSocket: one response that never ends
is the cheapest thing to hold (no re-request per event, no upgrade, no framing), it crosses
proxies as plain HTTP/1.1, the client is a few lines of ``http.client`` in the agent (no new
dependency), and the ``: ping`` comment every ``keepalive`` seconds lets both ends see a dead
connection. Measured in docs/benchmarks.md ("Notification channel").

How the hub learns of a move: :class:`BranchWatcher` lists the cluster branches
(``refs/heads/fleetlet/clusters/``, one protocol v2 ``ls-refs`` per repository and tick) and
wakes the channels of the clusters whose tip changed. Every ``hub serve`` replica (every
worker process) watches git by itself, so an agent is told whichever replica it is connected
to; there is no broker and nothing shared between replicas.

Authentication: a channel token opens one cluster's channel and nothing else. Channel tokens
live in their own file (``--channel-tokens``), hashed like the API's::

    # fleetlet channel tokens: the SHA-256 of each cluster's token, never the token itself
    channels:
      - cluster: edge-1
        sha256: 3c9f...

They are not API tokens: the rest of the API answers 401 to them, and another cluster's
channel answers 403.

The channel is served by :class:`ChannelApp`, an ASGI layer *in front of* the API application:
its requests never pass the API's middleware (request timeouts, concurrency limits), which
would cut or count connections meant to stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from agent.backoff import Backoff
from agent.errors import FleetletError
from agent.report import trace
from hub.api.tokens import HubConfigError, new_token, token_digest
from hub.serve_options import add_channel_arguments

log = logging.getLogger(__name__)

BRANCH_PREFIX = "refs/heads/fleetlet/clusters/"
EVENTS_PATH = re.compile(r"^/api/v1/clusters/(?P<cluster>[^/]+)/events/?$")
_CLUSTER = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_HEX = re.compile(r"^[0-9a-f]{64}$")
_HEADER = "# fleetlet channel tokens: the SHA-256 of each cluster's token, never the token itself\n"
LOOK = b"event: look\ndata: \n\n"
PING = b": ping\n\n"


# --- tokens ----------------------------------------------------------------------------------


class ChannelTokens:
    """Cluster -> the SHA-256 of its channel token."""

    def __init__(self, digests: dict[str, str]) -> None:
        self._digests = {c: bytes.fromhex(d) for c, d in digests.items()}
        # A lookup by digest (not by token): its timing says nothing about a token, and it
        # keeps a connection's check O(1) with 100,000 clusters.
        self._clusters = {d: c for c, d in self._digests.items()}

    def __len__(self) -> int:
        return len(self._digests)

    def digests(self) -> dict[str, str]:
        return {c: d.hex() for c, d in self._digests.items()}

    def opens(self, token: str, cluster: str) -> bool | None:
        """True: ``token`` is ``cluster``'s; False: it is another cluster's; None: unknown."""
        given = hashlib.sha256(token.encode()).digest()
        own = self._digests.get(cluster)
        if own is not None and hmac.compare_digest(given, own):
            return True
        return False if given in self._clusters else None


def load_channel_tokens(path: Path) -> ChannelTokens:
    """Read a channel tokens file (module docstring). Raises HubConfigError naming the file
    and the entry, never a token."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise HubConfigError(f"channel tokens file {path}: {exc.strerror}") from exc
    except yaml.YAMLError:
        raise HubConfigError(f"channel tokens file {path}: not valid YAML") from None
    entries = data.get("channels") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise HubConfigError(f"channel tokens file {path}: expected `channels:` with a list")
    digests: dict[str, str] = {}
    for i, item in enumerate(entries):
        where = f"channel tokens file {path}: entry {i + 1}"
        if not isinstance(item, dict):
            raise HubConfigError(f"{where}: expected a mapping with cluster and sha256")
        cluster, digest = item.get("cluster"), item.get("sha256")
        if not isinstance(cluster, str) or not _CLUSTER.match(cluster):
            raise HubConfigError(f"{where}: cluster must be a cluster name, got {cluster!r}")
        if not isinstance(digest, str) or not _HEX.match(digest):
            raise HubConfigError(f"{where} ({cluster}): sha256 must be 64 lowercase hex digits")
        if cluster in digests:
            raise HubConfigError(f"{where}: cluster {cluster} has a token already")
        digests[cluster] = digest
    return ChannelTokens(digests)


def write_channel_tokens(path: Path, tokens: dict[str, str]) -> None:
    """Write a channel tokens file for ``{cluster: token}`` (hashed; owner-readable only):
    for programs that make their own tokens, such as the tests."""
    _write(Path(path), {c: token_digest(t) for c, t in tokens.items()})


def add_channel_token(path: Path, cluster: str) -> str:
    """A new random channel token for ``cluster``, its hash added to the file at ``path``
    (created if missing); returns the token, the only time it is seen. Raises HubConfigError
    (a bad cluster name, a cluster that has a token already)."""
    if not _CLUSTER.match(cluster):
        raise HubConfigError(f"cluster {cluster!r}: not a cluster name")
    path = Path(path)
    digests = load_channel_tokens(path).digests() if path.exists() else {}
    if cluster in digests:
        raise HubConfigError(f"channel tokens file {path}: cluster {cluster} has a token already")
    token = new_token()
    _write(path, {**digests, cluster: token_digest(token)})
    return token


def _write(path: Path, digests: dict[str, str]) -> None:
    body = {"channels": [{"cluster": c, "sha256": d} for c, d in digests.items()]}
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(_HEADER + yaml.safe_dump(body, sort_keys=False))
    os.replace(tmp, path)


# --- who is listening ------------------------------------------------------------------------


class _Channel:
    """One open channel: woken for a ``look`` (``look`` set) or a keepalive."""

    __slots__ = ("event", "look")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.look = False


class Listeners:
    """The open channels of this process, by cluster; :meth:`wake` is thread-safe. One task
    wakes them all every ``keepalive`` seconds for a ``: ping`` (not a timer per channel)."""

    def __init__(self, keepalive: float = 15.0) -> None:
        self.keepalive = keepalive
        self._by_cluster: dict[str, set[_Channel]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pinger: asyncio.Task[None] | None = None
        self.told = 0
        """Notifications sent (one per open channel woken)."""

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_cluster.values())

    def add(self, cluster: str) -> _Channel:
        self._loop = asyncio.get_running_loop()
        if self._pinger is None or self._pinger.done():
            self._pinger = self._loop.create_task(self._ping())
        channel = _Channel()
        self._by_cluster.setdefault(cluster, set()).add(channel)
        return channel

    def remove(self, cluster: str, channel: _Channel) -> None:
        found = self._by_cluster.get(cluster)
        if found is not None:
            found.discard(channel)
            if not found:
                del self._by_cluster[cluster]

    def wake(self, clusters: Iterable[str]) -> None:
        """Tell the channels of ``clusters`` to look (from any thread)."""
        loop = self._loop
        if loop is None:
            return  # nobody ever connected
        names = list(clusters)
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is stopping
            loop.call_soon_threadsafe(self._wake, names)

    def _wake(self, clusters: list[str]) -> None:
        for cluster in clusters:
            for channel in self._by_cluster.get(cluster, ()):
                channel.look = True
                channel.event.set()

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(self.keepalive)
            for channels in list(self._by_cluster.values()):
                for channel in channels:
                    channel.event.set()


# --- the ASGI layer --------------------------------------------------------------------------


class ChannelApp:
    """``GET /api/v1/clusters/{cluster}/events`` for agents; everything else goes to ``inner``."""

    def __init__(
        self,
        inner: Any,
        *,
        tokens: ChannelTokens,
        listeners: Listeners,
        limit: int = 50_000,
    ) -> None:
        self.inner = inner
        self.tokens = tokens
        self.listeners = listeners
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        match = EVENTS_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None:
            await self.inner(scope, receive, send)
            return
        cluster = match["cluster"]
        if scope["method"] not in ("GET", "HEAD"):
            await _refuse(send, 405, f"method {scope['method']} not allowed on the channel")
            return
        token = _bearer(scope)
        verdict = self.tokens.opens(token, cluster) if token else None
        if verdict is None:
            await _refuse(send, 401, "missing or unknown channel token")
            return
        if not verdict:
            await _refuse(send, 403, f"this token opens another cluster's channel, not {cluster}")
            return
        if len(self.listeners) >= self.limit:
            await _refuse(send, 503, "too many open channels here: poll, retry later", retry=30)
            return
        await self._stream(cluster, receive, send)

    async def _stream(self, cluster: str, receive: Any, send: Any) -> None:
        channel = self.listeners.add(cluster)
        gone = asyncio.ensure_future(_disconnected(receive))
        gone.add_done_callback(lambda _: channel.event.set())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream"),
                        (b"cache-control", b"no-store"),
                        (b"x-accel-buffering", b"no"),  # nginx: pass each event at once
                        (b"x-content-type-options", b"nosniff"),
                    ],
                }
            )
            # The first message says the channel is up (the agent polls once: it may have
            # missed a move while it was not connected).
            await send({"type": "http.response.body", "body": PING, "more_body": True})
            while True:
                await channel.event.wait()
                channel.event.clear()
                if gone.done():
                    break
                body = LOOK if channel.look else PING
                channel.look = False
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if body is LOOK:
                    self.listeners.told += 1
                    trace.mark("hub:told", cluster)
        except OSError:
            pass  # the agent went away mid-send
        finally:
            gone.cancel()
            self.listeners.remove(cluster, channel)


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _bearer(scope: Any) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


async def _refuse(send: Any, status: int, message: str, *, retry: int | None = None) -> None:
    import json

    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="fleetlet-channel"'))
    if retry is not None:
        headers.append((b"retry-after", b"%d" % retry))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- learning of a move from git -------------------------------------------------------------


class BranchWatcher:
    """Lists the cluster branches of ``urls`` every ``interval`` seconds (a thread) and calls
    ``moved(clusters)`` with the clusters whose branch tip changed since the last listing.

    The first listing only sets what is known. A failed listing is logged and retried with
    backoff; what was known stays, so a move during the outage is told at the next success.
    :meth:`poke` lists at once: this hub published (a rollout step), its own listing says which
    branches moved without waiting for the next tick.
    """

    def __init__(
        self,
        *,
        urls: list[str],
        moved: Callable[[list[str]], None],
        interval: float = 1.0,
        credentials: tuple[str, str] | None = None,
        lister: Callable[[str], dict[str, str]] | None = None,
    ) -> None:
        self.urls = urls
        self.moved = moved
        self.interval = interval
        self.credentials = credentials
        self.lister = lister or self._list
        self.tips: dict[str, str] | None = None
        self.listings = 0
        self._backoff = Backoff(initial=interval, maximum=max(interval, 60.0))
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="channel-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poked.set()
        self._thread.join(timeout=10)

    def poke(self, _clusters: object = None) -> None:
        """List now rather than at the next tick (from any thread)."""
        self._poked.set()

    def tick(self) -> list[str]:
        """One listing of every repository; returns the clusters told. Raises FleetletError."""
        tips: dict[str, str] = {}
        for url in self.urls:
            for ref, commit in self.lister(url).items():
                if ref.startswith(BRANCH_PREFIX):
                    tips[ref[len(BRANCH_PREFIX) :]] = commit
        self.listings += 1
        known, self.tips = self.tips, tips
        if known is None:
            return []
        changed = sorted(c for c, tip in tips.items() if known.get(c) != tip)
        if changed and trace.enabled():
            for cluster in changed:
                trace.mark("hub:noticed", cluster)
        if changed:
            self.moved(changed)
        return changed

    def _run(self) -> None:
        wait = 0.0
        while True:
            self._poked.wait(wait)
            self._poked.clear()
            if self._stop.is_set():
                return
            started = time.monotonic()
            try:
                self.tick()
            except FleetletError as exc:
                wait = self._backoff.failure()
                log.warning("channel: listing the cluster branches failed (retry in %.0fs): %s",
                            wait, exc)  # fmt: skip
                continue
            self._backoff.reset()
            wait = max(0.0, self.interval - (time.monotonic() - started))

    def _list(self, url: str) -> dict[str, str]:
        from agent.source.credentials import GitCredentials
        from agent.source.lsrefs import NotProtocolV2, ls_refs_v2

        user_password = self.credentials
        credentials = (
            GitCredentials(username=user_password[0], password=user_password[1])
            if user_password
            else None
        )
        try:
            return ls_refs_v2(url, BRANCH_PREFIX, credentials, connect_timeout=5, io_timeout=20)
        except NotProtocolV2:
            from hub.publish.git import BranchStore

            with BranchStore(url=url, credentials=user_password) as store:
                return store.list_refs()


# --- hub serve -------------------------------------------------------------------------------


def channel_from_args(
    args: Any, app: Any, fleet: Any, credentials: tuple[str, str] | None
) -> tuple[Any, BranchWatcher | None]:
    """``app`` with the channel in front of it and the watcher to start, or ``(app, None)``
    without ``--channel-tokens``. Raises HubConfigError, ServeUsageError."""
    from hub.serve import ServeUsageError, parse_duration

    path = getattr(args, "channel_tokens", None)
    if not path:
        return app, None
    tokens = load_channel_tokens(Path(path))
    urls = channel_urls(args, fleet)
    if not urls:
        raise ServeUsageError(
            "--channel-tokens needs the cluster-branch repository: --channel-repo, "
            "--cluster-repo or --fleet with shards.repo"
        )
    listeners = Listeners(keepalive=parse_duration(args.channel_keepalive).total_seconds())
    watcher = BranchWatcher(
        urls=urls,
        moved=listeners.wake,
        interval=parse_duration(args.channel_watch).total_seconds(),
        credentials=credentials,
    )
    with contextlib.suppress(AttributeError):
        add_to_openapi(app.state.openapi)  # the API's document lists the events path
    served = ChannelApp(
        app,
        tokens=tokens,
        listeners=listeners,
    )
    log.info("channel: %d clusters may connect; watching %s", len(tokens), ", ".join(urls))
    return served, watcher


def add_to_openapi(document: dict[str, Any]) -> None:
    """The channel's path and its token scheme in the API's OpenAPI ``document`` (in place):
    a stream, not JSON, served in front of the API app."""
    error = {"$ref": "#/components/schemas/Error"}
    answers = {
        "401": "missing or unknown channel token (API tokens do not open a channel)",
        "403": "this token opens another cluster's channel",
        "405": "not GET",
        "503": "too many open channels on this hub: poll, retry after `Retry-After`",
    }
    document["components"]["securitySchemes"]["channelToken"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a cluster's channel token (`fleetlet hub channel-token add`): opens "
        "that cluster's events and nothing else",
    }
    document["paths"]["/api/v1/clusters/{cluster}/events"] = {
        "get": {
            "summary": "Notification channel",
            "operationId": "notification_channel",
            "description": "Server-sent events for one cluster's agent, held open: `event: look` "
            "when the cluster's branch moved (the agent then lists its branch in git; the event "
            "carries nothing else and is never trusted), a `: ping` comment when idle (every "
            "`--channel-keepalive`). Needs that cluster's channel token.",
            "security": [{"channelToken": []}],
            "parameters": [
                {"name": "cluster", "in": "path", "required": True,
                 "description": "the cluster", "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {
                    "description": "the stream (`event: look`, `: ping`), until either side "
                    "closes it",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **{
                    code: {"description": text, "content": {"application/json": {"schema": error}}}
                    for code, text in answers.items()
                },
            },
        }
    }  # fmt: skip


def channel_urls(args: Any, fleet: Any) -> list[str]:
    """The repositories whose cluster branches the channel watches (each shard's)."""
    given = list(getattr(args, "channel_repo", None) or [])
    if not given:
        template = getattr(args, "cluster_repo", None) or (
            fleet.settings.shards.repo if fleet is not None else None
        )
        given = [template] if template else []
    urls: list[str] = []
    for url in given:
        if "{shard}" in url:
            count = fleet.settings.shards.count if fleet is not None else 0
            if not count:
                from hub.serve import ServeUsageError

                raise ServeUsageError(f"--channel-repo {url}: a {{shard}} template needs --fleet")
            urls += [url.replace("{shard}", str(i)) for i in range(count)]
        else:
            urls.append(url)
    return urls


__all__ = [
    "BranchWatcher",
    "ChannelApp",
    "ChannelTokens",
    "Listeners",
    "add_channel_arguments",
    "add_channel_token",
    "channel_from_args",
    "load_channel_tokens",
    "write_channel_tokens",
]
