"""The agent's probe server: ``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP.

- ``/healthz``: the poll loop is alive: a tick started within a few intervals (the longest
  backoff counts as an interval: an agent waiting out a git outage is alive).
- ``/readyz``: the agent has completed a tick since it started (its state was read from the
  cluster and its accepted set, if any, reconciled once).

A ``ThreadingHTTPServer`` from the standard library: two fixed answers need no framework.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.report.metrics import Metrics


class _Ticking(Protocol):
    ticks: int
    last: Any


class _Polling(Protocol):
    interval: float

    @property
    def running(self) -> bool: ...


class ProbeServer:
    """Serves the probes on ``address`` (``HOST:PORT``, ``:PORT`` for all interfaces)."""

    def __init__(
        self,
        address: str,
        *,
        agent: _Ticking,
        poller: _Polling,
        max_backoff: float = 300.0,
        metrics: Metrics | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self._agent = agent
        self._metrics = metrics
        self._poller = poller
        self._started = time.monotonic()
        self._last_ticks = -1
        self._last_change = self._started
        self._grace = 3 * max(poller.interval, max_backoff)
        probe = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                content_type = "text/plain; charset=utf-8"
                if self.path.partition("?")[0] == "/metrics" and probe._metrics is not None:
                    code, body = 200, probe._metrics.exposition()
                    content_type = probe._metrics.content_type
                else:
                    code, text = probe.answer(self.path)
                    body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds would drown the agent's own log

        self._server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="probes", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def answer(self, path: str) -> tuple[int, str]:
        """The status code and text of a probe."""
        now = time.monotonic()
        ticks = self._agent.ticks
        if ticks != self._last_ticks:
            self._last_ticks, self._last_change = ticks, now
        if path == "/healthz":
            if not self._poller.running:
                return 503, "poll loop stopped\n"
            if now - self._last_change > self._grace:
                return 503, f"no reconcile started for {now - self._last_change:.0f}s\n"
            return 200, "ok\n"
        if path == "/readyz":
            if self._agent.last is None:
                return 503, "first reconcile not finished\n"
            return 200, "ok\n"
        return 404, "not found\n"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
