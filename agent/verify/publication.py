"""The signed publication: its statement, each cluster's proof, and the agent's verification.

One publication covers every cluster of a publish. The hub builds an RFC 6962 Merkle tree
over one leaf per cluster, ``(cluster, serial, set digest)``, and signs a small statement that
names the root once with Sigstore. Each cluster branch then carries four files
(:data:`BRANCH_FILES`): its set, the statement, the statement's Sigstore bundle and the
inclusion proof of its leaf. :func:`verify_publication` checks all of it and raises on the
first failed check; it never returns a "not valid" value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import rfc8785

from agent.api import (
    BundleDeploymentSet,
    canonical_bytes,
    digest_of,
    load_set,
    set_digest,
    set_from_canonical,
)
from agent.api.pins import is_digest, is_sha256_hex
from agent.errors import (
    ExpiredError,
    FieldProblem,
    InclusionProofError,
    ReplayError,
    SignatureError,
    StatementMismatchError,
    ValidationError,
    ValidityTooLongError,
    WrongClusterError,
)
from agent.verify._sigstore import TrustPolicy, verify_statement_signature
from agent.verify.merkle import HASH_SIZE, publication_leaf, verify_inclusion

API_VERSION = "fleetlet.io/v1alpha1"
STATEMENT_KIND = "PublicationStatement"
PROOF_KIND = "ClusterProof"
FORMAT_VERSION = 1

# The files of a cluster branch (``fleetlet/clusters/<cluster>``), defined here only.
SET_FILE = "set.yaml"
STATEMENT_FILE = "statement.json"
BUNDLE_FILE = "statement.sigstore.json"
PROOF_FILE = "proof.json"
BRANCH_FILES = (SET_FILE, STATEMENT_FILE, BUNDLE_FILE, PROOF_FILE)

DEFAULT_CLOCK_SKEW = timedelta(minutes=5)
_MAX_SAFE_INTEGER = 2**53 - 1
# A statement or proof is a few hundred bytes; anything near this is hostile.
_MAX_JSON_BYTES = 64 * 1024

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


# --- time stamps ----------------------------------------------------------------------------


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with second precision (``2026-11-22T22:00:00Z``), as in the sets.

    Sub-second parts are dropped; a naive ``moment`` is a ``ValueError``.
    """
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no time zone")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any, path: str, problems: list[FieldProblem]) -> datetime:
    if isinstance(value, str) and _TIME.fullmatch(value):
        try:
            return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            pass
    problems.append(
        FieldProblem(path=path, expected="a UTC time YYYY-MM-DDTHH:MM:SSZ", found=_brief(value))
    )
    return datetime.min.replace(tzinfo=UTC)


