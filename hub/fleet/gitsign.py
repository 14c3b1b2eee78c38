"""Signed fleet commits made with gitsign (Sigstore keyless), verified by the hub itself.

gitsign (``gpg.format=x509``, ``gpg.x509.program=gitsign``) puts a detached CMS/PKCS#7
SignedData in the commit's ``gpgsig`` header (``-----BEGIN SIGNED MESSAGE-----``): one
SignerInfo whose signed attributes hold the content type, the SHA-256 of the commit payload
(the commit without its ``gpgsig``) and the signer's claimed time; the ECDSA signature over
those attributes; the short-lived Fulcio certificate; and, in ``rekorMode=offline``, the Rekor
entry of that signature as a protobuf ``TransparencyLogEntry`` in the unsigned attribute
``1.3.6.1.4.1.57264.3.1``. The Rekor entry is a ``hashedrekord`` over SHA-256 of the signed
attributes (gitsign's docs/bundle-cms.md), which makes the signature an ordinary Sigstore
message signature whose artifact is the signed attributes.

Verification, each step failing closed with a reason the refusal names (``git verify-commit``
and ``gitsign verify`` are not run: the hub needs neither on its path nor a network):

1. the ``gpgsig`` is one PEM block of a detached CMS SignedData with one SHA-256 signer and
   its certificate;
2. the signed ``message-digest`` is SHA-256 of this commit's payload and the content type is
   ``data`` (a commit edited after signing, or a signature copied from another, fails here);
3. the transparency log entry is present (``rekorMode=offline``; an online-mode signature
   would need Rekor's search API at publish time) and a ``hashedrekord``: 0.0.1 from Rekor v1,
   with its integrated time and signed entry timestamp, or 0.0.2 from Rekor v2 (gitsign's
   experimental ``rekorVersion=2``), whose time comes from the RFC 3161 timestamp gitsign
   stores in the unsigned attribute ``signatureTimeStampToken``: one of the two is required;
4. sigstore-python verifies the rest, offline, against the policy's trusted root: the
   certificate chain to a trusted Fulcio CA at the log's integrated time (or the TSA's time,
   the timestamp verified against the trusted root's timestamp authorities), its embedded SCT,
   the signature over the signed attributes, the log entry's body (rebuilt from signature,
   digest and certificate, as gitsign does), its inclusion proof against a signed checkpoint
   and its signed entry timestamp; and asks :class:`_IdentityCheck` whether the
   certificate's subject and OIDC issuer are one of the policy's identities.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.verify.sources import KeylessIdentity

if TYPE_CHECKING:
    from cryptography import x509

GITSIGN_SIGNATURE = b"-----BEGIN SIGNED MESSAGE-----"
_END = b"-----END SIGNED MESSAGE-----"
_TLOG_ENTRY_OID = "1.3.6.1.4.1.57264.3.1"
_TIMESTAMP_OID = "1.2.840.113549.1.9.16.2.14"
_BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
_MAX_SIGNATURE = 64 * 1024


class GitsignRefusal(Exception):
    """The signature does not verify; the message says why, in one clause."""


@dataclass(frozen=True, slots=True)
class GitsignSigner:
    """Who signed, as the verified certificate says, and where the log recorded it."""

    identity: str
    """The certificate's subject (SAN) that matched the policy."""
    issuer: str
    """The OIDC issuer in the certificate."""
    certificate: str
    """``SHA256:<base64>`` of the Fulcio certificate (DER), as ssh-keygen writes digests."""
    log_index: int


