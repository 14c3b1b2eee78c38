"""A local "mini Sigstore" (Fulcio-like CA, CT log, Rekor v1/v2, RFC 3161 TSA, OIDC minter).

Test code: signing and verification go through sigstore-python unmodified.
"""

from tests.realenv.sigstore.mini import DEFAULT_IDENTITY, MiniSigstore

__all__ = ["DEFAULT_IDENTITY", "MiniSigstore"]