# --- the statement --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PublicationStatement:
    """What the hub signs once per publish.

    ``merkle_root`` is the RFC 6962 tree head (32 bytes) over ``tree_size`` leaves; the serial
    range is the lowest and highest set serial in the tree.
    """

    merkle_root: bytes
    tree_size: int
    issued_at: datetime
    expires_at: datetime
    source_repo: str
    source_commit: str
    serial_min: int
    serial_max: int
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The statement as its JSON document."""
        return {
            "apiVersion": API_VERSION,
            "kind": STATEMENT_KIND,
            "formatVersion": self.format_version,
            "merkleRoot": "sha256:" + self.merkle_root.hex(),
            "treeSize": self.tree_size,
            "serialRange": {"min": self.serial_min, "max": self.serial_max},
            "issuedAt": format_time(self.issued_at),
            "expiresAt": format_time(self.expires_at),
            "source": {"repo": self.source_repo, "commit": self.source_commit},
        }

    def to_bytes(self) -> bytes:
        """The signed bytes: RFC 8785 canonical JSON of :meth:`to_dict`."""
        return rfc8785.dumps(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes, *, origin: str = STATEMENT_FILE) -> PublicationStatement:
        """Parse a statement. Raises :class:`ValidationError` listing every problem found."""
        doc = _json_object(data, origin=origin)
        problems: list[FieldProblem] = []
        _check_header(doc, STATEMENT_KIND, problems)
        _check_keys(
            doc,
            {"apiVersion", "kind", "formatVersion", "merkleRoot", "treeSize", "serialRange"}
            | {"issuedAt", "expiresAt", "source"},
            "",
            problems,
        )
        if doc.get("formatVersion") != FORMAT_VERSION:
            problems.append(
                FieldProblem(
                    path="formatVersion",
                    expected=str(FORMAT_VERSION),
                    found=_brief(doc.get("formatVersion")),
                )
            )
        root = doc.get("merkleRoot")
        if not (isinstance(root, str) and is_digest(root)):
            problems.append(
                FieldProblem(path="merkleRoot", expected="sha256:<64 hex>", found=_brief(root))
            )
            root = "sha256:" + "00" * HASH_SIZE
        tree_size = _int(doc, "treeSize", "treeSize", problems, minimum=1)
        serials = _object(doc, "serialRange", "serialRange", problems)
        serial_min = _int(serials, "min", "serialRange.min", problems, minimum=0)
        serial_max = _int(serials, "max", "serialRange.max", problems, minimum=serial_min)
        _check_keys(serials, {"min", "max"}, "serialRange.", problems)
        source = _object(doc, "source", "source", problems)
        repo = _str(source, "repo", "source.repo", problems)
        commit = _str(source, "commit", "source.commit", problems)
        _check_keys(source, {"repo", "commit"}, "source.", problems)
        issued = _parse_time(doc.get("issuedAt"), "issuedAt", problems)
        expires = _parse_time(doc.get("expiresAt"), "expiresAt", problems)
        if not problems and expires <= issued:
            problems.append(
                FieldProblem(path="expiresAt", expected="later than issuedAt", found=str(expires))
            )
        if problems:
            raise ValidationError(problems, origin=origin)
        return cls(
            merkle_root=bytes.fromhex(root[len("sha256:") :]),
            tree_size=tree_size,
            issued_at=issued,
            expires_at=expires,
            source_repo=repo,
            source_commit=commit,
            serial_min=serial_min,
            serial_max=serial_max,
        )


# --- one cluster's proof --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ClusterProof:
    """Where a cluster's leaf sits in the signed tree, and the audit path from it to the root."""

    cluster: str
    leaf_index: int
    tree_size: int
    hashes: tuple[bytes, ...]

    def to_dict(self) -> dict[str, Any]:
        """The proof as its JSON document (hashes in lowercase hex, leaf to root)."""
        return {
            "apiVersion": API_VERSION,
            "kind": PROOF_KIND,
            "cluster": self.cluster,
            "leafIndex": self.leaf_index,
            "treeSize": self.tree_size,
            "hashes": [h.hex() for h in self.hashes],
        }

    def to_bytes(self) -> bytes:
        """RFC 8785 canonical JSON of :meth:`to_dict`."""
        doc = self.to_dict()
        # One per cluster on every publish: for ASCII text (hex, DNS names, small integers)
        # json.dumps gives the RFC 8785 bytes about ten times faster.
        if self.cluster.isascii() and self.tree_size <= _MAX_SAFE_INTEGER:
            return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return rfc8785.dumps(doc)

    @classmethod
    def from_bytes(cls, data: bytes, *, origin: str = PROOF_FILE) -> ClusterProof:
        """Parse a proof. Raises :class:`InclusionProofError` naming every problem found.

        The proof is unsigned: a malformed one is a failed inclusion check, not a schema error.
        """
        try:
            doc = _json_object(data, origin=origin)
        except ValidationError as exc:
            raise InclusionProofError(str(exc)) from exc
        problems: list[FieldProblem] = []
        _check_header(doc, PROOF_KIND, problems)
        _check_keys(
            doc, {"apiVersion", "kind", "cluster", "leafIndex", "treeSize", "hashes"}, "", problems
        )
        cluster = _str(doc, "cluster", "cluster", problems)
        index = _int(doc, "leafIndex", "leafIndex", problems, minimum=0)
        tree_size = _int(doc, "treeSize", "treeSize", problems, minimum=1)
        raw_hashes = doc.get("hashes")
        hashes: list[bytes] = []
        if not isinstance(raw_hashes, list) or len(raw_hashes) > 64:
            problems.append(
                FieldProblem(
                    path="hashes", expected="a list of at most 64 hashes", found=_brief(raw_hashes)
                )
            )
        else:
            for i, item in enumerate(raw_hashes):
                if isinstance(item, str) and is_sha256_hex(item):
                    hashes.append(bytes.fromhex(item))
                else:
                    problems.append(
                        FieldProblem(
                            path=f"hashes[{i}]", expected="64 lowercase hex", found=_brief(item)
                        )
                    )
        if problems:
            raise InclusionProofError(str(ValidationError(problems, origin=origin)))
        return cls(cluster=cluster, leaf_index=index, tree_size=tree_size, hashes=tuple(hashes))


