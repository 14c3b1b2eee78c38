"""Signed publications through the real mini Sigstore: one signature, every cluster verifies,
and every kind of tampering is refused with its own error."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import rfc8785
import yaml

from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    BundleDeploymentSpec,
    FormatOptions,
    SetSource,
    Source,
    dump_set,
    set_digest,
)
from agent.errors import (
    ExpiredError,
    FloatingReferenceError,
    IdentityMismatchError,
    InclusionProofError,
    ReplayError,
    SignatureError,
    StatementMismatchError,
    TemporaryError,
    TrustConfigError,
    UntrustedSignerError,
    ValidationError,
    ValidityTooLongError,
    WrongClusterError,
)
from agent.verify import (
    BRANCH_FILES,
    BUNDLE_FILE,
    DEFAULT_CLOCK_SKEW,
    DEFAULT_MAX_VALIDITY,
    PROOF_FILE,
    SET_FILE,
    STATEMENT_FILE,
    ClusterProof,
    DeferredTrust,
    IdentityPolicy,
    PublicationStatement,
    TrustPolicy,
    VouchedSignature,
    verify_publication,
)
from agent.verify._sigstore import verify_statement_signature
from agent.verify.merkle import MerkleTree, publication_leaf
from hub.errors import PublishError
from hub.publish import Publication, PublicationSigner, sign_publication
from tests.realenv.sigstore import DEFAULT_IDENTITY, MiniSigstore
from tests.realenv.sigstore_fixtures import PublicGoodSample, production_trusted_root_path

REPO = "https://git.fleet.test/fleet.git"
COMMIT = "c0ffee" + "0" * 34
CLUSTERS = {"edge-a": 4, "edge-b": 9, "edge-c": 1}  # cluster -> serial
NOW = datetime.now(UTC).replace(microsecond=0)
ISSUED = NOW - timedelta(minutes=1)
EXPIRES = NOW + timedelta(days=1)


def make_set(
    cluster: str,
    serial: int,
    *,
    issued: datetime = ISSUED,
    expires: datetime = EXPIRES,
    digest: str = "sha256:" + "1" * 64,
) -> BundleDeploymentSet:
    return BundleDeploymentSet(
        cluster=cluster,
        serial=serial,
        issued_at=issued,
        expires_at=expires,
        source=SetSource(repo=REPO, commit=COMMIT),
        bundle_deployments=(
            BundleDeploymentEntry(
                name="app",
                spec=BundleDeploymentSpec(
                    sources=(Source(kind="image", uri="registry.fleet.test/app", digest=digest),)
                ),
            ),
        ),
        groups=("app",),
    )


def signer_for(
    sigstore: MiniSigstore, identity: str = DEFAULT_IDENTITY, issuer: str | None = None
) -> PublicationSigner:
    return PublicationSigner.from_trust_config(
        trust_config=sigstore.trust_config_path,
        token=sigstore.mint_token(identity=identity, issuer=issuer),
    )


def publish(
    sigstore: MiniSigstore,
    *,
    identity: str = DEFAULT_IDENTITY,
    issuer: str | None = None,
    issued: datetime = ISSUED,
    expires: datetime = EXPIRES,
) -> Publication:
    return sign_publication(
        sets=[make_set(c, s, issued=issued, expires=expires) for c, s in CLUSTERS.items()],
        signer=signer_for(sigstore, identity, issuer),
        issued_at=issued,
        expires_at=expires,
        source_repo=REPO,
        source_commit=COMMIT,
    )


def trust_in(sigstore: MiniSigstore, *, issuer: str | None = None) -> TrustPolicy:
    return TrustPolicy(
        trusted_root=sigstore.trusted_root_path,
        identity=IdentityPolicy(issuer=issuer or sigstore.issuer, subject=DEFAULT_IDENTITY),
    )


def log_index(bundle_json: bytes) -> int:
    """The transparency-log index of a bundle's entry (read from the bundle's JSON)."""
    entries = json.loads(bundle_json)["verificationMaterial"]["tlogEntries"]
    assert len(entries) == 1
    return int(entries[0]["logIndex"])


def replaced(files: Mapping[str, bytes], **changes: bytes) -> dict[str, bytes]:
    out = dict(files)
    for key, value in changes.items():
        out[{"set": SET_FILE, "statement": STATEMENT_FILE, "proof": PROOF_FILE}[key]] = value
    return out


@pytest.fixture(scope="module")
def published(mini_sigstore: MiniSigstore) -> Publication:
    return publish(mini_sigstore)


@pytest.fixture(scope="module")
def trust(mini_sigstore: MiniSigstore) -> TrustPolicy:
    return trust_in(mini_sigstore)


# --- the good path --------------------------------------------------------------------------


@pytest.mark.parametrize("instance", ["mini_sigstore", "mini_sigstore_v2"])
def test_one_signing_event_and_every_cluster_verifies(
    instance: str, request: pytest.FixtureRequest
) -> None:
    sigstore: MiniSigstore = request.getfixturevalue(instance)
    before = log_index(sigstore.sign(b"probe before").to_json().encode())
    publication = publish(sigstore)
    after = log_index(sigstore.sign(b"probe after").to_json().encode())

    # Exactly one log entry between the two probes: the publication's single signature.
    assert log_index(publication.bundle_json) == before + 1
    assert after == before + 2
    assert set(publication.clusters) == set(CLUSTERS)
    trust = trust_in(sigstore)
    for cluster, serial in CLUSTERS.items():
        part = publication.clusters[cluster]
        assert set(part.files) == set(BRANCH_FILES)
        assert part.files[BUNDLE_FILE] == publication.bundle_json  # one bundle shared by all
        verified = verify_publication(
            files=part.files, cluster=cluster, last_serial=serial - 1, trust=trust
        )
        assert verified.deployment_set == make_set(cluster, serial)
        assert verified.set_digest == set_digest(make_set(cluster, serial)) == part.set_digest
        assert verified.statement == publication.statement
        assert verified.statement.tree_size == 3
        assert verified.signer_identities == (DEFAULT_IDENTITY,)
        assert verified.signer_issuer == sigstore.issuer


def test_a_first_sync_has_no_last_serial(published: Publication, trust: TrustPolicy) -> None:
    verified = verify_publication(
        files=published.clusters["edge-c"].files, cluster="edge-c", last_serial=None, trust=trust
    )
    assert verified.deployment_set.serial == 1


def test_the_statement_is_canonical_and_names_the_publication(published: Publication) -> None:
    statement = json.loads(published.statement_bytes)
    assert statement == {
        "apiVersion": "fleetlet.io/v1alpha1",
        "kind": "PublicationStatement",
        "formatVersion": 1,
        "merkleRoot": "sha256:" + published.statement.merkle_root.hex(),
        "treeSize": 3,
        "serialRange": {"min": 1, "max": 9},
        "issuedAt": ISSUED.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "expiresAt": EXPIRES.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": {"repo": REPO, "commit": COMMIT},
    }
    assert published.statement_bytes == rfc8785.dumps(statement)
    assert PublicationStatement.from_bytes(published.statement_bytes) == published.statement
    for part in published.clusters.values():
        assert part.files[PROOF_FILE] == rfc8785.dumps(json.loads(part.files[PROOF_FILE]))
        assert ClusterProof.from_bytes(part.files[PROOF_FILE]) == part.proof
    # The root is the tree over the clusters' leaves, in cluster-name order.
    leaves = [
        publication_leaf(
            cluster=c, serial=CLUSTERS[c], set_digest=set_digest(make_set(c, CLUSTERS[c]))
        )
        for c in sorted(CLUSTERS)
    ]
    assert MerkleTree(leaves).root == published.statement.merkle_root


# --- who signed -----------------------------------------------------------------------------


def test_a_wrong_signer_identity_is_refused(
    mini_sigstore: MiniSigstore, trust: TrustPolicy
) -> None:
    publication = publish(mini_sigstore, identity="intruder@fleet.test")
    with pytest.raises(IdentityMismatchError) as caught:
        verify_publication(
            files=publication.clusters["edge-a"].files, cluster="edge-a", last_serial=1, trust=trust
        )
    assert f"expected {DEFAULT_IDENTITY!r}, found 'intruder@fleet.test'" in str(caught.value)
    assert "issuer" not in str(caught.value)


def test_a_wrong_issuer_is_refused(mini_sigstore: MiniSigstore, trust: TrustPolicy) -> None:
    publication = publish(mini_sigstore, issuer="https://evil.test")
    with pytest.raises(IdentityMismatchError) as caught:
        verify_publication(
            files=publication.clusters["edge-a"].files, cluster="edge-a", last_serial=1, trust=trust
        )
    message = str(caught.value)
    assert f"OIDC issuer: expected {mini_sigstore.issuer!r}, found 'https://evil.test'" in message
    assert "subject" not in message


@pytest.mark.parametrize("instance", ["mini_sigstore", "mini_sigstore_v2"])
def test_a_foreign_trusted_root_is_refused(
    instance: str, request: pytest.FixtureRequest, other_sigstore: MiniSigstore
) -> None:
    """Same issuer URL and identity, but another CA, CT log, log and TSA."""
    sigstore: MiniSigstore = request.getfixturevalue(instance)
    publication = publish(sigstore)
    with pytest.raises(UntrustedSignerError, match="not trusted by the configured trusted root"):
        verify_publication(
            files=publication.clusters["edge-a"].files,
            cluster="edge-a",
            last_serial=1,
            trust=trust_in(other_sigstore),
        )


# --- what was signed ------------------------------------------------------------------------


def test_a_statement_edited_after_signing_is_refused(
    published: Publication, trust: TrustPolicy
) -> None:
    statement = json.loads(published.statement_bytes)
    statement["expiresAt"] = "2099-01-01T00:00:00Z"  # a hub that wants its sets to live forever
    files = replaced(published.clusters["edge-a"].files, statement=json.dumps(statement).encode())
    with pytest.raises(SignatureError, match="does not verify over the statement"):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


def test_a_vouched_signature_stands_for_those_bytes_only(
    published: Publication, trust: TrustPolicy
) -> None:
    """``agent run``'s worker checks a signature in a first step, then applies without
    sigstore: the signature is taken as verified for exactly the bytes checked; any other
    statement is verified for real (and a tampered one refused)."""
    files = published.clusters["edge-a"].files
    statement, bundle = files[STATEMENT_FILE], files[BUNDLE_FILE]
    signer = verify_statement_signature(
        statement=statement, bundle_json=bundle, trust=trust, bundle_name=BUNDLE_FILE
    )
    vouched = VouchedSignature.from_json(
        VouchedSignature.of(
            statement=statement, bundle_json=bundle, signer=signer, policy=trust.digest()
        ).to_json()
    )
    loads: list[str] = []

    def load() -> TrustPolicy:
        loads.append("sigstore")
        return trust

    deferred = DeferredTrust(load=load, identity=trust.identity, vouched=vouched)
    verified = verify_publication(files=files, cluster="edge-a", last_serial=1, trust=deferred)
    assert verified.deployment_set == make_set("edge-a", 4)
    assert verified.signer_identities == (DEFAULT_IDENTITY,)
    assert loads == [] and deferred.digest() == trust.digest()
    # Every other check still runs: a replayed serial is refused without sigstore too.
    with pytest.raises(ReplayError):
        verify_publication(files=files, cluster="edge-a", last_serial=4, trust=deferred)
    assert loads == []

    edited = json.loads(statement)
    edited["expiresAt"] = "2099-01-01T00:00:00Z"
    tampered = replaced(files, statement=json.dumps(edited).encode())
    with pytest.raises(SignatureError, match="does not verify over the statement"):
        verify_publication(files=tampered, cluster="edge-a", last_serial=1, trust=deferred)
    assert loads == ["sigstore"]  # those bytes were not vouched for: verified for real


def test_a_set_edited_after_signing_is_refused(published: Publication, trust: TrustPolicy) -> None:
    other_content = make_set("edge-a", 4, digest="sha256:" + "e" * 64)
    files = replaced(published.clusters["edge-a"].files, set=dump_set(other_content))
    with pytest.raises(InclusionProofError, match="is not in the signed publication"):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


def test_a_set_with_a_raised_serial_is_refused(published: Publication, trust: TrustPolicy) -> None:
    """Raising the serial of a genuine set (to get past anti-rollback) breaks its leaf."""
    files = replaced(published.clusters["edge-a"].files, set=dump_set(make_set("edge-a", 99)))
    with pytest.raises(InclusionProofError):
        verify_publication(files=files, cluster="edge-a", last_serial=50, trust=trust)


def test_a_proof_for_another_leaf_is_refused(published: Publication, trust: TrustPolicy) -> None:
    files = replaced(
        published.clusters["edge-a"].files, proof=published.clusters["edge-b"].files[PROOF_FILE]
    )
    with pytest.raises(InclusionProofError, match="leaf of cluster 'edge-b'"):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


@pytest.mark.parametrize(
    "change",
    [{"leafIndex": 1}, {"leafIndex": 2}, {"treeSize": 4}, {"hashes": []}, {"hashes": ["0" * 64]}],
)
def test_a_tampered_proof_is_refused(
    published: Publication, trust: TrustPolicy, change: dict[str, object]
) -> None:
    part = published.clusters["edge-a"]
    proof = {**json.loads(part.files[PROOF_FILE]), **change}
    files = replaced(part.files, proof=json.dumps(proof).encode())
    with pytest.raises(InclusionProofError):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


@pytest.mark.parametrize(
    "garbage", [b"", b"\xff\xfe", b"[]", b"{}", b"[" * 60_000, b" " * 100_000, b'{"hashes": 1}']
)
def test_a_garbage_proof_is_refused(
    published: Publication, trust: TrustPolicy, garbage: bytes
) -> None:
    files = replaced(published.clusters["edge-a"].files, proof=garbage)
    with pytest.raises(InclusionProofError, match=PROOF_FILE):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


def test_a_set_for_another_cluster_is_refused(published: Publication, trust: TrustPolicy) -> None:
    # edge-b's whole, genuinely signed branch served to edge-a...
    with pytest.raises(WrongClusterError, match="addressed to cluster 'edge-b'"):
        verify_publication(
            files=published.clusters["edge-b"].files, cluster="edge-a", last_serial=1, trust=trust
        )
    # ...or only its set, next to edge-a's proof.
    files = replaced(
        published.clusters["edge-a"].files, set=published.clusters["edge-b"].files[SET_FILE]
    )
    with pytest.raises(WrongClusterError):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


@pytest.mark.parametrize("last_serial", [4, 5, 1000])
def test_a_replayed_older_or_equal_serial_is_refused(
    published: Publication, trust: TrustPolicy, last_serial: int
) -> None:
    with pytest.raises(ReplayError, match=f"serial 4 is not newer than .* {last_serial}"):
        verify_publication(
            files=published.clusters["edge-a"].files,
            cluster="edge-a",
            last_serial=last_serial,
            trust=trust,
        )


def test_an_expired_publication_is_refused(mini_sigstore: MiniSigstore, trust: TrustPolicy) -> None:
    publication = publish(
        mini_sigstore, issued=NOW - timedelta(days=2), expires=NOW - timedelta(hours=1)
    )
    with pytest.raises(ExpiredError, match="expired at"):
        verify_publication(
            files=publication.clusters["edge-a"].files, cluster="edge-a", last_serial=1, trust=trust
        )


def test_the_clock_skew_allowance_applies_at_both_ends(
    published: Publication, trust: TrustPolicy
) -> None:
    files = published.clusters["edge-a"].files
    skew = DEFAULT_CLOCK_SKEW
    late = EXPIRES + skew
    verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust, now=late)
    with pytest.raises(ExpiredError, match="expired at"):
        verify_publication(
            files=files,
            cluster="edge-a",
            last_serial=1,
            trust=trust,
            now=late + timedelta(seconds=1),
        )
    early = ISSUED - skew
    verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust, now=early)
    with pytest.raises(ExpiredError, match="not valid before"):
        verify_publication(
            files=files,
            cluster="edge-a",
            last_serial=1,
            trust=trust,
            now=early - timedelta(seconds=1),
        )
    # A larger allowance accepts what the default refused.
    verify_publication(
        files=files,
        cluster="edge-a",
        last_serial=1,
        trust=trust,
        now=late + timedelta(minutes=1),
        clock_skew=skew + timedelta(minutes=2),
    )


def test_an_expiry_further_away_than_the_agents_maximum_is_refused(
    mini_sigstore: MiniSigstore, trust: TrustPolicy
) -> None:
    # A hub (or a stolen signing identity) that signs sets valid for years defeats the freeze
    # protection; year 9999 also once crashed the check itself (OverflowError).
    assert trust.max_validity == DEFAULT_MAX_VALIDITY == timedelta(days=30)
    for expires in (NOW + timedelta(days=31), datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)):
        publication = publish(mini_sigstore, expires=expires)
        files = publication.clusters["edge-a"].files
        with pytest.raises(ValidityTooLongError, match="more than 30 days") as caught:
            verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)
        assert caught.value.reason == "ValidityTooLong"
        # An agent configured for a longer maximum accepts it, without overflowing.
        patient = TrustPolicy(
            trusted_root=mini_sigstore.trusted_root_path,
            identity=trust.identity,
            max_validity=timedelta(days=4_000_000),
        )
        verified = verify_publication(files=files, cluster="edge-a", last_serial=1, trust=patient)
        assert verified.deployment_set.expires_at == expires
    with pytest.raises(TrustConfigError, match="positive"):
        TrustPolicy(
            trusted_root=mini_sigstore.trusted_root_path,
            identity=trust.identity,
            max_validity=timedelta(0),
        )


def test_what_the_agent_acts_on_is_what_the_digest_covers_number_types_included(
    mini_sigstore: MiniSigstore, trust: TrustPolicy
) -> None:
    # RFC 8785 writes 3.0 as 3 and -0.0 as 0: set.yaml can change a value's type without
    # changing the signed digest. The agent must act on the values as signed.
    values = {"replicas": 3, "offset": 0, "ratio": 0.5, "big": 1e300}
    sets = [
        dataclasses.replace(
            make_set(c, s),
            bundle_deployments=(
                BundleDeploymentEntry(
                    name="app",
                    spec=BundleDeploymentSpec(
                        sources=(
                            Source(
                                kind="image",
                                uri="registry.fleet.test/app",
                                digest="sha256:" + "1" * 64,
                            ),
                        ),
                        format="helm",
                        format_options=FormatOptions(values=values),
                    ),
                ),
            ),
        )
        for c, s in CLUSTERS.items()
    ]
    publication = sign_publication(
        sets=sets,
        signer=signer_for(mini_sigstore),
        issued_at=ISSUED,
        expires_at=EXPIRES,
        source_repo=REPO,
        source_commit=COMMIT,
    )
    files = publication.clusters["edge-a"].files
    text = files[SET_FILE].decode()
    assert "replicas: 3\n" in text and "offset: 0\n" in text
    tampered = text.replace("replicas: 3\n", "replicas: 3.0\n").replace(
        "offset: 0\n", "offset: -0.0\n"
    )
    # As YAML reads it, the tampered set carries floats where the signed one had integers.
    spec = yaml.safe_load(tampered)["bundleDeployments"][0]["spec"]
    assert type(spec["formatOptions"]["values"]["replicas"]) is float
    verified = verify_publication(
        files=replaced(files, set=tampered.encode()), cluster="edge-a", last_serial=1, trust=trust
    )
    options = verified.deployment_set.bundle_deployments[0].spec.format_options
    assert options is not None and options.values is not None
    acted = dict(options.values)
    assert acted == values
    assert [type(acted[k]) for k in ("replicas", "offset", "ratio", "big")] == [
        int,
        int,
        float,
        float,
    ]
    assert verified.set_digest == publication.clusters["edge-a"].set_digest


def test_a_floating_reference_is_refused(published: Publication, trust: TrustPolicy) -> None:
    document = yaml.safe_load(published.clusters["edge-a"].files[SET_FILE])
    source = document["bundleDeployments"][0]["spec"]["sources"][0]
    del source["digest"]
    source["uri"] += ":latest"
    files = replaced(published.clusters["edge-a"].files, set=yaml.safe_dump(document).encode())
    with pytest.raises(FloatingReferenceError, match=r"sources\[0\]\.digest"):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


def test_a_set_that_outlives_its_statement_is_refused(
    mini_sigstore: MiniSigstore, trust: TrustPolicy
) -> None:
    """sign_publication refuses to build one; a hand-built publication is refused on arrival."""
    long_lived = make_set("edge-a", 4, expires=EXPIRES + timedelta(days=30))
    with pytest.raises(ValidationError, match="expiresAt"):
        sign_publication(
            sets=[long_lived],
            signer=signer_for(mini_sigstore),
            issued_at=ISSUED,
            expires_at=EXPIRES,
            source_repo=REPO,
            source_commit=COMMIT,
        )
    digest = set_digest(long_lived)
    tree = MerkleTree([publication_leaf(cluster="edge-a", serial=4, set_digest=digest)])
    statement = PublicationStatement(
        merkle_root=tree.root,
        tree_size=1,
        issued_at=ISSUED,
        expires_at=EXPIRES,
        source_repo=REPO,
        source_commit=COMMIT,
        serial_min=4,
        serial_max=4,
    )
    files = {
        SET_FILE: dump_set(long_lived),
        STATEMENT_FILE: statement.to_bytes(),
        BUNDLE_FILE: mini_sigstore.sign(statement.to_bytes()).to_json().encode(),
        PROOF_FILE: ClusterProof(cluster="edge-a", leaf_index=0, tree_size=1, hashes=()).to_bytes(),
    }
    with pytest.raises(StatementMismatchError, match="expiresAt: expected at most") as caught:
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)
    assert caught.value.reason == "StatementMismatch"


@pytest.mark.parametrize(
    ("missing", "error"),
    [
        (BUNDLE_FILE, SignatureError),
        (STATEMENT_FILE, SignatureError),
        (SET_FILE, ValidationError),
        (PROOF_FILE, InclusionProofError),
    ],
)
def test_a_missing_file_fails_the_check_it_feeds(
    published: Publication, trust: TrustPolicy, missing: str, error: type[Exception]
) -> None:
    files = {k: v for k, v in published.clusters["edge-a"].files.items() if k != missing}
    with pytest.raises(error, match=missing):
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)


def test_a_garbage_bundle_is_a_signature_error(published: Publication, trust: TrustPolicy) -> None:
    files = {**published.clusters["edge-a"].files, BUNDLE_FILE: b'{"mediaType": "nonsense"}'}
    with pytest.raises(SignatureError, match="not a readable Sigstore bundle") as caught:
        verify_publication(files=files, cluster="edge-a", last_serial=1, trust=trust)
    assert "\n" not in str(caught.value)


# --- the agent's own trust configuration ----------------------------------------------------


@pytest.mark.parametrize(("issuer", "subject"), [("", ""), ("https://issuer.test", " "), ("", "x")])
def test_an_empty_identity_policy_is_a_trust_config_error(issuer: str, subject: str) -> None:
    with pytest.raises(TrustConfigError, match="identity policy"):
        IdentityPolicy(issuer=issuer, subject=subject)


def test_an_unusable_trusted_root_is_a_trust_config_error(
    tmp_path: Path, mini_sigstore: MiniSigstore
) -> None:
    identity = IdentityPolicy(issuer=mini_sigstore.issuer, subject=DEFAULT_IDENTITY)
    with pytest.raises(TrustConfigError, match="cannot read"):
        TrustPolicy(trusted_root=tmp_path / "absent.json", identity=identity)
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(TrustConfigError, match="not a trusted root"):
        TrustPolicy(trusted_root=tmp_path / "garbage.json", identity=identity)
    root = json.loads(mini_sigstore.trusted_root_path.read_text())
    for part in ("tlogs", "ctlogs", "certificateAuthorities"):
        (tmp_path / f"no-{part}.json").write_text(json.dumps({**root, part: []}))
        with pytest.raises(TrustConfigError):
            TrustPolicy(trusted_root=tmp_path / f"no-{part}.json", identity=identity)


# --- what sign_publication refuses to sign --------------------------------------------------


def test_inconsistent_inputs_are_refused_before_signing(mini_sigstore: MiniSigstore) -> None:
    signer = signer_for(mini_sigstore)
    before = log_index(mini_sigstore.sign(b"probe").to_json().encode())
    cases: list[tuple[list[BundleDeploymentSet], str]] = [
        ([], "at least one set"),
        ([make_set("edge-a", 1), make_set("edge-a", 2)], "one set per cluster"),
        (
            [
                dataclasses.replace(
                    make_set("edge-a", 1), source=SetSource(repo=REPO, commit="f" * 40)
                )
            ],
            "source",
        ),
    ]
    for sets, message in cases:
        with pytest.raises(ValidationError, match=message):
            sign_publication(
                sets=sets,
                signer=signer,
                issued_at=ISSUED,
                expires_at=EXPIRES,
                source_repo=REPO,
                source_commit=COMMIT,
            )
    # Nothing was signed for them.
    assert log_index(mini_sigstore.sign(b"probe").to_json().encode()) == before + 1


# --- the production path --------------------------------------------------------------------


def test_the_public_good_root_verifies_a_real_bundle(public_good_sample: PublicGoodSample) -> None:
    """The same code path against sigstore-python's shipped public-good root, offline."""
    trust = TrustPolicy(
        trusted_root=production_trusted_root_path(),
        identity=IdentityPolicy(
            issuer=public_good_sample.issuer, subject=public_good_sample.identity
        ),
    )
    signer = verify_statement_signature(
        statement=public_good_sample.artifact,
        bundle_json=public_good_sample.bundle_json.encode(),
        trust=trust,
        bundle_name="sample",
    )
    assert signer.identities == (public_good_sample.identity,)
    assert signer.issuer == public_good_sample.issuer
    wrong = TrustPolicy(
        trusted_root=production_trusted_root_path(),
        identity=IdentityPolicy(issuer=public_good_sample.issuer, subject="someone@else.test"),
    )
    with pytest.raises(IdentityMismatchError, match=r"someone@else\.test"):
        verify_statement_signature(
            statement=public_good_sample.artifact,
            bundle_json=public_good_sample.bundle_json.encode(),
            trust=wrong,
            bundle_name="sample",
        )


