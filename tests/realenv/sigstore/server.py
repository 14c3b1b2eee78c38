"""The mini Sigstore's HTTP front: Fulcio, Rekor v1/v2 and TSA endpoints on one loopback port."""

from __future__ import annotations

import base64
import json
import logging
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.realenv.sigstore.ca import FulcioCA
from tests.realenv.sigstore.errors import ServiceError
from tests.realenv.sigstore.oidc import TokenMinter
from tests.realenv.sigstore.rekor import TransparencyLog
from tests.realenv.sigstore.tsa import TimestampAuthority

FULCIO_PATH = "/api/v2/signingCert"
# Fulcio's legacy API, which gitsign's client still speaks (sigstore/fulcio pkg/api).
FULCIO_V1_PATH = "/api/v1/signingCert"
REKOR_V1_PATH = "/api/v1/log/entries"
REKOR_V2_PATH = "/api/v2/log/entries"
TSA_PATH = "/api/v1/timestamp"
_MAX_BODY = 1 << 20

_logger = logging.getLogger(__name__)


@dataclass
class Services:
    """What the server fronts."""

    minter: TokenMinter
    ca: FulcioCA
    log: TransparencyLog
    tsa: TimestampAuthority


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        _logger.debug("mini-sigstore: " + format, *args)

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if length > _MAX_BODY:
                raise ServiceError("request too large", status=413)
            body = self.rfile.read(length)
            services = self.server.services
            if self.path == FULCIO_PATH:
                # 200, as the real Fulcio answers (grpc-gateway); sigstore-go accepts nothing else.
                self._json(200, self._signing_cert(services, body))
            elif self.path == FULCIO_V1_PATH:
                # 201 with the PEM chain (leaf first); the SCT is embedded in the leaf, so
                # the SCT header is empty.
                chain = self._signing_cert_v1(services, body)
                self._reply(201, "application/pem-certificate-chain", chain, {"SCT": ""})
            elif self.path == REKOR_V1_PATH:
                entry = services.log.add_v1(_load_json(body))
                # Rekor names the new entry in ETag and Location; rekor's Go client reads
                # the entry under the ETag.
                uuid = next(iter(entry))
                self._json(201, entry, {"ETag": uuid, "Location": f"{REKOR_V1_PATH}/{uuid}"})
            elif self.path == REKOR_V2_PATH:
                self._json(201, services.log.add_v2(_load_json(body)))
            elif self.path == TSA_PATH:
                self._reply(200, "application/timestamp-reply", services.tsa.respond(body))
            else:
                raise ServiceError(f"no such endpoint {self.path}", status=404)
        except ServiceError as exc:
            self._json(exc.status, {"code": exc.status, "message": str(exc)})

    def _signing_cert(self, services: Services, body: bytes) -> dict[str, Any]:
        claims = self._claims(services)
        request = _load_json(body)
        if "publicKeyRequest" in request:  # cosign and sigstore-go: a key and a proof
            leaf = services.ca.issue_for_key(
                _proven_key(request["publicKeyRequest"], claims), claims
            )
        else:  # sigstore-python: a CSR
            try:
                pem = base64.b64decode(request["certificateSigningRequest"])
                csr = x509.load_pem_x509_csr(pem)
            except (KeyError, TypeError, ValueError) as exc:
                raise ServiceError(f"malformed certificate request: {exc}") from exc
            leaf = services.ca.issue(csr, claims)
        chain = [leaf, *services.ca.chain]
        pems = [c.public_bytes(serialization.Encoding.PEM).decode() for c in chain]
        return {"signedCertificateEmbeddedSct": {"chain": {"certificates": pems}}}

    def _signing_cert_v1(self, services: Services, body: bytes) -> bytes:
        """Fulcio v1: ``{publicKey: {content: base64 DER}, signedEmailAddress: base64}``,
        the proof a signature over SHA-256 of the token's subject, as gitsign sends it."""
        claims = self._claims(services)
        request = _load_json(body)
        try:
            der = base64.b64decode(request["publicKey"]["content"])
            pem = serialization.load_der_public_key(der).public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            proof = request["signedEmailAddress"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ServiceError(f"malformed certificate request: {exc}") from exc
        key = _proven_key(
            {"publicKey": {"content": pem.decode()}, "proofOfPossession": proof}, claims
        )
        leaf = services.ca.issue_for_key(key, claims)
        chain = [leaf, *services.ca.chain]
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)

    def _claims(self, services: Services) -> dict[str, Any]:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            raise ServiceError("missing bearer token", status=401)
        return services.minter.verify(auth.removeprefix("Bearer ").strip())

    def _json(
        self, status: int, doc: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        self._reply(status, "application/json", json.dumps(doc).encode(), headers)

    def _reply(
        self,
        status: int,
        content_type: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def _proven_key(request: Any, claims: dict[str, Any]) -> ec.EllipticCurvePublicKey:
    """The public key of a Fulcio ``publicKeyRequest`` whose ``proofOfPossession`` (a
    signature over the token's subject: its e-mail, else ``sub``) it verifies. Raises
    ServiceError (400)."""
    try:
        key = serialization.load_pem_public_key(request["publicKey"]["content"].encode())
        proof = base64.b64decode(request["proofOfPossession"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServiceError(f"malformed public key request: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ServiceError("only ECDSA keys are accepted")
    subject = str(claims.get("email") or claims["sub"]).encode()
    try:
        key.verify(proof, subject, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise ServiceError("proof of possession invalid") from exc
    return key


def _load_json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ServiceError(f"request is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ServiceError("request is not a JSON object")
    return doc


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, services: Services) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.services = services


class SigstoreServer:
    """Serves `services` on 127.0.0.1 (free port) from a background thread."""

    def __init__(self, services: Services) -> None:
        self._httpd = _Server(services)
        self._thread = threading.Thread(
            # A short poll interval keeps stop() quick (shutdown waits for the next poll).
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="mini-sigstore",
            daemon=True,
        )
        self._started = False

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:41234."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        """Start serving."""
        self._thread.start()
        self._started = True

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._started:
            # shutdown() waits for serve_forever(), so only call it when that runs.
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._started = False
        self._httpd.server_close()