def verify_gitsign(
    signature: bytes,
    payload: bytes,
    identities: Sequence[KeylessIdentity],
    trusted_root: bytes | None,
) -> GitsignSigner:
    """Verify gitsign's ``signature`` (the ``gpgsig`` header) over the commit ``payload``
    against ``identities`` and ``trusted_root`` (``trusted_root.json`` bytes; None: the
    public-good Sigstore root shipped with sigstore-python). Raises :class:`GitsignRefusal`."""
    try:
        from asn1crypto import cms, core  # type: ignore[import-untyped]
    except ImportError as exc:  # the `hub` extra's dependency: fail closed, saying so
        raise GitsignRefusal(
            "asn1crypto is not installed on the hub (pip install 'fleetlet[hub]')"
        ) from exc

    der = _pem_body(signature)
    try:
        info = cms.ContentInfo.load(der, strict=True)
        if info["content_type"].native != "signed_data":
            raise GitsignRefusal("the signature is not a CMS SignedData")
        signed = info["content"]
        signers = list(signed["signer_infos"])
        detached = signed["encap_content_info"]["content"].native is None
        certificates = [c.chosen for c in signed["certificates"] or []]
    except GitsignRefusal:
        raise
    except Exception as exc:  # asn1crypto raises more than ValueError on hostile input
        raise GitsignRefusal(f"the signature is not readable CMS ({_one_line(exc)})") from exc
    if not detached:
        raise GitsignRefusal("the signature carries its own content (not detached)")
    if len(signers) != 1:
        raise GitsignRefusal(f"the signature has {len(signers)} signers, gitsign writes one")
    signer = signers[0]
    try:
        if signer["digest_algorithm"]["algorithm"].native != "sha256":
            raise GitsignRefusal("the signature's digest is not SHA-256")
        attrs = signer["signed_attrs"]
        found = {a["type"].native: a["values"] for a in attrs}
        if len(found) != len(attrs):
            raise GitsignRefusal("the signature repeats a signed attribute")
        content_type = found.get("content_type")
        digest = found.get("message_digest")
        if content_type is None or [v.native for v in content_type] != ["data"]:
            raise GitsignRefusal("the signed content type is not data")
        if digest is None or len(digest) != 1:
            raise GitsignRefusal("the signature has no signed message digest")
        signed_digest = digest[0].native
        # What was signed: the DER of the attributes as a SET OF, not as the [0] they are
        # stored under (RFC 5652 5.4), from the received bytes.
        attrs_der = _der_set(attrs.contents)
        sig = signer["signature"].native
        certificate = _signer_certificate(certificates, signer["sid"])
        entry_der = _unsigned_attribute(signer["unsigned_attrs"], _TLOG_ENTRY_OID)
        entry_bytes = core.OctetString.load(entry_der).native if entry_der else None
        timestamps = _timestamp_responses(signer["unsigned_attrs"])
    except GitsignRefusal:
        raise
    except Exception as exc:  # asn1crypto raises more than ValueError on hostile input
        raise GitsignRefusal(f"the signature is not readable CMS ({_one_line(exc)})") from exc
    if signed_digest != hashlib.sha256(payload).digest():
        raise GitsignRefusal(
            "the signature is over other content than this commit (the commit was changed "
            "after it was signed)"
        )
    if entry_bytes is None:
        raise GitsignRefusal(
            "the signature carries no transparency log entry (gitsign's default "
            "rekorMode=online keeps it only in Rekor; sign with gitsign.rekorMode=offline so "
            "the hub can check it offline)"
        )
    entry = _log_entry(entry_bytes)
    if "integratedTime" not in entry and not timestamps:
        raise GitsignRefusal(
            "the signature has no verified time: its Rekor v2 log entry has none of its own and "
            "it carries no RFC 3161 timestamp (sign with gitsign.timestampServerURL)"
        )
    bundle = _bundle(attrs_der, sig, certificate, entry, timestamps)
    return _sigstore_verify(bundle, attrs_der, certificate, identities, trusted_root)


