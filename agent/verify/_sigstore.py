"""The one place the agent touches sigstore-python: trust policy and bundle verification.

sigstore-python reports every failure as one generic ``VerificationError``. This module turns
them into fleetlet's own errors, once, where they enter: whether the failure happened before
the identity policy was consulted (the certificate, its SCT or its time source is not trusted)
or after it (the signature or the log entry does not match the statement) is known exactly,
because the policy object passed to sigstore records that it was reached.

sigstore-python and what it pulls in (tuf, pydantic models, requests) add about 45 MB of
resident memory, so it is imported only when a :class:`TrustPolicy` is built: importing
``agent.verify`` for its file names or its Merkle tree stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from agent.errors import (
    IdentityMismatchError,
    SignatureError,
    TrustConfigError,
    UntrustedSignerError,
)

if TYPE_CHECKING:
    from cryptography import x509
    from sigstore.models import TrustedRoot
    from sigstore.verify import Verifier

# Fulcio's OIDC issuer extensions: v1 holds raw UTF-8 bytes, v2 a DER UTF8String.
_OIDC_ISSUER_V1 = "1.3.6.1.4.1.57264.1.1"
_OIDC_ISSUER_V2 = "1.3.6.1.4.1.57264.1.8"
_OTHERNAME_SAN = "1.3.6.1.4.1.57264.1.7"


@dataclass(frozen=True, kw_only=True)
class IdentityPolicy:
    """Who may sign publications: the OIDC ``issuer`` and the certificate ``subject`` (SAN).

    Both are required and matched exactly. Raises :class:`TrustConfigError` when either is
    empty: an empty policy would accept any signer the trusted root knows.
    """

    issuer: str
    subject: str

    def __post_init__(self) -> None:
        missing = [name for name in ("issuer", "subject") if not getattr(self, name).strip()]
        if missing:
            raise TrustConfigError(
                f"identity policy: {' and '.join(missing)} must be set (an empty policy would "
                "accept any signer the trusted root knows)"
            )


DEFAULT_MAX_VALIDITY = timedelta(days=30)
"""How far in the future a publication's ``expiresAt`` may be, unless configured otherwise: a
signed set that stays valid for years would defeat the freeze protection of the expiry."""


class TrustPolicy:
    """The agent's trust configuration: a Sigstore trusted root, the expected signer, and the
    longest validity it accepts.

    ``trusted_root`` is a path to a ``trusted_root.json`` or an already loaded ``TrustedRoot``
    (e.g. the public-good root shipped with sigstore-python). It comes from the agent's own
    deployment, never from the repository it protects. ``max_validity`` bounds how far away
    a publication's ``expiresAt`` may be when it is verified.

    Raises :class:`TrustConfigError` when the trusted root cannot be read or lacks a
    transparency log, a CT log or a certificate authority, or ``max_validity`` is not
    positive.
    """

    __slots__ = ("identity", "max_validity", "trusted_root", "verifier")

    trusted_root: TrustedRoot
    verifier: Verifier

    def __init__(
        self,
        *,
        trusted_root: TrustedRoot | str | os.PathLike[str],
        identity: IdentityPolicy,
        max_validity: timedelta = DEFAULT_MAX_VALIDITY,
    ) -> None:
        from sigstore.models import TrustedRoot
        from sigstore.verify import Verifier

        if not isinstance(identity, IdentityPolicy):
            raise TrustConfigError("identity policy: an issuer and a subject are required")
        if max_validity <= timedelta(0):
            raise TrustConfigError(f"maximum publication validity must be positive: {max_validity}")
        self.identity = identity
        self.max_validity = max_validity
        self.trusted_root = (
            trusted_root if isinstance(trusted_root, TrustedRoot) else _load_root(trusted_root)
        )
        # sigstore insists on a CT log; it checks the rest itself when building the verifier.
        # (A private field, but the trust format is pinned with the sigstore major version.)
        if not self.trusted_root._inner.ctlogs:
            raise TrustConfigError("trusted root: no CT log (ctlogs is empty)")
        try:
            self.verifier = Verifier(trusted_root=self.trusted_root)
        except Exception as exc:  # sigstore raises several unrelated types for a bad root
            raise TrustConfigError(f"trusted root: unusable: {_one_line(exc)}") from exc

    def digest(self) -> str:
        """A digest of who may sign and which CAs are trusted (and the longest validity): a
        refusal is remembered under it, so a changed policy tries the same commit again."""
        from cryptography.hazmat.primitives import hashes

        from agent.api import canonical_bytes, digest_of

        cas = sorted(
            c.fingerprint(hashes.SHA256()).hex() for c in self.trusted_root.get_fulcio_certs()
        )
        return digest_of(
            canonical_bytes(
                {
                    "issuer": self.identity.issuer,
                    "subject": self.identity.subject,
                    "cas": cas,
                    "maxValidity": self.max_validity.total_seconds(),
                }
            )
        )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, kw_only=True)
class VouchedSignature:
    """A signature verified by an earlier step of the same job: the exact statement and
    bundle bytes (their SHA-256), who signed them and the digest of the trust policy they were
    verified under (:meth:`TrustPolicy.digest`).

    ``agent run``'s worker checks a new publication's signature first, in a process of its
    own, then replaces itself (``exec``) with the process that renders and applies, which
    never loads sigstore (about 45 MB) unless it must verify other bytes. Only those same
    bytes are accepted on its word: :func:`verify_statement_signature` verifies anything else.
    """

    statement_sha256: str
    bundle_sha256: str
    identities: tuple[str, ...]
    issuer: str | None
    policy: str

    @classmethod
    def of(
        cls, *, statement: bytes, bundle_json: bytes, signer: SignerIdentity, policy: str
    ) -> VouchedSignature:
        return cls(
            statement_sha256=_sha256(statement),
            bundle_sha256=_sha256(bundle_json),
            identities=signer.identities,
            issuer=signer.issuer,
            policy=policy,
        )

    def covers(self, statement: bytes, bundle_json: bytes) -> bool:
        """Whether these are the bytes that were verified."""
        return (
            _sha256(statement) == self.statement_sha256
            and _sha256(bundle_json) == self.bundle_sha256
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "statement": self.statement_sha256,
                "bundle": self.bundle_sha256,
                "identities": list(self.identities),
                "issuer": self.issuer,
                "policy": self.policy,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> VouchedSignature:
        """Raises ValueError (not such a record)."""
        try:
            doc = json.loads(text)
            return cls(
                statement_sha256=str(doc["statement"]),
                bundle_sha256=str(doc["bundle"]),
                identities=tuple(str(i) for i in doc["identities"]),
                issuer=doc["issuer"],
                policy=str(doc["policy"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a vouched signature: {exc}") from exc


class DeferredTrust:
    """The trust policy, built (and sigstore loaded) only when a signature must be checked;
    with ``vouched``, the signature of those exact bytes is taken as verified.

    ``load`` builds the :class:`TrustPolicy` (it raises TrustConfigError); ``identity`` and
    ``max_validity`` are the policy's, known without loading it.
    """

    def __init__(
        self,
        *,
        load: Callable[[], TrustPolicy],
        identity: IdentityPolicy,
        max_validity: timedelta = DEFAULT_MAX_VALIDITY,
        vouched: VouchedSignature | None = None,
    ) -> None:
        self._load = load
        self._policy: TrustPolicy | None = None
        self.identity = identity
        self.max_validity = max_validity
        self.vouched = vouched

    def policy(self) -> TrustPolicy:
        """The trust policy, built on first use. Raises TrustConfigError."""
        if self._policy is None:
            self._policy = self._load()
        return self._policy

    def digest(self) -> str:
        """:meth:`TrustPolicy.digest` (the vouched signature's, without loading sigstore)."""
        if self.vouched is not None and self._policy is None:
            return self.vouched.policy
        return self.policy().digest()


def _load_root(path: str | os.PathLike[str]) -> TrustedRoot:
    from sigstore.models import TrustedRoot

    try:
        return TrustedRoot.from_file(os.fspath(path))
    except OSError as exc:
        raise TrustConfigError(f"trusted root {os.fspath(path)}: cannot read: {exc}") from exc
    except Exception as exc:  # pydantic/protobuf parse errors and sigstore's own
        raise TrustConfigError(
            f"trusted root {os.fspath(path)}: not a trusted root: {_one_line(exc)}"
        ) from exc


@dataclass(frozen=True, kw_only=True)
class SignerIdentity:
    """Who signed, as read from a verified signing certificate."""

    identities: tuple[str, ...]
    issuer: str | None


def certificate_signer(cert: x509.Certificate) -> SignerIdentity:
    """Read the SAN identities and the OIDC issuer of a Fulcio-style certificate."""
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        identities: list[str] = []
    else:
        identities = [*san.get_values_for_type(x509.RFC822Name)]
        identities += san.get_values_for_type(x509.UniformResourceIdentifier)
        identities += [
            other.value.decode(errors="replace")
            for other in san.get_values_for_type(x509.OtherName)
            if other.type_id.dotted_string == _OTHERNAME_SAN
        ]
    return SignerIdentity(identities=tuple(identities), issuer=_issuer(cert))


def _issuer(cert: x509.Certificate) -> str | None:
    from cryptography import x509

    for oid in (_OIDC_ISSUER_V1, _OIDC_ISSUER_V2):
        try:
            ext = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid)).value
        except x509.ExtensionNotFound:
            continue
        raw = getattr(ext, "value", b"")
        if oid == _OIDC_ISSUER_V2:
            raw = _der_utf8string(raw)
        return raw.decode(errors="replace")
    return None