# --- verification ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class VerifiedPublication:
    """A publication that passed every check: the set to apply and what vouches for it."""

    deployment_set: BundleDeploymentSet
    set_digest: str
    statement: PublicationStatement
    proof: ClusterProof
    signer_identities: tuple[str, ...]
    signer_issuer: str | None


def verify_publication(
    *,
    files: Mapping[str, bytes],
    cluster: str,
    last_serial: int | None,
    trust: TrustPolicy,
    now: datetime | None = None,
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
) -> VerifiedPublication:
    """Verify one cluster branch's files (:data:`BRANCH_FILES`) and return the accepted set.

    Checks, in this order: the Sigstore bundle over the statement (trusted root and identity
    policy), the statement's schema, the set's schema, that the set names ``cluster``, the
    inclusion proof of the set's leaf under the signed root, that set and statement agree,
    that the serial is greater than ``last_serial`` (``None``: nothing accepted yet), and the
    validity period (``clock_skew`` allowed either way; an ``expiresAt`` further away than
    ``trust.max_validity`` is refused). The set returned is the one its canonical bytes (the
    signed digest's input) say, read from those bytes. A set naming another cluster is
    refused as such whether or not it is in the tree; serial and validity are only judged on
    a set proven to be in the signed tree, so those reasons describe what the hub signed.

    Raises (each a distinct type): :class:`SignatureError`, :class:`UntrustedSignerError`,
    :class:`IdentityMismatchError`, :class:`ValidationError` (statement or set malformed, or
    set and statement disagree), :class:`FloatingReferenceError`, :class:`WrongClusterError`,
    :class:`InclusionProofError`, :class:`ReplayError`, :class:`ExpiredError`,
    :class:`ValidityTooLongError`. A missing file
    fails the check it feeds. ``now`` defaults to the current time; a naive ``now`` is a
    ``ValueError``.
    """
    now = datetime.now(UTC) if now is None else now
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")

    statement_bytes = files.get(STATEMENT_FILE)
    bundle_bytes = files.get(BUNDLE_FILE)
    if statement_bytes is None or bundle_bytes is None:
        missing = STATEMENT_FILE if statement_bytes is None else BUNDLE_FILE
        raise SignatureError(f"{missing} is missing: the publication is not signed")
    signer = verify_statement_signature(
        statement=statement_bytes, bundle_json=bundle_bytes, trust=trust, bundle_name=BUNDLE_FILE
    )
    statement = PublicationStatement.from_bytes(statement_bytes)

    set_bytes = files.get(SET_FILE)
    if set_bytes is None:
        raise ValidationError(
            [FieldProblem(path=SET_FILE, expected="the cluster's set", found="no such file")]
        )
    parsed = load_set(set_bytes, origin=SET_FILE)
    # What is hashed (and so signed) is the set's canonical bytes; what is acted on is the set
    # read back from exactly those bytes, so no value can differ by a type the digest is blind
    # to (RFC 8785 writes 3.0 as 3).
    signed = canonical_bytes(parsed)
    digest = digest_of(signed)
    deployment_set = set_from_canonical(signed, origin=SET_FILE)
    if set_digest(deployment_set) != digest:
        raise ValidationError(
            [
                FieldProblem(
                    path=SET_FILE,
                    expected="a set its canonical bytes describe exactly",
                    found="a set that reads back differently",
                )
            ]
        )
    if deployment_set.cluster != cluster:
        raise WrongClusterError(
            f"{SET_FILE} is addressed to cluster {deployment_set.cluster!r}, "
            f"this is cluster {cluster!r}"
        )

    proof_bytes = files.get(PROOF_FILE)
    if proof_bytes is None:
        raise InclusionProofError(f"{PROOF_FILE} is missing: the set cannot be tied to the root")
    proof = ClusterProof.from_bytes(proof_bytes)
    _check_inclusion(deployment_set, digest, proof, statement)
    _check_agreement(deployment_set, statement)

    if last_serial is not None and deployment_set.serial <= last_serial:
        raise ReplayError(
            f"set serial {deployment_set.serial} is not newer than the last accepted serial "
            f"{last_serial} (a replayed or stale publication)"
        )
    _check_validity(
        deployment_set,
        statement,
        now=now,
        clock_skew=clock_skew,
        max_validity=trust.max_validity,
    )

    return VerifiedPublication(
        deployment_set=deployment_set,
        set_digest=digest,
        statement=statement,
        proof=proof,
        signer_identities=signer.identities,
        signer_issuer=signer.issuer,
    )


