"""Fleet commits signed with gitsign (Sigstore keyless): ``hub publish`` verifies them itself
against the commit policy's identities and trusted root, and the sets record the signer.

The real gitsign (pinned, built from the Go module proxy) signs through the mini Sigstore
(Fulcio, Rekor v1, the token minter) as ``git commit -S`` runs it with ``gpg.format=x509``;
the real git daemon receives the publication. What an operator checks: a gitsign-signed
commit publishes and every cluster's verified set names the signer, its issuer and the
certificate; an unsigned commit, one signed by another identity, one signed with an SSH key
when the policy names only gitsign identities, a commit edited after signing, a signature
whose transparency log entry was altered, one without its log entry (gitsign's online mode)
and one whose certificate comes from another Sigstore are each refused, naming the commit,
what was wrong and what the policy wanted, and nothing reaches the git server.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pygit2
import pytest
import yaml

from hub.errors import FleetRepoError
from hub.fleet.commits import CommitPolicy, load_commit_policy
from hub.fleet.gitsign import _fields
from hub.publish.flow import UnsignedCommitError, prepare, publish
from hub.publish.git import BranchStore
from tests.realenv.gitserver import GitDaemon
from tests.realenv.gitsign import Gitsign
from tests.realenv.sigstore import MiniSigstore
from tests.signed_publish import publish_and_verify
from tests.test_hub_fleet import write_fleet
from tests.test_hub_publish import server_refs
from tests.test_signed_commits import BUNDLE, CLUSTERS, cli, git_show, make_key

ALICE = "alice@example.com"


@dataclass
class Fleet:
    dir: Path
    policy: dict[str, Any]
    policy_file: Path
    sigstore: MiniSigstore
    gitsign: Gitsign

    def git(self, *args: str, stdin: bytes | None = None) -> str:
        done = subprocess.run(
            ["git", "-c", "user.name=Fleet", "-c", "user.email=fleet@example.com", *args],
            cwd=self.dir,
            input=stdin,
            check=True,
            capture_output=True,
            timeout=60,
        )
        return done.stdout.decode().strip()

    def stage(self, message: str) -> None:
        write_fleet(
            self.dir,
            clusters=[{**CLUSTERS[0], "labels": {"region": "eu", "change": message}}, CLUSTERS[1]],
            bundles=[BUNDLE],
            settings={"name": "gitsigned", "commitSigning": self.policy},
        )
        self.git("add", "-A")

    def commit(
        self,
        message: str,
        identity: str | None = ALICE,
        *,
        sigstore: MiniSigstore | None = None,
        rekor_mode: str = "offline",
    ) -> str:
        """A commit changing the fleet, signed by gitsign as ``identity`` (None: unsigned)."""
        self.stage(message)
        if identity is None:
            self.git("commit", "-q", "-m", message)
            return self.git("rev-parse", "HEAD")
        return self.gitsign.commit(
            self.dir, message, sigstore or self.sigstore, identity, rekor_mode=rekor_mode
        )

    def rewrite_head(self, change: Callable[[bytes, bytes], tuple[bytes, bytes]]) -> str:
        """Replace HEAD by a commit whose (payload, signature) went through ``change``, as
        someone with push access could: the work tree stays a clean checkout."""
        head = pygit2.Repository(str(self.dir)).head.peel(pygit2.Commit)
        signature, payload = head.gpg_signature
        payload, signature = change(payload, signature)
        headers, body = payload.split(b"\n\n", 1)
        folded = signature.rstrip(b"\n").replace(b"\n", b"\n ")
        raw = headers + b"\ngpgsig " + folded + b"\n\n" + body
        commit = self.git("hash-object", "-w", "-t", "commit", "--stdin", stdin=raw)
        self.git("update-ref", "HEAD", commit)
        return commit

    def trusted(self) -> CommitPolicy:
        return load_commit_policy(self.policy_file)


def make_fleet(
    tmp_path: Path, sigstore: MiniSigstore, binary: Path, identities: list[dict[str, str]]
) -> Fleet:
    """A fleet repository and the hub's trusted copy of its policy, each beside its own copy
    of the mini Sigstore's trusted root."""
    policy = {"identities": identities, "trustedRoot": "trust/trusted_root.json"}
    root = tmp_path / "fleet"
    hub = tmp_path / "hub"
    for home in (root, hub):
        (home / "trust").mkdir(parents=True)
        shutil.copyfile(sigstore.trusted_root_path, home / "trust" / "trusted_root.json")
    (hub / "commit-policy.yaml").write_text(yaml.safe_dump(policy))
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, timeout=60)
    return Fleet(root, policy, hub / "commit-policy.yaml", sigstore, Gitsign(binary, tmp_path))


