"""notation (Notary Project) signatures of OCI sources: ``hub publish`` verifies them against a
``sourceSigning`` policy's ``notation`` trust store and trusted identities.

The real notation CLI (pinned, built from the Go module proxy) signs Helm charts in the test
registry with certificates a test CA issued; the signature is a JWS envelope attached as an OCI
referrer (through the ``sha256-<digest>`` referrers tag: the test registry has no referrers
API). What an operator checks: a signed chart publishes and every set carries the proof
(layout ``notation``, the certificate's subject); an unsigned chart, one signed under another
CA, one signed by another identity of the trusted CA and one carrying a signature made for
another chart are each refused with the reason.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization

from hub.errors import FleetRepoError
from hub.publish.flow import UnsignedSourceError, prepare, publish
from hub.publish.git import BranchStore
from tests.realenv.gitserver import GitDaemon
from tests.realenv.helm import HelmCli
from tests.realenv.notation import IssuingCA, Notation, make_ca
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.server import TSA_PATH
from tests.signed_publish import publish_and_verify
from tests.test_hub_publish import server_refs
from tests.test_source_signatures import Charts, write_signed_fleet

RELEASE = "x509.subject: C=US, ST=WA, O=Acme, CN=release"
SIGNER = "notation CN=release,O=Acme,ST=WA,C=US"
_INDEX = "application/vnd.oci.image.index.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def charts(registry: Registry, tmp_path: Path) -> Charts:
    return Charts(registry, HelmCli(tmp_path / "helm"), f"notary-{tmp_path.name[-24:]}", tmp_path)


@pytest.fixture
def acme() -> IssuingCA:
    return make_ca("Acme Signing CA")


@pytest.fixture
def notation(notation_binary: Path, tmp_path: Path, acme: IssuingCA) -> Notation:
    tool = Notation(notation_binary, tmp_path / "notation")
    tool.add_signing_key("release", acme, "release")
    return tool


def policy(tmp_path: Path, acme: IssuingCA) -> tuple[dict[str, Any], dict[str, Path]]:
    """The ``release`` policy trusting ``acme`` for the release identity, and its file."""
    ca_file = tmp_path / "acme-ca.pem"
    ca_file.write_bytes(acme.pem)
    notation = {"trustStore": ["trust/acme-ca.pem"], "trustedIdentities": [RELEASE]}
    return {"release": {"notation": notation}}, {"trust/acme-ca.pem": ca_file}


def test_a_notation_signed_chart_publishes_and_every_set_carries_the_proof(
    charts: Charts,
    notation: Notation,
    acme: IssuingCA,
    git_daemon: GitDaemon,
    mini_sigstore: MiniSigstore,
    tmp_path: Path,
) -> None:
    uri, digest = charts.push("1.0.0")
    notation.sign(f"{uri}@{digest}", "release")
    policies, files = policy(tmp_path, acme)
    fleet = write_signed_fleet(tmp_path / "fleet", uri, {"tag": "1.0.0"}, policies, files=files)
    prepared = prepare(fleet)
    assert prepared.signatures is not None
    (verdict,) = prepared.signatures.verdicts.values()
    assert verdict.check.ok, verdict.check.reason
    assert (verdict.check.signer, verdict.check.layout) == (SIGNER, "notation")
    name = f"notary-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    sets = publish_and_verify(
        prepared, url=git_daemon.url_for(name), repo=repo, sigstore=mini_sigstore
    )
    for verified in sets.values():
        (entry,) = verified.deployment_set.bundle_deployments
        (source,) = entry.spec.sources
        assert source.digest == digest and source.signature is not None
        assert (source.signature.signer, source.signature.layout) == (SIGNER, "notation")
        assert source.signature.policy == verdict.policy.digest()


def replay_signature(registry: Registry, uri: str, signed: str, target: str) -> None:
    """Attach ``signed``'s notation signature to ``target``: its manifest with the subject
    changed, listed in ``target``'s referrers tag (what a registry account could do)."""
    base = f"http://{registry.host}/v2/{uri.split('/', 1)[1]}/manifests"
    index = requests.get(
        f"{base}/sha256-{signed.removeprefix('sha256:')}", headers={"Accept": _INDEX}, timeout=30
    ).json()
    (listed,) = index["manifests"]
    manifest = requests.get(
        f"{base}/{listed['digest']}", headers={"Accept": _MANIFEST}, timeout=30
    ).json()
    subject = requests.head(f"{base}/{target}", headers={"Accept": _MANIFEST}, timeout=30)
    manifest["subject"] = {
        "mediaType": _MANIFEST,
        "digest": target,
        "size": int(subject.headers["Content-Length"]),
    }
    body = json.dumps(manifest).encode()
    put = requests.put(
        f"{base}/replayed", data=body, headers={"Content-Type": _MANIFEST}, timeout=30
    )
    put.raise_for_status()
    entry = {**listed, "digest": put.headers["Docker-Content-Digest"], "size": len(body)}
    index["manifests"] = [entry]
    requests.put(
        f"{base}/sha256-{target.removeprefix('sha256:')}",
        data=json.dumps(index).encode(),
        headers={"Content-Type": _INDEX},
        timeout=30,
    ).raise_for_status()


