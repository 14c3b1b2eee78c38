"""The hostile-input corpus, delivered the way an attacker would: through the git server and
the registry, to a real agent pipeline with its state in a real API server (and, for outputs,
to a real agent applying to it).

Every case must be refused with its own reason, recorded in the cluster (the agent's state
keeps the refusal and its reason; the accepted serial does not move) and nothing else in the
cluster may change. The exception is a hostile manifest file, which the render (not the source
layer) refuses: the verified set is accepted and only that bundle's group fails, with the
same rule (nothing of the bundle is applied; see agent/inbound.py). The same cases are unit-tested closer to their code in
tests/test_publication.py, tests/test_source_archive.py and tests/test_render_manifests.py;
here they travel the whole inbound path.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pygit2
import pytest
import yaml

from agent.errors import (
    ExpiredError,
    FleetletError,
    FloatingReferenceError,
    IdentityMismatchError,
    InclusionProofError,
    SignatureError,
    UntrustedSignerError,
    ValidityTooLongError,
    WrongClusterError,
)
from agent.kube import KubeClient
from agent.render import formats
from agent.render.plain import RenderRequest
from agent.report.runs import RunLog
from agent.report.seal import OutputPlace, open_sealed, read_private_key, write_keypair
from agent.source.archive import ArchiveLimits
from agent.source.branch import BranchContentError
from agent.source.content import ContentRefusedError
from agent.state import ClusterState
from agent.verify import BUNDLE_FILE, PROOF_FILE, SET_FILE, STATEMENT_FILE, TrustPolicy
from hub.publish.flow import prepare, publish
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.fleetlab import Lab, conditions, configmap, live, namespace_manifest
from tests.fleetlab import lab as lab  # the fixture
from tests.hostile import archives, manifests
from tests.realenv.kube import Cluster
from tests.realenv.oci import (
    BUNDLE_LAYER_MEDIA_TYPE,
    EMPTY_CONFIG,
    EMPTY_CONFIG_MEDIA_TYPE,
    OciClient,
    build_manifest,
    push_layers,
    sha256_digest,
)
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_agent_sync import CLUSTERS, Published, agent, trust_for
from tests.test_agent_sync import published as published  # the fixture
from tests.test_crds import crds as crds  # the fixture: the CRDs installed
from tests.test_hub_fleet import write_fleet

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
def test_a_hostile_manifest_fails_its_bundle_not_the_publication(
    published: Published,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    case: manifests.ManifestCase,
) -> None:
    # A manifest is refused by the render (the tree was fetched and unpacked safely): only
    # its bundle's group fails, the verified set is accepted (see agent/inbound.py).
    publish_hostile(published, tar_of(case.file, case.data), f"hostile-{case.name}")
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    result = pipeline.sync()
    assert result.outcome == "rendered" and result.bundles == []
    (failure,) = result.failed
    assert failure.name == "app"
    assert getattr(failure.error, "rule", None) == case.rule, str(failure.error)
    assert case.file in str(failure.error)  # names the file
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    state = ClusterState(kube=kube, namespace=namespace, name="fleetlet-agent-state-alpha").load()
    assert state.last_serial == result.serial and state.refused_commit is None
    # The reconcile's render of the bundle gets the same failure, without rendering it again
    # (the render cache counts a render as a miss); a later one (a retry) renders anew.
    assert result.deployment_set is not None
    entries = result.deployment_set.bundle_deployments
    misses = pipeline.renders.misses
    with pytest.raises(FleetletError) as caught:
        pipeline.render(result.deployment_set, entries)
    assert caught.value is failure.error and pipeline.renders.misses == misses
    with pytest.raises(FleetletError) as retried:
        pipeline.render(result.deployment_set, entries)
    assert getattr(retried.value, "rule", None) == case.rule
    assert pipeline.renders.misses == misses + 1
    # Nothing of the bundle reached the cluster (no reconcile ran; it would refuse the group).
    assert (
        kube.get({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sync-app"}})
        is None
    )


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


# --- a bundle tree judged as a whole: layers, sources, the cache (issue 15, items 1 and 5) -----


LAYERED_DEFAULT = [c for c in archives.LAYERED if c.limits == ArchiveLimits()]


@pytest.mark.parametrize("case", LAYERED_DEFAULT, ids=[c.name for c in LAYERED_DEFAULT])
def test_an_image_whose_layers_escape_together_is_refused(
    published: Published,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    case: archives.LayeredCase,
) -> None:
    tag = f"layered-{case.name}"
    push_layers(OciClient(host=published.registry.host), "agent/app", case.build(), tag=tag)
    published.publish(tag=tag)
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(ContentRefusedError) as caught:
        pipeline.sync()
    assert caught.value.rule == case.rule, str(caught.value)
    assert caught.value.file.endswith(f"!{case.member}")
    assert list((tmp_path / "cache" / "entries").iterdir()) == []  # nothing cached


def publish_bundles(published: Published, name: str, bundles: list[dict[str, Any]]) -> None:
    """Publish ``bundles`` (fleet-repo documents, targeting every cluster) to the branches."""
    fleet = write_fleet(
        published.tmp / f"fleet-{name}",
        clusters=CLUSTERS,
        bundles=[{"targets": [{"clusterSelector": {}}], **b} for b in bundles],
        settings={
            "name": "sync",
            "repo": "https://fleet.example.invalid/sync.git",
            "publication": {"expiresAfter": "7d", "refreshBefore": "1d"},
            "signing": {"identity": DEFAULT_IDENTITY, "issuer": published.sigstore.issuer},
        },
    )
    signer = PublicationSigner.from_trust_config(
        trust_config=published.sigstore.trust_config_path, token=published.sigstore.mint_token()
    )
    with BranchStore(url=published.url) as store:
        publish(prepare(fleet), store, signer=signer)


@pytest.mark.parametrize(
    ("carried", "rule"), [(True, "PathThroughSymlink"), (False, "SymlinkEscapes")]
)
def test_sources_whose_links_escape_together_poison_no_other_bundles_cache(
    published: Published,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    carried: bool,
    rule: str,
) -> None:
    # The attacker controls one bundle's content and knows another's digest (the fleet repo
    # is no secret) and the agent's cache layout (the product is open).
    client = OciClient(host=published.registry.host)
    registry = published.registry.host
    victim = client.resolve_tag("agent/app", "v1")
    entry = hashlib.sha256(f"image:{victim}".encode()).hexdigest()
    # Composed at <workdir>/trees/<serial>/attack: four levels up from d is the workdir.
    link = archives.escaping_link(4, f"cache/entries/{entry}/tree")
    parts = {
        "a": archives.tar(archives.entry("x", kind=tarfile.SYMTYPE, link=link)),
        "b": archives.loop_dir(),
        "c": archives.tar(archives.entry("crb.yaml", data=CLUSTER_ROLE_BINDING)),
    }
    sources = []
    for part, layer in parts.items():
        if part == "c" and not carried:
            continue
        push_layers(client, f"attack/{part}", [layer], tag="v1")
        source = {"kind": "image", "uri": f"{registry}/attack/{part}", "tag": "v1"}
        sources.append({**source, "destination": "x/evil"} if part == "c" else source)
    publish_bundles(
        published,
        f"poison-{rule}",
        [
            {
                "name": "app",
                "sources": [{"kind": "image", "uri": f"{registry}/agent/app", "tag": "v1"}],
                "formatOptions": {"targetNamespace": "sync-app"},
            },
            {"name": "attack", "sources": sources, "dependsOn": ["app"]},
        ],
    )
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(ContentRefusedError) as caught:
        pipeline.sync()
    assert caught.value.rule == rule, str(caught.value)
    assert caught.value.file == "x"
    # The victim's cached tree (rendered first) holds what its digest says, nothing more.
    cached = tmp_path / "cache" / "entries" / entry / "tree"
    assert sorted(p.name for p in cached.iterdir()) == ["01_namespace.yaml", "02_config.yaml"]


def test_hostile_source_content_refuses_the_set_even_where_a_failed_render_stops_its_group(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    # A bundle that does not render fails only its group; a bundle depending on it cannot
    # move in this set, but its sources are still fetched and judged: hostile source content
    # refuses the whole publication wherever it is.
    case = ARCHIVES[0]
    registry = published.registry.host
    push_layer(published.registry, "agent/broken", tar_of("broken.yaml", b"kind: [x\n"), "v1")
    push_layer(published.registry, "attack/hostile", case.build(), "v1")
    publish_bundles(
        published,
        "beside-a-broken-render",
        [
            {
                "name": "broken",
                "sources": [{"kind": "image", "uri": f"{registry}/agent/broken", "tag": "v1"}],
            },
            {
                "name": "attack",
                "sources": [{"kind": "image", "uri": f"{registry}/attack/hostile", "tag": "v1"}],
                "dependsOn": ["broken"],
            },
        ],
    )
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(ContentRefusedError) as caught:
        pipeline.sync()
    assert caught.value.rule == case.rule and "attack/hostile" in str(caught.value)
    kube = KubeClient(kubeconfig=str(kube_cluster.kubeconfig))
    state = ClusterState(kube=kube, namespace=namespace, name="fleetlet-agent-state-alpha").load()
    assert state.last_serial is None and state.refusal_reason == caught.value.reason


CLUSTER_ROLE_BINDING = b"""apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: attacker-is-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: User, name: attacker, apiGroup: rbac.authorization.k8s.io}]
"""


# --- what is signed is what is acted on; how long it may be valid (items 7 and 8) ------------


class _RecordingFormat:
    """A format plugin that renders one ConfigMap telling the types of the values it got."""

    name = "helm"

    def render(self, tree: Path, request: RenderRequest) -> list[dict[str, Any]]:
        values = request.options.get("values") or {}
        data = {k: type(v).__name__ for k, v in values.items()}
        meta = {"name": "value-types", "namespace": "sync-app"}
        return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}]


def test_set_yaml_cannot_retype_a_signed_value(
    published: Published,
    kube_cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = published.registry.host
    publish_bundles(
        published,
        "values",
        [
            {
                "name": "app",
                "sources": [{"kind": "image", "uri": f"{registry}/agent/app", "tag": "v1"}],
                "format": "helm",
                "formatOptions": {"values": {"replicas": 3, "offset": 0}},
            }
        ],
    )
    files = branch_files(published, "alpha")
    text = files[SET_FILE].decode()
    assert "replicas: 3\n" in text
    retyped = text.replace("replicas: 3\n", "replicas: 3.0\n").replace(
        "offset: 0\n", "offset: -0.0\n"
    )
    commit_branch(published, "alpha", {**files, SET_FILE: retyped.encode()})
    monkeypatch.setitem(formats._LOADED, "helm", _RecordingFormat())
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)

    result = pipeline.sync()

    assert result.outcome == "rendered"  # the signature still holds: RFC 8785 writes 3.0 as 3
    [bundle] = result.bundles
    assert bundle.objects[0]["data"] == {"replicas": "int", "offset": "int"}


def test_a_publication_valid_for_too_long_is_refused(
    published: Published, kube_cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    registry = published.registry.host
    fleet = write_fleet(
        published.tmp / "fleet-long",
        clusters=CLUSTERS,
        bundles=[
            {
                "name": "app",
                "sources": [{"kind": "image", "uri": f"{registry}/agent/app", "tag": "v1"}],
                "targets": [{"clusterSelector": {}}],
            }
        ],
        settings={
            "name": "sync",
            "repo": "https://fleet.example.invalid/sync.git",
            "publication": {"expiresAfter": "365d", "refreshBefore": "1d"},
            "signing": {"identity": DEFAULT_IDENTITY, "issuer": published.sigstore.issuer},
        },
    )
    signer = PublicationSigner.from_trust_config(
        trust_config=published.sigstore.trust_config_path, token=published.sigstore.mint_token()
    )
    with BranchStore(url=published.url) as store:
        publish(prepare(fleet), store, signer=signer)
    pipeline, _, _ = agent(published, kube_cluster, "alpha", tmp_path, namespace)
    with pytest.raises(ValidityTooLongError):
        pipeline.sync()
    state = ClusterState(
        kube=KubeClient(kubeconfig=str(kube_cluster.kubeconfig)),
        namespace=namespace,
        name="fleetlet-agent-state-alpha",
    ).load()
    assert state.refusal_reason == "ValidityTooLong"


# --- outputs: a bundle reads only what it may, a Secret's value stays sealed (item 2) ---------


def _secret_manifest(name: str, namespace: str, password: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {"password": password},
        }
    )


def test_outputs_read_only_the_bundles_own_objects_and_a_secret_is_always_sealed(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, bundle = lab.name("outputs"), lab.name("reader")
    own, stolen = f"own-{lab.suffix}", f"stolen-{lab.suffix}"
    # Something of the agent's own namespace a bundle must never report: another bundle's
    # sensitive outputs.
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "fleetlet-outputs-victim", "namespace": namespace},
            "stringData": {"password": stolen},
        },
        field_manager="fleetlet-tests",
    )
    private_key, public_key = tmp_path / "hub.key", tmp_path / "hub.pub"
    write_keypair(private_key, public_key)
    digest = lab.push(
        "outputs",
        {"01_ns.yaml": namespace_manifest(ns), "02_secret.yaml": _secret_manifest("own", ns, own)},
        tag="v1",
    )

    def declare(outputs: list[dict[str, Any]]) -> None:
        lab.publish(
            [{"name": bundle, "sources": [lab.source("outputs", digest)], "outputs": outputs}]
        )

    # Declared not sensitive, both of them: one reads the bundle's own Secret, the other a
    # Secret of the agent's namespace that the bundle never applied (and names no account).
    leaked = {
        "name": "leaked",
        "object": {"apiVersion": "v1", "kind": "Secret", "namespace": ns, "name": "own"},
        "fieldPath": ".data.password",
    }
    theft = {
        "name": "theft",
        "object": {
            "apiVersion": "v1",
            "kind": "Secret",
            "namespace": namespace,
            "name": "fleetlet-outputs-victim",
        },
        "fieldPath": ".data.password",
    }
    declare([leaked, theft])
    agent = lab.agent(
        "edge-1",
        crds,
        namespace=namespace,
        workdir=tmp_path / "agent",
        status=False,
        hub_public_key=public_key,
    )
    agent.tick()
    ready = conditions(kube, bundle)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "OutputFailed"), ready
    assert "output theft" in ready["message"] and "did not apply it" in ready["message"]
    [run] = RunLog(kube, namespace=namespace).runs(bundle)
    assert run.result == "Failed" and run.outputs == ()
    assert live(kube, "fleetlet.io/v1alpha1", "BundleOutputs", bundle) is None

    declare([leaked])
    agent.tick()
    assert conditions(kube, bundle)["Ready"]["status"] == "True"
    latest = RunLog(kube, namespace=namespace).runs(bundle)[0]
    [reported] = latest.outputs
    # Read from a Secret: sealed, whatever the declaration said, and only in the Secret.
    assert reported.value is None and reported.sealed is not None
    place = OutputPlace(cluster="edge-1", bundle=bundle, output="leaked", run=latest.id)
    assert open_sealed(read_private_key(private_key), reported.sealed, place=place).value == own
    outputs = live(kube, "fleetlet.io/v1alpha1", "BundleOutputs", bundle)
    assert outputs is not None
    [shown] = outputs["spec"]["outputs"]
    assert shown["sensitive"] is True and "value" not in shown
    everything = json.dumps(
        [live(kube, "v1", "ConfigMap", f"fleetlet-runs-{bundle}", namespace), outputs]
    )
    assert own not in everything and stolen not in everything


def test_bundle_content_cannot_touch_the_agents_own_objects_unless_allowed(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A bundle (no ServiceAccount: it acts with the agent's rights) that would reset the
    agent's anti-rollback state, add a BundleDeployment, replace a fleetlet CRD and widen the
    agent's ClusterRole is refused as a whole before anything is written; only a bundle a
    cluster admin allowed may manage them."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    name = lab.name("takeover")
    state = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fleetlet-agent-state\n"
        f"  namespace: {namespace}\ndata:\n  state: '{{}}'\n"
    )
    bd = (
        "apiVersion: fleetlet.io/v1alpha1\nkind: BundleDeployment\nmetadata:\n"
        f"  name: {lab.name('forged')}\nspec:\n  sources: [{{kind: http, uri: 'https://x.invalid/a.tgz', "
        f"sha256: '{'0' * 64}'}}]\n"
    )
    role = (
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n"
        f"  name: fleetlet-agent-{lab.suffix}\nrules: [{{apiGroups: ['*'], resources: ['*'], "
        "verbs: ['*']}]\n"
    )
    elsewhere = configmap("fine", lab.name("ok"), {"a": "1"})
    files = {
        "01_ns.yaml": namespace_manifest(lab.name("ok")),
        "02_fine.yaml": elsewhere,
        "03_state.yaml": state,
        "04_bd.yaml": bd,
        "05_role.yaml": role,
    }
    digest = lab.push("takeover", files, tag="v1")
    lab.publish([{"name": name, "sources": [lab.source("takeover", digest)]}])
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    result = agent.tick()
    assert result.outbound is not None and result.outbound.failed == (name,), result
    ready = conditions(kube, name)["Ready"]
    assert "nothing was written" in ready["message"], ready
    for what in ("ConfigMap", "BundleDeployment", "ClusterRole"):
        assert what in ready["message"] and "off limits to bundle content" in ready["message"]
    assert "3 objects refused" in ready["message"], ready
    # Nothing of the group: the harmless object neither, the agent's state intact.
    assert live(kube, "v1", "ConfigMap", "fine", lab.name("ok")) is None
    assert (
        live(kube, "rbac.authorization.k8s.io/v1", "ClusterRole", f"fleetlet-agent-{lab.suffix}")
        is None
    )
    assert agent.state.load().last_serial == 1

    # A cluster admin lets this bundle manage the agent's objects (say, it upgrades the agent
    # itself): its RBAC now goes through.
    allowed_files = {k: v for k, v in files.items() if k != "03_state.yaml" and k != "04_bd.yaml"}
    digest = lab.push("takeover", allowed_files, tag="v2")
    lab.publish([{"name": name, "sources": [lab.source("takeover", digest)]}])
    allowed = lab.agent(
        "edge-1", crds, namespace=namespace, workdir=tmp_path / "agent",
        extra=["--allow-agent-objects", name],
    )  # fmt: skip
    again = allowed.tick()
    assert again.outbound is not None and again.outbound.moved == (name,), again
    role_ref = ("rbac.authorization.k8s.io/v1", "ClusterRole", f"fleetlet-agent-{lab.suffix}")
    assert live(kube, *role_ref) is not None
    kube.delete({"apiVersion": role_ref[0], "kind": role_ref[1], "metadata": {"name": role_ref[2]}})
