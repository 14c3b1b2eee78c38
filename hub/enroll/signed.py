"""A request signed by the cluster's own key, fresh and seen once: what :meth:`Enrollment.submit`
checks before it reads anything else of a request.

The agent signs the exact bytes of its request body (:func:`agent.install.enroll.signed_request`)
with the Ed25519 key it made in the cluster; the body carries the key's public part, a random
nonce and the time. So:

- a body edited in flight (a label added, the name or the key swapped) does not verify: 401;
- a body sent again is refused: its time is outside the hub's window (``MAX_SKEW`` either way),
  or, within the window, its nonce was seen (one empty file per nonce under ``nonces/<slot>``,
  created exclusively, the slots older than the window removed as time goes): 409.

Whoever holds the token can still sign a request of their own with a key of their own: the
token, its scope and its policy are what admit that; the signature binds what was admitted to
the key the credentials are sealed to.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing

from agent.install.enroll import SIGNED_CONTEXT
from hub.enroll.refused import EnrollRefused

MAX_SKEW = 300
"""Seconds a request's ``issuedAt`` may differ from the hub's clock, either way."""
NONCES_DIR = "nonces"
_NONCE = re.compile(r"^[0-9a-f]{32,64}$")
_SLOT = 600


def verified_body(raw: bytes, signature: str, *, path: str, now: float | None = None) -> Any:
    """The JSON body, once its signature by its own ``publicKey`` verifies and its ``issuedAt``
    is within the window. Raises EnrollRefused (400 malformed, 401 not signed or stale)."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise EnrollRefused(400, "the body must be JSON") from None
    if not isinstance(body, dict):
        raise EnrollRefused(400, "the body must be a JSON object")
    key = _public_key(body.get("publicKey"))
    try:
        sig = base64.b64decode(signature, validate=True)
        key.verify(SIGNED_CONTEXT + f"POST {path}\n".encode() + raw, sig)
    except (binascii.Error, ValueError, nacl.exceptions.BadSignatureError):
        raise EnrollRefused(
            401,
            "the request's signature does not verify with its publicKey "
            "(no Fleetlet-Signature, or the request was edited in flight)",
        ) from None
    issued = body.get("issuedAt")
    try:
        at = datetime.strptime(str(issued), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise EnrollRefused(400, f"issuedAt must be a UTC time (…Z), got {issued!r}") from None
    if abs((time.time() if now is None else now) - at) > MAX_SKEW:
        raise EnrollRefused(
            401,
            f"the request was issued at {issued}, outside the hub's window of {MAX_SKEW} s "
            "(a replayed request, or the cluster's clock is off)",
        )
    if not isinstance(body.get("nonce"), str) or not _NONCE.match(body["nonce"]):
        raise EnrollRefused(400, "nonce must be 32 to 64 lowercase hex digits")
    return body


def _public_key(value: Any) -> nacl.signing.VerifyKey:
    try:
        raw = base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise EnrollRefused(400, "publicKey must be an Ed25519 public key (32 bytes, base64)")
    return nacl.signing.VerifyKey(raw)


def claim_nonce(directory: Path, nonce: str, issued_at: str, *, now: float | None = None) -> None:
    """Record ``nonce`` as seen. Raises EnrollRefused (409) when it was seen already."""
    at = datetime.strptime(issued_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    root = Path(directory) / NONCES_DIR
    slot = root / str(int(at) // _SLOT)
    slot.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(slot / nonce, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise EnrollRefused(
            409, f"this request was received already (nonce {nonce}): a replay is refused"
        ) from None
    # Slots whose requests are all out of the window now: their nonces can never come back.
    oldest = int((time.time() if now is None else now) - MAX_SKEW) // _SLOT - 1
    for old in root.iterdir():
        if old.name.isdigit() and int(old.name) < oldest:
            with contextlib.suppress(OSError):
                shutil.rmtree(old)
