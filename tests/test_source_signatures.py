"""Source signatures: ``hub publish`` publishes an OCI source only when its cosign signature
satisfies the fleet's signature policy, and the sets carry the proof.

The real pinned ``cosign`` signs Helm charts that the real ``helm`` pushed to the test
registry: with a key pair, in both of cosign's layouts (a Sigstore bundle as an OCI referrer,
the older ``sha256-<digest>.sig`` tag), and keyless through the mini Sigstore (its Fulcio and
Rekor). What an operator checks: a signed chart publishes and every cluster's verified set
records who signed it and the policy's digest; an unsigned chart, one signed by another key
or identity, and one carrying a signature made for another digest are each refused naming
the bundle, the source, the digest and what was missing, and nothing reaches the git server;
an unchanged source is not read again on the next publish.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.api import load_set, to_dict
from agent.install.manifests import InstallConfigError
from agent.kube import KubeClient
from agent.report.bundles import BundleDeployments
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore
from agent.source.oci import OciFetcher, OciSettings
from agent.source.registry import RegistrySettings
from agent.source.signed import (
    SourceSignatureError,
    SourceVerifier,
    load_cluster_policy,
    signed_sources,
)
from agent.verify.sources import load_public_key
from hub.errors import FleetRepoError
from hub.publish.flow import UnsignedSourceError, prepare, publish, render
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.fleetlab import Lab, configmap, live, namespace_manifest
from tests.fleetlab import lab as lab  # the fixture
from tests.realenv.binaries import kubectl
from tests.realenv.cosign import Cosign
from tests.realenv.gitserver import GitDaemon
from tests.realenv.helm import HelmCli, copy_chart
from tests.realenv.kube import Cluster
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.signed_publish import publish_and_verify
from tests.test_crds import crds as crds  # the fixture: the CRDs installed
from tests.test_hub_fleet import write_fleet
from tests.test_hub_publish import server_refs
from tests.test_signed_commits import cli

CLUSTERS = [{"name": "eu-1", "labels": {"region": "eu"}}, {"name": "us-1", "labels": {}}]
CI = "ci@charts.test"
_ACCEPT = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json"


@dataclass
class Charts:
    """Charts pushed to the test registry under a namespace of this test's own."""

    registry: Registry
    helm: HelmCli
    namespace: str
    tmp: Path

    def push(self, version: str) -> tuple[str, str]:
        """Push the greeter chart at ``version``: (repository uri, manifest digest)."""
        chart = copy_chart("greeter", self.tmp / f"src-{version}", version=version)
        archive = self.helm.package(chart, self.tmp / "packages")
        digest = self.helm.push(archive, self.registry.host, namespace=self.namespace)
        return f"{self.registry.host}/{self.namespace}/greeter", digest

    def copy_sig_tag(self, uri: str, source: str, target: str) -> None:
        """Put the ``.sig`` manifest of digest ``source`` under ``target``'s ``.sig`` tag: a
        signature made for another artifact, replayed."""
        repo = uri.split("/", 1)[1]
        base = f"http://{self.registry.host}/v2/{repo}/manifests"
        got = requests.get(
            f"{base}/{source.replace(':', '-')}.sig", headers={"Accept": _ACCEPT}, timeout=30
        )
        got.raise_for_status()
        put = requests.put(
            f"{base}/{target.replace(':', '-')}.sig",
            data=got.content,
            headers={"Content-Type": got.headers["Content-Type"]},
            timeout=30,
        )
        put.raise_for_status()


@pytest.fixture
def charts(registry: Registry, tmp_path: Path) -> Charts:
    return Charts(registry, HelmCli(tmp_path / "helm"), f"signed-{tmp_path.name[-24:]}", tmp_path)


@pytest.fixture
def cosign(cosign_binary: Path, tmp_path: Path) -> Cosign:
    return Cosign(cosign_binary, tmp_path / "cosign")


def write_signed_fleet(
    root: Path,
    uri: str,
    digest_or_tag: dict[str, str],
    policies: dict[str, Any],
    *,
    files: dict[str, Path] | None = None,
    default: str | None = "release",
    verify: str | None = None,
) -> Path:
    """A fleet whose bundle ``web`` deploys the chart at ``uri``, with ``policies`` in
    fleet.yaml (and ``files`` copied into the fleet repository)."""
    signing: dict[str, Any] = {"policies": policies}
    if default is not None:
        signing["default"] = default
    bundle: dict[str, Any] = {
        "name": "web",
        "format": "helm",
        "sources": [{"kind": "image", "uri": uri, **digest_or_tag}],
        "targets": [{"clusterSelector": {}}],
    }
    if verify is not None:
        bundle["verify"] = verify
    write_fleet(
        root,
        clusters=CLUSTERS,
        bundles=[bundle],
        settings={"name": "signed-sources", "sourceSigning": signing},
    )
    for relative, source in (files or {}).items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, root / relative)
    return root


