"""Source signature policies: who must have signed an OCI artifact before it is deployed.

A policy names signers in two ways, either of which satisfies it:

- ``keys``: cosign public keys (PEM, as ``cosign generate-key-pair`` writes ``cosign.pub``);
- ``identities``: keyless (Sigstore) signers, each an OIDC ``issuer`` and a certificate
  ``subject``, each exact or a regular expression (``issuerRegExp``, ``subjectRegExp``, matched
  whole), checked against ``trustedRoot`` (a ``trusted_root.json``; by default the public-good
  Sigstore root shipped with sigstore-python);
- ``notation``: notation (Notary Project) signers, as notation's trust policy names them: a
  ``trustStore`` of CA certificates (PEM, inline or files) and ``trustedIdentities``
  (``x509.subject: C=US, O=Acme, CN=release``, or ``*``: any certificate the store issued).

The same document is read by the hub (``fleet.yaml: sourceSigning.policies.<name>``, files
relative to the fleet repository) and by the agent (``agent install --verify-sources FILE``,
the cluster's own policy, files relative to that file)::

    keys: [keys/release.pub]                # or inline PEM
    identities:
      - issuer: https://token.actions.githubusercontent.com
        subjectRegExp: ^https://github\\.com/acme/charts/\\.github/workflows/.+@refs/tags/v.+$
    trustedRoot: trust/trusted_root.json    # optional

:meth:`SourcePolicy.digest` names a policy by content (key fingerprints, identities, the
trusted root's bytes): the signed set records it beside each verified source.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.errors import FieldProblem

_IDENTITY_FIELDS = ("issuer", "issuerRegExp", "subject", "subjectRegExp")
_POLICY_FIELDS = ("keys", "identities", "trustedRoot", "notation")
_NOTATION_FIELDS = ("trustStore", "trustedIdentities", "tsaTrustStore")
_PEM_CERT = re.compile(
    r"-----BEGIN CERTIFICATE-----\s+[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----", re.DOTALL
)
_SUBJECT_PREFIX = "x509.subject:"
_PEM_KEY = re.compile(
    r"-----BEGIN PUBLIC KEY-----\s+[A-Za-z0-9+/=\s]+-----END PUBLIC KEY-----", re.DOTALL
)
_MAX_FILE = 1024 * 1024

ReadFile = Callable[[str], bytes]
"""Reads a file a policy names (relative to the policy's home); raises OSError or ValueError
(a path leaving that home) with the reason."""


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A cosign public key: its PEM text and fingerprint (``sha256:`` of its DER SPKI)."""

    pem: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class KeylessIdentity:
    """A keyless signer: issuer and subject, each exact or a regular expression."""

    issuer: str | None = None
    issuer_regexp: str | None = None
    subject: str | None = None
    subject_regexp: str | None = None

    def matches(self, issuer: str | None, subjects: tuple[str, ...]) -> bool:
        if issuer is None or not _match(issuer, self.issuer, self.issuer_regexp):
            return False
        return any(_match(s, self.subject, self.subject_regexp) for s in subjects)

    def to_dict(self) -> dict[str, str]:
        pairs = zip(
            _IDENTITY_FIELDS,
            (self.issuer, self.issuer_regexp, self.subject, self.subject_regexp),
            strict=True,
        )
        return {k: v for k, v in pairs if v is not None}

    def describe(self) -> str:
        subject = self.subject or f"/{self.subject_regexp}/"
        issuer = self.issuer or f"/{self.issuer_regexp}/"
        return f"{subject} from {issuer}"


def _match(value: str, exact: str | None, pattern: str | None) -> bool:
    if exact is not None:
        return value == exact
    return pattern is not None and re.fullmatch(pattern, value) is not None


@dataclass(frozen=True, slots=True)
class NotationTrust:
    """notation's trust: CA certificates (DER) and the identities (``x509.subject:`` DNs as
    written, or ``*``) whose signatures they certify."""

    trust_store: tuple[bytes, ...]
    trusted_identities: tuple[str, ...]
    tsa_store: tuple[bytes, ...] = ()
    """Root certificates (DER) of the timestamp authorities whose RFC 3161 countersignature
    dates a signature (notation's ``tsa`` trust store); none: certificates must be valid now."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "trustStore": sorted(
                "sha256:" + hashlib.sha256(c).hexdigest() for c in self.trust_store
            ),
            "trustedIdentities": sorted(self.trusted_identities),
        }
        if self.tsa_store:
            doc["tsaTrustStore"] = sorted(
                "sha256:" + hashlib.sha256(c).hexdigest() for c in self.tsa_store
            )
        return doc

    def describe(self) -> str:
        who = " or ".join(self.trusted_identities)
        return f"notation {who} under {len(self.trust_store)} trusted CA(s)"


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """Who must have signed a source: any of ``keys``, of ``identities`` or of ``notation``."""

    name: str
    keys: tuple[PublicKey, ...] = ()
    identities: tuple[KeylessIdentity, ...] = ()
    trusted_root: bytes | None = None
    """The ``trusted_root.json`` bytes for ``identities`` (None: the public-good root)."""
    notation: NotationTrust | None = None

    def digest(self) -> str:
        """``sha256:`` of the policy's canonical JSON: the same signers and root give the same
        digest, whatever the YAML's layout or the policy's name."""
        doc: dict[str, Any] = {
            "keys": sorted(k.fingerprint for k in self.keys),
            "identities": sorted(json.dumps(i.to_dict(), sort_keys=True) for i in self.identities),
            "trustedRoot": (
                "sha256:" + hashlib.sha256(self.trusted_root).hexdigest()
                if self.trusted_root is not None
                else "public-good"
            ),
        }
        if self.notation is not None:
            doc["notation"] = self.notation.to_dict()
        data = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(data.encode()).hexdigest()

    def wanted(self) -> str:
        """What the policy asks, in one line."""
        parts = [f"key {k.fingerprint[:19]}" for k in self.keys]
        parts += [f"keyless {i.describe()}" for i in self.identities]
        kinds = [f"a cosign signature by one of: {', '.join(parts)}"] if parts else []
        if self.notation is not None:
            kinds.append(f"a {self.notation.describe()}")
        return " or ".join(kinds)

    def describe(self) -> str:
        return f"policy {self.name!r} ({self.digest()[:19]})"

    def document(self, trusted_root_file: str) -> dict[str, Any]:
        """The policy as one self-contained document (keys inline), its trusted root named
        ``trusted_root_file``: what ``agent install --verify-sources`` stores."""
        doc: dict[str, Any] = {}
        if self.keys:
            doc["keys"] = [k.pem + "\n" for k in self.keys]
        if self.identities:
            doc["identities"] = [i.to_dict() for i in self.identities]
        if self.trusted_root is not None:
            doc["trustedRoot"] = trusted_root_file
        if self.notation is not None:
            doc["notation"] = {
                "trustStore": [_pem_certificate(c) for c in self.notation.trust_store],
                "trustedIdentities": list(self.notation.trusted_identities),
            }
            if self.notation.tsa_store:
                doc["notation"]["tsaTrustStore"] = [
                    _pem_certificate(c) for c in self.notation.tsa_store
                ]
        return doc


def parse_source_policy(
    raw: Any, *, name: str, where: str, read: ReadFile, problems: list[FieldProblem]
) -> SourcePolicy | None:
    """``raw`` as a policy named ``name``; every problem is added to ``problems`` with its
    path under ``where``, and None returned."""
    start = len(problems)

    def problem(path: str, expected: str, found: Any) -> None:
        problems.append(FieldProblem(path=path, expected=expected, found=_brief(found)))

    if not isinstance(raw, dict):
        problem(where, "a mapping with keys and/or identities (and trustedRoot)", raw)
        return None
    for key in sorted(set(raw) - set(_POLICY_FIELDS), key=str):
        problem(f"{where}.{key}", ", ".join(_POLICY_FIELDS), "unknown field")
    keys = _keys(raw.get("keys"), f"{where}.keys", read, problem)
    identities = _identities(raw.get("identities"), f"{where}.identities", problem)
    notation = (
        _notation(raw["notation"], f"{where}.notation", read, problem)
        if "notation" in raw
        else None
    )
    if not keys and not identities and notation is None and len(problems) == start:
        problem(
            where, "at least one of keys, identities or notation (a policy naming no signer)", raw
        )
    root: bytes | None = None
    if "trustedRoot" in raw:
        root = _trusted_root(raw["trustedRoot"], f"{where}.trustedRoot", read, problem)
        if root is not None and not identities:
            problem(f"{where}.trustedRoot", "identities beside it (keys need no root)", "no")
    if len(problems) > start:
        return None
    return SourcePolicy(
        name=name,
        keys=tuple(keys),
        identities=tuple(identities),
        trusted_root=root,
        notation=notation,
    )


def _notation(
    raw: Any, where: str, read: ReadFile, problem: Callable[[str, str, Any], None]
) -> NotationTrust | None:
    """``notation: {trustStore: [PEM or file], trustedIdentities: ["x509.subject: ..." | "*"],
    tsaTrustStore?: [PEM or file]}``."""
    if not isinstance(raw, dict):
        problem(where, "a mapping {trustStore, trustedIdentities}", raw)
        return None
    for key in sorted(set(raw) - set(_NOTATION_FIELDS), key=str):
        problem(f"{where}.{key}", ", ".join(_NOTATION_FIELDS), "unknown field")
    store = _certificates(raw.get("trustStore"), f"{where}.trustStore", read, problem)
    tsa: list[bytes] = []
    if "tsaTrustStore" in raw:
        tsa = _certificates(raw["tsaTrustStore"], f"{where}.tsaTrustStore", read, problem)
    names = raw.get("trustedIdentities")
    identities: list[str] = []
    if not isinstance(names, list) or not names:
        problem(
            f"{where}.trustedIdentities",
            'a non-empty list of "x509.subject: <DN>" or "*"',
            names,
        )
    for i, item in enumerate(names if isinstance(names, list) else []):
        if item == "*" or (isinstance(item, str) and parse_subject(item) is not None):
            identities.append(item)
        else:
            problem(
                f"{where}.trustedIdentities[{i}]",
                '"x509.subject: C=US, O=Acme, CN=release" (RDNs as TYPE=value) or "*"',
                item,
            )
    if not store or not identities or ("tsaTrustStore" in raw and not tsa):
        return None
    return NotationTrust(tuple(store), tuple(identities), tuple(tsa))


def _certificates(
    entries: Any, where: str, read: ReadFile, problem: Callable[[str, str, Any], None]
) -> list[bytes]:
    """The DER of every PEM certificate of ``entries`` (a non-empty list, each PEM text or
    the path of a file)."""
    from cryptography import x509

    if not isinstance(entries, list) or not entries:
        problem(where, "a non-empty list of PEM certificates or files holding them", entries)
        return []
    store: list[bytes] = []
    for i, item in enumerate(entries):
        at = f"{where}[{i}]"
        text = item if isinstance(item, str) else ""
        if text and "-----BEGIN" not in text:
            try:
                text = read(text.strip()).decode("utf-8", errors="replace")
            except (OSError, ValueError) as exc:
                problem(at, "a readable file of PEM certificates", f"{item}: {exc}")
                continue
        found = _PEM_CERT.findall(text)
        try:
            certs = [x509.load_pem_x509_certificate(pem.encode()) for pem in found]
        except ValueError:
            certs = []
        if not certs:
            problem(at, "PEM certificates (a CA that issues the signers' certificates)", item)
            continue
        store += [c.public_bytes(_der()) for c in certs]
    return store


def parse_subject(identity: str) -> frozenset[tuple[str, str]] | None:
    """The ``(TYPE, value)`` pairs of an ``x509.subject: ...`` identity, or None when it is not
    one. Values may hold escaped commas (``\\,``)."""
    if not identity.startswith(_SUBJECT_PREFIX):
        return None
    parts = re.split(r"(?<!\\),", identity[len(_SUBJECT_PREFIX) :])
    pairs = set()
    for part in parts:
        kind, sep, value = part.strip().partition("=")
        if not sep or not kind.strip() or not value.strip():
            return None
        pairs.add((kind.strip().upper(), value.strip().replace("\\,", ",")))
    return frozenset(pairs) if pairs else None


def _der() -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.DER


def _pem_certificate(der: bytes) -> str:
    body = base64.encodebytes(der).decode().replace("\n", "")
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN CERTIFICATE-----\n{lines}\n-----END CERTIFICATE-----\n"


def parse_identities(
    raw: Any, where: str, problems: list[FieldProblem]
) -> tuple[KeylessIdentity, ...]:
    """``identities`` as in a policy (also the fleet's ``commitSigning.identities``)."""

    def problem(path: str, expected: str, found: Any) -> None:
        problems.append(FieldProblem(path=path, expected=expected, found=_brief(found)))

    return tuple(_identities(raw, where, problem))


def parse_trusted_root(
    raw: Any, where: str, read: ReadFile, problems: list[FieldProblem]
) -> bytes | None:
    """``trustedRoot`` as in a policy: the named file's bytes, checked to be a trusted root."""

    def problem(path: str, expected: str, found: Any) -> None:
        problems.append(FieldProblem(path=path, expected=expected, found=_brief(found)))

    return _trusted_root(raw, where, read, problem)


def _keys(
    raw: Any, where: str, read: ReadFile, problem: Callable[[str, str, Any], None]
) -> list[PublicKey]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        problem(where, "a non-empty list of PEM public keys or files holding one", raw)
        return []
    out: list[PublicKey] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, str) or not item.strip():
            problem(at, "a PEM public key or the path of a file holding one", item)
            continue
        text = item
        if "-----BEGIN" not in item:
            try:
                text = read(item.strip()).decode("utf-8", errors="replace")
            except (OSError, ValueError) as exc:
                problem(at, "a readable file holding a PEM public key", f"{item}: {exc}")
                continue
        key = load_public_key(text)
        if key is None:
            problem(at, "a PEM public key (ECDSA, Ed25519 or RSA; cosign.pub)", item)
            continue
        out.append(key)
    return out


def load_public_key(text: str) -> PublicKey | None:
    """The first PEM public key of ``text``, or None if there is none usable."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    match = _PEM_KEY.search(text)
    if match is None:
        return None
    pem = match.group(0)
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | rsa.RSAPublicKey):
        return None
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return PublicKey(pem=pem, fingerprint="sha256:" + hashlib.sha256(der).hexdigest())


def _identities(
    raw: Any, where: str, problem: Callable[[str, str, Any], None]
) -> list[KeylessIdentity]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        problem(where, "a non-empty list of {issuer|issuerRegExp, subject|subjectRegExp}", raw)
        return []
    out: list[KeylessIdentity] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            problem(at, "a mapping {issuer|issuerRegExp, subject|subjectRegExp}", item)
            continue
        bad = False
        for key in sorted(set(item) - set(_IDENTITY_FIELDS), key=str):
            problem(f"{at}.{key}", ", ".join(_IDENTITY_FIELDS), "unknown field")
            bad = True
        values: dict[str, str] = {}
        for part in ("issuer", "subject"):
            given = [f for f in (part, f"{part}RegExp") if f in item]
            if len(given) != 1:
                problem(at, f"exactly one of {part} or {part}RegExp", ", ".join(given) or "none")
                bad = True
                continue
            value = item[given[0]]
            if not isinstance(value, str) or not value.strip():
                problem(f"{at}.{given[0]}", "a non-empty string", value)
                bad = True
                continue
            if given[0].endswith("RegExp"):
                try:
                    re.compile(value)
                except re.error as exc:
                    problem(f"{at}.{given[0]}", "a valid regular expression", f"{value} ({exc})")
                    bad = True
                    continue
            values[given[0]] = value
        if not bad:
            out.append(
                KeylessIdentity(
                    issuer=values.get("issuer"),
                    issuer_regexp=values.get("issuerRegExp"),
                    subject=values.get("subject"),
                    subject_regexp=values.get("subjectRegExp"),
                )
            )
    return out


def _trusted_root(
    raw: Any, where: str, read: ReadFile, problem: Callable[[str, str, Any], None]
) -> bytes | None:
    if not isinstance(raw, str) or not raw.strip():
        problem(where, "the path of a trusted_root.json", raw)
        return None
    try:
        data = read(raw.strip())
    except (OSError, ValueError) as exc:
        problem(where, "a readable trusted_root.json", f"{raw}: {exc}")
        return None
    try:
        doc = json.loads(data)
    except ValueError as exc:
        problem(where, "a trusted_root.json (JSON)", f"{raw}: {exc}")
        return None
    if not isinstance(doc, dict) or not str(doc.get("mediaType", "")).startswith(
        "application/vnd.dev.sigstore.trustedroot"
    ):
        problem(where, "a Sigstore trusted root (mediaType ...trustedroot+json)", raw)
        return None
    return data


def file_reader(home: Any) -> ReadFile:
    """A :data:`ReadFile` for paths relative to the directory ``home`` (a Path), refusing
    paths that leave it and files over 1 MiB."""
    from pathlib import Path

    base = Path(home).resolve()

    def read(relative: str) -> bytes:
        path = (base / relative).resolve()
        if not path.is_relative_to(base):
            raise ValueError(f"leaves {base}")
        if path.stat().st_size > _MAX_FILE:
            raise ValueError(f"larger than {_MAX_FILE} bytes")
        return path.read_bytes()

    return read


def _brief(value: Any) -> str:
    text = "missing" if value is None else value if isinstance(value, str) else repr(value)
    text = " ".join(str(text).split())
    return text if len(text) <= 100 else text[:97] + "..."
