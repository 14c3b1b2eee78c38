"""A CT log key that signs RFC 6962 v1 SCTs over precertificates (Fulcio's embedded SCT)."""

from __future__ import annotations

import hashlib
import struct
import time

from asn1crypto import core  # type: ignore[import-untyped]

from tests.realenv.sigstore.keys import key_id, new_p256_key, sign_sha256

_HASH_SHA256 = 4
_SIG_ECDSA = 3
_PRECERT_ENTRY = 1


class CTLog:
    """The CT log: only its key matters to sigstore (an SCT is a promise to log)."""

    def __init__(self) -> None:
        self.key = new_p256_key()
        self.log_id = key_id(self.key.public_key())

    def sct_list_extension(self, *, issuer_spki: bytes, tbs_precert: bytes) -> bytes:
        """Return the DER extension value: an OCTET STRING holding a one-SCT TLS list.

        `tbs_precert` is the TBSCertificate without the SCT extension, `issuer_spki` the
        DER SubjectPublicKeyInfo of the issuing CA.
        """
        timestamp = int(time.time() * 1000)
        signed = (
            struct.pack("!BBQH", 0, 0, timestamp, _PRECERT_ENTRY)
            + hashlib.sha256(issuer_spki).digest()
            + len(tbs_precert).to_bytes(3, "big")
            + tbs_precert
            + struct.pack("!H", 0)
        )
        return encode_sct_list(self.log_id, timestamp, sign_sha256(self.key, signed))


def encode_sct_list(log_id: bytes, timestamp: int, signature: bytes) -> bytes:
    """Return the SCT list extension value for one SCT (also used for placeholders)."""
    sct = (
        b"\x00"
        + log_id
        + struct.pack("!QH", timestamp, 0)
        + struct.pack("!BBH", _HASH_SHA256, _SIG_ECDSA, len(signature))
        + signature
    )
    tls_list = struct.pack("!HH", len(sct) + 2, len(sct)) + sct
    return bytes(core.OctetString(tls_list).dump())