def _check_inclusion(
    deployment_set: BundleDeploymentSet,
    digest: str,
    proof: ClusterProof,
    statement: PublicationStatement,
) -> None:
    if proof.cluster != deployment_set.cluster:
        raise InclusionProofError(
            f"{PROOF_FILE} proves the leaf of cluster {proof.cluster!r} (index "
            f"{proof.leaf_index}), not of cluster {deployment_set.cluster!r}"
        )
    # The path alone does not bind the size: it must be the signed one.
    if proof.tree_size != statement.tree_size:
        raise InclusionProofError(
            f"{PROOF_FILE} is for a tree of {proof.tree_size} leaves, the signed statement "
            f"covers {statement.tree_size}"
        )
    leaf = publication_leaf(
        cluster=deployment_set.cluster, serial=deployment_set.serial, set_digest=digest
    )
    try:
        verify_inclusion(
            leaf=leaf,
            index=proof.leaf_index,
            tree_size=statement.tree_size,
            proof=proof.hashes,
            root=statement.merkle_root,
        )
    except InclusionProofError as exc:
        raise InclusionProofError(
            f"{SET_FILE} (cluster {deployment_set.cluster!r}, serial {deployment_set.serial}, "
            f"{digest}) is not in the signed publication: {exc}"
        ) from exc


def _check_agreement(deployment_set: BundleDeploymentSet, statement: PublicationStatement) -> None:
    """A set must come from the statement's source and cannot outlive the statement."""
    problems = []
    if deployment_set.source.repo != statement.source_repo:
        problems.append(
            FieldProblem(
                path="source.repo",
                expected=f"{statement.source_repo!r} (the signed statement's)",
                found=repr(deployment_set.source.repo),
            )
        )
    if deployment_set.source.commit != statement.source_commit:
        problems.append(
            FieldProblem(
                path="source.commit",
                expected=f"{statement.source_commit!r} (the signed statement's)",
                found=repr(deployment_set.source.commit),
            )
        )
    if deployment_set.expires_at > statement.expires_at:
        problems.append(
            FieldProblem(
                path="expiresAt",
                expected=f"at most {format_time(statement.expires_at)} (the statement's)",
                found=format_time(deployment_set.expires_at),
            )
        )
    if problems:
        raise StatementMismatchError(str(ValidationError(problems, origin=SET_FILE)))


