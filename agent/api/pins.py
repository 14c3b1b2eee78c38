"""Is this text a pin? The one check of digests, commit ids and sha256 hashes.

The patterns are the API's own (:mod:`agent.api.models`, also in the CRD schemas); matched
whole (a trailing newline is not a pin), for any value (anything else is not a pin).
"""

from __future__ import annotations

import re

from agent.api.models import COMMIT, DIGEST, SHA256_HEX

_DIGEST = re.compile(DIGEST)
_COMMIT = re.compile(COMMIT)
_SHA256_HEX = re.compile(SHA256_HEX)


def is_digest(value: object) -> bool:
    """``sha256:<64 lower-case hex>`` (an OCI manifest or blob digest)."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def is_commit(value: object) -> bool:
    """A full git commit id (40 lower-case hex)."""
    return isinstance(value, str) and _COMMIT.fullmatch(value) is not None


def is_sha256_hex(value: object) -> bool:
    """A sha256 in hex (64 lower-case hex), as an http source's pin."""
    return isinstance(value, str) and _SHA256_HEX.fullmatch(value) is not None


__all__ = ["is_commit", "is_digest", "is_sha256_hex"]
