"""An RFC 3161 timestamp authority: TimeStampResp with a CMS SignedData over a TSTInfo."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools

from asn1crypto import algos, cms, core, tsp  # type: ignore[import-untyped]
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.realenv.sigstore.errors import ServiceError
from tests.realenv.sigstore.keys import sign_sha256

TSA_POLICY = "1.3.6.1.4.1.57264.2"


class TimestampAuthority:
    """Signs timestamps with a leaf (critical EKU timeStamping) under its own self-signed root."""

    def __init__(self, *, org: str = "fleetlet.test") -> None:
        self.not_before = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
        not_after = self.not_before + dt.timedelta(days=3650)
        root_key = ec.generate_private_key(ec.SECP384R1())
        root_name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                x509.NameAttribute(NameOID.COMMON_NAME, "mini-tsa-selfsigned"),
            ]
        )
        root_ski = x509.SubjectKeyIdentifier.from_public_key(root_key.public_key())
        self.root = (
            x509.CertificateBuilder()
            .subject_name(root_name)
            .issuer_name(root_name)
            .public_key(root_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .add_extension(root_ski, critical=False)
            .sign(root_key, hashes.SHA384())
        )
        self._key = ec.generate_private_key(ec.SECP384R1())
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                        x509.NameAttribute(NameOID.COMMON_NAME, "mini-tsa"),
                    ]
                )
            )
            .issuer_name(root_name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(not_after)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                critical=True,
            )
            # RFC 3161 §2.3: the only EKU, and critical.
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(root_ski), False
            )
            .sign(root_key, hashes.SHA384())
        )
        self._serials = itertools.count(1)

    @property
    def chain(self) -> list[x509.Certificate]:
        """Signing certificate then root, the order of a trusted root's TSA certChain."""
        return [self.cert, self.root]

    def respond(self, request_der: bytes) -> bytes:
        """Return the DER TimeStampResp for a DER TimeStampReq.

        Raises ServiceError (400) for an unparsable request or an unsupported hash.
        """
        try:
            request = tsp.TimeStampReq.load(request_der)
            imprint = request["message_imprint"]
            hash_name = imprint["hash_algorithm"]["algorithm"].native
            hashed = imprint["hashed_message"].native
            nonce = request["nonce"].native
        except (ValueError, TypeError, KeyError) as exc:
            raise ServiceError(f"malformed TimeStampReq: {exc}") from exc
        if hash_name != "sha256" or len(hashed) != 32:
            raise ServiceError(f"unsupported message imprint hash {hash_name}")
        cert_der = self.cert.public_bytes(serialization.Encoding.DER)
        asn1_cert = asn1_x509.Certificate.load(cert_der)
        tst_fields: dict[str, object] = {
            "version": "v1",
            "policy": TSA_POLICY,
            "message_imprint": {
                "hash_algorithm": {"algorithm": "sha256"},
                "hashed_message": hashed,
            },
            "serial_number": next(self._serials),
            "gen_time": dt.datetime.now(dt.UTC).replace(microsecond=0),
            "accuracy": {"seconds": 1},
        }
        if nonce is not None:
            tst_fields["nonce"] = nonce
        tst_info = tsp.TSTInfo(tst_fields)
        signed_attrs = cms.CMSAttributes(
            [
                {"type": "content_type", "values": ["tst_info"]},
                {"type": "message_digest", "values": [hashlib.sha256(tst_info.dump()).digest()]},
                {
                    "type": "signing_certificate_v2",
                    "values": [
                        {
                            "certs": [
                                {
                                    "hash_algorithm": {"algorithm": "sha256"},
                                    "cert_hash": hashlib.sha256(cert_der).digest(),
                                    "issuer_serial": {
                                        "issuer": [
                                            asn1_x509.GeneralName(
                                                name="directory_name", value=asn1_cert.issuer
                                            )
                                        ],
                                        "serial_number": asn1_cert.serial_number,
                                    },
                                }
                            ]
                        }
                    ],
                },
            ]
        )
        # The signature covers the DER of the attributes as a SET OF (RFC 5652 §5.4).
        signature = sign_sha256(self._key, signed_attrs.dump())
        signed_data = cms.SignedData(
            {
                "version": "v3",
                "digest_algorithms": [algos.DigestAlgorithm({"algorithm": "sha256"})],
                "encap_content_info": {
                    "content_type": "tst_info",
                    "content": core.ParsableOctetString(tst_info.dump()),
                },
                "certificates": [asn1_cert],
                "signer_infos": [
                    {
                        "version": "v1",
                        "sid": cms.SignerIdentifier(
                            name="issuer_and_serial_number",
                            value={
                                "issuer": asn1_cert.issuer,
                                "serial_number": asn1_cert.serial_number,
                            },
                        ),
                        "digest_algorithm": {"algorithm": "sha256"},
                        "signed_attrs": signed_attrs,
                        "signature_algorithm": {"algorithm": "sha256_ecdsa"},
                        "signature": signature,
                    }
                ],
            }
        )
        response = tsp.TimeStampResp(
            {
                "status": {"status": "granted"},
                "time_stamp_token": {"content_type": "signed_data", "content": signed_data},
            }
        )
        return bytes(response.dump())