@pytest.fixture
def fleet(tmp_path: Path, mini_sigstore: MiniSigstore, gitsign_binary: Path) -> Fleet:
    identities = [{"issuer": mini_sigstore.issuer, "subject": ALICE}]
    return make_fleet(tmp_path, mini_sigstore, gitsign_binary, identities)


def test_a_gitsign_signed_commit_publishes_and_the_sets_name_the_signer(
    fleet: Fleet, git_daemon: GitDaemon, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    name = f"gitsign-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    commit = fleet.commit("first")
    verdict = prepare(fleet.dir, commit_policy=fleet.trusted()).commit
    assert verdict is not None and verdict.ok, verdict
    assert verdict.format == "gitsign"
    assert verdict.signer == ALICE and verdict.issuer == mini_sigstore.issuer
    sets = publish_and_verify(
        prepare(fleet.dir, commit_policy=fleet.trusted()),
        url=git_daemon.url_for(name),
        repo=repo,
        sigstore=mini_sigstore,
    )
    for verified in sets.values():
        source = verified.deployment_set.source
        assert source.commit == commit
        signed = source.signed_by
        assert signed is not None
        assert (signed.format, signed.principal, signed.issuer) == (
            "gitsign",
            ALICE,
            mini_sigstore.issuer,
        )
        assert signed.key == verdict.key and signed.key.startswith("SHA256:")
        assert signed.policy == fleet.trusted().digest()
    text = git_show(repo, "fleetlet/clusters/eu-1:set.yaml")
    assert "format: gitsign" in text and f"principal: {ALICE}" in text
    record = json.loads(git_show(repo, "refs/fleetlet/publication:publication.json"))
    assert record["source"]["signedBy"] == {
        "principal": ALICE,
        "key": verdict.key,
        "format": "gitsign",
        "issuer": mini_sigstore.issuer,
    }
    message = git_show(repo, "-s", "--format=%B", "fleetlet/clusters/us-1")
    assert f"Source-Signed-By: {ALICE} {verdict.key} gitsign {mini_sigstore.issuer}" in message
    # The hub verified it itself: git's own verification has no gitsign to call here.
    checked = subprocess.run(
        ["git", "-c", "gpg.x509.program=false", "verify-commit", commit],
        cwd=fleet.dir,
        capture_output=True,
        timeout=60,
    )
    assert checked.returncode != 0


def test_identities_match_by_regular_expression_and_the_command_line_reports_the_signer(
    tmp_path: Path, mini_sigstore: MiniSigstore, gitsign_binary: Path, git_daemon: GitDaemon
) -> None:
    identities = [
        {"issuerRegExp": r"^https://issuer\.test$", "subjectRegExp": r"^.+@example\.com$"}
    ]
    fleet = make_fleet(tmp_path, mini_sigstore, gitsign_binary, identities)
    commit = fleet.commit("by-carol", "carol@example.com")
    name = f"gitsign-cli-{tmp_path.name}.git"
    git_daemon.create_bare(name)
    shown = cli(
        "diff",
        str(fleet.dir),
        "--repo",
        git_daemon.url_for(name),
        "-q",
        "-o",
        "json",
        "--commit-policy",
        str(fleet.policy_file),
    )
    assert shown.returncode == 0, shown.stderr
    verdict = json.loads(shown.stdout)["commit"]
    assert verdict["commit"] == commit and verdict["signed"] is True
    assert verdict["signedBy"].startswith(f"carol@example.com from {mini_sigstore.issuer} (gitsign")


def _flip_signed_entry_timestamp(payload: bytes, signature: bytes) -> tuple[bytes, bytes]:
    """The signature with one bit of its log entry's signed entry timestamp flipped."""
    from asn1crypto import cms, core

    lines = signature.strip().splitlines()
    der = base64.b64decode(b"".join(lines[1:-1]))
    signer_info = cms.ContentInfo.load(der)["content"]["signer_infos"][0]
    (attribute,) = [
        a for a in signer_info["unsigned_attrs"] if a["type"].dotted == "1.3.6.1.4.1.57264.3.1"
    ]
    entry = core.OctetString.load(attribute["values"][0].dump()).native
    (promise,) = [v for n, v in _fields(entry) if n == 5]
    (stamp,) = [v for n, v in _fields(bytes(promise)) if n == 1]
    assert isinstance(stamp, bytes) and der.count(stamp) == 1
    tampered = der.replace(stamp, stamp[:-1] + bytes([stamp[-1] ^ 1]))
    pem = base64.encodebytes(tampered)
    return payload, lines[0] + b"\n" + pem + lines[-1] + b"\n"


@pytest.mark.parametrize(
    "case",
    [
        "unsigned",
        "another identity",
        "ssh key",
        "edited",
        "log entry",
        "online",
        "foreign root",
        "garbage",
    ],
)
def test_publish_refuses_a_commit_not_signed_as_the_gitsign_policy_wants(
    fleet: Fleet,
    git_daemon: GitDaemon,
    other_sigstore: MiniSigstore,
    tmp_path: Path,
    case: str,
) -> None:
    if case == "unsigned":
        commit, reason = fleet.commit("change", None), "unsigned"
    elif case == "another identity":
        commit = fleet.commit("change", "mallory@example.com")
        reason = (
            f"signed by mallory@example.com ({fleet.sigstore.issuer}), which is not an "
            "identity of the policy"
        )
    elif case == "ssh key":
        key = make_key(tmp_path, "alice")
        fleet.stage("change")
        ssh = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key.private}"]
        fleet.git(*ssh, "commit", "-q", "-S", "-m", "change")
        commit = fleet.git("rev-parse", "HEAD")
        reason = "signed with an SSH key, but the policy names only gitsign identities"
    elif case == "edited":
        fleet.commit("change")
        commit = fleet.rewrite_head(
            lambda payload, sig: (payload.replace(b"\nchange\n", b"\nsomething else\n"), sig)
        )
        reason = "the signature is over other content than this commit"
    elif case == "log entry":
        fleet.commit("change")
        commit = fleet.rewrite_head(_flip_signed_entry_timestamp)
        reason = "its transparency log entry does not verify (invalid log entry: SET"
    elif case == "garbage":
        fleet.commit("change")
        junk = b"-----BEGIN SIGNED MESSAGE-----\nMAMCAQA=\n-----END SIGNED MESSAGE-----\n"
        commit = fleet.rewrite_head(lambda payload, sig: (payload, junk))
        reason = "the signature is not readable CMS"
    elif case == "online":
        commit = fleet.commit("change", rekor_mode="online")
        reason = "the signature carries no transparency log entry"
    else:
        # Another Sigstore, same issuer URL and identity: only the trusted root tells them apart.
        commit = fleet.commit("change", sigstore=other_sigstore)
        reason = "the signing certificate is not trusted by the policy's trusted root"
    name = f"refused-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    with (
        pytest.raises(UnsignedCommitError) as refused,
        BranchStore(url=git_daemon.url_for(name)) as store,
    ):
        publish(prepare(fleet.dir, commit_policy=fleet.trusted()), store, signer=None)
    message = str(refused.value)
    assert f"fleet commit {commit} is not signed as the commit policy requires" in message
    assert reason in message
    assert f"a gitsign (keyless) signature by one of: {ALICE} from {fleet.sigstore.issuer}" in (
        message
    )
    assert "nothing was pushed" in message
    assert server_refs(repo, every=True) == {}


