"""The hostile-input corpus, delivered the way an attacker would: through the git server and
the registry, to a real agent pipeline with its state in a real API server.

Every case must be refused with its own reason, recorded in the cluster (the agent's state
keeps the refusal and its reason; the accepted serial does not move) and nothing else in the
cluster may change. The same cases are unit-tested closer to their code in
tests/test_publication.py, tests/test_source_archive.py and tests/test_render_manifests.py;
here they travel the whole inbound path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pygit2
import pytest

from agent.errors import (
    ExpiredError,
    FleetletError,
    FloatingReferenceError,
    IdentityMismatchError,
    InclusionProofError,
    SignatureError,
    UntrustedSignerError,
    WrongClusterError,
)
from agent.kube import KubeClient
from agent.source.archive import ArchiveLimits
from agent.source.branch import BranchContentError
from agent.source.content import ContentRefusedError
from agent.state import ClusterState
from agent.verify import BUNDLE_FILE, PROOF_FILE, SET_FILE, STATEMENT_FILE, TrustPolicy
from tests.hostile import archives, manifests
from tests.realenv.kube import Cluster
from tests.realenv.oci import (
    BUNDLE_LAYER_MEDIA_TYPE,
    EMPTY_CONFIG,
    EMPTY_CONFIG_MEDIA_TYPE,
    OciClient,
    build_manifest,
    sha256_digest,
)
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.test_agent_sync import Published, agent, trust_for
from tests.test_agent_sync import published as published  # the fixture

Files = dict[str, bytes]


def branch_files(published: Published, cluster: str) -> Files:
    repo = pygit2.Repository(str(published.repo))
    tree = repo.revparse_single(f"refs/heads/fleetlet/clusters/{cluster}").peel(pygit2.Tree)
    return {entry.name: repo[entry.id].data for entry in tree}


def commit_branch(published: Published, cluster: str, files: Files) -> None:
    """Commit ``files`` on the cluster's branch in the server's own repository."""
    repo = pygit2.Repository(str(published.repo))
    ref = f"refs/heads/fleetlet/clusters/{cluster}"
    builder = repo.TreeBuilder()
    for name, data in sorted(files.items()):
        builder.insert(name, repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
    who = pygit2.Signature("attacker", "attacker@example.invalid")
    parent = repo.references[ref].target
    repo.create_commit(ref, who, who, "tampered", builder.write(), [parent])


def edit_statement(files: Files, _other: Files) -> Files:
    doc = json.loads(files[STATEMENT_FILE])
    doc["expiresAt"] = "2099-01-01T00:00:00Z"  # a longer life than was signed
    return {**files, STATEMENT_FILE: json.dumps(doc).encode()}


def edit_set(files: Files, _other: Files) -> Files:
    return {**files, SET_FILE: files[SET_FILE].replace(b"sync-app", b"sync-evil")}


def foreign_proof(files: Files, other: Files) -> Files:
    return {**files, PROOF_FILE: other[PROOF_FILE]}


def other_clusters_publication(_files: Files, other: Files) -> Files:
    return dict(other)


def floating_reference(files: Files, _other: Files) -> Files:
    text = files[SET_FILE].decode()
    start = text.index("sha256:")
    return {**files, SET_FILE: (text[:start] + "latest" + text[start + 71 :]).encode()}


def unsigned(files: Files, _other: Files) -> Files:
    return {k: v for k, v in files.items() if k != BUNDLE_FILE}


TAMPERED: list[tuple[str, Callable[[Files, Files], Files], type[Exception], str]] = [
    ("statement-edited", edit_statement, SignatureError, "SignatureInvalid"),
    ("set-edited", edit_set, InclusionProofError, "InclusionProofInvalid"),
    ("proof-of-another-leaf", foreign_proof, InclusionProofError, "InclusionProofInvalid"),
    ("set-for-another-cluster", other_clusters_publication, WrongClusterError, "WrongCluster"),
    ("floating-reference", floating_reference, FloatingReferenceError, "FloatingReference"),
    ("signature-removed", unsigned, BranchContentError, "BranchContentInvalid"),
]


def assert_refused_and_untouched(
    kube_cluster: Cluster, namespace: str, cluster: str, reason: str
) -> None:
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    state = ClusterState(
        kube=kube, namespace=namespace, name=f"fleetlet-agent-state-{cluster}"
    ).load()
    assert state.refusal_reason == reason
    assert state.last_serial is None  # nothing accepted
    # Nothing else in the cluster: the bundle's namespace was never created, and the agent's
    # namespace holds only its own state (and the namespace's root CA ConfigMap).
    assert (
        kube.get({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sync-app"}})
        is None
    )
    names = {o["metadata"]["name"] for o in kube.list("v1", "ConfigMap", namespace=namespace)}
    assert names <= {f"fleetlet-agent-state-{cluster}", "kube-root-ca.crt"}


@pytest.mark.parametrize(
    ("case", "tamper", "error", "reason"), TAMPERED, ids=[c[0] for c in TAMPERED]
)
def test_a_tampered_branch_is_refused(
    published: Published,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    case: str,
    tamper: Callable[[Files, Files], Files],
    error: type[Exception],
    reason: str,
) -> None:
    commit_branch(
        published,
        "alpha",
        tamper(branch_files(published, "alpha"), branch_files(published, "beta")),
    )
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(error):
        pipeline.sync()
    assert_refused_and_untouched(kube_cluster, namespace, "alpha", reason)


def wrong_identity(sigstore: MiniSigstore, _other: MiniSigstore) -> TrustPolicy:
    return trust_for(sigstore, subject="someone-else@fleet.test")


def wrong_issuer(sigstore: MiniSigstore, _other: MiniSigstore) -> TrustPolicy:
    policy = trust_for(sigstore)
    return TrustPolicy(
        trusted_root=sigstore.trusted_root_path,
        identity=type(policy.identity)(
            issuer="https://other-issuer.test", subject=policy.identity.subject
        ),
    )


def foreign_root(_sigstore: MiniSigstore, other: MiniSigstore) -> TrustPolicy:
    return trust_for(other)


TRUST: list[
    tuple[str, Callable[[MiniSigstore, MiniSigstore], TrustPolicy], type[Exception], str]
] = [
    ("wrong-identity", wrong_identity, IdentityMismatchError, "IdentityMismatch"),
    ("wrong-issuer", wrong_issuer, IdentityMismatchError, "IdentityMismatch"),
    ("foreign-root", foreign_root, UntrustedSignerError, "UntrustedSigner"),
]


@pytest.mark.parametrize(("case", "policy", "error", "reason"), TRUST, ids=[c[0] for c in TRUST])
def test_a_publication_the_trust_policy_rejects_is_refused(
    published: Published,
    other_sigstore: MiniSigstore,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    case: str,
    policy: Callable[[MiniSigstore, MiniSigstore], TrustPolicy],
    error: type[Exception],
    reason: str,
) -> None:
    trust = policy(published.sigstore, other_sigstore)
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace, trust=trust)
    with pytest.raises(error):
        pipeline.sync()
    assert_refused_and_untouched(kube_cluster, namespace, "alpha", reason)


def test_an_expired_publication_is_refused(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    pipeline._clock = lambda: datetime.now(UTC) + timedelta(days=30)  # the hub went quiet
    with pytest.raises(ExpiredError):
        pipeline.sync()
    assert_refused_and_untouched(kube_cluster, namespace, "alpha", "PublicationExpired")


# --- hostile content, through a real registry -----------------------------------------------


def push_layer(registry: Registry, repository: str, layer: bytes, tag: str) -> str:
    client = OciClient(host=registry.host)
    desc = client.push_blob(repository, layer, BUNDLE_LAYER_MEDIA_TYPE)
    client.push_blob(repository, EMPTY_CONFIG, EMPTY_CONFIG_MEDIA_TYPE)
    manifest = build_manifest(layer=desc)
    digest = client.push_manifest(repository, sha256_digest(manifest), manifest)
    client.push_manifest(repository, tag, manifest)
    return digest


def tar_of(name: str, data: bytes) -> bytes:
    # Uncompressed (the archive reader takes both): the manifest's own limits must trip, not
    # the gzip expansion ratio.
    return archives.tar(archives.entry(name, data=data), compress=False)


ARCHIVES = [c for c in archives.CASES if c.limits == ArchiveLimits()]
MANIFESTS = [c for c in manifests.CASES if c.limits == type(c.limits)()]


def publish_hostile(published: Published, layer: bytes, tag: str) -> None:
    push_layer(published.registry, "agent/app", layer, tag)
    published.publish(tag=tag)


@pytest.mark.parametrize("case", ARCHIVES, ids=[c.name for c in ARCHIVES])
def test_a_hostile_archive_is_refused(
    published: Published,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    case: archives.ArchiveCase,
) -> None:
    publish_hostile(published, case.build(), f"hostile-{case.name}")
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(ContentRefusedError) as caught:
        pipeline.sync()
    assert caught.value.rule == case.rule
    assert "agent/app" in str(caught.value)  # names the source
    # A content refusal is permanent but not a verification failure: the agent's state
    # accepted nothing, and nothing of the bundle reached the cluster.
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    assert (
        kube.get({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sync-app"}})
        is None
    )
    state = ClusterState(kube=kube, namespace=namespace, name="fleetlet-agent-state-alpha").load()
    assert state.last_serial is None


@pytest.mark.parametrize("case", MANIFESTS, ids=[c.name for c in MANIFESTS])
def test_a_hostile_manifest_is_refused(
    published: Published,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    case: manifests.ManifestCase,
) -> None:
    publish_hostile(published, tar_of(case.file, case.data), f"hostile-{case.name}")
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(FleetletError) as caught:
        pipeline.sync()
    assert getattr(caught.value, "rule", None) == case.rule, str(caught.value)
    assert case.file in str(caught.value)  # names the file


def corrupt_blob(registry: Registry, digest: str) -> None:
    hexdigest = digest.split(":", 1)[1]
    data = next(registry.workdir.rglob(f"blobs/sha256/{hexdigest[:2]}/{hexdigest}/data"))
    data.write_bytes(data.read_bytes()[:-1] + b"X")


def test_a_layer_that_does_not_match_its_digest_is_refused(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    # The registry's storage is altered behind its back (a compromised or broken mirror).
    # (A manifest altered the same way is caught by this registry itself, with a 500; the
    # agent's own manifest check is tested against a lying server in test_source_oci.py.)
    layer = tar_of("cm.yaml", manifests.CONFIGMAP)
    push_layer(published.registry, "agent/app", layer, "corrupt")
    published.publish(tag="corrupt")
    corrupt_blob(published.registry, sha256_digest(layer))
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(ContentRefusedError) as caught:
        pipeline.sync()
    assert caught.value.rule == "LayerDigest", str(caught.value)
