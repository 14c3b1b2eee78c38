"""Test-side gitsign: the real pinned binary signing git commits keyless through a mini
Sigstore (its Fulcio and Rekor), as ``git commit -S`` runs it with ``gpg.format=x509``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.server import TSA_PATH


class Gitsign:
    """git configured to sign with ``binary``; gitsign's state (HOME, TUF cache, the log's
    public key) lives in ``home``. Nothing reaches beyond loopback: the identity token is
    minted by the mini Sigstore and handed over in ``SIGSTORE_ID_TOKEN`` (cosign's ``envvar``
    token provider), Fulcio and Rekor are the mini Sigstore's, and the Rekor client takes the
    log's key from ``SIGSTORE_REKOR_PUBLIC_KEY`` instead of the public-good TUF root."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.home = home
        home.mkdir(parents=True, exist_ok=True)

    def env(
        self,
        sigstore: MiniSigstore,
        identity: str,
        *,
        rekor_mode: str = "offline",
        timestamp: bool = True,
    ) -> dict[str, str]:
        """The environment of a ``git commit -S`` that gitsign signs as ``identity``. A
        Rekor v2 ``sigstore`` (gitsign's experimental ``rekorVersion=2``) also gets its TSA,
        unless ``timestamp`` is off: Rekor v2 entries carry no time of their own."""
        rekor_key = self.home / f"rekor-{sigstore.log.name}.pub"
        rekor_key.write_bytes(
            sigstore.log.key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "TUF_ROOT": str(self.home / "tuf"),
            "SIGSTORE_ID_TOKEN": sigstore.mint_token(identity),
            "GITSIGN_TOKEN_PROVIDER": "envvar",
            "GITSIGN_FULCIO_URL": sigstore.url,
            "GITSIGN_REKOR_URL": sigstore.url,
            "GITSIGN_OIDC_ISSUER": sigstore.issuer,
            # offline: the Rekor entry is stored in the signature, where the hub checks it.
            "GITSIGN_REKOR_MODE": rekor_mode,
            "SIGSTORE_REKOR_PUBLIC_KEY": str(rekor_key),
        }
        if sigstore.rekor_version == 2:
            env["GITSIGN_REKOR_VERSION"] = "2"
            if timestamp:
                chain = self.home / f"tsa-{sigstore.log.name}.pem"
                chain.write_bytes(
                    b"".join(c.public_bytes(serialization.Encoding.PEM) for c in sigstore.tsa.chain)
                )
                env["GITSIGN_TIMESTAMP_SERVER_URL"] = sigstore.url + TSA_PATH
                env["GITSIGN_TIMESTAMP_CERT_CHAIN"] = str(chain)
        return env

    def git_config(self) -> list[str]:
        """``git -c`` options that make ``-S`` sign with gitsign (as its README configures)."""
        return ["-c", "gpg.format=x509", "-c", f"gpg.x509.program={self.binary}"]

    def commit(
        self,
        repo: Path,
        message: str,
        sigstore: MiniSigstore,
        identity: str,
        *,
        rekor_mode: str = "offline",
        timestamp: bool = True,
    ) -> str:
        """``git commit -S -m message`` in ``repo`` (changes already staged); the commit id."""
        env = self.env(sigstore, identity, rekor_mode=rekor_mode, timestamp=timestamp)
        author = ["-c", "user.name=Fleet", "-c", f"user.email={identity}"]
        done = subprocess.run(
            ["git", *author, *self.git_config(), "commit", "-q", "-S", "-m", message],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise AssertionError(f"git commit -S (gitsign) failed: {done.stderr.strip()}")
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
