"""cosign's signatures of an OCI artifact, found in its registry and checked against a policy.

Where cosign puts a signature of ``repo@sha256:<hex>``:

1. **a Sigstore bundle as an OCI referrer** (cosign v3's default, ``--new-bundle-format``): a
   manifest whose ``subject`` is the artifact and whose layer is the bundle (``application/
   vnd.dev.sigstore.bundle.v0.3+json``), a DSSE envelope over an in-toto statement naming the
   digest (predicate ``https://sigstore.dev/cosign/sign/v1``). Listed by the referrers API
   (``GET /v2/<repo>/referrers/<digest>``) or, on registries without it, by the referrers tag
   ``sha256-<hex>`` (an index: the distribution spec's fallback, which cosign maintains);
2. **the tag ``sha256-<hex>.sig``** (the older layout, ``--new-bundle-format=false``): an image
   manifest whose layers are simple-signing payloads naming the digest, each with its
   signature (and, keyless, the certificate) in the layer's annotations.

:func:`check_signatures` finds them all and passes the artifact when one signature passes
every step, each failing closed with a reason the refusal names:

1. the signature is good: made by one of the policy's keys (``cryptography``: ECDSA, Ed25519,
   RSA), or keyless, verified by sigstore-python against the policy's trusted root (chain to a
   trusted CA, SCT, transparency-log entry) for one of the policy's identities;
2. what was signed names this very digest (a signature copied from another artifact fails).

A keyless signature in the older layout carries no transparency-log inclusion proof (only a
signed entry timestamp), which sigstore-python requires: it is refused, saying so.
sigstore-python's and cryptography's exceptions are turned into reasons here, once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests

from agent.errors import TemporaryError
from agent.source.content import AuthenticationError
from agent.source.registry import RegistryClient, RegistryProtocolError, RegistryUnavailableError
from agent.verify.notation import ARTIFACT_TYPE as NOTATION_ARTIFACT_TYPE
from agent.verify.sources import PublicKey, SourcePolicy

if TYPE_CHECKING:
    from cryptography import x509
    from sigstore.verify import Verifier

BUNDLE_ARTIFACT_TYPE_PREFIX = "application/vnd.dev.sigstore.bundle"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
COSIGN_SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
IN_TOTO = "application/vnd.in-toto+json"
_SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
_CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
_PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"
_MANIFESTS = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_MAX_MANIFEST = 1024 * 1024
_MAX_BLOB = 4 * 1024 * 1024
_MAX_SIGNATURES = 32
LAYOUT_BUNDLE = "bundle"
LAYOUT_SIG_TAG = "sig-tag"
LAYOUT_NOTATION = "notation"


class SignaturesUnavailableError(TemporaryError):
    """The registry did not answer while its signatures were read; a retry may help."""

    reason = "RegistryUnavailable"


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """The verdict on one artifact: signed as the policy wants (by whom, in which layout), or
    why not."""

    digest: str
    policy: str
    """The policy's digest."""
    ok: bool
    reason: str
    """``ok``: who signed; else what is wrong, in one sentence."""
    signer: str | None = None
    """``key sha256:...`` or ``<subject> (<issuer>)``, when ``ok``."""
    layout: str | None = None
    valid_until: str | None = None
    """A pass that depends on the time (notation: certificates valid now) holds until then
    (``YYYY-MM-DDTHH:MM:SSZ``); None: for good."""

    def expired(self, now: datetime | None = None) -> bool:
        """Raises ValueError for a ``valid_until`` that is not such a time."""
        if self.valid_until is None:
            return False
        until = datetime.strptime(self.valid_until, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return (now or datetime.now(UTC)) >= until

    def to_json(self) -> str:
        return json.dumps(
            {
                "digest": self.digest,
                "policy": self.policy,
                "ok": self.ok,
                "reason": self.reason,
                "signer": self.signer,
                "layout": self.layout,
                "validUntil": self.valid_until,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> SignatureCheck:
        """Raises ValueError (not such a record)."""
        try:
            doc = json.loads(text)
            return cls(
                digest=str(doc["digest"]),
                policy=str(doc["policy"]),
                ok=bool(doc["ok"]),
                reason=str(doc["reason"]),
                signer=doc["signer"],
                layout=doc["layout"],
                valid_until=doc.get("validUntil"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a signature check: {exc}") from exc


class PassCache:
    """Passed checks by (digest, policy digest), one small JSON file each in ``directory``: a
    digest never changes, so its pass holds until the policy does. Refusals are not kept (a
    signature may be added). Every failure to read or write it only costs a check."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, digest: str, policy: str) -> Path:
        name = hashlib.sha256(f"{policy}\n{digest}".encode()).hexdigest()
        return self.directory / f"{name}.json"

    def get(self, digest: str, policy: str) -> SignatureCheck | None:
        try:
            check = SignatureCheck.from_json(self._path(digest, policy).read_bytes())
        except (OSError, ValueError):
            return None
        ok = check.ok and check.digest == digest and check.policy == policy
        try:
            return check if ok and not check.expired() else None
        except ValueError:  # a validUntil this code did not write
            return None

    def put(self, check: SignatureCheck) -> None:
        if not check.ok:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".check-")
            with os.fdopen(fd, "w") as handle:
                handle.write(check.to_json())
            os.replace(tmp, self._path(check.digest, check.policy))
        except OSError:
            return


@dataclass(frozen=True, slots=True)
class _Found:
    layout: str
    where: str
    bundle: bytes | None = None
    payload: bytes | None = None
    signature: str | None = None
    certificate: str | None = None


class _Rejected(Exception):
    """One signature does not satisfy the policy (the message says why)."""


class SignatureReader:
    """Reads the signatures of artifacts of one repository through the shared registry
    client (bounded retries, explicit credentials)."""

    def __init__(self, client: RegistryClient, *, base: str, repository: str) -> None:
        """``base``: ``http(s)://host``."""
        self.client = client
        self.url = f"{base}/v2/{repository}"
        self.requests = 0

    def find(self, digest: str) -> list[_Found]:
        """Every cosign signature of ``digest``, in both layouts. Raises
        SignaturesUnavailableError, or _Rejected when the registry refuses access."""
        hexpart = digest.removeprefix("sha256:")
        found: list[_Found] = []
        index = self._manifest(f"referrers/{digest}", referrers=True)
        if index is None:  # no referrers API: the fallback tag
            index = self._manifest(f"manifests/sha256-{hexpart}")
        for desc in _descriptors(index, "manifests")[:_MAX_SIGNATURES]:
            artifact = str(desc.get("artifactType") or "")
            predicate = (desc.get("annotations") or {}).get(_PREDICATE_ANNOTATION)
            if artifact == NOTATION_ARTIFACT_TYPE:  # notation's: agent/verify/notation.py
                child = desc.get("digest")
                manifest = self._manifest(f"manifests/{child}", expect=child)
                for layer in _descriptors(manifest, "layers")[:1]:
                    envelope = self._blob(layer)
                    where = f"notation referrer {child}"
                    media = str(layer.get("mediaType", ""))
                    found.append(_Found(LAYOUT_NOTATION, where, bundle=envelope, signature=media))
                continue
            if not artifact.startswith(BUNDLE_ARTIFACT_TYPE_PREFIX):
                continue
            if predicate not in (None, COSIGN_SIGN_PREDICATE):
                continue  # an attestation (SBOM, provenance): not a signature of the artifact
            child = desc.get("digest")
            manifest = self._manifest(f"manifests/{child}", expect=child)
            for layer in _descriptors(manifest, "layers")[:1]:
                if str(layer.get("mediaType", "")).startswith(BUNDLE_ARTIFACT_TYPE_PREFIX):
                    found.append(
                        _Found(LAYOUT_BUNDLE, f"referrer {child}", bundle=self._blob(layer))
                    )
        legacy = self._manifest(f"manifests/sha256-{hexpart}.sig")
        for layer in _descriptors(legacy, "layers")[:_MAX_SIGNATURES]:
            notes = layer.get("annotations") or {}
            if layer.get("mediaType") != SIMPLE_SIGNING or _SIGNATURE_ANNOTATION not in notes:
                continue
            found.append(
                _Found(
                    LAYOUT_SIG_TAG,
                    f"tag sha256-{hexpart[:12]}....sig",
                    payload=self._blob(layer),
                    signature=str(notes[_SIGNATURE_ANNOTATION]),
                    certificate=notes.get(_CERTIFICATE_ANNOTATION),
                )
            )
        return found

    def _get(self, url: str, headers: dict[str, str], limit: int) -> tuple[int, bytes]:
        self.requests += 1
        try:
            response = self.client.do_request(url, "GET", headers=headers, stream=True)
        except AuthenticationError as exc:
            raise _Rejected(f"the registry refused access to the signatures: {exc}") from exc
        except (RegistryUnavailableError, RegistryProtocolError) as exc:
            raise SignaturesUnavailableError(f"reading signatures: {exc}") from exc
        with response:
            if response.status_code != 200:
                return response.status_code, b""
            body = b""
            try:
                for chunk in response.iter_content(1 << 16):
                    body += chunk
                    if len(body) > limit:
                        raise _Rejected(f"{url}: larger than {limit} bytes")
            except requests.RequestException as exc:
                raise SignaturesUnavailableError(f"reading {url}: {exc}") from exc
        return 200, body

    def _manifest(
        self, path: str, *, expect: Any = None, referrers: bool = False
    ) -> dict[str, Any] | None:
        status, body = self._get(f"{self.url}/{path}", {"Accept": _MANIFESTS}, _MAX_MANIFEST)
        if status != 200:
            return None
        if expect is not None and "sha256:" + hashlib.sha256(body).hexdigest() != expect:
            raise _Rejected(f"manifest {expect} does not hash to its digest")
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if referrers and not isinstance(doc.get("manifests") if isinstance(doc, dict) else 0, list):
            return None  # a registry answering something else at that path
        return doc if isinstance(doc, dict) else None

    def _blob(self, layer: dict[str, Any]) -> bytes:
        digest, size = layer.get("digest"), layer.get("size")
        if not isinstance(digest, str) or not isinstance(size, int) or size > _MAX_BLOB:
            raise _Rejected(f"a signature layer's descriptor is malformed or too large: {layer}")
        status, body = self._get(f"{self.url}/blobs/{digest}", {}, _MAX_BLOB)
        if status != 200:
            raise _Rejected(f"signature blob {digest}: HTTP {status}")
        if len(body) != size or "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise _Rejected(f"signature blob {digest} does not match its descriptor")
        return body


def _descriptors(doc: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    items = (doc or {}).get(key)
    return [d for d in items if isinstance(d, dict)] if isinstance(items, list) else []


def check_signatures(reader: SignatureReader, digest: str, policy: SourcePolicy) -> SignatureCheck:
    """Verify the artifact ``digest`` of ``reader``'s repository against ``policy`` (the steps
    of the module docstring). Never raises for an artifact that fails (the verdict says why);
    raises SignaturesUnavailableError when the registry does not answer."""
    wanted = policy.digest()
    try:
        found = reader.find(digest)
    except _Rejected as exc:
        return SignatureCheck(digest, wanted, False, str(exc))
    if not found:
        unsigned = (
            "unsigned: no cosign signature found (neither a Sigstore bundle referrer nor a "
            "sha256-<digest>.sig tag)"
        )
        if policy.notation is not None:
            unsigned = "unsigned: no cosign or notation signature found (no referrer, no .sig tag)"
        return SignatureCheck(digest, wanted, False, unsigned)
    reasons: list[str] = []
    for item in found:
        try:
            signer, until = _verify_one(item, digest, policy)
        except _Rejected as exc:
            reasons.append(f"{item.where}: {exc}")
            continue
        valid = until.strftime("%Y-%m-%dT%H:%M:%SZ") if until is not None else None
        return SignatureCheck(
            digest, wanted, True, f"signed by {signer}", signer, item.layout, valid_until=valid
        )
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    count = f"{len(found)} signature{'s' if len(found) > 1 else ''}"
    return SignatureCheck(digest, wanted, False, f"{count} found, none acceptable: {shown}")


def _verify_one(item: _Found, digest: str, policy: SourcePolicy) -> tuple[str, datetime | None]:
    """Who signed, and until when that holds (None: for good)."""
    if item.layout == LAYOUT_NOTATION:
        from agent.verify.notation import NotationRefusal, verify_notation

        if policy.notation is None:
            raise _Rejected("a notation signature, and the policy names no notation trust store")
        assert item.bundle is not None
        try:
            found = verify_notation(item.bundle, item.signature or "", digest, policy.notation)
        except NotationRefusal as exc:
            raise _Rejected(str(exc)) from exc
        except Exception as exc:  # a hostile envelope reaching deep into cryptography
            raise _Rejected(f"the notation envelope is malformed ({exc})") from exc
        return found.signer, found.valid_until
    if item.layout == LAYOUT_BUNDLE:
        assert item.bundle is not None
        return _verify_bundle(item.bundle, digest, policy), None
    assert item.payload is not None and item.signature is not None
    if item.certificate and not policy.keys:
        raise _Rejected(
            "a keyless signature in the older .sig layout, which carries no transparency-log "
            "inclusion proof to verify (sign with cosign's default bundle format)"
        )
    try:
        signature = base64.b64decode(item.signature, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _Rejected("the signature annotation is not base64") from exc
    signer = _by_key(policy.keys, item.payload, signature)
    _check_simple_signing(item.payload, digest)
    return signer, None


def _verify_bundle(data: bytes, digest: str, policy: SourcePolicy) -> str:
    try:
        doc = json.loads(data)
        material = doc["verificationMaterial"]
        envelope = doc["dsseEnvelope"]
        payload_type = str(envelope["payloadType"])
        payload = base64.b64decode(envelope["payload"])
        signatures = [base64.b64decode(s["sig"]) for s in envelope["signatures"]]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise _Rejected(f"not a Sigstore bundle with a DSSE envelope ({exc})") from exc
    if "publicKey" in material:
        if not policy.keys:
            raise _Rejected("signed with a key, and the policy names no key")
        pae = _pae(payload_type, payload)
        signer = None
        for signature in signatures[:4]:
            try:
                signer = _by_key(policy.keys, pae, signature)
                break
            except _Rejected:
                continue
        if signer is None:
            raise _Rejected("the signature verifies with none of the policy's keys")
    else:
        if not policy.identities:
            raise _Rejected("a keyless (certificate) signature, and the policy names no identity")
        payload_type, payload, signer = _keyless(data, policy)
    if payload_type != IN_TOTO:
        raise _Rejected(f"the envelope holds {payload_type!r}, not an in-toto statement")
    _check_statement(payload, digest)
    return signer


def _pae(payload_type: str, payload: bytes) -> bytes:
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def _by_key(keys: tuple[PublicKey, ...], message: bytes, signature: bytes) -> str:
    """``key sha256:...`` of the policy key that verifies ``signature`` over ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    for key in keys:
        public = serialization.load_pem_public_key(key.pem.encode())
        try:
            if isinstance(public, ec.EllipticCurvePublicKey):
                size = public.curve.key_size
                algorithm: hashes.HashAlgorithm = (
                    hashes.SHA256()
                    if size <= 256
                    else hashes.SHA384()
                    if size <= 384
                    else hashes.SHA512()
                )
                public.verify(signature, message, ec.ECDSA(algorithm))
            elif isinstance(public, ed25519.Ed25519PublicKey):
                public.verify(signature, message)
            elif isinstance(public, rsa.RSAPublicKey):
                public.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
            else:
                continue
        except (InvalidSignature, ValueError):
            continue
        return f"key {key.fingerprint}"
    raise _Rejected("the signature verifies with none of the policy's keys")


def _check_statement(payload: bytes, digest: str) -> None:
    try:
        statement = json.loads(payload)
        subjects = statement["subject"]
        predicate = statement.get("predicateType")
        named = {f"sha256:{s['digest']['sha256']}" for s in subjects if "sha256" in s["digest"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise _Rejected(f"the signed statement is not an in-toto statement ({exc})") from exc
    if predicate != COSIGN_SIGN_PREDICATE:
        raise _Rejected(f"the statement is an attestation ({predicate}), not a signature")
    if digest not in named:
        shown = ", ".join(sorted(named)) or "no digest"
        raise _Rejected(f"the signature is for {shown}, not for {digest}")


def _check_simple_signing(payload: bytes, digest: str) -> None:
    try:
        doc = json.loads(payload)
        signed = doc["critical"]["image"]["docker-manifest-digest"]
        kind = doc["critical"]["type"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _Rejected(f"the signed payload is not a cosign simple-signing one ({exc})") from exc
    if kind != "cosign container image signature":
        raise _Rejected(f"the signed payload is of type {kind!r}")
    if signed != digest:
        raise _Rejected(f"the signature is for {signed}, not for {digest}")


# --- keyless: sigstore-python -------------------------------------------------------------------

_VERIFIERS: dict[bytes | None, Verifier] = {}
_VERIFIERS_LOCK = threading.Lock()


class TrustedRootError(ValueError):
    """A trusted root sigstore-python cannot read (its message says why, on one line)."""


def sigstore_verifier(root: bytes | None) -> Verifier:
    """sigstore's Verifier for a trusted root's bytes (None: the public-good root shipped
    with sigstore-python, read offline), built once per root and shared by every check of
    keyless signatures (cosign's here, gitsign's in the hub). Raises TrustedRootError."""
    with _VERIFIERS_LOCK:
        cached = _VERIFIERS.get(root)
        if cached is not None:
            return cached
        from sigstore.models import ClientTrustConfig, TrustedRoot
        from sigstore.verify import Verifier
        from sigstore_models.trustroot import v1 as trustroot_v1

        try:
            if root is None:
                trusted = ClientTrustConfig.production(offline=True).trusted_root
            else:
                trusted = TrustedRoot(trustroot_v1.TrustedRoot.from_json(root))
            verifier = Verifier(trusted_root=trusted)
        except Exception as exc:  # sigstore, pydantic and TUF errors alike
            raise TrustedRootError(_one_line(exc)) from exc
        _VERIFIERS[root] = verifier
        return verifier


class _IdentityCheck:
    """A sigstore verification policy: the certificate's issuer and subjects against the
    policy's identities (exact or regular expression); remembers who signed."""

    def __init__(self, policy: SourcePolicy) -> None:
        self.policy = policy
        self.signer: str | None = None
        self.found: str | None = None

    def verify(self, cert: x509.Certificate) -> None:
        from agent.verify._sigstore import certificate_signer

        who = certificate_signer(cert)
        self.found = f"{', '.join(who.identities) or 'no subject'} ({who.issuer or 'no issuer'})"
        for identity in self.policy.identities:
            if identity.matches(who.issuer, who.identities):
                self.signer = self.found
                return
        raise _Rejected(f"signed by {self.found}, not an identity of the policy")


def _keyless(data: bytes, policy: SourcePolicy) -> tuple[str, bytes, str]:
    from sigstore.models import Bundle

    try:
        verifier = sigstore_verifier(policy.trusted_root)
    except TrustedRootError as exc:
        raise _Rejected(f"the policy's trusted root is unusable: {exc}") from exc
    try:
        bundle = Bundle.from_json(data)
    except Exception as exc:  # InvalidBundle, JSON and model validation errors alike
        raise _Rejected(f"not a readable Sigstore bundle: {_one_line(exc)}") from exc
    check = _IdentityCheck(policy)
    try:
        payload_type, payload = verifier.verify_dsse(bundle, check)
    except _Rejected:
        raise
    except Exception as exc:  # every failure deep in sigstore is a refusal
        stage = "the signature or its log entry" if check.found else "the certificate"
        raise _Rejected(
            f"{stage} does not verify against the policy's trusted root: {_one_line(exc)}"
        ) from exc
    if check.signer is None:
        raise _Rejected("the signer's identity was never checked")
    return payload_type, payload, check.signer


def _one_line(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