def test_a_key_signed_chart_publishes_and_every_set_carries_the_proof(
    charts: Charts,
    cosign: Cosign,
    git_daemon: GitDaemon,
    mini_sigstore: MiniSigstore,
    tmp_path: Path,
) -> None:
    uri, digest = charts.push("1.0.0")
    private, public = cosign.key_pair("release")
    cosign.sign(f"{uri}@{digest}", private)
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        uri,
        {"tag": "1.0.0"},
        {"release": {"keys": ["keys/release.pub"]}},
        files={"keys/release.pub": public},
    )
    prepared = prepare(fleet)
    assert prepared.signatures is not None
    (verdict,) = prepared.signatures.verdicts.values()
    fingerprint = load_public_key(public.read_text())
    assert fingerprint is not None
    assert verdict.check.ok, verdict.check.reason
    assert verdict.check.signer == f"key {fingerprint.fingerprint}"
    assert verdict.check.layout == "bundle"
    name = f"signed-src-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    sets = publish_and_verify(
        prepared, url=git_daemon.url_for(name), repo=repo, sigstore=mini_sigstore
    )
    for verified in sets.values():
        (entry,) = verified.deployment_set.bundle_deployments
        (source,) = entry.spec.sources
        assert source.digest == digest
        assert source.signature is not None
        assert source.signature.signer == f"key {fingerprint.fingerprint}"
        assert source.signature.policy == verdict.policy.digest()
        assert source.signature.layout == "bundle"


def test_the_older_sig_tag_layout_is_verified_too(
    charts: Charts, cosign: Cosign, tmp_path: Path
) -> None:
    uri, digest = charts.push("1.1.0")
    private, public = cosign.key_pair("release")
    cosign.sign(f"{uri}@{digest}", private, legacy=True)
    pem = public.read_text()
    fleet = write_signed_fleet(
        tmp_path / "fleet", uri, {"digest": digest}, {"release": {"keys": [pem]}}
    )
    prepared = prepare(fleet)
    assert prepared.signatures is not None
    (verdict,) = prepared.signatures.verdicts.values()
    assert verdict.check.ok, verdict.check.reason
    assert verdict.check.layout == "sig-tag"
    prepared.require_signed_sources()  # nothing to refuse


@pytest.mark.parametrize("case", ["unsigned", "another key", "another digest"])
def test_publish_refuses_a_chart_not_signed_as_its_policy_wants(
    charts: Charts, cosign: Cosign, git_daemon: GitDaemon, tmp_path: Path, case: str
) -> None:
    uri, digest = charts.push("2.0.0")
    private, public = cosign.key_pair("release")
    if case == "another key":
        other, _ = cosign.key_pair("mallory")
        cosign.sign(f"{uri}@{digest}", other)
        expected = "1 signature found, none acceptable: "
        reason = "the signature verifies with none of the policy's keys"
    elif case == "another digest":
        # A genuine signature of another chart of the same repository, replayed onto this one.
        _, signed = charts.push("2.0.1")
        cosign.sign(f"{uri}@{signed}", private, legacy=True)
        charts.copy_sig_tag(uri, signed, digest)
        expected = "1 signature found, none acceptable: "
        reason = f"the signature is for {signed}, not for {digest}"
    else:
        expected = "unsigned: no cosign signature found"
        reason = "neither a Sigstore bundle referrer nor a sha256-<digest>.sig tag"
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        uri,
        {"tag": "2.0.0"},
        {"release": {"keys": ["keys/release.pub"]}},
        files={"keys/release.pub": public},
        default=None,
        verify="release",
    )
    name = f"refused-src-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    with (
        pytest.raises(UnsignedSourceError) as refused,
        BranchStore(url=git_daemon.url_for(name)) as store,
    ):
        publish(prepare(fleet), store, signer=None)
    message = str(refused.value)
    assert f"web: image {uri}@{digest} is not signed as policy 'release'" in message
    assert expected in message
    assert reason in message
    assert "the policy wants a cosign signature by one of: key sha256:" in message
    assert "nothing was pushed" in message
    assert server_refs(repo, every=True) == {}