def _pem_body(signature: bytes) -> bytes:
    if len(signature) > _MAX_SIGNATURE:
        raise GitsignRefusal(f"the signature is larger than {_MAX_SIGNATURE} bytes")
    text = signature.strip()
    if not text.startswith(GITSIGN_SIGNATURE) or not text.endswith(_END):
        raise GitsignRefusal("the signature is not one SIGNED MESSAGE block")
    body = text[len(GITSIGN_SIGNATURE) : -len(_END)]
    try:
        return base64.b64decode(b"".join(body.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise GitsignRefusal("the SIGNED MESSAGE block is not base64") from exc


def _der_set(contents: bytes, tag: int = 0x31) -> bytes:
    """``contents`` under a DER header: a SET OF (tag 0x31), or ``tag``."""
    size = len(contents)
    if size < 0x80:
        return bytes([tag, size]) + contents
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(length)]) + length + contents


def _timestamp_responses(attrs: Any) -> list[bytes]:
    """The RFC 3161 tokens gitsign stores (``signatureTimeStampToken`` unsigned attributes,
    over the signature value), each as the TimeStampResp a Sigstore bundle holds: status
    granted, then the token, from the received bytes."""
    if attrs.native is None:
        return []
    tokens = [
        bytes(value.dump())
        for a in attrs
        if a["type"].dotted == _TIMESTAMP_OID
        for value in a["values"]
    ]
    granted = bytes.fromhex("3003020100")  # PKIStatusInfo {status granted}
    return [_der_set(granted + token, 0x30) for token in tokens[:4]]


def _signer_certificate(certificates: list[Any], sid: Any) -> bytes:
    """The DER of the certificate the signer identifier names."""
    from asn1crypto import x509 as asn1_x509

    for cert in certificates:
        if not isinstance(cert, asn1_x509.Certificate):
            continue
        if sid.name == "issuer_and_serial_number":
            named = sid.chosen
            if (
                cert.issuer.dump() == named["issuer"].dump()
                and cert.serial_number == named["serial_number"].native
            ):
                return bytes(cert.dump())
        elif cert.key_identifier == sid.chosen.native:
            return bytes(cert.dump())
    raise GitsignRefusal("the signature does not include its signer's certificate")


def _unsigned_attribute(attrs: Any, oid: str) -> bytes | None:
    """The DER of the single value of the unsigned attribute ``oid``, or None."""
    if attrs.native is None:
        return None
    values = [a["values"] for a in attrs if a["type"].dotted == oid]
    if not values:
        return None
    if len(values) != 1 or len(values[0]) != 1:
        raise GitsignRefusal("the signature has more than one transparency log entry")
    return bytes(values[0][0].dump())


# --- the transparency log entry: protobuf (sigstore's rekor/v1 TransparencyLogEntry) ---------


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Protobuf wire format: (field number, varint or bytes) pairs. Raises GitsignRefusal."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise GitsignRefusal("the transparency log entry is truncated")
            out.append((number, data[pos : pos + size]))
            pos += size
        else:
            raise GitsignRefusal(f"the transparency log entry has an unexpected wire type {wire}")
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise GitsignRefusal("the transparency log entry is not valid protobuf")


def _one(fields: list[tuple[int, int | bytes]], number: int, kind: type) -> Any:
    values = [v for n, v in fields if n == number]
    if len(values) != 1 or not isinstance(values[0], kind):
        raise GitsignRefusal(f"the transparency log entry lacks field {number}")
    return values[0]


