"""A Fulcio-like CA: P-384 root and intermediate, 10-minute leaves with an embedded SCT."""

from __future__ import annotations

import datetime as dt

from asn1crypto import core  # type: ignore[import-untyped]
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.realenv.sigstore.ctlog import CTLog, encode_sct_list
from tests.realenv.sigstore.errors import ServiceError
from tests.realenv.sigstore.keys import spki_der

OID_ISSUER_V1 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
OID_ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
OID_SCT_LIST = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
LEAF_LIFETIME = dt.timedelta(minutes=10)


def _name(org: str, common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _now() -> dt.datetime:
    # Whole seconds: X.509 times have no fractions, and log times are integer seconds.
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def build_ca_pair(
    *, org: str, name: str, intermediate_eku: x509.ObjectIdentifier | None, not_before: dt.datetime
) -> tuple[
    ec.EllipticCurvePrivateKey, x509.Certificate, ec.EllipticCurvePrivateKey, x509.Certificate
]:
    """Return (root key, root cert, intermediate key, intermediate cert), both P-384."""
    root_key = ec.generate_private_key(ec.SECP384R1())
    root_name = _name(org, f"{name}-root")
    root_ski = x509.SubjectKeyIdentifier.from_public_key(root_key.public_key())
    root = (
        x509.CertificateBuilder()
        .subject_name(root_name)
        .issuer_name(root_name)
        .public_key(root_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .add_extension(root_ski, critical=False)
        .sign(root_key, hashes.SHA384())
    )
    inter_key = ec.generate_private_key(ec.SECP384R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(org, f"{name}-intermediate"))
        .issuer_name(root_name)
        .public_key(inter_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_ca_key_usage(), critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(inter_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(root_ski),
            critical=False,
        )
    )
    if intermediate_eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([intermediate_eku]), critical=False)
    return root_key, root, inter_key, builder.sign(root_key, hashes.SHA384())


def _ca_key_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


class FulcioCA:
    """Issues code-signing leaves for a CSR's key and a verified OIDC identity."""

    def __init__(self, *, ct_log: CTLog, org: str = "fleetlet.test") -> None:
        self.ct_log = ct_log
        self.not_before = _now() - dt.timedelta(hours=1)
        _, self.root, self._inter_key, self.intermediate = build_ca_pair(
            org=org,
            name="mini-fulcio",
            intermediate_eku=ExtendedKeyUsageOID.CODE_SIGNING,
            not_before=self.not_before,
        )

    @property
    def chain(self) -> list[x509.Certificate]:
        """Intermediate then root, the order of a trusted root's certChain."""
        return [self.intermediate, self.root]

    def issue(
        self, csr: x509.CertificateSigningRequest, claims: dict[str, object]
    ) -> x509.Certificate:
        """Return a leaf for the CSR's public key and the identity in the verified `claims`.

        Raises ServiceError (400) when the CSR's signature (proof of possession) is bad, its key
        is not ECDSA, or the claims name no usable identity.
        """
        if not csr.is_signature_valid:
            raise ServiceError("CSR signature invalid: no proof of possession")
        public_key = csr.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise ServiceError("only ECDSA keys are accepted")
        return self.issue_for_key(public_key, claims)

    def issue_for_key(
        self, public_key: ec.EllipticCurvePublicKey, claims: dict[str, object]
    ) -> x509.Certificate:
        """A leaf for ``public_key`` whose possession the caller checked (Fulcio's
        ``publicKeyRequest``, as cosign and sigstore-go send it): see :meth:`issue`."""
        issuer = str(claims["iss"])
        san: x509.GeneralName
        if "email" in claims:
            if claims.get("email_verified") is not True:
                raise ServiceError("token e-mail is not verified", status=401)
            san = x509.RFC822Name(str(claims["email"]))
        else:
            san = x509.UniformResourceIdentifier(str(claims["sub"]))
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.intermediate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + LEAF_LIFETIME)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._inter_key.public_key()),
                critical=False,
            )
            # Empty subject: the SAN carries the identity and must then be critical.
            .add_extension(x509.SubjectAlternativeName([san]), critical=True)
            .add_extension(x509.UnrecognizedExtension(OID_ISSUER_V1, issuer.encode()), False)
            .add_extension(
                x509.UnrecognizedExtension(OID_ISSUER_V2, core.UTF8String(issuer).dump()), False
            )
        )
        # Build once with a placeholder SCT to get the precertificate TBS (the TBS without the
        # SCT extension), have the CT log sign it, then build the real certificate: the TBS
        # minus the SCT extension is byte-identical between the two.
        placeholder = encode_sct_list(self.ct_log.log_id, 0, b"\x00" * 72)
        precert = builder.add_extension(
            x509.UnrecognizedExtension(OID_SCT_LIST, placeholder), False
        ).sign(self._inter_key, hashes.SHA384())
        sct = self.ct_log.sct_list_extension(
            issuer_spki=spki_der(self._inter_key.public_key()),
            tbs_precert=precert.tbs_precertificate_bytes,
        )
        return builder.add_extension(x509.UnrecognizedExtension(OID_SCT_LIST, sct), False).sign(
            self._inter_key, hashes.SHA384()
        )