def test_keyless_signatures_by_the_policy_identity_only(
    charts: Charts,
    cosign: Cosign,
    mini_sigstore: MiniSigstore,
    other_sigstore: MiniSigstore,
    tmp_path: Path,
) -> None:
    """cosign signs keyless through the mini Sigstore (Fulcio certificate, Rekor entry); the
    hub verifies with sigstore-python against the policy's trusted root and identities."""
    uri, digest = charts.push("3.0.0")
    cosign.sign_keyless(f"{uri}@{digest}", mini_sigstore, CI)
    root = {"trust/root.json": mini_sigstore.trusted_root_path}
    identity = {"issuer": mini_sigstore.issuer, "subjectRegExp": r"ci@charts\.test"}
    fleet = write_signed_fleet(
        tmp_path / "ok",
        uri,
        {"digest": digest},
        {"ci": {"identities": [identity], "trustedRoot": "trust/root.json"}},
        files=root,
        default="ci",
    )
    prepared = prepare(fleet)
    assert prepared.signatures is not None
    (verdict,) = prepared.signatures.verdicts.values()
    assert verdict.check.ok, verdict.check.reason
    assert verdict.check.signer == f"{CI} ({mini_sigstore.issuer})"
    # Another identity of the same trusted Sigstore.
    fleet = write_signed_fleet(
        tmp_path / "other-identity",
        uri,
        {"digest": digest},
        {"ci": {"identities": [{**identity, "subjectRegExp": "release@.*"}], "trustedRoot": "r"}},
        files={"r": mini_sigstore.trusted_root_path},
        default="ci",
    )
    with pytest.raises(UnsignedSourceError) as refused:
        prepare(fleet).require_signed_sources()
    assert f"signed by {CI} ({mini_sigstore.issuer}), not an identity of the policy" in str(
        refused.value
    )
    # The right identity, certified by a Sigstore the policy does not trust.
    fleet = write_signed_fleet(
        tmp_path / "other-root",
        uri,
        {"digest": digest},
        {"ci": {"identities": [identity], "trustedRoot": "r"}},
        files={"r": other_sigstore.trusted_root_path},
        default="ci",
    )
    with pytest.raises(UnsignedSourceError) as refused:
        prepare(fleet).require_signed_sources()
    assert "the certificate does not verify against the policy's trusted root" in str(refused.value)
    # The right identity and root, but the older .sig layout: no inclusion proof to check.
    _, older = charts.push("3.0.1")
    cosign.sign_keyless(f"{uri}@{older}", mini_sigstore, CI, legacy=True)
    fleet = write_signed_fleet(
        tmp_path / "older-layout",
        uri,
        {"digest": older},
        {"ci": {"identities": [identity], "trustedRoot": "trust/root.json"}},
        files=root,
        default="ci",
    )
    with pytest.raises(UnsignedSourceError) as refused:
        prepare(fleet).require_signed_sources()
    assert "a keyless signature in the older .sig layout, which carries no transparency-log" in (
        str(refused.value)
    )


def test_a_verified_digest_is_not_read_again(
    charts: Charts, cosign: Cosign, registry: Registry, tmp_path: Path
) -> None:
    uri, digest = charts.push("4.0.0")
    private, public = cosign.key_pair("release")
    cosign.sign(f"{uri}@{digest}", private)
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        uri,
        {"digest": digest},
        {"release": {"keys": ["keys/release.pub"]}},
        files={"keys/release.pub": public},
    )
    cache = tmp_path / "signatures"
    first = prepare(fleet, signature_cache=cache).signatures
    assert first is not None and (first.checked, first.cached) == (1, 0)
    assert first.requests >= 2
    again = prepare(fleet, signature_cache=cache).signatures
    assert again is not None and (again.checked, again.cached, again.requests) == (1 - 1, 1, 0)
    (verdict,) = again.verdicts.values()
    assert verdict.check.ok
    # A refusal is never remembered: the same digest under a policy it fails is read again.
    _, stranger = cosign.key_pair("stranger")
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        uri,
        {"digest": digest},
        {"release": {"keys": ["keys/release.pub"]}},
        files={"keys/release.pub": stranger},
    )
    for _ in range(2):
        failed = prepare(fleet, signature_cache=cache).signatures
        assert failed is not None and (failed.checked, failed.cached) == (1, 0)
        assert not next(iter(failed.verdicts.values())).check.ok