def test_rekor_v2_signatures_are_verified_with_their_timestamp(
    tmp_path: Path, mini_sigstore_v2: MiniSigstore, gitsign_binary: Path
) -> None:
    """gitsign's experimental rekorVersion=2: the log entry has no time of its own, the
    RFC 3161 timestamp in the signature gives it; without one the commit is refused."""
    fleet = make_fleet(
        tmp_path,
        mini_sigstore_v2,
        gitsign_binary,
        [{"issuer": mini_sigstore_v2.issuer, "subject": ALICE}],
    )
    fleet.commit("stamped")
    verdict = prepare(fleet.dir, commit_policy=fleet.trusted()).commit
    assert verdict is not None and verdict.ok, verdict
    assert verdict.format == "gitsign" and verdict.signer == ALICE
    fleet.stage("unstamped")
    commit = fleet.gitsign.commit(fleet.dir, "unstamped", mini_sigstore_v2, ALICE, timestamp=False)
    verdict = prepare(fleet.dir, commit_policy=fleet.trusted()).commit
    assert verdict is not None and not verdict.ok
    assert verdict.commit == commit
    assert "the signature has no verified time" in verdict.reason


def test_a_policy_with_both_kinds_accepts_either(
    tmp_path: Path, mini_sigstore: MiniSigstore, gitsign_binary: Path
) -> None:
    key = make_key(tmp_path, "bob")
    fleet = make_fleet(
        tmp_path,
        mini_sigstore,
        gitsign_binary,
        [{"issuer": mini_sigstore.issuer, "subject": ALICE}],
    )
    fleet.policy["signers"] = [{"principal": key.principal, "key": key.public}]
    fleet.policy_file.write_text(yaml.safe_dump(fleet.policy))
    fleet.commit("keyless")
    verdict = prepare(fleet.dir, commit_policy=fleet.trusted()).commit
    assert verdict is not None and verdict.ok and verdict.format == "gitsign"
    fleet.stage("ssh")
    ssh = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key.private}"]
    fleet.git(*ssh, "commit", "-q", "-S", "-m", "ssh")
    verdict = prepare(fleet.dir, commit_policy=fleet.trusted()).commit
    assert verdict is not None and verdict.ok and verdict.format == "ssh"
    assert verdict.signer == key.principal


