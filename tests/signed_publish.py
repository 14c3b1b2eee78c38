"""A prepared fleet published signed by the tests' Sigstore, and each cluster's set read back
as its agent verifies it: the steps the signature tests (sources and commits) share."""

from __future__ import annotations

from pathlib import Path

from agent.verify import IdentityPolicy, TrustPolicy, VerifiedPublication, verify_publication
from hub.publish.flow import Prepared, publish
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY, MiniSigstore
from tests.test_hub_publish import branch_files


def signer(sigstore: MiniSigstore) -> PublicationSigner:
    """The hub's publication signer, keyless against the tests' Sigstore."""
    return PublicationSigner.from_trust_config(
        trust_config=sigstore.trust_config_path, token=sigstore.mint_token()
    )


def publish_and_verify(
    prepared: Prepared,
    *,
    url: str,
    repo: Path,
    sigstore: MiniSigstore,
    clusters: tuple[str, ...] = ("eu-1", "us-1"),
) -> dict[str, VerifiedPublication]:
    """Publishes ``prepared`` to the bare repository ``repo`` (served at ``url``), checks that
    exactly ``clusters`` were pushed, and returns each one's set as its agent verifies it
    (signature, identity, cluster: what a user's cluster would accept)."""
    with BranchStore(url=url) as store:
        report = publish(prepared, store, signer=signer(sigstore))
    assert sorted(report.pushed) == sorted(clusters)
    trust = TrustPolicy(
        trusted_root=sigstore.trusted_root_path,
        identity=IdentityPolicy(issuer=sigstore.issuer, subject=DEFAULT_IDENTITY),
    )
    return {
        cluster: verify_publication(
            files=branch_files(repo, cluster), cluster=cluster, last_serial=None, trust=trust
        )
        for cluster in clusters
    }
