"""Is this text a pin? The one check of digests, commit ids and sha256 hashes.

The patterns are the API's own (:mod:`agent.api.models`, also in the CRD schemas); matched
whole (a trailing newline is not a pin), for any value (anything else is not a pin).
"""

from __future__ import annotations

import functools
import re


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """The API's patterns of a digest, a commit and a sha256, compiled on first use (so that
    reading a bundle tree does not import every API type)."""
    from agent.api.models import COMMIT, DIGEST, SHA256_HEX

    return re.compile(DIGEST), re.compile(COMMIT), re.compile(SHA256_HEX)


def is_digest(value: object) -> bool:
    """``sha256:<64 lower-case hex>`` (an OCI manifest or blob digest)."""
    return isinstance(value, str) and _patterns()[0].fullmatch(value) is not None


def is_commit(value: object) -> bool:
    """A full git commit id (40 lower-case hex)."""
    return isinstance(value, str) and _patterns()[1].fullmatch(value) is not None


def is_sha256_hex(value: object) -> bool:
    """A sha256 in hex (64 lower-case hex), as an http source's pin."""
    return isinstance(value, str) and _patterns()[2].fullmatch(value) is not None


__all__ = ["is_commit", "is_digest", "is_sha256_hex"]