def test_a_gitsign_commit_is_refused_when_the_policy_names_only_ssh_signers(
    tmp_path: Path, mini_sigstore: MiniSigstore, gitsign_binary: Path
) -> None:
    key = make_key(tmp_path, "bob")
    fleet = make_fleet(
        tmp_path,
        mini_sigstore,
        gitsign_binary,
        [{"issuer": mini_sigstore.issuer, "subject": ALICE}],
    )
    fleet.policy = {"signers": [{"principal": key.principal, "key": key.public}]}
    fleet.policy_file.write_text(yaml.safe_dump(fleet.policy))
    commit = fleet.commit("keyless")
    verdict = prepare(fleet.dir, commit_policy=fleet.trusted()).commit
    assert verdict is not None and not verdict.ok
    assert verdict.refusal().startswith(
        f"fleet commit {commit} is not signed as the commit policy requires: signed with "
        "gitsign (keyless), but the policy names only SSH signers; the policy wants an SSH "
        f"signature by one of: {key.principal} ({key.fingerprint})"
    )


def test_gitsign_policy_mistakes_name_the_field(
    tmp_path: Path, mini_sigstore: MiniSigstore, gitsign_binary: Path
) -> None:
    fleet = make_fleet(
        tmp_path,
        mini_sigstore,
        gitsign_binary,
        [{"issuer": mini_sigstore.issuer, "subject": ALICE}],
    )
    fleet.policy = {
        "identities": [{"issuer": mini_sigstore.issuer, "subjectRegExp": "(unclosed"}],
        "trustedRoot": "../outside.json",
    }
    fleet.stage("bad")
    with pytest.raises(FleetRepoError) as found:
        prepare(fleet.dir)
    text = str(found.value)
    assert "fleet.yaml: commitSigning.identities[0].subjectRegExp" in text
    assert "fleet.yaml: commitSigning.trustedRoot" in text
    bad = tmp_path / "hub" / "root-alone.yaml"
    bad.write_text(yaml.safe_dump({"trustedRoot": "trust/trusted_root.json"}))
    with pytest.raises(FleetRepoError) as found:
        load_commit_policy(bad)
    text = str(found.value)
    assert "trustedRoot" in text and "identities beside it" in text
    assert "signers" in text
