"""Test-side cosign: the real pinned binary signing artifacts in the test registry, with a key
pair or keyless against a mini Sigstore, in either of cosign's signature layouts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.realenv.sigstore import MiniSigstore


class Cosign:
    """``cosign`` with its state (home, TUF cache, keys) inside ``home``; nothing reaches
    beyond loopback: keys sign without a transparency log, keyless signing uses the mini
    Sigstore's signing config and trusted root."""

    PASSWORD = "cosign-test-password"

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.home = home
        home.mkdir(parents=True, exist_ok=True)

    def run(self, *args: str) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TUF_ROOT": str(self.home / "tuf"),
            "COSIGN_PASSWORD": self.PASSWORD,
        }
        done = subprocess.run(
            [str(self.binary), *args],
            env=env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise AssertionError(f"cosign {' '.join(args[:2])} failed: {done.stderr.strip()}")
        return done.stdout + done.stderr

    def key_pair(self, name: str) -> tuple[Path, Path]:
        """``cosign generate-key-pair``: (private key, public key) named ``name``."""
        self.run("generate-key-pair", "--output-key-prefix", name)
        return self.home / f"{name}.key", self.home / f"{name}.pub"

    def sign(self, reference: str, key: Path, *, legacy: bool = False) -> None:
        """Sign ``registry/repo@digest`` with ``key``, no transparency log; ``legacy``: the
        older ``sha256-<digest>.sig`` tag instead of a Sigstore bundle referrer."""
        self.run(
            "sign",
            "--key",
            str(key),
            "--tlog-upload=false",
            "--use-signing-config=false",
            f"--new-bundle-format={'false' if legacy else 'true'}",
            "--allow-http-registry",
            "--yes",
            reference,
        )

    def sign_keyless(
        self, reference: str, sigstore: MiniSigstore, identity: str, *, legacy: bool = False
    ) -> None:
        """Sign ``reference`` keyless through ``sigstore`` (its Fulcio and Rekor) as
        ``identity``: a Sigstore bundle referrer, as cosign v3 writes by default; ``legacy``:
        the older ``.sig`` tag (cosign then takes the services' URLs, not a signing config)."""
        # cosign writes the bundle as protobuf JSON, which omits a zero logIndex, and
        # sigstore-python then refuses the bundle as incomplete: only the first entry of a
        # log has index 0, so make sure this one is not the first (public Rekor is far past).
        sigstore.sign(b"an entry before cosign's")
        token = self.home / "token"
        token.write_text(sigstore.mint_token(identity))
        where = (
            [
                "--use-signing-config=false",
                "--fulcio-url",
                sigstore.url,
                "--rekor-url",
                sigstore.url,
            ]
            if legacy
            else ["--signing-config", str(sigstore.signing_config_path)]
        )
        self.run(
            "sign",
            "--identity-token",
            str(token),
            *where,
            f"--new-bundle-format={'false' if legacy else 'true'}",
            "--trusted-root",
            str(sigstore.trusted_root_path),
            "--allow-http-registry",
            "--yes",
            reference,
        )
