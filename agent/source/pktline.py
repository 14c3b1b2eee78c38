"""pkt-lines, the framing of git's wire protocol (``gitprotocol-common``): four hex digits of
length, then the payload; ``0000`` flush, ``0001`` delimiter, ``0002`` response end.

One reader for the three clients that speak it: the agent's protocol v2 ref listing
(:mod:`agent.source.lsrefs`), the hub's push (``hub.publish.sendpack``) and its status fetch
(``hub.status.fetch``).
"""

from __future__ import annotations

from collections.abc import Callable

MAX_LENGTH = 65520
"""The largest pkt-line git sends, its four length digits included."""
FLUSH = b"0000"
DELIMITER = b"0001"


class PktLineError(ValueError):
    """The server's answer is not pkt-line framing, ended early, went over the reader's
    limit, or is an ``ERR`` line (the message says which). Each client converts it, with the
    server's address, into its own transport error."""


def pkt(data: bytes) -> bytes:
    """``data`` framed as one pkt-line."""
    return b"%04x" % (len(data) + 4) + data


class PktReader:
    """Reads pkt-lines from ``read(size)`` (a socket's ``recv``, a stream's ``read``: either
    may return fewer bytes than asked; empty or None is the end of the answer).

    ``limit`` bounds the bytes read over the reader's life (None: unbounded)."""

    def __init__(self, read: Callable[[int], bytes | None], *, limit: int | None = None) -> None:
        self._read = read
        self._limit = limit
        self._total = 0

    def exactly(self, size: int) -> bytes:
        """The next ``size`` bytes. Raises PktLineError if the answer ends first or the limit
        is passed."""
        if self._limit is not None and self._total + size > self._limit:
            raise PktLineError(f"the git server's answer is larger than {self._limit} bytes")
        chunks: list[bytes] = []
        left = size
        while left:
            chunk = self._read(left)
            if not chunk:
                raise PktLineError("the git server closed the connection mid-answer")
            chunks.append(chunk)
            left -= len(chunk)
        self._total += size
        return b"".join(chunks)

    def line(self) -> bytes | None:
        """The next line's payload: None for a flush, ``b""`` for a delimiter or a response
        end. Raises PktLineError for a bad length or an ``ERR`` line."""
        digits = self.exactly(4)
        try:
            length = int(digits, 16)
        except ValueError:
            raise PktLineError(f"the git server sent a bad pkt-line length {digits!r}") from None
        if length == 0:
            return None
        if length in (1, 2):
            return b""
        if length < 4 or length > MAX_LENGTH:
            raise PktLineError(f"the git server sent a bad pkt-line length {length}")
        payload = self.exactly(length - 4)
        if payload.startswith(b"ERR "):
            message = payload[4:].decode(errors="replace").strip()
            raise PktLineError(f"the git server says: {message}")
        return payload

    def skip_section(self) -> None:
        """Read past the lines up to the next flush, delimiter or response end, keeping none
        (a receive-pack advertisement of 100,000 refs the client does not need)."""
        exactly = self.exactly
        while True:
            digits = exactly(4)
            try:
                length = int(digits, 16)
            except ValueError:
                raise PktLineError(
                    f"the git server sent a bad pkt-line length {digits!r}"
                ) from None
            if length in (0, 1, 2):
                return
            if length < 4 or length > MAX_LENGTH:
                raise PktLineError(f"the git server sent a bad pkt-line length {length}")
            exactly(length - 4)

    def section(self) -> list[bytes]:
        """The lines up to the next flush, delimiter or response end (not included)."""
        lines: list[bytes] = []
        while line := self.line():
            lines.append(line)
        return lines


__all__ = ["DELIMITER", "FLUSH", "MAX_LENGTH", "PktLineError", "PktReader", "pkt"]
