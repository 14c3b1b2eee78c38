"""Key helpers shared by the mini Sigstore's services (all keys are ECDSA, as sigstore wants)."""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec


def new_p256_key() -> ec.EllipticCurvePrivateKey:
    """Return a fresh P-256 key (logs, CT log, token minter)."""
    return ec.generate_private_key(ec.SECP256R1())


def spki_der(key: ec.EllipticCurvePublicKey) -> bytes:
    """Return the DER SubjectPublicKeyInfo of `key`."""
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_id(key: ec.EllipticCurvePublicKey) -> bytes:
    """Return sha256(DER SPKI): the key id sigstore uses for logs and CT logs."""
    return hashlib.sha256(spki_der(key)).digest()


def sign_sha256(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    """Return the DER ECDSA-SHA256 signature of `data`."""
    return key.sign(data, ec.ECDSA(hashes.SHA256()))
