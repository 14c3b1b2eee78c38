"""MiniSigstore: CA, CT log, transparency log, TSA and token minter behind one loopback server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from sigstore.dsse import Statement
from sigstore.models import Bundle, ClientTrustConfig, TrustedRoot
from sigstore.oidc import IdentityToken
from sigstore.sign import Signer, SigningContext
from sigstore.verify import Verifier

from tests.realenv.sigstore import trust
from tests.realenv.sigstore.ca import FulcioCA
from tests.realenv.sigstore.ctlog import CTLog
from tests.realenv.sigstore.oidc import TokenMinter
from tests.realenv.sigstore.rekor import TransparencyLog
from tests.realenv.sigstore.server import TSA_PATH, Services, SigstoreServer
from tests.realenv.sigstore.tsa import TimestampAuthority

DEFAULT_IDENTITY = "publisher@fleet.test"


class MiniSigstore:
    """A private Sigstore instance on 127.0.0.1, with its own keys.

    `rekor_version` 1 gives Rekor v1 entries (time from the log's signed entry timestamp);
    2 gives Rekor v2 entries, whose only source of time is the TSA, so `timestamping`
    defaults to on for v2 and off for v1. The trusted root always lists the TSA.
    """

    def __init__(
        self,
        *,
        workdir: Path,
        rekor_version: int = 1,
        issuer: str = "https://issuer.test",
        timestamping: bool | None = None,
        name: str = "mini-sigstore",
    ) -> None:
        self.workdir = Path(workdir)
        self.rekor_version = rekor_version
        self.issuer = issuer
        self.timestamping = rekor_version == 2 if timestamping is None else timestamping
        self.minter = TokenMinter(issuer=issuer)
        self.ct_log = CTLog()
        self.ca = FulcioCA(ct_log=self.ct_log)
        self.log = TransparencyLog(name=f"{name}.rekor.test", version=rekor_version)
        self.tsa = TimestampAuthority()
        self._server: SigstoreServer | None = None
        self.startup_seconds = 0.0

    @property
    def url(self) -> str:
        """Base URL of the running server. Raises RuntimeError before start()."""
        if self._server is None:
            raise RuntimeError("MiniSigstore is not started")
        return self._server.url

    @property
    def trusted_root_path(self) -> Path:
        """trusted_root.json (verification)."""
        return self.workdir / "trusted_root.json"

    @property
    def signing_config_path(self) -> Path:
        """signing_config.json (where to sign)."""
        return self.workdir / "signing_config.json"

    @property
    def trust_config_path(self) -> Path:
        """Client trust config (`sigstore --trust-config`, `ClientTrustConfig.from_json`)."""
        return self.workdir / "trust_config.json"

    def start(self) -> MiniSigstore:
        """Serve on a free loopback port and write the trust documents into `workdir`."""
        began = time.perf_counter()
        self.workdir.mkdir(parents=True, exist_ok=True)
        server = SigstoreServer(
            Services(minter=self.minter, ca=self.ca, log=self.log, tsa=self.tsa)
        )
        server.start()
        self._server = server
        try:
            self._write_trust_documents()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - began
        return self

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> MiniSigstore:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _write_trust_documents(self) -> None:
        url = self.url
        start = self.ca.not_before
        root = trust.trusted_root(
            tlogs=[trust.log_instance(base_url=url, key=self.log.key.public_key(), start=start)],
            ctlogs=[
                trust.log_instance(base_url=url, key=self.ct_log.key.public_key(), start=start)
            ],
            cas=[trust.certificate_authority(uri=url, chain=self.ca.chain, start=start)],
            tsas=[
                trust.certificate_authority(
                    uri=url + TSA_PATH, chain=self.tsa.chain, start=self.tsa.not_before
                )
            ],
        )
        config = trust.signing_config(
            ca_url=url,
            oidc_url=self.issuer,
            rekor_url=url,
            rekor_version=self.rekor_version,
            tsa_url=url + TSA_PATH if self.timestamping else None,
            start=start,
        )
        self.trusted_root_path.write_text(json.dumps(root, indent=2))
        self.signing_config_path.write_text(json.dumps(config, indent=2))
        self.trust_config_path.write_text(
            json.dumps(trust.client_trust_config(root, config), indent=2)
        )

    def mint_token(self, identity: str = DEFAULT_IDENTITY, issuer: str | None = None) -> str:
        """Return an OIDC JWT this instance's Fulcio accepts (`issuer` overrides `iss`)."""
        return self.minter.mint(identity, issuer=issuer)

    def trust_config(self) -> ClientTrustConfig:
        """The client trust config, loaded by sigstore."""
        return ClientTrustConfig.from_json(self.trust_config_path.read_text())

    def trusted_root(self) -> TrustedRoot:
        """The trusted root, loaded by sigstore."""
        return TrustedRoot.from_file(str(self.trusted_root_path))

    def verifier(self) -> Verifier:
        """A sigstore Verifier that trusts only this instance."""
        return Verifier(trusted_root=self.trusted_root())

    @contextmanager
    def signer(
        self, identity: str = DEFAULT_IDENTITY, issuer: str | None = None
    ) -> Iterator[Signer]:
        """sigstore-python's Signer for this instance and a freshly minted token."""
        context = SigningContext.from_trust_config(self.trust_config())
        with context.signer(IdentityToken(self.mint_token(identity, issuer=issuer))) as signer:
            yield signer

    def sign(
        self, data: bytes, identity: str = DEFAULT_IDENTITY, issuer: str | None = None
    ) -> Bundle:
        """Sign `data` (hashedrekord) through this instance with sigstore-python's signer.

        Raises sigstore's errors (and requests' for transport) unchanged: this is test code.
        """
        with self.signer(identity, issuer) as signer:
            return signer.sign_artifact(data)

    def sign_dsse(
        self, statement: Statement, identity: str = DEFAULT_IDENTITY, issuer: str | None = None
    ) -> Bundle:
        """Sign an in-toto statement as a DSSE envelope (dsse 0.0.1 on v1, hashedrekord on v2).

        Raises sigstore's errors unchanged.
        """
        with self.signer(identity, issuer) as signer:
            return signer.sign_dsse(statement)


__all__ = ["DEFAULT_IDENTITY", "MiniSigstore"]