# --- signing failures -----------------------------------------------------------------------


def publish_one(signer: PublicationSigner) -> Publication:
    return sign_publication(
        sets=[make_set("edge-a", 1)],
        signer=signer,
        issued_at=ISSUED,
        expires_at=EXPIRES,
        source_repo=REPO,
        source_commit=COMMIT,
    )


def test_signing_while_sigstore_is_down_is_a_temporary_error(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    sigstore = MiniSigstore(workdir=tmp_path_factory.mktemp("sigstore-down")).start()
    try:
        signer = signer_for(sigstore)
    finally:
        sigstore.stop()
    with pytest.raises(TemporaryError, match=r"unavailable|unreachable"):
        publish_one(signer)


def test_an_expired_or_garbage_token_is_a_publish_error(mini_sigstore: MiniSigstore) -> None:
    expired = mini_sigstore.minter.mint(DEFAULT_IDENTITY, lifetime=-60)
    for token in (expired, "not-a-jwt"):
        with pytest.raises(PublishError):
            publish_one(
                PublicationSigner.from_trust_config(
                    trust_config=mini_sigstore.trust_config_path, token=token
                )
            )


def test_an_unreadable_signing_trust_config_is_a_publish_error(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="cannot read"):
        PublicationSigner.from_trust_config(trust_config=tmp_path / "absent.json", token="x")
    (tmp_path / "bad.json").write_text('{"mediaType": "nonsense"}')
    with pytest.raises(PublishError, match="unusable") as caught:
        PublicationSigner.from_trust_config(trust_config=tmp_path / "bad.json", token="x")
    assert "\n" not in str(caught.value)
