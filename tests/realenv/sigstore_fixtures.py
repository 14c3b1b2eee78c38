"""pytest fixtures: mini Sigstore instances on loopback, and the real public-good sample.

``mini_sigstore`` (Rekor v1) and ``mini_sigstore_v2`` (Rekor v2 + TSA) are shared by the whole
session. ``other_sigstore`` is an independent instance with its own keys but the same issuer
URL and default identity: a bundle it signs must be refused by anyone trusting the others (the
"foreign root" case). ``public_good_sample`` is a bundle signed by the real Sigstore public-good
instance, checked into ``tests/assets/``, verifiable offline with sigstore-python's shipped root.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realenv.sigstore import MiniSigstore

ASSETS = Path(__file__).resolve().parent.parent / "assets"
PRODUCTION_TUF_URL = "https://tuf-repo-cdn.sigstore.dev"


@pytest.fixture(scope="session")
def mini_sigstore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniSigstore]:
    """A running mini Sigstore with a Rekor v1 log (time from signed entry timestamps)."""
    with MiniSigstore(workdir=tmp_path_factory.mktemp("sigstore-v1"), rekor_version=1) as running:
        yield running


@pytest.fixture(scope="session")
def mini_sigstore_v2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniSigstore]:
    """A running mini Sigstore with a Rekor v2 log and an RFC 3161 TSA (time from the TSA)."""
    with MiniSigstore(workdir=tmp_path_factory.mktemp("sigstore-v2"), rekor_version=2) as running:
        yield running


@pytest.fixture(scope="session")
def other_sigstore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniSigstore]:
    """An independent mini Sigstore (own CA, logs, TSA, minter): an untrusted foreign root."""
    with MiniSigstore(
        workdir=tmp_path_factory.mktemp("sigstore-other"), rekor_version=1, name="other-sigstore"
    ) as running:
        yield running


@dataclass(frozen=True)
class PublicGoodSample:
    """A real public-good bundle, its artifact and the identity in its certificate."""

    artifact_path: Path
    bundle_path: Path
    identity: str
    issuer: str

    @property
    def artifact(self) -> bytes:
        """The signed bytes."""
        return self.artifact_path.read_bytes()

    @property
    def bundle_json(self) -> str:
        """The bundle, as published."""
        return self.bundle_path.read_text()


def production_trusted_root_path() -> Path:
    """The public-good trusted root shipped inside the installed sigstore wheel."""
    store = importlib.resources.files("sigstore") / "_store"
    quoted = PRODUCTION_TUF_URL.replace(":", "%3A").replace("/", "%2F")
    return Path(str(store / quoted / "trusted_root.json"))


@pytest.fixture(scope="session")
def public_good_sample() -> PublicGoodSample:
    """sigstore-python's own production regression bundle (see tests/assets/README.md)."""
    return PublicGoodSample(
        artifact_path=ASSETS / "new_bundle.txt",
        bundle_path=ASSETS / "new_bundle.txt.sigstore.json",
        identity="aryadeeptade@gmail.com",
        issuer="https://github.com/login/oauth",
    )
