"""Sensitive output values sealed to the hub's X25519 public key (libsodium sealed boxes).

The agent holds only the hub's public key: it can seal, never open. The hub opens with its
private key. Key files hold the raw 32-byte key in base64 (one line); :func:`generate_keypair`
makes a pair for ``fleetlet hub keygen``. Sealed values are base64 text, as in the status
document's ``{"sealed": ...}``.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

import nacl.exceptions
import nacl.public

from agent.api.status import OutputValue
from agent.errors import PermanentError

KEY_BYTES = 32


class HubKeyError(PermanentError):
    """A hub key (file or text) is not a base64 raw X25519 key, or cannot be read."""

    reason = "HubKeyInvalid"


class SealError(PermanentError):
    """A sealed value cannot be opened (wrong key, damaged or not a sealed box)."""

    reason = "SealedValueInvalid"


def _key_bytes(text: str | bytes, *, what: str) -> bytes:
    raw = text.encode("ascii", "replace") if isinstance(text, str) else text
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HubKeyError(f"{what}: not base64") from exc
    if len(key) != KEY_BYTES:
        raise HubKeyError(f"{what}: expected a {KEY_BYTES}-byte key, got {len(key)} bytes")
    return key


def public_key_from_text(
    text: str | bytes, *, what: str = "hub public key"
) -> nacl.public.PublicKey:
    """The public key in ``text`` (base64 of 32 bytes). Raises HubKeyError."""
    return nacl.public.PublicKey(_key_bytes(text, what=what))


def private_key_from_text(
    text: str | bytes, *, what: str = "hub private key"
) -> nacl.public.PrivateKey:
    """The private key in ``text`` (base64 of 32 bytes). Raises HubKeyError."""
    return nacl.public.PrivateKey(_key_bytes(text, what=what))


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise HubKeyError(f"cannot read hub key file {path}: {exc}") from exc


def read_public_key(path: Path) -> nacl.public.PublicKey:
    """The public key in the file ``path``. Raises HubKeyError."""
    return public_key_from_text(_read(path), what=f"hub public key {path}")


def read_private_key(path: Path) -> nacl.public.PrivateKey:
    """The private key in the file ``path``. Raises HubKeyError."""
    return private_key_from_text(_read(path), what=f"hub private key {path}")


def generate_keypair() -> tuple[str, str]:
    """A new ``(private, public)`` pair, each the base64 text of a key file."""
    private = nacl.public.PrivateKey.generate()
    return (
        base64.b64encode(bytes(private)).decode("ascii"),
        base64.b64encode(bytes(private.public_key)).decode("ascii"),
    )


def write_keypair(private_path: Path, public_path: Path) -> str:
    """Generate a pair into two files (the private one mode 0600); return the public text.

    Raises HubKeyError if a file exists already or cannot be written.
    """
    private, public = generate_keypair()
    try:
        with open(private_path, "x", encoding="ascii") as f:
            Path(private_path).chmod(0o600)
            f.write(private + "\n")
        with open(public_path, "x", encoding="ascii") as f:
            f.write(public + "\n")
    except OSError as exc:
        raise HubKeyError(f"cannot write the hub key pair: {exc}") from exc
    return public


def seal(public_key: nacl.public.PublicKey, value: str) -> str:
    """``value`` (UTF-8) sealed to ``public_key``, as base64 text."""
    box = nacl.public.SealedBox(public_key)
    return base64.b64encode(box.encrypt(value.encode("utf-8"))).decode("ascii")


def open_sealed(private_key: nacl.public.PrivateKey, sealed: str) -> str:
    """The value in ``sealed`` (base64 sealed box), opened with the hub's private key.

    Raises SealError when it was sealed to another key, is damaged, or is not a sealed box.
    """
    try:
        data = base64.b64decode(sealed, validate=True)
        return nacl.public.SealedBox(private_key).decrypt(data).decode("utf-8")
    except (binascii.Error, ValueError, nacl.exceptions.CryptoError) as exc:
        raise SealError(f"cannot open a sealed value: {exc}") from exc


def sensitive_output(
    name: str, value: str, public_key: nacl.public.PublicKey | None
) -> OutputValue:
    """The status document's form of a sensitive output: sealed to the hub's key, or
    ``omitted`` when no hub key is configured. The clear value is never kept."""
    if public_key is None:
        return OutputValue(name=name, omitted=True)
    return OutputValue(name=name, sealed=seal(public_key, value))
