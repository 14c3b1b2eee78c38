"""OIDC token minter: ES256 JWTs shaped like the ones Fulcio accepts from a real issuer."""

from __future__ import annotations

import time
from typing import Any

import jwt

from tests.realenv.sigstore.errors import ServiceError
from tests.realenv.sigstore.keys import new_p256_key

AUDIENCE = "sigstore"


class TokenMinter:
    """Mints identity tokens signed by its own key; the mini Fulcio checks them."""

    def __init__(self, *, issuer: str, lifetime: int = 600) -> None:
        self.issuer = issuer
        self.lifetime = lifetime
        self._key = new_p256_key()

    def mint(
        self,
        identity: str,
        *,
        issuer: str | None = None,
        audience: str = AUDIENCE,
        lifetime: int | None = None,
    ) -> str:
        """Return a JWT for `identity` (an e-mail address or a URI).

        An e-mail identity gets `email`/`email_verified` claims (its SAN becomes an
        rfc822Name); anything else is the `sub` and becomes a URI SAN. `issuer` overrides
        the `iss` claim (the token is still signed by this minter, as a federated issuer).
        """
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": issuer or self.issuer,
            "sub": identity,
            "aud": audience,
            "iat": now,
            "nbf": now,
            "exp": now + (self.lifetime if lifetime is None else lifetime),
        }
        if _is_email(identity):
            claims["email"] = identity
            claims["email_verified"] = True
        return jwt.encode(claims, self._key, algorithm="ES256")

    def verify(self, token: str) -> dict[str, Any]:
        """Check the token's signature, audience and validity period; return its claims.

        Raises ServiceError (401) when any check fails.
        """
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key.public_key(),
                algorithms=["ES256"],
                audience=AUDIENCE,
                options={"require": ["iss", "sub", "aud", "iat", "exp"]},
            )
        except jwt.PyJWTError as exc:
            raise ServiceError(f"invalid identity token: {exc}", status=401) from exc
        return claims


def _is_email(identity: str) -> bool:
    return "@" in identity and "://" not in identity