@pytest.mark.parametrize("case", ["unsigned", "another CA", "another identity", "another digest"])
def test_publish_refuses_a_chart_not_signed_as_its_notation_policy_wants(
    charts: Charts,
    notation: Notation,
    acme: IssuingCA,
    registry: Registry,
    git_daemon: GitDaemon,
    tmp_path: Path,
    case: str,
) -> None:
    uri, digest = charts.push("2.0.0")
    if case == "another CA":
        notation.add_signing_key("rogue", make_ca("Acme Signing CA"), "release")
        notation.sign(f"{uri}@{digest}", "rogue")
        reason = "CN=Acme Signing CA,O=Acme,ST=WA,C=US, which is not in the policy's trust store"
    elif case == "another identity":
        notation.add_signing_key("intern", acme, "intern")
        notation.sign(f"{uri}@{digest}", "intern")
        reason = "signed by CN=intern,O=Acme,ST=WA,C=US, not a trusted identity of the policy"
    elif case == "another digest":
        _, signed = charts.push("2.0.1")
        notation.sign(f"{uri}@{signed}", "release")
        replay_signature(registry, uri, signed, digest)
        reason = f"the signature is for {signed}, not for {digest}"
    else:
        reason = "unsigned: no cosign or notation signature found"
    policies, files = policy(tmp_path, acme)
    fleet = write_signed_fleet(tmp_path / "fleet", uri, {"tag": "2.0.0"}, policies, files=files)
    name = f"notary-refused-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    with (
        pytest.raises(UnsignedSourceError) as refused,
        BranchStore(url=git_daemon.url_for(name)) as store,
    ):
        publish(prepare(fleet), store, signer=None)
    message = str(refused.value)
    assert f"web: image {uri}@{digest} is not signed as policy 'release'" in message
    assert reason in message
    assert f"the policy wants a notation {RELEASE} under 1 trusted CA(s)" in message
    assert server_refs(repo, every=True) == {}


def test_notation_policy_mistakes_name_the_field(tmp_path: Path, acme: IssuingCA) -> None:
    policies = {
        "release": {
            "notation": {
                "trustStore": ["-----BEGIN CERTIFICATE-----\nnot\n-----END CERTIFICATE-----"],
                "trustedIdentities": ["CN=release"],
            }
        }
    }
    fleet = write_signed_fleet(
        tmp_path / "fleet", "registry.test/charts/web", {"tag": "1.0.0"}, policies
    )
    with pytest.raises(FleetRepoError) as found:
        prepare(fleet)
    text = str(found.value)
    assert "sourceSigning.policies.release.notation.trustStore[0]" in text
    assert "sourceSigning.policies.release.notation.trustedIdentities[0]" in text