@pytest.mark.parametrize(
    ("policies", "verify", "problem"),
    [
        ({"release": {}}, None, "sourceSigning.policies.release: expected at least one of keys"),
        (
            {"release": {"keys": ["keys/missing.pub"]}},
            None,
            "sourceSigning.policies.release.keys[0]: expected a readable file",
        ),
        (
            {"release": {"identities": [{"issuer": "https://x", "subjectRegExp": "("}]}},
            None,
            "subjectRegExp: expected a valid regular expression",
        ),
        ({"release": {"keys": ["../../etc/passwd"]}}, None, "leaves"),
        ({"release": {"keys": ["PEM"]}}, "nightly", "bundles/web.yaml: verify: expected the name"),
    ],
)
def test_a_broken_policy_is_refused_naming_the_field(
    tmp_path: Path, policies: dict[str, Any], verify: str | None, problem: str
) -> None:
    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    for body in policies.values():
        if body.get("keys") == ["PEM"]:
            body["keys"] = [pem]
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        "127.0.0.1:1/none/chart",
        {"digest": "sha256:" + "0" * 64},
        policies,
        default=None,
        verify=verify,
    )
    with pytest.raises(FleetRepoError) as refused:
        prepare(fleet)
    assert problem in str(refused.value)


# --- the cluster's own check (agent install --verify-sources) ------------------------------


def test_the_agent_refuses_a_source_the_hub_vouched_for_when_its_policy_disagrees(
    charts: Charts, cosign: Cosign, tmp_path: Path
) -> None:
    """The hub publishes a chart signed by the fleet's release key; a cluster whose own policy
    trusts only its platform team's key refuses it before fetching a byte, naming both the
    hub's word and its own policy; a cluster that trusts the release key uses it."""
    uri, digest = charts.push("5.0.0")
    private, public = cosign.key_pair("release")
    cosign.sign(f"{uri}@{digest}", private)
    _, platform = cosign.key_pair("platform")
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        uri,
        {"digest": digest},
        {"release": {"keys": ["keys/release.pub"]}},
        files={"keys/release.pub": public},
    )
    (entry,) = prepare(fleet).plans["eu-1"].entries
    (source,) = entry.spec.sources
    assert source.signature is not None  # the hub vouched for it
    hub_signer = source.signature.signer

    def store(policy_key: Path, name: str) -> tuple[ContentStore, SourceVerifier]:
        policy_file = tmp_path / name / "policy.yaml"
        policy_file.parent.mkdir()
        shutil.copyfile(policy_key, policy_file.parent / "key.pub")
        policy_file.write_text("keys: [key.pub]\n")
        verifier = SourceVerifier(
            load_cluster_policy(policy_file),
            cache_dir=tmp_path / name / "signatures",
            settings=RegistrySettings(plain_http=True),
        )
        cache = ContentCache(root=tmp_path / name / "content", max_bytes=64 << 20)
        oci = OciFetcher(settings=OciSettings(plain_http=True))
        return ContentStore(cache=cache, oci=oci, verifier=verifier), verifier

    strict, _ = store(platform, "strict")
    before = charts.registry.request_count()
    with pytest.raises(SourceSignatureError) as refused:
        strict.tree(source)
    message = str(refused.value)
    assert f"image {uri}" in message and digest in message
    assert "not signed as the cluster's source policy" in message
    assert "the signature verifies with none of the policy's keys" in message
    assert f"the hub vouched for it (signed by {hub_signer}" in message
    assert refused.value.reason == "SourceSignatureRefused"
    # Only signatures were read: no manifest or layer of the chart itself.
    read = [r.path for r in charts.registry.requests(since=before)]
    assert not any(f"/manifests/{digest}" in p for p in read), read
    trusting, verifier = store(public, "trusting")
    tree = trusting.tree(source)
    assert (tree / "greeter" / "Chart.yaml").is_file()
    trusting.tree(source)  # cached content, and a cached pass: no second check
    assert verifier.checked == 1