def _log_entry(data: bytes) -> dict[str, Any]:
    """The entry as the bundle's protobuf JSON (``canonicalizedBody`` added later): a Rekor v1
    ``hashedrekord`` 0.0.1 (with its integrated time and signed entry timestamp) or a Rekor v2
    0.0.2 (neither: its time comes from an RFC 3161 timestamp)."""
    top = _fields(data)
    kind = _fields(_one(top, 3, bytes))
    kind_version = {
        "kind": _one(kind, 1, bytes).decode(errors="replace"),
        "version": _one(kind, 2, bytes).decode(errors="replace"),
    }
    found = (kind_version["kind"], kind_version["version"])
    if found not in (("hashedrekord", "0.0.1"), ("hashedrekord", "0.0.2")):
        raise GitsignRefusal(
            f"the transparency log entry is a {found[0]} {found[1]}, not a hashedrekord "
            "0.0.1 or 0.0.2 as gitsign writes them"
        )
    if found[1] == "0.0.1" and not [v for n, v in top if n == 4]:
        # gitsign v0.17's rekorVersion=2 stores its Rekor v2 entries labelled 0.0.1, with
        # neither integrated time nor signed entry timestamp: read as what they are (the
        # inclusion proof then covers the 0.0.2 body, or the entry is refused).
        kind_version["version"] = "0.0.2"
        found = ("hashedrekord", "0.0.2")
    proof = _fields(_one(top, 6, bytes))
    checkpoint = _fields(_one(proof, 5, bytes))
    index = [v for n, v in top if n == 1]  # protobuf omits a zero
    entry: dict[str, Any] = {
        "logIndex": str(index[0] if index else 0),
        "logId": {"keyId": _b64(_one(_fields(_one(top, 2, bytes)), 1, bytes))},
        "kindVersion": kind_version,
        "inclusionProof": {
            "logIndex": str(next((v for n, v in proof if n == 1), 0)),
            "rootHash": _b64(_one(proof, 2, bytes)),
            "treeSize": str(_one(proof, 3, int)),
            "hashes": [_b64(v) for n, v in proof if n == 4 and isinstance(v, bytes)],
            "checkpoint": {"envelope": _one(checkpoint, 1, bytes).decode(errors="replace")},
        },
    }
    if found[1] == "0.0.1":
        promise = _fields(_one(top, 5, bytes))
        entry["integratedTime"] = str(_one(top, 4, int))
        entry["inclusionPromise"] = {"signedEntryTimestamp": _b64(_one(promise, 1, bytes))}
    return entry


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _bundle(
    attrs_der: bytes,
    signature: bytes,
    certificate: bytes,
    entry: dict[str, Any],
    timestamps: list[bytes],
) -> dict[str, Any]:
    """A Sigstore bundle of the signature: the artifact is the signed attributes; the log
    entry's body is rebuilt as Rekor canonicalized it (RFC 8785 JSON, the certificate as
    PEM), so the inclusion proof covers the signature, the digest and the certificate; the
    RFC 3161 ``timestamps`` (TimeStampResp DER) go with it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    digest = hashlib.sha256(attrs_der).digest()
    try:
        cert = x509.load_der_x509_certificate(certificate)
        pem = cert.public_bytes(serialization.Encoding.PEM)
    except ValueError as exc:
        raise GitsignRefusal(f"the signer's certificate is not readable ({exc})") from exc
    sig_b64 = base64.b64encode(signature).decode()
    if entry["kindVersion"]["version"] == "0.0.2":
        body = _body_v002(digest, sig_b64, cert, certificate)
    else:
        body = _body_v001(digest, sig_b64, pem)
    material: dict[str, Any] = {
        "certificate": {"rawBytes": base64.b64encode(certificate).decode()},
        "tlogEntries": [{**entry, "canonicalizedBody": base64.b64encode(body).decode()}],
    }
    if timestamps:
        material["timestampVerificationData"] = {
            "rfc3161Timestamps": [{"signedTimestamp": _b64(t)} for t in timestamps]
        }
    return {
        "mediaType": _BUNDLE_TYPE,
        "verificationMaterial": material,
        "messageSignature": {
            "messageDigest": {"algorithm": "SHA2_256", "digest": base64.b64encode(digest).decode()},
            "signature": sig_b64,
        },
    }


def _body_v001(digest: bytes, sig_b64: str, pem: bytes) -> bytes:
    import rfc8785

    return rfc8785.dumps(
        {
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": digest.hex()}},
                "signature": {
                    "content": sig_b64,
                    "publicKey": {"content": base64.b64encode(pem).decode()},
                },
            },
        }
    )


def _body_v002(digest: bytes, sig_b64: str, cert: Any, certificate: bytes) -> bytes:
    """Rekor v2's canonical ``hashedrekord`` 0.0.2 body (protobuf JSON, RFC 8785)."""
    import rfc8785
    from cryptography.hazmat.primitives.asymmetric import ec

    key = cert.public_key()
    details = {"secp256r1": "PKIX_ECDSA_P256_SHA_256", "secp384r1": "PKIX_ECDSA_P384_SHA_384"}
    curve = key.curve.name if isinstance(key, ec.EllipticCurvePublicKey) else ""
    if curve not in details:
        raise GitsignRefusal("the signing certificate's key is not ECDSA P-256 or P-384")
    return rfc8785.dumps(
        {
            "apiVersion": "0.0.2",
            "kind": "hashedrekord",
            "spec": {
                "hashedRekordV002": {
                    "data": {"algorithm": "SHA2_256", "digest": _b64(digest)},
                    "signature": {
                        "content": sig_b64,
                        "verifier": {
                            "keyDetails": details[curve],
                            "x509Certificate": {"rawBytes": _b64(certificate)},
                        },
                    },
                }
            },
        }
    )


