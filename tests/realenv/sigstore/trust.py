"""Trust documents pointing sigstore-python at a mini Sigstore (media types are versioned)."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.realenv.sigstore.keys import key_id, spki_der

TRUSTED_ROOT_MEDIA_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
SIGNING_CONFIG_MEDIA_TYPE = "application/vnd.dev.sigstore.signingconfig.v0.2+json"
CLIENT_TRUST_CONFIG_MEDIA_TYPE = "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _time(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def log_instance(
    *, base_url: str, key: ec.EllipticCurvePublicKey, start: dt.datetime
) -> dict[str, Any]:
    """A `tlogs[]`/`ctlogs[]` entry for an ECDSA P-256 log key."""
    return {
        "baseUrl": base_url,
        "hashAlgorithm": "SHA2_256",
        "publicKey": {
            "rawBytes": _b64(spki_der(key)),
            "keyDetails": "PKIX_ECDSA_P256_SHA_256",
            "validFor": {"start": _time(start)},
        },
        "logId": {"keyId": _b64(key_id(key))},
    }


def certificate_authority(
    *, uri: str, chain: list[x509.Certificate], start: dt.datetime
) -> dict[str, Any]:
    """A `certificateAuthorities[]`/`timestampAuthorities[]` entry (chain leaf-most first)."""
    subject = chain[-1].subject
    org = subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)
    common_name = subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return {
        "subject": {
            "organization": str(org[0].value) if org else "",
            "commonName": str(common_name[0].value) if common_name else "",
        },
        "uri": uri,
        "certChain": {
            "certificates": [
                {"rawBytes": _b64(c.public_bytes(serialization.Encoding.DER))} for c in chain
            ]
        },
        "validFor": {"start": _time(start)},
    }


def trusted_root(
    *,
    tlogs: list[dict[str, Any]],
    ctlogs: list[dict[str, Any]],
    cas: list[dict[str, Any]],
    tsas: list[dict[str, Any]],
) -> dict[str, Any]:
    """The trusted root document."""
    return {
        "mediaType": TRUSTED_ROOT_MEDIA_TYPE,
        "tlogs": tlogs,
        "certificateAuthorities": cas,
        "ctlogs": ctlogs,
        "timestampAuthorities": tsas,
    }


def _service(url: str, version: int, start: dt.datetime, operator: str) -> dict[str, Any]:
    return {
        "url": url,
        "majorApiVersion": version,
        "validFor": {"start": _time(start)},
        "operator": operator,
    }


def signing_config(
    *,
    ca_url: str,
    oidc_url: str,
    rekor_url: str,
    rekor_version: int,
    tsa_url: str | None,
    start: dt.datetime,
    operator: str = "fleetlet.test",
) -> dict[str, Any]:
    """The signing config: one CA, one OIDC issuer, one log, and optionally one TSA."""
    return {
        "mediaType": SIGNING_CONFIG_MEDIA_TYPE,
        "caUrls": [_service(ca_url, 1, start, operator)],
        "oidcUrls": [_service(oidc_url, 1, start, operator)],
        "rekorTlogUrls": [_service(rekor_url, rekor_version, start, operator)],
        "tsaUrls": [_service(tsa_url, 1, start, operator)] if tsa_url else [],
        "rekorTlogConfig": {"selector": "ANY"},
        "tsaConfig": {"selector": "ANY"},
    }


def client_trust_config(root: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The client trust config (`sigstore --trust-config`, `ClientTrustConfig.from_json`)."""
    return {
        "mediaType": CLIENT_TRUST_CONFIG_MEDIA_TYPE,
        "trustedRoot": root,
        "signingConfig": config,
    }
