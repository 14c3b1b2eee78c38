"""Sensitive output values sealed to the hub's X25519 key, bound to their place and to their
sender.

The agent holds the hub's public key: it can seal, never open. A sealed value is an AEAD box
(XChaCha20-Poly1305, libsodium) under the X25519 key shared by a sender key and the hub's key,
with the value's place as authenticated associated data: its cluster, bundle, output name and
run (:class:`OutputPlace`). A box replayed under another cluster, bundle, output or run does
not open there.

The sender key tells the hub who sealed it. An agent given its **sealing key** seals with it:
the key is derived from the hub's private key and the cluster's name
(:func:`agent_sealing_key`, issued with ``fleetlet hub agent-key``), so the hub knows every
agent's public key without a registry, and a box whose sender is that cluster's key can only
have been made by the holder of that key (or by the hub). Without one, the agent seals with a
fresh key each time: still bound to its place, but anybody holding the hub's public key could
have made it, and the hub says so (:attr:`OpenedOutput.from_agent`).

Key files hold the raw 32-byte key in base64 (one line); :func:`generate_keypair` makes a pair.
A sealed value is base64 text: version byte 2, the sender's public key (32 bytes), the nonce
(24 bytes), then the ciphertext with its 16-byte tag.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path

import nacl.bindings
import nacl.exceptions
import nacl.public
import nacl.utils

from agent.api.status import OutputValue
from agent.errors import PermanentError

KEY_BYTES = 32
SEAL_VERSION = 2
_NONCE_BYTES = 24
_TAG_BYTES = 16
_HEADER_BYTES = 1 + KEY_BYTES + _NONCE_BYTES
_AGENT_KEY_LABEL = b"fleetlet.io/agent-sealing-key/v1"
_PLACE_LABEL = "fleetlet.io/sealed-output/v2"


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
        raise HubKeyError(f"cannot read key file {path}: {exc}") from exc


def read_public_key(path: Path) -> nacl.public.PublicKey:
    """The public key in the file ``path``. Raises HubKeyError."""
    return public_key_from_text(_read(path), what=f"hub public key {path}")


def read_private_key(path: Path, *, what: str = "hub private key") -> nacl.public.PrivateKey:
    """The private key in the file ``path`` (``what`` names it in errors). Raises
    HubKeyError."""
    return private_key_from_text(_read(path), what=f"{what} {path}")


def key_text(key: nacl.public.PrivateKey | nacl.public.PublicKey) -> str:
    """The base64 text of a key file."""
    return base64.b64encode(bytes(key)).decode("ascii")


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


@dataclass(frozen=True, kw_only=True)
class OutputPlace:
    """Where a sealed value belongs: the box opens only for the same place."""

    cluster: str
    bundle: str
    output: str
    run: str

    def associated_data(self) -> bytes:
        """The authenticated associated data of the box: canonical JSON of the place."""
        return json.dumps(
            {
                "bundle": self.bundle,
                "cluster": self.cluster,
                "kind": _PLACE_LABEL,
                "output": self.output,
                "run": self.run,
            },
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
        ).encode("ascii")


@dataclass(frozen=True, kw_only=True)
class OpenedOutput:
    """A value opened by the hub: ``from_agent`` when the sender is the cluster's own sealing
    key, False when anybody holding the hub's public key could have sealed it."""

    value: str
    from_agent: bool

    def __repr__(self) -> str:
        return f"OpenedOutput(value=<hidden>, from_agent={self.from_agent})"


def agent_sealing_key(hub_private: nacl.public.PrivateKey, cluster: str) -> nacl.public.PrivateKey:
    """The sealing key of ``cluster``'s agent: HKDF-SHA256 of the hub's private key, with the
    cluster's name as context. The hub can always compute it again: it stores nothing."""
    prk = hmac.new(_AGENT_KEY_LABEL, bytes(hub_private), hashlib.sha256).digest()
    okm = hmac.new(prk, cluster.encode("utf-8") + b"\x01", hashlib.sha256).digest()
    return nacl.public.PrivateKey(okm)


def seal(
    hub_key: nacl.public.PublicKey,
    value: str,
    *,
    place: OutputPlace,
    sender: nacl.public.PrivateKey | None = None,
) -> str:
    """``value`` (UTF-8) sealed to ``hub_key`` for ``place``, as base64 text; ``sender`` is
    the agent's sealing key (None: a fresh key, and the hub cannot tell who sealed it)."""
    key_pair = sender or nacl.public.PrivateKey.generate()
    shared = nacl.public.Box(key_pair, hub_key).shared_key()
    nonce = nacl.utils.random(_NONCE_BYTES)
    box = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(
        value.encode("utf-8"), place.associated_data(), nonce, shared
    )
    data = bytes([SEAL_VERSION]) + bytes(key_pair.public_key) + nonce + box
    return base64.b64encode(data).decode("ascii")


def open_sealed(
    hub_private: nacl.public.PrivateKey, sealed: str, *, place: OutputPlace
) -> OpenedOutput:
    """The value in ``sealed``, opened with the hub's private key for ``place``, and whether
    ``place.cluster``'s agent sealed it.

    Raises SealError when it was sealed for another place or to another key, is damaged, or is
    not a sealed value of this version (an unbound one of an older agent included).
    """
    try:
        data = base64.b64decode(sealed, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SealError("a sealed value is not base64") from exc
    if len(data) < _HEADER_BYTES + _TAG_BYTES or data[0] != SEAL_VERSION:
        raise SealError(
            f"not a sealed value of version {SEAL_VERSION} (bound to its place): refused"
        )
    sender = data[1 : 1 + KEY_BYTES]
    nonce = data[1 + KEY_BYTES : _HEADER_BYTES]
    try:
        shared = nacl.public.Box(hub_private, nacl.public.PublicKey(sender)).shared_key()
        clear = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(
            data[_HEADER_BYTES:], place.associated_data(), nonce, shared
        )
        value = clear.decode("utf-8")
    except (nacl.exceptions.CryptoError, ValueError) as exc:
        raise SealError(
            f"does not open as output {place.output} of {place.cluster}/{place.bundle} run "
            f"{place.run}: sealed for another place or to another key, or damaged"
        ) from exc
    expected = bytes(agent_sealing_key(hub_private, place.cluster).public_key)
    return OpenedOutput(value=value, from_agent=hmac.compare_digest(sender, expected))


def sensitive_output(
    value: str,
    public_key: nacl.public.PublicKey | None,
    *,
    place: OutputPlace,
    sender: nacl.public.PrivateKey | None = None,
) -> OutputValue:
    """The status document's form of a sensitive output: sealed to the hub's key for
    ``place`` (by ``sender``), or ``omitted`` when no hub key is configured. The clear value is
    never kept."""
    if public_key is None:
        return OutputValue(name=place.output, omitted=True)
    return OutputValue(
        name=place.output, sealed=seal(public_key, value, place=place, sender=sender)
    )
