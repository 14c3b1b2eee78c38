"""The mini Sigstore signs and verifies through sigstore-python unmodified, and refuses what a
real Sigstore refuses; a real public-good bundle verifies offline with the shipped trusted root."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from sigstore import dsse
from sigstore.errors import VerificationError
from sigstore.models import Bundle, ClientTrustConfig, TrustedRoot
from sigstore.verify import Verifier, policy

from tests.realenv.sigstore import DEFAULT_IDENTITY, MiniSigstore
from tests.realenv.sigstore_fixtures import PublicGoodSample, production_trusted_root_path

ARTIFACT = b"apiVersion: fleetlet.io/v1alpha1\nkind: Publication\nserial: 42\n"


@pytest.fixture(params=[1, 2], ids=["rekor-v1", "rekor-v2+tsa"])
def instance(
    request: pytest.FixtureRequest, mini_sigstore: MiniSigstore, mini_sigstore_v2: MiniSigstore
) -> MiniSigstore:
    """Each test taking `instance` runs against Rekor v1 and against Rekor v2 + TSA."""
    return mini_sigstore if request.param == 1 else mini_sigstore_v2


def _identity(instance: MiniSigstore, identity: str = DEFAULT_IDENTITY) -> policy.Identity:
    return policy.Identity(identity=identity, issuer=instance.issuer)


def _roundtrip(bundle: Bundle) -> Bundle:
    # What an agent receives is the JSON, not the in-memory object.
    return Bundle.from_json(bundle.to_json())


def test_signed_file_verifies_with_identity_policy(instance: MiniSigstore, tmp_path: Path) -> None:
    artifact = tmp_path / "publication.yaml"
    artifact.write_bytes(ARTIFACT)
    bundle = _roundtrip(instance.sign(artifact.read_bytes()))

    instance.verifier().verify_artifact(artifact.read_bytes(), bundle, _identity(instance))

    entry = json.loads(bundle.to_json())["verificationMaterial"]["tlogEntries"][0]
    timestamps = bundle.verification_material.timestamp_verification_data
    if instance.rekor_version == 1:
        assert entry["kindVersion"] == {"kind": "hashedrekord", "version": "0.0.1"}
        assert "signedEntryTimestamp" in entry["inclusionPromise"]
        assert timestamps is None
    else:
        assert entry["kindVersion"] == {"kind": "hashedrekord", "version": "0.0.2"}
        assert "integratedTime" not in entry and "inclusionPromise" not in entry
        assert timestamps is not None and len(timestamps.rfc3161_timestamps) == 1


def test_dsse_statement_verifies(instance: MiniSigstore) -> None:
    digest = dsse.DigestSet(root={"sha256": hashlib.sha256(ARTIFACT).hexdigest()})
    statement = (
        dsse.StatementBuilder()
        .subjects([dsse.Subject(name="cluster-a", digest=digest)])
        .predicate_type("https://fleetlet.io/publication/v1")
        .predicate({"serial": 42})
        .build()
    )
    bundle = _roundtrip(instance.sign_dsse(statement))
    payload_type, payload = instance.verifier().verify_dsse(bundle, _identity(instance))
    assert payload_type == "application/vnd.in-toto+json"
    assert json.loads(payload)["predicate"] == {"serial": 42}
    with pytest.raises(VerificationError):
        instance.verifier().verify_dsse(bundle, _identity(instance, "intruder@fleet.test"))


def test_uri_identity_verifies(instance: MiniSigstore) -> None:
    workflow = "https://git.fleet.test/fleet/hub/.ci/publish.yaml@refs/heads/main"
    bundle = instance.sign(ARTIFACT, identity=workflow)
    instance.verifier().verify_artifact(ARTIFACT, bundle, _identity(instance, workflow))


def test_leaf_certificate_follows_the_fulcio_profile(mini_sigstore: MiniSigstore) -> None:
    cert = mini_sigstore.sign(ARTIFACT).signing_certificate
    ext = cert.extensions
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(minutes=10)
    assert ext.get_extension_for_class(x509.KeyUsage).critical
    assert ext.get_extension_for_class(x509.KeyUsage).value.digital_signature
    assert (
        ExtendedKeyUsageOID.CODE_SIGNING in ext.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    san = ext.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical
    assert san.value.get_values_for_type(x509.RFC822Name) == [DEFAULT_IDENTITY]
    issuer_v1 = ext.get_extension_for_oid(x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1"))
    assert issuer_v1.value.value == mini_sigstore.issuer.encode()  # type: ignore[attr-defined]
    scts = ext.get_extension_for_class(x509.PrecertificateSignedCertificateTimestamps).value
    assert len(scts) == 1
    assert (
        scts[0].log_id
        == hashlib.sha256(
            mini_sigstore.ct_log.key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        ).digest()
    )


def test_wrong_identity_is_refused(instance: MiniSigstore) -> None:
    bundle = instance.sign(ARTIFACT)
    with pytest.raises(VerificationError, match="SANs do not match"):
        instance.verifier().verify_artifact(
            ARTIFACT, bundle, _identity(instance, "intruder@fleet.test")
        )


def test_wrong_issuer_is_refused(instance: MiniSigstore) -> None:
    rogue_issuer = "https://rogue-issuer.test"
    bundle = instance.sign(ARTIFACT, issuer=rogue_issuer)
    with pytest.raises(VerificationError, match="OIDCIssuer does not match"):
        instance.verifier().verify_artifact(ARTIFACT, bundle, _identity(instance))
    # Only the issuer was wrong: the same bundle passes a policy naming that issuer.
    instance.verifier().verify_artifact(
        ARTIFACT, bundle, policy.Identity(identity=DEFAULT_IDENTITY, issuer=rogue_issuer)
    )


@pytest.mark.parametrize(
    ("signer", "trusting"),
    [
        ("other_sigstore", "mini_sigstore"),
        ("other_sigstore", "mini_sigstore_v2"),
        ("mini_sigstore_v2", "other_sigstore"),
        ("mini_sigstore", "mini_sigstore_v2"),
    ],
)
def test_bundle_from_untrusted_instance_is_refused(
    signer: str, trusting: str, request: pytest.FixtureRequest
) -> None:
    signing: MiniSigstore = request.getfixturevalue(signer)
    verifying: MiniSigstore = request.getfixturevalue(trusting)
    # Same issuer URL and identity: only the roots differ.
    assert signing.issuer == verifying.issuer
    bundle = _roundtrip(signing.sign(ARTIFACT))
    signing.verifier().verify_artifact(ARTIFACT, bundle, _identity(signing))
    # The foreign chain does not build (v1 time), or the foreign TSA gives no trusted time (v2).
    with pytest.raises(VerificationError, match=r"certificate chain|verified time"):
        verifying.verifier().verify_artifact(ARTIFACT, bundle, _identity(verifying))


def test_tampered_file_is_refused(instance: MiniSigstore, tmp_path: Path) -> None:
    artifact = tmp_path / "publication.yaml"
    artifact.write_bytes(ARTIFACT)
    bundle = instance.sign(artifact.read_bytes())
    artifact.write_bytes(ARTIFACT.replace(b"serial: 42", b"serial: 43"))
    with pytest.raises(VerificationError, match="digest mismatch"):
        instance.verifier().verify_artifact(artifact.read_bytes(), bundle, _identity(instance))


def test_rekor_v2_time_comes_only_from_the_tsa(
    mini_sigstore_v2: MiniSigstore, other_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    """With the TSA swapped for a foreign one, a v2 bundle has no trusted time: refused."""
    bundle = mini_sigstore_v2.sign(ARTIFACT)
    root = json.loads(mini_sigstore_v2.trusted_root_path.read_text())
    foreign = json.loads(other_sigstore.trusted_root_path.read_text())
    root["timestampAuthorities"] = foreign["timestampAuthorities"]
    path = tmp_path / "trusted_root.json"
    path.write_text(json.dumps(root))
    verifier = Verifier(trusted_root=TrustedRoot.from_file(str(path)))
    with pytest.raises(VerificationError, match="verified time"):
        verifier.verify_artifact(ARTIFACT, bundle, _identity(mini_sigstore_v2))


def test_trust_config_is_what_sigstore_loads(instance: MiniSigstore) -> None:
    config = ClientTrustConfig.from_json(instance.trust_config_path.read_text())
    tlog_versions = [s.major_api_version for s in config.signing_config._inner.rekor_tlog_urls]
    assert tlog_versions == [instance.rekor_version]
    assert bool(config.signing_config.get_tsas()) == (instance.rekor_version == 2)


def test_sigstore_cli_uses_the_trust_config(mini_sigstore_v2: MiniSigstore, tmp_path: Path) -> None:
    """`sigstore --trust-config` signs and verifies against the mini Sigstore, offline.

    One instance only (each CLI start costs seconds); v2 + TSA is the newer path.
    """
    instance = mini_sigstore_v2
    artifact = tmp_path / "publication.yaml"
    artifact.write_bytes(ARTIFACT)
    cli = [sys.executable, "-m", "sigstore", "--trust-config", str(instance.trust_config_path)]
    signed = subprocess.run(
        [*cli, "sign", "--identity-token", instance.mint_token(), str(artifact)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert signed.returncode == 0, signed.stderr
    assert (tmp_path / "publication.yaml.sigstore.json").exists()
    verify = [*cli, "verify", "identity", "--cert-oidc-issuer", instance.issuer]
    accepted = subprocess.run(
        [*verify, "--cert-identity", DEFAULT_IDENTITY, str(artifact)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert accepted.returncode == 0, accepted.stderr
    refused = subprocess.run(
        [*verify, "--cert-identity", "intruder@fleet.test", str(artifact)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0


# --- the services refuse what real Fulcio and Rekor refuse ---------------------------------


def _csr_pem(key: ec.EllipticCurvePrivateKey, *, corrupt: bool = False) -> str:
    der = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.DER)
    )
    if corrupt:
        # The last byte belongs to the signature: flipping it breaks proof of possession.
        der = der[:-1] + bytes([der[-1] ^ 0x01])
    pem = x509.load_der_x509_csr(der).public_bytes(serialization.Encoding.PEM)
    return base64.b64encode(pem).decode()


def _request_cert(instance: MiniSigstore, token: str, csr_b64: str) -> requests.Response:
    return requests.post(
        f"{instance.url}/api/v2/signingCert",
        json={"certificateSigningRequest": csr_b64},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def test_fulcio_checks_token_and_proof_of_possession(
    mini_sigstore: MiniSigstore, other_sigstore: MiniSigstore
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    good = _request_cert(mini_sigstore, mini_sigstore.mint_token(), _csr_pem(key))
    assert good.status_code == 200  # as the real Fulcio answers (sigstore-go wants nothing else)
    chain = good.json()["signedCertificateEmbeddedSct"]["chain"]["certificates"]
    assert len(chain) == 3

    foreign_token = _request_cert(mini_sigstore, other_sigstore.mint_token(), _csr_pem(key))
    assert foreign_token.status_code == 401

    wrong_audience = mini_sigstore.minter.mint(DEFAULT_IDENTITY, audience="not-sigstore")
    assert _request_cert(mini_sigstore, wrong_audience, _csr_pem(key)).status_code == 401

    expired = mini_sigstore.minter.mint(DEFAULT_IDENTITY, lifetime=-60)
    assert _request_cert(mini_sigstore, expired, _csr_pem(key)).status_code == 401

    corrupt = _request_cert(mini_sigstore, mini_sigstore.mint_token(), _csr_pem(key, corrupt=True))
    assert corrupt.status_code == 400
    assert "proof of possession" in corrupt.json()["message"]

    # cosign's (sigstore-go's) form: a public key and a signature over the token's subject.
    def key_request(proof_of: bytes) -> requests.Response:
        pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        proof = key.sign(proof_of, ec.ECDSA(hashes.SHA256()))
        return requests.post(
            f"{mini_sigstore.url}/api/v2/signingCert",
            json={
                "publicKeyRequest": {
                    "publicKey": {"algorithm": "ECDSA", "content": pem.decode()},
                    "proofOfPossession": base64.b64encode(proof).decode(),
                }
            },
            headers={"Authorization": f"Bearer {mini_sigstore.mint_token()}"},
            timeout=10,
        )

    assert key_request(DEFAULT_IDENTITY.encode()).status_code == 200
    wrong = key_request(b"someone-else@fleet.test")
    assert wrong.status_code == 400
    assert "proof of possession invalid" in wrong.json()["message"]


def test_rekor_refuses_an_entry_whose_signature_does_not_verify(instance: MiniSigstore) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert_pem = _request_cert(instance, instance.mint_token(), _csr_pem(key)).json()[
        "signedCertificateEmbeddedSct"
    ]["chain"]["certificates"][0]
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    signature = key.sign(ARTIFACT, ec.ECDSA(hashes.SHA256()))
    other_digest = hashlib.sha256(ARTIFACT + b"tampered").digest()
    if instance.rekor_version == 1:
        url = f"{instance.url}/api/v1/log/entries"
        proposed: dict[str, object] = {
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": other_digest.hex()}},
                "signature": {
                    "content": base64.b64encode(signature).decode(),
                    "publicKey": {"content": base64.b64encode(cert_pem.encode()).decode()},
                },
            },
        }
    else:
        url = f"{instance.url}/api/v2/log/entries"
        proposed = {
            "hashedRekordRequestV002": {
                "digest": base64.b64encode(other_digest).decode(),
                "signature": {
                    "content": base64.b64encode(signature).decode(),
                    "verifier": {
                        "x509Certificate": {
                            "rawBytes": base64.b64encode(
                                cert.public_bytes(serialization.Encoding.DER)
                            ).decode()
                        },
                        "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    },
                },
            }
        }
    refused = requests.post(url, json=proposed, timeout=10)
    assert refused.status_code == 400
    assert "signature" in refused.json()["message"]


# --- the production path: a real public-good bundle, offline --------------------------------


def test_public_good_bundle_verifies_offline_with_shipped_root(
    public_good_sample: PublicGoodSample,
) -> None:
    verifier = Verifier(trusted_root=TrustedRoot.from_file(str(production_trusted_root_path())))
    bundle = Bundle.from_json(public_good_sample.bundle_json)
    identity = policy.Identity(
        identity=public_good_sample.identity, issuer=public_good_sample.issuer
    )
    verifier.verify_artifact(public_good_sample.artifact, bundle, identity)

    with pytest.raises(VerificationError):
        verifier.verify_artifact(public_good_sample.artifact + b"x", bundle, identity)
    with pytest.raises(VerificationError):
        verifier.verify_artifact(
            public_good_sample.artifact,
            bundle,
            policy.Identity(identity="someone@else.test", issuer=public_good_sample.issuer),
        )


def test_public_good_bundle_verifies_with_production_offline_trust_config(
    public_good_sample: PublicGoodSample, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sigstore seeds its TUF cache from the wheel; keep that cache out of the user's home.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = ClientTrustConfig.production(offline=True)
    verifier = Verifier(trusted_root=config.trusted_root)
    bundle = Bundle.from_json(public_good_sample.bundle_json)
    identity = policy.Identity(
        identity=public_good_sample.identity, issuer=public_good_sample.issuer
    )
    verifier.verify_artifact(public_good_sample.artifact, bundle, identity)
    with pytest.raises(VerificationError):
        verifier.verify_artifact(public_good_sample.artifact.upper(), bundle, identity)


def test_public_good_bundle_is_refused_by_a_mini_sigstore_root(
    public_good_sample: PublicGoodSample, mini_sigstore: MiniSigstore
) -> None:
    bundle = Bundle.from_json(public_good_sample.bundle_json)
    identity = policy.Identity(
        identity=public_good_sample.identity, issuer=public_good_sample.issuer
    )
    with pytest.raises(VerificationError):
        mini_sigstore.verifier().verify_artifact(public_good_sample.artifact, bundle, identity)