def test_the_clusters_own_copy_of_a_notation_policy_is_the_same_policy(
    tmp_path: Path, acme: IssuingCA
) -> None:
    """``agent install --verify-sources`` stores the policy self-contained (the CA inline)."""
    from agent.errors import FieldProblem
    from agent.verify.sources import file_reader, parse_source_policy

    policies, files = policy(tmp_path, acme)
    fleet = write_signed_fleet(
        tmp_path / "fleet", "registry.test/charts/web", {"tag": "1.0.0"}, policies, files=files
    )
    problems: list[FieldProblem] = []
    read = file_reader(fleet)
    original = parse_source_policy(
        policies["release"], name="release", where="p", read=read, problems=problems
    )
    assert original is not None and original.notation is not None
    stored = original.document("trusted_root.json")
    assert "-----BEGIN CERTIFICATE-----" in stored["notation"]["trustStore"][0]
    again = parse_source_policy(stored, name="release", where="p", read=read, problems=problems)
    assert problems == [] and again is not None
    assert again.digest() == original.digest()


def test_the_agent_verifies_a_notation_signature_under_its_own_policy(
    charts: Charts, notation: Notation, acme: IssuingCA, tmp_path: Path
) -> None:
    """A cluster whose own policy (``agent install --verify-sources``) trusts another CA
    refuses the chart the hub vouched for; one trusting the signing CA uses it."""
    from agent.source.cache import ContentCache
    from agent.source.compose import ContentStore
    from agent.source.oci import OciFetcher, OciSettings
    from agent.source.registry import RegistrySettings
    from agent.source.signed import SourceSignatureError, SourceVerifier, load_cluster_policy

    uri, digest = charts.push("5.0.0")
    notation.sign(f"{uri}@{digest}", "release")
    policies, files = policy(tmp_path, acme)
    fleet = write_signed_fleet(tmp_path / "fleet", uri, {"digest": digest}, policies, files=files)
    (entry,) = prepare(fleet).plans["eu-1"].entries
    (source,) = entry.spec.sources
    assert source.signature is not None and source.signature.layout == "notation"

    def store(ca_pem: bytes, name: str) -> ContentStore:
        policy_file = tmp_path / name / "policy.yaml"
        policy_file.parent.mkdir()
        (policy_file.parent / "ca.pem").write_bytes(ca_pem)
        policy_file.write_text(
            json.dumps({"notation": {"trustStore": ["ca.pem"], "trustedIdentities": [RELEASE]}})
        )
        verifier = SourceVerifier(
            load_cluster_policy(policy_file),
            cache_dir=tmp_path / name / "signatures",
            settings=RegistrySettings(plain_http=True),
        )
        cache = ContentCache(root=tmp_path / name / "content", max_bytes=64 << 20)
        return ContentStore(
            cache=cache, oci=OciFetcher(settings=OciSettings(plain_http=True)), verifier=verifier
        )

    with pytest.raises(SourceSignatureError) as refused:
        store(make_ca("Platform CA").pem, "strict").tree(source)
    message = str(refused.value)
    assert "not signed as the cluster's source policy" in message
    assert "which is not in the policy's trust store" in message
    assert f"the hub vouched for it (signed by {SIGNER}" in message
    tree = store(acme.pem, "trusting").tree(source)
    assert (tree / "greeter" / "Chart.yaml").is_file()


