"""notation's (Notary Project) signatures of an OCI artifact: JWS envelopes of the
``notary.x509`` signing scheme, checked against a policy's trust store and trusted identities.

``notation sign`` attaches the signature as an OCI referrer of the artifact (artifact type
``application/vnd.cncf.notary.signature``, through the referrers API or the ``sha256-<hex>``
referrers tag), whose one layer (``application/jose+json``) is a JWS in JSON serialization:
a protected header (``alg``, ``cty`` the notary payload type, ``crit`` naming the
signing scheme and optionally ``io.cncf.notary.expiry``), the payload (``{"targetArtifact":
<descriptor>}``), the signature, and the certificate chain in the unprotected ``x5c`` (leaf
first). The steps, as the Notary Project's verification specification orders them, each
failing closed with a reason:

1. the envelope is a JWS of the notary payload type, with a known algorithm (ES256/384/512,
   PS256/384/512), signing scheme ``notary.x509`` and no critical header it does not know
   (a verification plugin, for one, is refused), not expired;
2. the signature verifies over the protected header and payload with the leaf certificate's
   key (of the algorithm's kind);
3. the chain links leaf to a certificate of the policy's trust store, each certificate
   issuing the one before it, every issuer a CA, the leaf a code-signing certificate, all
   valid now, or, when the policy has a TSA trust store (``tsaTrustStore``), at the time of
   the RFC 3161 countersignature over the signature value
   (``io.cncf.notary.timestampSignature``, verified with rfc3161-client against that store;
   the time the envelope itself claims is the signer's own and never used);
4. the leaf's subject is one of the trusted identities (the identity's RDNs a subset of the
   subject's, as notation matches them), or the policy trusts ``*``;
5. the payload's target artifact is this very digest.

COSE envelopes (``notation sign --signature-format cose``) are recognised and refused, saying
so.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent.verify.sources import NotationTrust, parse_subject

ARTIFACT_TYPE = "application/vnd.cncf.notary.signature"
JWS = "application/jose+json"
COSE = "application/cose"
_PAYLOAD_TYPE = "application/vnd.cncf.notary.payload.v1+json"
_SCHEME = "io.cncf.notary.signingScheme"
_EXPIRY = "io.cncf.notary.expiry"
_TIMESTAMP = "io.cncf.notary.timestampSignature"
_KNOWN_CRITICAL = {_SCHEME, _EXPIRY}
_ALGORITHMS = {
    "ES256": ("ec", "secp256r1", "SHA256"),
    "ES384": ("ec", "secp384r1", "SHA384"),
    "ES512": ("ec", "secp521r1", "SHA512"),
    "PS256": ("rsa", None, "SHA256"),
    "PS384": ("rsa", None, "SHA384"),
    "PS512": ("rsa", None, "SHA512"),
}
_SHORT_NAMES = {
    "2.5.4.6": "C",
    "2.5.4.8": "ST",
    "2.5.4.7": "L",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.3": "CN",
}


class NotationRefusal(Exception):
    """The notation signature does not satisfy the policy (the message says why)."""


@dataclass(frozen=True, slots=True)
class NotationSigner:
    """Who signed (``notation <leaf subject>``), and until when the verdict holds: the
    earliest end of validity of the chain's certificates, or the envelope's expiry."""

    signer: str
    valid_until: datetime | None


def verify_notation(
    envelope: bytes,
    media_type: str,
    digest: str,
    trust: NotationTrust,
    *,
    now: datetime | None = None,
) -> NotationSigner:
    """Verify a notation signature envelope of ``media_type`` over the artifact ``digest``
    against ``trust`` (the steps of the module docstring). Returns who signed and until when;
    raises :class:`NotationRefusal`."""
    if media_type == COSE:
        raise NotationRefusal("a COSE envelope, which is not verified (sign with notation's JWS)")
    if media_type != JWS:
        raise NotationRefusal(f"an envelope of media type {media_type!r}, not a JWS")
    moment = now or datetime.now(UTC)
    try:
        doc = json.loads(envelope)
        protected_b64 = str(doc["protected"])
        payload_b64 = str(doc["payload"])
        signature = _b64url(str(doc["signature"]))
        header = json.loads(_b64url(protected_b64))
        payload = json.loads(_b64url(payload_b64))
        chain_b64 = doc.get("header", {}).get("x5c")
        chain = [base64.b64decode(c, validate=True) for c in chain_b64]
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise NotationRefusal(f"not a notation JWS envelope ({_one_line(exc)})") from exc
    if not isinstance(header, dict) or not chain:
        raise NotationRefusal("not a notation JWS envelope (no protected header or no x5c chain)")
    algorithm = _check_header(header, moment)
    certificates = _load_chain(chain)
    leaf = certificates[0]
    _check_signature(leaf, algorithm, f"{protected_b64}.{payload_b64}".encode(), signature)
    stamped = None
    if trust.tsa_store:
        stamped = _timestamp(doc.get("header", {}).get(_TIMESTAMP), signature, trust)
    anchored = _check_chain(certificates, trust, stamped or moment)
    # Timestamped, the verdict holds for good; else until the chain's first end.
    ends = [] if stamped else [c.not_valid_after_utc for c in certificates[: anchored + 1]]
    if _EXPIRY in header:
        ends.append(datetime.fromisoformat(str(header[_EXPIRY]).replace("Z", "+00:00")))
    subject = _subject(leaf)
    if "*" not in trust.trusted_identities and not any(
        (wanted := parse_subject(i)) is not None and wanted <= subject
        for i in trust.trusted_identities
    ):
        raise NotationRefusal(
            f"signed by {leaf.subject.rfc4514_string()}, not a trusted identity of the policy"
        )
    target = payload.get("targetArtifact") if isinstance(payload, dict) else None
    signed = target.get("digest") if isinstance(target, dict) else None
    if signed != digest:
        raise NotationRefusal(f"the signature is for {signed}, not for {digest}")
    return NotationSigner(f"notation {leaf.subject.rfc4514_string()}", min(ends, default=None))


def _timestamp(value: Any, signature: bytes, trust: NotationTrust) -> datetime | None:
    """The time the RFC 3161 countersignature (over the signature value) vouches for, verified
    against the policy's TSA trust store; None when the envelope has none."""
    if value is None:
        return None
    from cryptography import x509
    from rfc3161_client import VerifierBuilder, decode_timestamp_response

    try:
        token = base64.b64decode(str(value), validate=True)
        # A TimeStampResp (status granted, then the token), as rfc3161-client reads them.
        body = bytes.fromhex("3003020100") + token
        size = len(body).to_bytes((len(body).bit_length() + 7) // 8 or 1, "big")
        length = bytes([len(body)]) if len(body) < 0x80 else bytes([0x80 | len(size)]) + size
        response = decode_timestamp_response(b"\x30" + length + body)
    except Exception as exc:  # binascii, ASN.1 and the Rust parser's errors alike
        raise NotationRefusal(f"the timestamp countersignature is not readable ({exc})") from exc
    failures = []
    for root in trust.tsa_store:
        try:
            verifier = VerifierBuilder().add_root_certificate(x509.load_der_x509_certificate(root))
            verifier.build().verify_message(response, signature)
        except Exception as exc:  # rfc3161-client's VerificationError and its parsers'
            failures.append(_one_line(exc))
            continue
        moment = response.tst_info.gen_time
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise NotationRefusal(
        "the timestamp countersignature does not verify against the policy's TSA trust store "
        f"({'; '.join(failures[:2])})"
    )


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check_header(header: dict[str, Any], moment: datetime) -> str:
    algorithm = header.get("alg")
    if algorithm not in _ALGORITHMS:
        raise NotationRefusal(f"the envelope's algorithm {algorithm!r} is not one notation uses")
    if header.get("cty") != _PAYLOAD_TYPE:
        raise NotationRefusal(f"the envelope's content type is {header.get('cty')!r}, not notary's")
    critical = header.get("crit")
    if not isinstance(critical, list) or _SCHEME not in critical:
        raise NotationRefusal("the envelope does not mark its signing scheme critical")
    unknown = sorted(str(c) for c in critical if c not in _KNOWN_CRITICAL)
    if unknown:
        raise NotationRefusal(f"the envelope has critical headers the hub does not know: {unknown}")
    if header.get(_SCHEME) != "notary.x509":
        raise NotationRefusal(
            f"signing scheme {header.get(_SCHEME)!r}, not notary.x509 (signing authorities "
            "need a timestamp countersignature, which is not verified)"
        )
    if _EXPIRY in header:
        try:
            expiry = datetime.fromisoformat(str(header[_EXPIRY]).replace("Z", "+00:00"))
        except ValueError as exc:
            raise NotationRefusal("the envelope's expiry is not a time") from exc
        if expiry.tzinfo is None or expiry <= moment:
            raise NotationRefusal(f"the signature expired at {header[_EXPIRY]}")
    return str(algorithm)


def _load_chain(chain: list[bytes]) -> list[Any]:
    from cryptography import x509

    try:
        return [x509.load_der_x509_certificate(der) for der in chain[:8]]
    except ValueError as exc:
        raise NotationRefusal(f"the envelope's certificate chain is not readable ({exc})") from exc


def _check_signature(leaf: Any, algorithm: str, message: bytes, signature: bytes) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    kind, curve, hash_name = _ALGORITHMS[algorithm]
    digest = getattr(hashes, hash_name)()
    key = leaf.public_key()
    try:
        if kind == "ec":
            if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != curve:
                raise NotationRefusal(f"the signing certificate's key does not fit {algorithm}")
            half = len(signature) // 2
            if len(signature) != 2 * ((key.curve.key_size + 7) // 8):
                raise NotationRefusal("the signature does not verify with its certificate")
            der = encode_dss_signature(
                int.from_bytes(signature[:half], "big"), int.from_bytes(signature[half:], "big")
            )
            key.verify(der, message, ec.ECDSA(digest))
        else:
            if not isinstance(key, rsa.RSAPublicKey):
                raise NotationRefusal(f"the signing certificate's key does not fit {algorithm}")
            pss = padding.PSS(mgf=padding.MGF1(digest), salt_length=digest.digest_size)
            key.verify(signature, message, pss, digest)
    except InvalidSignature as exc:
        raise NotationRefusal("the signature does not verify with its certificate") from exc


def _check_chain(certificates: list[Any], trust: NotationTrust, moment: datetime) -> int:
    """Check the chain up to the trust store certificate; return that certificate's index."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    ders = [c.public_bytes(serialization.Encoding.DER) for c in certificates]
    anchored = next((i for i, der in enumerate(ders) if der in trust.trust_store), None)
    if anchored is None:
        raise NotationRefusal(
            f"the certificate chain of {certificates[0].subject.rfc4514_string()} ends at "
            f"{certificates[-1].subject.rfc4514_string()}, which is not in the policy's trust store"
        )
    for i, cert in enumerate(certificates[: anchored + 1]):
        if not cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc:
            raise NotationRefusal(
                f"certificate {cert.subject.rfc4514_string()} is not valid now (valid "
                f"{cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
                f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})"
            )
        if i < anchored:
            issuer = certificates[i + 1]
            try:
                cert.verify_directly_issued_by(issuer)
            except (ValueError, TypeError, InvalidSignature) as exc:
                raise NotationRefusal(
                    f"certificate {cert.subject.rfc4514_string()} is not issued by "
                    f"{issuer.subject.rfc4514_string()} ({_one_line(exc)})"
                ) from exc
        if i > 0 and not _is_ca(cert, x509):
            raise NotationRefusal(f"certificate {cert.subject.rfc4514_string()} is not a CA")
    leaf = certificates[0]
    if anchored > 0 and _is_ca(leaf, x509):
        raise NotationRefusal("the signing certificate is a CA certificate")
    try:
        usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return anchored
    if x509.oid.ExtendedKeyUsageOID.CODE_SIGNING not in usage:
        raise NotationRefusal(
            "the signing certificate is not for code signing (extended key usage)"
        )
    return anchored


def _is_ca(cert: Any, x509: Any) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _subject(cert: Any) -> frozenset[tuple[str, str]]:
    return frozenset(
        (_SHORT_NAMES.get(a.oid.dotted_string, a.oid.dotted_string), str(a.value))
        for a in cert.subject
    )


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