def _der_utf8string(der: bytes) -> bytes:
    """The content of a DER UTF8String (tag 0x0C), or the bytes unchanged if it is not one."""
    if len(der) < 2 or der[0] != 0x0C:
        return der
    length, offset = der[1], 2
    if length & 0x80:
        count = length & 0x7F
        length, offset = int.from_bytes(der[2 : 2 + count], "big"), 2 + count
    return der[offset : offset + length]


class _ClassifyingIdentity:
    """A sigstore policy: sigstore's own ``Identity`` check, reported as fleetlet errors.

    sigstore calls the policy only after the certificate chain, the SCT and the time source
    were accepted, so ``reached`` tells which side of that line a failure is on.
    """

    def __init__(self, expected: IdentityPolicy) -> None:
        self.expected = expected
        self.reached = False
        self.signer: SignerIdentity | None = None

    def verify(self, cert: x509.Certificate) -> None:
        self.reached = True
        from sigstore.verify import policy

        self.signer = certificate_signer(cert)
        check = policy.Identity(identity=self.expected.subject, issuer=self.expected.issuer)
        try:
            check.verify(cert)
        except Exception as exc:  # sigstore's VerificationError, or a missing extension
            raise IdentityMismatchError(self._mismatch(self.signer)) from exc

    def _mismatch(self, found: SignerIdentity) -> str:
        problems = []
        if found.issuer != self.expected.issuer:
            problems.append(
                f"OIDC issuer: expected {self.expected.issuer!r}, found {found.issuer!r}"
            )
        if self.expected.subject not in found.identities:
            shown = ", ".join(repr(i) for i in found.identities) or "none"
            problems.append(f"subject: expected {self.expected.subject!r}, found {shown}")
        if not problems:  # sigstore refused for a reason our reading did not see
            problems.append("the certificate does not satisfy the identity policy")
        return "signer identity does not match the policy: " + "; ".join(problems)