# --- sigstore-python --------------------------------------------------------------------------


class _IdentityCheck:
    """A sigstore verification policy: the certificate's OIDC issuer and subjects against the
    policy's identities; remembers who signed and which subject matched."""

    def __init__(self, identities: Sequence[KeylessIdentity]) -> None:
        self.identities = identities
        self.found: str | None = None
        self.matched: tuple[str, str] | None = None

    def verify(self, cert: x509.Certificate) -> None:
        from agent.verify._sigstore import certificate_signer

        who = certificate_signer(cert)
        self.found = f"{', '.join(who.identities) or 'no subject'} ({who.issuer or 'no issuer'})"
        for identity in self.identities:
            if identity.matches(who.issuer, who.identities):
                subject = next(s for s in who.identities if identity.matches(who.issuer, (s,)))
                self.matched = (subject, who.issuer or "")
                return
        raise GitsignRefusal(f"signed by {self.found}, which is not an identity of the policy")


def _sigstore_verify(
    bundle_doc: dict[str, Any],
    attrs_der: bytes,
    certificate: bytes,
    identities: Sequence[KeylessIdentity],
    trusted_root: bytes | None,
) -> GitsignSigner:
    from sigstore.hashes import Hashed
    from sigstore.models import Bundle
    from sigstore_models.common.v1 import HashAlgorithm

    from agent.verify.cosign import TrustedRootError, sigstore_verifier

    try:
        verifier = sigstore_verifier(trusted_root)
    except TrustedRootError as exc:
        raise GitsignRefusal(f"the policy's trusted root is unusable ({exc})") from exc
    try:
        bundle = Bundle.from_json(json.dumps(bundle_doc))
    except Exception as exc:  # InvalidBundle and model validation errors alike
        raise GitsignRefusal(
            f"the signature does not make a valid Sigstore bundle ({_one_line(exc)})"
        ) from exc
    check = _IdentityCheck(identities)
    digest = Hashed(algorithm=HashAlgorithm.SHA2_256, digest=hashlib.sha256(attrs_der).digest())
    try:
        verifier.verify_artifact(digest, bundle, check)
    except GitsignRefusal:
        raise
    except Exception as exc:  # every failure deep in sigstore is a refusal
        if check.found is None:
            raise GitsignRefusal(
                "the signing certificate is not trusted by the policy's trusted root (chain, "
                f"SCT or log time: {_one_line(exc)})"
            ) from exc
        raise GitsignRefusal(
            f"the signature by {check.found} or its transparency log entry does not verify "
            f"({_one_line(exc)})"
        ) from exc
    if check.matched is None:
        raise GitsignRefusal("the signer's identity was never checked")
    fingerprint = base64.b64encode(hashlib.sha256(certificate).digest()).decode().rstrip("=")
    return GitsignSigner(
        identity=check.matched[0],
        issuer=check.matched[1],
        certificate=f"SHA256:{fingerprint}",
        log_index=int(bundle_doc["verificationMaterial"]["tlogEntries"][0]["logIndex"]),
    )


def _one_line(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
