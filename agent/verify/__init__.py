"""Verification of what the hub publishes: the Merkle tree and the signed publication.

``agent.verify.merkle`` is the RFC 6962 tree both sides share; ``agent.verify.publication``
holds the statement and proof formats, the branch file names and :func:`verify_publication`;
the trust configuration (:class:`TrustPolicy`, :class:`IdentityPolicy`) is the only part that
touches sigstore-python.
"""

from agent.verify._sigstore import (
    DEFAULT_MAX_VALIDITY,
    DeferredTrust,
    IdentityPolicy,
    SignerIdentity,
    TrustPolicy,
    VouchedSignature,
    verify_statement_signature,
)
from agent.verify.publication import (
    BRANCH_FILES,
    BUNDLE_FILE,
    DEFAULT_CLOCK_SKEW,
    PROOF_FILE,
    SET_FILE,
    STATEMENT_FILE,
    ClusterProof,
    PublicationStatement,
    VerifiedPublication,
    verify_publication,
)

__all__ = [
    "BRANCH_FILES",
    "BUNDLE_FILE",
    "DEFAULT_CLOCK_SKEW",
    "DEFAULT_MAX_VALIDITY",
    "PROOF_FILE",
    "SET_FILE",
    "STATEMENT_FILE",
    "ClusterProof",
    "DeferredTrust",
    "IdentityPolicy",
    "PublicationStatement",
    "SignerIdentity",
    "TrustPolicy",
    "VerifiedPublication",
    "VouchedSignature",
    "verify_publication",
    "verify_statement_signature",
]
