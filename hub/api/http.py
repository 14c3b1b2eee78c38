"""The hub's HTTP server protocol: uvicorn's h11 protocol with a deadline for a request's
headers.

uvicorn closes a keep-alive connection that stays idle (``timeout_keep_alive``), but a client
that opens a connection and sends its headers a byte at a time (slowloris) is never cut off:
there is no timer before the first byte, and each byte stops the keep-alive timer. Here a
connection has :attr:`HeaderTimeoutProtocol.header_timeout` seconds, from the moment it opens
(or its previous answer was sent), to complete a request's headers, however slowly they come;
past it the server answers 408 and closes the connection, as nginx's ``client_header_timeout``
does. Given to uvicorn by name, ``Config(http="hub.api.http:HeaderTimeoutProtocol")`` (worker
processes import it); ``hub serve --header-timeout`` sets the class's ``header_timeout``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 10.0
_BODY = b'{"error": "the request headers took too long to come"}'
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)


class HeaderTimeoutProtocol(H11Protocol):
    """:class:`H11Protocol` with a deadline for each request's headers (see the module)."""

    header_timeout = HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:  # a request's headers are complete: it is being answered
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers have the same time

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered (its headers came in time)
        if not self.transport.is_closing():
            self.transport.write(_TIMED_OUT)
            self.transport.close()
