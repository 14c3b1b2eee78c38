"""Durations as the fleet repo writes them: ``7d``, ``36h``, ``1h30m``, ``90s``."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: object) -> timedelta | None:
    """``"7d"``, ``"36h"``, ``"1h30m"``, ``"90s"`` -> timedelta; None if malformed or zero."""
    if not isinstance(text, str) or not text:
        return None
    m = _DURATION.match(text)
    if not m:
        return None
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    delta = timedelta(days=d, hours=h, minutes=mi, seconds=s)
    return delta if delta > timedelta(0) else None


def format_duration(delta: timedelta) -> str:
    """The shortest text :func:`parse_duration` reads back as ``delta`` (whole seconds)."""
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"
