"""The proof a source carries in the signed set: its signature was verified, by whom, and
against which policy (the hub's ``fleet.yaml: sourceSigning``; docs/supply-chain.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.api.validation import ApiObject, api_field

_DIGEST = r"^sha256:[0-9a-f]{64}$"
_DIGEST_TEXT = "sha256:<64 hex>"


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceSignature(ApiObject):
    """A source's cosign or notation signature, verified by the hub against its signature
    policy before publishing."""

    policy: str = api_field(
        "Digest of the signature policy the signature was verified against.",
        pattern=_DIGEST,
        expected=_DIGEST_TEXT,
        max_length=71,
    )
    signer: str = api_field(
        "Who signed: `key sha256:<fingerprint of the public key>`, the keyless signer's "
        "`<subject> (<OIDC issuer>)` from its certificate, or `notation <certificate subject>`.",
        expected="the signer, in one line",
        max_length=1024,
    )
    layout: Literal["bundle", "sig-tag", "notation"] = api_field(
        "Where the signature was: `bundle` (a cosign Sigstore bundle attached as an OCI "
        "referrer), `sig-tag` (cosign's older `sha256-<digest>.sig` tag) or `notation` (a "
        "notation JWS envelope attached as an OCI referrer)."
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SignedSource(ApiObject):
    """In the status document: an image source of the bundle, whose signature the hub
    verified (and the cluster too, under its own policy, when ``clusterPolicy`` is set)."""

    digest: str = api_field(
        "The source's manifest digest.", pattern=_DIGEST, expected=_DIGEST_TEXT, max_length=71
    )
    signer: str = api_field(
        "Who signed, as the hub verified it.", expected="the signer", max_length=1024
    )
    policy: str = api_field(
        "Digest of the fleet's signature policy the hub verified it against.",
        pattern=_DIGEST,
        expected=_DIGEST_TEXT,
        max_length=71,
    )
    cluster_policy: str | None = api_field(
        "Digest of the cluster's own source policy (`--verify-sources`), which the agent "
        "verified the signature against before using the source.",
        default=None,
        pattern=_DIGEST,
        expected=_DIGEST_TEXT,
        max_length=71,
    )


__all__ = ["SignedSource", "SourceSignature"]
