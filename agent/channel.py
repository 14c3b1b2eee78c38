"""The agent's end of the hub's notification channel (``agent run --notify-url``).

One thread holds ``GET {hub}/api/v1/clusters/{cluster}/events`` (server-sent events, see
:mod:`hub.channel`) with the cluster's channel token. Each ``look`` event, and each
(re)connection (a move may have happened while it was down), calls ``look()``: the scheduler
polls git at once, as it would at its next tick. Nothing in an event is read or trusted; a
forged or replayed one costs one ``ls-refs``.

While the channel is up the poll job runs only every ``--notify-poll-interval``; when it is down
(the hub away, the connection dropped or silent for three keepalives) the agent polls at its
``--interval`` again and reconnects with backoff and jitter, so no publication is missed.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import random
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit

from agent.backoff import Backoff
from agent.report import trace

log = logging.getLogger(__name__)


class ChannelRefused(Exception):
    """The hub answered, but not with a channel (a bad token, another cluster's, too many)."""


class NotifyChannel:
    """Holds the channel in a daemon thread until :meth:`stop`; see the module docstring."""

    def __init__(
        self,
        *,
        url: str,
        cluster: str,
        token_file: Path | None,
        look: Callable[[], None],
        connect_timeout: float = 10.0,
        silence: float = 60.0,
        initial_backoff: float = 1.0,
        max_backoff: float = 300.0,
        on_change: Callable[[bool], None] | None = None,
        on_event: Callable[[], None] | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        """``url``: the hub's base URL (http or https); ``silence``: a channel quiet for this
        long is dropped (the hub sends a comment every 15 s by default)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"notify url {url!r}: expected http(s)://HOST[:PORT][/PATH]")
        self.url = url
        self._parts = parts
        self.path = f"{parts.path.rstrip('/')}/api/v1/clusters/{quote(cluster, safe='')}/events"
        self.token_file = token_file
        self.look = look
        self.connect_timeout = connect_timeout
        self.silence = silence
        self.on_change = on_change
        self.on_event = on_event
        self._backoff = Backoff(initial=initial_backoff, maximum=max_backoff)
        self._rng = rng
        self._up = False
        self.connections = 0
        self.events = 0
        self._stop = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name="notify-channel", daemon=True)

    @property
    def up(self) -> bool:
        """Whether the channel is connected now."""
        return self._up

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(2)  # unblocks the read
        self._thread.join(timeout=5)

    def _set(self, up: bool) -> None:
        if up != self._up:
            self._up = up
            if self.on_change is not None:
                self.on_change(up)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._hold()
                problem = "the hub closed the channel"
            except (OSError, http.client.HTTPException, ChannelRefused) as exc:
                problem = str(exc) or type(exc).__name__
            self._set(False)
            if self._stop.is_set():
                return
            wait = self._backoff.failure()
            wait += wait * 0.5 * self._rng()  # agents cut off together do not return together
            log.warning(
                "notify channel down (%s): polling at the normal interval; reconnecting in %.1f s",
                problem,
                wait,
            )
            self._stop.wait(wait)

    def _hold(self) -> None:
        """One connection, read until it ends. Raises OSError, HTTPException, ChannelRefused."""
        parts = self._parts
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        conn = kind(parts.hostname or "", parts.port, timeout=self.connect_timeout)
        self._conn = conn
        try:
            headers = {"Accept": "text/event-stream", "User-Agent": "fleetlet-agent"}
            token = self._token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            conn.request("GET", self.path, headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                body = response.read(300).decode("utf-8", errors="replace").strip()
                raise ChannelRefused(f"{self.url}: HTTP {response.status}: {body}")
            if conn.sock is not None:
                conn.sock.settimeout(self.silence)
            self.connections += 1
            self._backoff.reset()
            log.info("notify channel up: %s%s", self.url.rstrip("/"), self.path)
            self._set(True)
            self.look()  # a move may have happened while the channel was down
            event = ""
            while not self._stop.is_set():
                line = response.readline(4096)
                if not line:
                    return
                text = line.decode("utf-8", errors="replace").rstrip("\r\n")
                if text.startswith("event:"):
                    event = text[6:].strip()
                elif not text:
                    if event == "look":
                        trace.mark("agent:told")
                        self.events += 1
                        if self.on_event is not None:
                            self.on_event()
                        self.look()
                    event = ""
        finally:
            self._conn = None
            conn.close()

    def _token(self) -> str:
        if self.token_file is None:
            return ""
        try:
            return self.token_file.read_text().strip()  # read each time: it may be rotated
        except OSError as exc:
            raise ChannelRefused(f"--notify-token-file {self.token_file}: {exc.strerror}") from exc


__all__ = ["ChannelRefused", "NotifyChannel"]
