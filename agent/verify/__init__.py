"""Verification of what the hub publishes: the Merkle tree and the signed publication.

``agent.verify.merkle`` is the RFC 6962 tree both sides share; ``agent.verify.publication``
holds the statement and proof formats, the branch file names and :func:`verify_publication`;
the trust configuration (:class:`TrustPolicy`, :class:`IdentityPolicy`) is the only part that
touches sigstore-python.

The names are exported on first use: importing one module of the package
(:mod:`agent.verify.sources`, whose policies a fleet repo's ``fleet.yaml`` declares) does not
load the publication's format and the API's types (about 35 ms).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_FROM = {
    **dict.fromkeys(
        (
            "DEFAULT_MAX_VALIDITY",
            "DeferredTrust",
            "IdentityPolicy",
            "SignerIdentity",
            "TrustPolicy",
            "VouchedSignature",
            "verify_statement_signature",
        ),
        "agent.verify._sigstore",
    ),
    **dict.fromkeys(
        (
            "BRANCH_FILES",
            "BUNDLE_FILE",
            "DEFAULT_CLOCK_SKEW",
            "PROOF_FILE",
            "SET_FILE",
            "STATEMENT_FILE",
            "ClusterProof",
            "PublicationStatement",
            "VerifiedPublication",
            "verify_publication",
        ),
        "agent.verify.publication",
    ),
}

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


def __getattr__(name: str) -> Any:
    """``agent.verify.NAME``, imported from its module on first use."""
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module 'agent.verify' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