def test_agent_install_carries_the_cluster_policy(
    cosign: Cosign, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    from agent.install.command import config_from_args
    from agent.install.manifests import install_objects
    from fleetlet.cli import build_parser

    _, public = cosign.key_pair("platform")
    policy = tmp_path / "policy" / "sources.yaml"
    policy.parent.mkdir()
    shutil.copyfile(public, policy.parent / "platform.pub")
    shutil.copyfile(mini_sigstore.trusted_root_path, policy.parent / "root.json")
    policy.write_text(
        "keys: [platform.pub]\n"
        f"identities: [{{issuer: '{mini_sigstore.issuer}', subjectRegExp: '.+@charts\\.test'}}]\n"
        "trustedRoot: root.json\n"
    )
    args = build_parser().parse_args(
        [
            "agent", "install",
            "--image", "registry.example.test/fleetlet-agent@sha256:" + "1" * 64,
            "--repo", "https://git.example.test/state.git",
            "--status-repo", "https://git.example.test/status.git",
            "--cluster", "edge-1",
            "--identity", "https://ci.example.test/publish",
            "--issuer", mini_sigstore.issuer,
            "--trusted-root", str(mini_sigstore.trusted_root_path),
            "--verify-sources", str(policy),
        ]
    )  # fmt: skip
    objects = install_objects(config_from_args(args))
    (trust,) = [
        o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "fleetlet-trust"
    ]
    files = {k: base64.b64decode(v).decode() for k, v in trust["data"].items()}
    stored = yaml.safe_load(files["source-policy.yaml"])
    assert stored["trustedRoot"] == "source-trusted-root.json"
    assert files["source-trusted-root.json"] == mini_sigstore.trusted_root_path.read_text()
    assert "BEGIN PUBLIC KEY" in stored["keys"][0]  # self-contained: the key inline
    # The agent's Deployment and the candidate an in-cluster upgrade runs both read the policy.
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == [
        "fleetlet-agent",
        "fleetlet-agent-candidate",
    ]
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["FLEETLET_SOURCE_POLICY"] == "/etc/fleetlet/trust/source-policy.yaml"
    # What the agent will read there is the same policy.
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name, text in files.items():
        (mounted / name).write_text(text)
    original = load_cluster_policy(policy)
    assert load_cluster_policy(mounted / "source-policy.yaml").digest() == original.digest()
    # A broken policy stops the install, naming the field.
    policy.write_text("keys: [missing.pub]\n")
    with pytest.raises(InstallConfigError, match=r"policy.keys\[0\]: expected a readable file"):
        config_from_args(args)


def test_the_cluster_shows_the_proof_on_each_bundledeployment(
    charts: Charts, cosign: Cosign, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """What ``kubectl get bundledeployments -o yaml`` and the status document show."""
    uri, digest = charts.push("6.0.0")
    private, public = cosign.key_pair("release")
    cosign.sign(f"{uri}@{digest}", private)
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        uri,
        {"digest": digest},
        {"release": {"keys": ["keys/release.pub"]}},
        files={"keys/release.pub": public},
    )
    prepared = prepare(fleet)
    (written,) = [p for p in render(prepared, tmp_path / "sets") if p.stem == "eu-1"]
    deployment_set = load_set(written.read_bytes(), origin=str(written))
    policy = load_public_key(public.read_text())
    assert policy is not None
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    bundles = BundleDeployments(kube=kube, owner=namespace)
    bundles.publish(deployment_set)
    try:
        shown = subprocess.run(
            [kubectl(), "--kubeconfig", str(crds.kubeconfig), "get", "bundledeployment", "web",
             "-o", "yaml"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        (source,) = yaml.safe_load(shown)["spec"]["sources"]
        assert source["digest"] == digest
        assert source["signature"] == {
            "policy": prepared.fleet.settings.source_signing.policies["release"].digest(),  # type: ignore[union-attr]
            "signer": f"key {policy.fingerprint}",
            "layout": "bundle",
        }
    finally:
        bundles.delete("web")
    # The status document's record of the bundle (agent.loop builds it with this).
    (entry,) = deployment_set.bundle_deployments
    (signed,) = signed_sources(entry, cluster_policy=None)
    assert (signed.digest, signed.signer) == (digest, f"key {policy.fingerprint}")
    assert to_dict(signed)["policy"] == source["signature"]["policy"]


def test_hub_diff_reports_and_hub_publish_refuses_on_the_command_line(
    charts: Charts, cosign: Cosign, git_daemon: GitDaemon, tmp_path: Path
) -> None:
    uri, digest = charts.push("7.0.0")
    _, public = cosign.key_pair("release")  # the chart stays unsigned
    fleet = write_signed_fleet(
        tmp_path / "fleet",
        uri,
        {"tag": "7.0.0"},
        {"release": {"keys": ["keys/release.pub"]}},
        files={"keys/release.pub": public},
    )
    name = f"cli-src-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    url = git_daemon.url_for(name)
    shown = cli("diff", str(fleet), "--repo", url, "-q")
    assert shown.returncode == 0, shown.stderr
    assert f"web: image {uri}@{digest} is not signed as policy 'release'" in shown.stdout
    assert "hub publish would refuse it" in shown.stdout
    refused = cli("publish", str(fleet), "--repo", url, "--no-sign", "-q")
    assert refused.returncode != 0
    assert f"web: image {uri}@{digest} is not signed as policy 'release'" in refused.stderr
    assert "unsigned: no cosign signature found" in refused.stderr
    assert "nothing was pushed" in refused.stderr
    assert server_refs(repo, every=True) == {}


def test_an_agent_with_its_own_policy_refuses_what_the_hub_vouched_for(
    lab: Lab,
    cosign: Cosign,
    crds: Cluster,
    namespace: str,
    app_namespace: str,
    tmp_path: Path,
) -> None:
    """End to end: the hub publishes a bundle image signed by the fleet's release key (the set
    says so); an agent whose cluster policy trusts only the platform key refuses the
    publication (SourceSignatureRefused, nothing applied); an agent with the release key in its
    policy applies it."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    name = lab.name("signed")
    target = lab.name("signed-ns")
    files = {
        "01_ns.yaml": namespace_manifest(target),
        "02_cm.yaml": configmap("signed", target, {"a": "1"}),
    }
    digest = lab.push("signed", files, tag="v1")
    release, release_pub = cosign.key_pair("release")
    _, platform_pub = cosign.key_pair("platform")
    cosign.sign(f"{lab.registry.host}/signed@{digest}", release)
    fleet = write_fleet(
        tmp_path / "fleet",
        clusters=lab.clusters,
        bundles=[
            {
                "name": name,
                "sources": [lab.source("signed", digest)],
                "targets": [{"clusterSelector": {}}],
            }
        ],
        settings={
            "name": "lab",
            "signing": {"identity": DEFAULT_IDENTITY, "issuer": lab.sigstore.issuer},
            "sourceSigning": {
                "policies": {"release": {"keys": [release_pub.read_text()]}},
                "default": "release",
            },
        },
    )
    signer = PublicationSigner.from_trust_config(
        trust_config=lab.sigstore.trust_config_path, token=lab.sigstore.mint_token()
    )
    with BranchStore(url=lab.url, cache_dir=tmp_path / "hub-cache") as store:
        publish(prepare(fleet), store, signer=signer)

    def policy(key: Path, where: str) -> Path:
        home = tmp_path / where
        home.mkdir()
        shutil.copyfile(key, home / "key.pub")
        (home / "policy.yaml").write_text("keys: [key.pub]\n")
        return home / "policy.yaml"

    strict = lab.agent(
        "edge-1",
        crds,
        namespace=namespace,
        workdir=tmp_path / "strict",
        extra=["--verify-sources", str(policy(platform_pub, "platform"))],
    )
    with pytest.raises(SourceSignatureError) as refused:
        strict.tick()
    message = str(refused.value)
    assert f"image {lab.registry.host}/signed@{digest}" in message
    assert "not signed as the cluster's source policy" in message
    assert "the hub vouched for it (signed by key sha256:" in message
    # The whole publication is refused, as for hostile content: remembered in the cluster,
    # reported in the status document, nothing of it applied.
    state = strict.state.load()
    assert state.refusal_reason == "SourceSignatureRefused" and state.last_serial is None
    document = strict.status_document()
    assert document.last_refusal is not None
    assert document.last_refusal.reason == "SourceSignatureRefused"
    assert live(kube, "v1", "ConfigMap", "signed", target) is None

    # A cluster whose policy trusts the release key applies it, and shows the proof.
    trusting = lab.agent(
        "edge-1",
        crds,
        namespace=app_namespace,
        workdir=tmp_path / "trusting",
        extra=["--verify-sources", str(policy(release_pub, "release"))],
    )
    trusting.tick()
    assert live(kube, "v1", "ConfigMap", "signed", target) is not None
    bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name)
    assert bd is not None and bd["spec"]["sources"][0]["signature"]["layout"] == "bundle"
    (report,) = [b for b in trusting.status_document().bundles if b.name == name]
    (signed,) = report.signed_sources
    assert signed.digest == digest and signed.cluster_policy is not None