def test_a_notation_pass_is_remembered_only_while_its_certificates_are_valid(
    charts: Charts, notation: Notation, acme: IssuingCA, tmp_path: Path
) -> None:
    """Its verdict depends on the time (the chain must be valid now): the cache keeps it
    until the first certificate of the chain expires, unlike a cosign pass."""
    from agent.verify.cosign import PassCache

    uri, digest = charts.push("6.0.0")
    notation.sign(f"{uri}@{digest}", "release")
    policies, files = policy(tmp_path, acme)
    fleet = write_signed_fleet(tmp_path / "fleet", uri, {"digest": digest}, policies, files=files)
    prepared = prepare(fleet)
    assert prepared.signatures is not None
    (verdict,) = prepared.signatures.verdicts.values()
    check = verdict.check
    assert check.ok and check.valid_until is not None
    # The signing certificate (12 hours) ends before its CA (a day).
    leaf_end = datetime.strptime(check.valid_until, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert timedelta(hours=11) < leaf_end - datetime.now(UTC) <= timedelta(hours=12)
    cache = PassCache(tmp_path / "passes")
    cache.put(check)
    assert cache.get(digest, check.policy) == check
    cache.put(replace(check, valid_until="2020-01-01T00:00:00Z"))
    assert cache.get(digest, check.policy) is None


def test_a_timestamped_signature_outlives_its_certificate(
    charts: Charts,
    notation: Notation,
    acme: IssuingCA,
    registry: Registry,
    mini_sigstore_v2: MiniSigstore,
    tmp_path: Path,
) -> None:
    """With a TSA trust store in the policy, the RFC 3161 countersignature (notation sign
    --timestamp-url) dates the signature: the chain is judged at that time, so the pass holds
    for good and still holds once the signing certificate has expired; a TSA the policy does
    not trust is refused."""
    from agent.verify.notation import JWS, NotationRefusal, verify_notation

    tsa_root = tmp_path / "tsa-root.pem"
    tsa_root.write_bytes(mini_sigstore_v2.tsa.chain[-1].public_bytes(serialization.Encoding.PEM))
    uri, digest = charts.push("7.0.0")
    stamp = mini_sigstore_v2.url + TSA_PATH
    notation.sign(f"{uri}@{digest}", "release", timestamp_url=stamp, timestamp_root=tsa_root)
    policies, files = policy(tmp_path, acme)
    policies["release"]["notation"]["tsaTrustStore"] = ["trust/tsa-root.pem"]
    files["trust/tsa-root.pem"] = tsa_root
    fleet = write_signed_fleet(tmp_path / "fleet", uri, {"digest": digest}, policies, files=files)
    prepared = prepare(fleet)
    assert prepared.signatures is not None
    (verdict,) = prepared.signatures.verdicts.values()
    assert verdict.check.ok, verdict.check.reason
    assert verdict.check.valid_until is None
    trust = verdict.policy.notation
    assert trust is not None
    envelope = notation_envelope(registry, uri, digest)
    later = datetime.now(UTC) + timedelta(days=2)  # the signing certificate lasts 12 hours
    assert verify_notation(envelope, JWS, digest, trust, now=later).valid_until is None
    untimed = replace(trust, tsa_store=())
    with pytest.raises(NotationRefusal, match="is not valid now"):
        verify_notation(envelope, JWS, digest, untimed, now=later)
    foreign = replace(trust, tsa_store=(acme.certificate.public_bytes(serialization.Encoding.DER),))
    with pytest.raises(NotationRefusal, match="does not verify against the policy's TSA trust"):
        verify_notation(envelope, JWS, digest, foreign)


def notation_envelope(registry: Registry, uri: str, digest: str) -> bytes:
    """The JWS of the first notation signature listed in ``digest``'s referrers tag."""
    base = f"http://{registry.host}/v2/{uri.split('/', 1)[1]}"
    index = requests.get(
        f"{base}/manifests/sha256-{digest.removeprefix('sha256:')}",
        headers={"Accept": _INDEX},
        timeout=30,
    ).json()
    manifest = requests.get(
        f"{base}/manifests/{index['manifests'][0]['digest']}",
        headers={"Accept": _MANIFEST},
        timeout=30,
    ).json()
    blob = requests.get(f"{base}/blobs/{manifest['layers'][0]['digest']}", timeout=30)
    blob.raise_for_status()
    return blob.content
