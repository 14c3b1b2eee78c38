"""Test-side notation: the real pinned binary signing artifacts in the test registry with
certificates a test CA issued, as an organisation's PKI would (notation's local signing key:
a ``signingkeys.json`` entry with the key and the certificate chain, leaf first)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_USAGE = dict.fromkeys(
    (
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
        "encipher_only",
        "decipher_only",
    ),
    False,
)


@dataclass(frozen=True)
class IssuingCA:
    """A CA certificate and its key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "WA"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def make_ca(common_name: str) -> IssuingCA:
    """A self-signed P-384 CA, valid for a day."""
    key = ec.generate_private_key(ec.SECP384R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=False, key_cert_sign=True, crl_sign=True, **_USAGE),
            critical=True,
        )
        .sign(key, hashes.SHA384())
    )
    return IssuingCA(cert, key)


class Notation:
    """``notation`` with its configuration (``NOTATION_CONFIG``) and keys inside ``home``."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.home = home
        self.config = home / "config"
        self.config.mkdir(parents=True, exist_ok=True)
        self._keys: list[dict[str, str]] = []

    def add_signing_key(self, name: str, ca: IssuingCA, common_name: str) -> None:
        """A P-256 key and a code-signing certificate for it issued by ``ca`` (subject
        ``C=US, ST=WA, O=Acme, CN=<common_name>``), registered under ``name``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(hours=12))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=False, crl_sign=False, **_USAGE
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), False)
            .sign(ca.key, hashes.SHA384())
        )
        key_path = self.home / f"{name}.key"
        chain_path = self.home / f"{name}.crt"
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        chain_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.pem)
        self._keys.append({"name": name, "keyPath": str(key_path), "certPath": str(chain_path)})
        (self.config / "signingkeys.json").write_text(json.dumps({"keys": self._keys}))

    def sign(
        self,
        reference: str,
        key: str,
        *,
        timestamp_url: str = "",
        timestamp_root: Path | None = None,
    ) -> None:
        """``notation sign --key KEY`` of ``registry/repo@digest`` (plain HTTP registry); with
        ``timestamp_url``, countersigned by that RFC 3161 TSA (whose root is ``timestamp_root``)."""
        stamp = []
        if timestamp_url:
            stamp = ["--timestamp-url", timestamp_url, "--timestamp-root-cert", str(timestamp_root)]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "NOTATION_CONFIG": str(self.config),
        }
        done = subprocess.run(
            [str(self.binary), "sign", "--insecure-registry", "--key", key, *stamp, reference],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise AssertionError(f"notation sign failed: {done.stderr.strip()}")
