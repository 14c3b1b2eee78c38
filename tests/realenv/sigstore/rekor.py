"""A Rekor-like transparency log: RFC 6962 Merkle tree, signed checkpoints, v1 and v2 entries."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from typing import Any

import rfc8785
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed

from tests.realenv.sigstore.errors import ServiceError
from tests.realenv.sigstore.keys import key_id, new_p256_key, sign_sha256


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash."""
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n >= 2)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def merkle_root(leaves: list[bytes]) -> bytes:
    """RFC 6962 MTH over leaf hashes."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = _split(len(leaves))
    return _node(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def inclusion_path(index: int, leaves: list[bytes]) -> list[bytes]:
    """RFC 6962 PATH(m, D[n]): sibling hashes from the leaf up to the root."""
    if len(leaves) <= 1:
        return []
    k = _split(len(leaves))
    if index < k:
        return [*inclusion_path(index, leaves[:k]), merkle_root(leaves[k:])]
    return [*inclusion_path(index - k, leaves[k:]), merkle_root(leaves[:k])]


def _verify_hashedrekord_signature(cert: x509.Certificate, digest: bytes, sig: bytes) -> None:
    """Check the entry's signature over the artifact digest, as Rekor does before logging.

    Raises ServiceError (400) when the key is not ECDSA or the signature does not verify.
    """
    public_key = cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise ServiceError("only ECDSA verifiers are accepted")
    try:
        public_key.verify(sig, digest, ec.ECDSA(Prehashed(hashes.SHA256())))
    except InvalidSignature as exc:
        raise ServiceError("entry signature does not verify against its certificate") from exc


def _hashedrekord_v001_body(proposed: dict[str, Any]) -> bytes:
    """Check a proposed hashedrekord 0.0.1 entry; return its canonical body.

    Raises ServiceError (400) when it is malformed or its signature does not verify.
    """
    try:
        spec = proposed["spec"]
        algorithm = spec["data"]["hash"]["algorithm"]
        digest = bytes.fromhex(spec["data"]["hash"]["value"])
        sig_b64 = spec["signature"]["content"]
        cert_b64 = spec["signature"]["publicKey"]["content"]
        cert = x509.load_pem_x509_certificate(base64.b64decode(cert_b64))
        signature = base64.b64decode(sig_b64)
    except (KeyError, TypeError, ValueError) as exc:
        raise ServiceError(f"malformed hashedrekord entry: {exc}") from exc
    if algorithm != "sha256" or len(digest) != 32:
        raise ServiceError("only sha256 digests are accepted")
    _verify_hashedrekord_signature(cert, digest, signature)
    return rfc8785.dumps(
        {
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": digest.hex()}},
                "signature": {"content": sig_b64, "publicKey": {"content": cert_b64}},
            },
        }
    )


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def _dsse_v001_body(proposed: dict[str, Any]) -> bytes:
    """Check a proposed dsse 0.0.1 entry (every signature over the PAE); return its body.

    Raises ServiceError (400) when it is malformed or a signature does not verify.
    """
    try:
        content = proposed["spec"]["proposedContent"]
        envelope_text: str = content["envelope"]
        envelope = json.loads(envelope_text)
        payload = base64.b64decode(envelope["payload"])
        pae = _pae(envelope["payloadType"], payload)
        signatures = [base64.b64decode(s["sig"]) for s in envelope["signatures"]]
        verifiers: list[str] = content["verifiers"]
        cert = x509.load_pem_x509_certificate(base64.b64decode(verifiers[0]))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ServiceError(f"malformed dsse entry: {exc}") from exc
    if len(verifiers) != 1 or not signatures:
        raise ServiceError("dsse entries need one verifier and at least one signature")
    public_key = cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise ServiceError("only ECDSA verifiers are accepted")
    for signature in signatures:
        try:
            public_key.verify(signature, pae, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature as exc:
            raise ServiceError("envelope signature does not verify against its verifier") from exc
    return rfc8785.dumps(
        {
            "apiVersion": "0.0.1",
            "kind": "dsse",
            "spec": {
                "envelopeHash": {
                    "algorithm": "sha256",
                    "value": hashlib.sha256(envelope_text.encode()).hexdigest(),
                },
                "payloadHash": {
                    "algorithm": "sha256",
                    "value": hashlib.sha256(payload).hexdigest(),
                },
                # Rekor sorts them by their base64 text.
                "signatures": [
                    {"signature": sig, "verifier": verifiers[0]}
                    for sig in sorted(base64.b64encode(s).decode() for s in signatures)
                ],
            },
        }
    )


class TransparencyLog:
    """An append-only log; `version` selects the Rekor API shape (1 or 2) it speaks."""

    def __init__(self, *, name: str, version: int) -> None:
        if version not in (1, 2):
            raise ValueError(f"unknown Rekor version {version}")
        self.name = name
        self.version = version
        self.key = new_p256_key()
        self.log_id = key_id(self.key.public_key())
        self._tree_id = int.from_bytes(self.log_id[:7], "big")
        self._leaves: list[bytes] = []
        self._lock = threading.Lock()

    @property
    def origin(self) -> str:
        """Checkpoint origin line (Rekor v1 adds the tree id, as rekor.sigstore.dev does)."""
        return f"{self.name} - {self._tree_id}" if self.version == 1 else self.name

    def _append(self, body: bytes) -> tuple[int, int, bytes, list[bytes], str]:
        """Append `body`; return (index, tree size, root, proof, signed checkpoint)."""
        with self._lock:
            self._leaves.append(leaf_hash(body))
            index = len(self._leaves) - 1
            leaves = list(self._leaves)
        root = merkle_root(leaves)
        proof = inclusion_path(index, leaves)
        return index, len(leaves), root, proof, self._checkpoint(len(leaves), root)

    def _checkpoint(self, size: int, root: bytes) -> str:
        note = f"{self.origin}\n{size}\n{base64.b64encode(root).decode()}\n"
        signature = base64.b64encode(self.log_id[:4] + sign_sha256(self.key, note.encode()))
        return f"{note}\n\u2014 {self.name} {signature.decode()}\n"

    def add_v1(self, proposed: dict[str, Any]) -> dict[str, Any]:
        """Log a proposed hashedrekord or dsse 0.0.1 entry; return Rekor v1's `{uuid: entry}`.

        Raises ServiceError (400) for another kind, a malformed entry or a bad signature.
        """
        if self.version != 1:
            raise ServiceError("this log speaks Rekor v2", status=404)
        kind = (proposed.get("kind"), proposed.get("apiVersion"))
        if kind == ("hashedrekord", "0.0.1"):
            body = _hashedrekord_v001_body(proposed)
        elif kind == ("dsse", "0.0.1"):
            body = _dsse_v001_body(proposed)
        else:
            raise ServiceError("only hashedrekord and dsse 0.0.1 entries are accepted")
        integrated_time = int(time.time())
        index, size, root, proof, checkpoint = self._append(body)
        body_b64 = base64.b64encode(body).decode()
        set_payload = rfc8785.dumps(
            {
                "body": body_b64,
                "integratedTime": integrated_time,
                "logID": self.log_id.hex(),
                "logIndex": index,
            }
        )
        entry = {
            "body": body_b64,
            "integratedTime": integrated_time,
            "logID": self.log_id.hex(),
            "logIndex": index,
            "verification": {
                "inclusionProof": {
                    "checkpoint": checkpoint,
                    "hashes": [h.hex() for h in proof],
                    "logIndex": index,
                    "rootHash": root.hex(),
                    "treeSize": size,
                },
                "signedEntryTimestamp": base64.b64encode(
                    sign_sha256(self.key, set_payload)
                ).decode(),
            },
        }
        return {leaf_hash(body).hex(): entry}

    def add_v2(self, request: dict[str, Any]) -> dict[str, Any]:
        """Log a hashedrekord 0.0.2 request; return the protobuf-JSON TransparencyLogEntry.

        Raises ServiceError (400) for another request kind, a malformed one or a bad signature.
        """
        if self.version != 2:
            raise ServiceError("this log speaks Rekor v1", status=404)
        try:
            req = request["hashedRekordRequestV002"]
            digest = base64.b64decode(req["digest"])
            signature = base64.b64decode(req["signature"]["content"])
            verifier = req["signature"]["verifier"]
            key_details = verifier["keyDetails"]
            cert_der = base64.b64decode(verifier["x509Certificate"]["rawBytes"])
            cert = x509.load_der_x509_certificate(cert_der)
        except (KeyError, TypeError, ValueError) as exc:
            raise ServiceError(f"malformed hashedRekordRequestV002: {exc}") from exc
        if key_details != "PKIX_ECDSA_P256_SHA_256" or len(digest) != 32:
            raise ServiceError(f"unsupported key details {key_details!r}")
        _verify_hashedrekord_signature(cert, digest, signature)
        body = rfc8785.dumps(
            {
                "apiVersion": "0.0.2",
                "kind": "hashedrekord",
                "spec": {
                    "hashedRekordV002": {
                        "data": {
                            "algorithm": "SHA2_256",
                            "digest": base64.b64encode(digest).decode(),
                        },
                        "signature": {
                            "content": base64.b64encode(signature).decode(),
                            "verifier": {
                                "keyDetails": key_details,
                                "x509Certificate": {
                                    "rawBytes": base64.b64encode(cert_der).decode()
                                },
                            },
                        },
                    }
                },
            }
        )
        index, size, root, proof, checkpoint = self._append(body)
        # Rekor v2 has no integrated time and no promise: time comes from a TSA.
        return {
            "logIndex": str(index),
            "logId": {"keyId": base64.b64encode(self.log_id).decode()},
            "kindVersion": {"kind": "hashedrekord", "version": "0.0.2"},
            "inclusionProof": {
                "logIndex": str(index),
                "rootHash": base64.b64encode(root).decode(),
                "treeSize": str(size),
                "hashes": [base64.b64encode(h).decode() for h in proof],
                "checkpoint": {"envelope": checkpoint},
            },
            "canonicalizedBody": base64.b64encode(body).decode(),
        }
