"""pkt-line framing, the one reader of the agent's ref listing and the hub's push and fetch:
what a server may send, and what a broken or hostile one gets."""

from __future__ import annotations

import io

import pytest

from agent.source.pktline import PktLineError, PktReader, pkt


def reader(data: bytes, *, limit: int | None = None, chunk: int = 3) -> PktReader:
    # Reads return at most ``chunk`` bytes, as a socket's recv may.
    stream = io.BytesIO(data)
    return PktReader(lambda size: stream.read(min(size, chunk)), limit=limit)


def test_lines_sections_flushes_and_delimiters() -> None:
    data = pkt(b"version 2\n") + pkt(b"ls-refs\n") + b"0000" + pkt(b"a\n") + b"0001" + pkt(b"b\n")
    r = reader(data + b"0002")
    assert r.section() == [b"version 2\n", b"ls-refs\n"]
    assert r.section() == [b"a\n"]
    assert r.line() == b"b\n"
    assert r.line() == b""  # response end
    assert pkt(b"") == b"0004"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"00", "closed the connection mid-answer"),
        (b"0009ab", "closed the connection mid-answer"),
        (b"zzzz", "bad pkt-line length b'zzzz'"),
        (b"0003", "bad pkt-line length 3"),
        (b"fff1" + b"x" * 10, "bad pkt-line length 65521"),
        (pkt(b"ERR access denied\n"), "the git server says: access denied"),
    ],
)
def test_a_broken_answer_is_one_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(PktLineError, match=message):
        reader(data).section()


def test_the_limit_bounds_what_is_read_over_the_readers_life() -> None:
    r = reader(pkt(b"x" * 20) * 3, limit=50)
    assert r.line() == b"x" * 20
    assert r.line() == b"x" * 20
    with pytest.raises(PktLineError, match="larger than 50 bytes"):
        r.line()