def verify_statement_signature(
    *, statement: bytes, bundle_json: bytes, trust: TrustPolicy | DeferredTrust, bundle_name: str
) -> SignerIdentity:
    """Verify the Sigstore bundle ``bundle_json`` over ``statement`` against ``trust`` (a
    :class:`DeferredTrust` vouching for exactly these bytes answers without sigstore).

    Returns who signed. Raises :class:`SignatureError` (unreadable bundle, statement edited,
    signature or log entry inconsistent), :class:`UntrustedSignerError` (certificate, SCT or
    time source not trusted by the trusted root), :class:`IdentityMismatchError`,
    TrustConfigError (a deferred policy that cannot be built).
    """
    if isinstance(trust, DeferredTrust):
        vouched = trust.vouched
        if vouched is not None and vouched.covers(statement, bundle_json):
            return SignerIdentity(identities=vouched.identities, issuer=vouched.issuer)
        trust = trust.policy()
    from sigstore.models import Bundle

    try:
        bundle = Bundle.from_json(bundle_json)
    except Exception as exc:  # InvalidBundle, JSON and model validation errors alike
        raise SignatureError(
            f"{bundle_name}: not a readable Sigstore bundle: {_one_line(exc)}"
        ) from exc
    check = _ClassifyingIdentity(trust.identity)
    try:
        trust.verifier.verify_artifact(statement, bundle, check)
    except IdentityMismatchError:
        raise
    # Hostile bundles reach deep into sigstore and its parsers, which raise more than their
    # own VerificationError (ExtensionNotFound, ValueError...): every failure is a refusal.
    except Exception as exc:
        if not check.reached:
            raise UntrustedSignerError(
                f"{bundle_name}: the signing certificate is not trusted by the configured "
                f"trusted root: {_one_line(exc)}"
            ) from exc
        raise SignatureError(
            f"{bundle_name}: the signature does not verify over the statement: {_one_line(exc)}"
        ) from exc
    if check.signer is None:  # sigstore accepted without asking the policy: never trust that
        raise SignatureError(f"{bundle_name}: the signer's identity was never checked")
    return check.signer


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """sigstore's and pydantic's messages span lines; errors here are one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