def _check_validity(
    deployment_set: BundleDeploymentSet,
    statement: PublicationStatement,
    *,
    now: datetime,
    clock_skew: timedelta,
    max_validity: timedelta,
) -> None:
    # Times come from the publication: any of them may sit at year 9999, so nothing is added
    # to them (an OverflowError is not a refusal); differences of two times never overflow.
    expires = min(deployment_set.expires_at, statement.expires_at)
    if now - clock_skew > expires:
        raise ExpiredError(
            f"the publication expired at {format_time(expires)} (now {format_time(now)}, "
            f"clock skew allowed {clock_skew})"
        )
    issued = max(deployment_set.issued_at, statement.issued_at)
    if issued > now + clock_skew:
        raise ExpiredError(
            f"the publication is not valid before {format_time(issued)} (now "
            f"{format_time(now)}, clock skew allowed {clock_skew}): check this cluster's clock"
        )
    if expires - now > max_validity + clock_skew:
        raise ValidityTooLongError(
            f"the publication would stay valid until {format_time(expires)}, more than "
            f"{max_validity} from now ({format_time(now)}): this agent accepts at most that "
            "(--max-publication-validity)"
        )


# --- small JSON helpers (every problem is collected, not only the first) -------------------


def _json_object(data: bytes, *, origin: str) -> dict[str, Any]:
    if len(data) > _MAX_JSON_BYTES:
        raise ValidationError(
            [
                FieldProblem(
                    path="(document)",
                    expected=f"at most {_MAX_JSON_BYTES} bytes",
                    found=f"{len(data)} bytes",
                )
            ],
            origin=origin,
        )
    try:
        doc = json.loads(data)
    # RecursionError: hostile nesting ("[[[[..."), which the json module does not bound.
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValidationError(
            [FieldProblem(path="(document)", expected="JSON", found=f"unparseable ({exc})")],
            origin=origin,
        ) from exc
    if not isinstance(doc, dict):
        raise ValidationError(
            [FieldProblem(path="(document)", expected="a JSON object", found=_brief(doc))],
            origin=origin,
        )
    return doc


def _check_header(doc: Mapping[str, Any], kind: str, problems: list[FieldProblem]) -> None:
    for key, expected in (("apiVersion", API_VERSION), ("kind", kind)):
        if doc.get(key) != expected:
            problems.append(FieldProblem(path=key, expected=expected, found=_brief(doc.get(key))))


def _check_keys(
    doc: Mapping[str, Any], allowed: set[str], prefix: str, problems: list[FieldProblem]
) -> None:
    for key in sorted(set(doc) - allowed):
        problems.append(
            FieldProblem(path=prefix + key, expected="a known field", found="an unknown field")
        )


def _object(
    doc: Mapping[str, Any], key: str, path: str, problems: list[FieldProblem]
) -> Mapping[str, Any]:
    value = doc.get(key)
    if isinstance(value, dict):
        return value
    problems.append(FieldProblem(path=path, expected="an object", found=_brief(value)))
    return {}


def _str(doc: Mapping[str, Any], key: str, path: str, problems: list[FieldProblem]) -> str:
    value = doc.get(key)
    if isinstance(value, str) and value:
        return value
    problems.append(FieldProblem(path=path, expected="a non-empty string", found=_brief(value)))
    return ""


def _int(
    doc: Mapping[str, Any], key: str, path: str, problems: list[FieldProblem], *, minimum: int
) -> int:
    value = doc.get(key)
    # bool is an int in Python, not in the schema.
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    problems.append(
        FieldProblem(path=path, expected=f"an integer >= {minimum}", found=_brief(value))
    )
    return minimum


def _brief(value: Any) -> str:
    text = "missing" if value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__: Sequence[str] = (
    "API_VERSION",
    "BRANCH_FILES",
    "BUNDLE_FILE",
    "DEFAULT_CLOCK_SKEW",
    "FORMAT_VERSION",
    "PROOF_FILE",
    "SET_FILE",
    "STATEMENT_FILE",
    "ClusterProof",
    "PublicationStatement",
    "VerifiedPublication",
    "format_time",
    "verify_publication",
)
