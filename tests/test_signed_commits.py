"""Signed fleet commits: ``hub publish`` publishes only a fleet commit signed as the commit
policy says, and the sets record who signed it.

Real git (``git commit -S`` with ``gpg.format=ssh``), keys made by ``ssh-keygen``, the real
git daemon and the mini Sigstore. What an operator checks: a commit signed by an allowed
signer publishes and every cluster's verified set names the signer; an unsigned commit, one
signed by a key outside the policy, one signed outside its key's validity, and one whose
fleet.yaml widens the policy are each refused with the commit, who signed and what the policy
wanted, and nothing reaches the git server; ``hub diff`` says the same and still shows the
diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api import load_set
from agent.kube import KubeClient
from agent.report.bundles import SIGNED_BY_ANNOTATION, BundleDeployments
from hub.errors import FleetRepoError
from hub.fleet.commits import CommitPolicy, load_commit_policy
from hub.publish.flow import UnsignedCommitError, prepare, publish, render
from hub.publish.git import BranchStore
from tests.realenv.binaries import kubectl
from tests.realenv.gitserver import GitDaemon
from tests.realenv.kube import Cluster
from tests.realenv.sigstore import MiniSigstore
from tests.signed_publish import publish_and_verify
from tests.test_crds import crds as crds  # the fixture: the CRDs installed
from tests.test_hub_fleet import write_fleet
from tests.test_hub_publish import server_refs

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = [{"name": "eu-1", "labels": {"region": "eu"}}, {"name": "us-1", "labels": {}}]
BUNDLE = {
    "name": "web",
    "sources": [
        {"kind": "http", "uri": "https://charts.example.invalid/web.tgz", "sha256": "ab" * 32}
    ],
    "targets": [{"clusterSelector": {}}],
}


@dataclass
class Key:
    principal: str
    private: Path
    public: str
    fingerprint: str


def make_key(tmp: Path, name: str) -> Key:
    private = tmp / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(private)],
        check=True,
        timeout=60,
    )
    public = " ".join(Path(f"{private}.pub").read_text().split()[:2])
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{private}.pub"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return Key(f"{name}@example.com", private, public, listed.split()[1])


@dataclass
class Fleet:
    dir: Path
    keys: dict[str, Key]
    policy: dict[str, Any]
    policy_file: Path

    def git(self, *args: str, key: Key | None = None) -> str:
        signing = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key.private}"] if key else []
        done = subprocess.run(
            ["git", "-c", "user.name=Fleet", "-c", "user.email=fleet@example.com", *signing, *args],
            cwd=self.dir,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.stdout.strip()

    def commit(self, message: str, key: Key | None, settings: dict[str, Any] | None = None) -> str:
        """A commit changing the fleet (a label), signed with ``key`` (None: unsigned)."""
        write_fleet(
            self.dir,
            clusters=[{**CLUSTERS[0], "labels": {"region": "eu", "change": message}}, CLUSTERS[1]],
            bundles=[BUNDLE],
            settings=settings or self.settings(),
        )
        self.git("add", "-A")
        self.git("commit", "-q", *(["-S"] if key else []), "-m", message, key=key)
        return self.git("rev-parse", "HEAD")

    def settings(self, policy: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"name": "signed", "commitSigning": policy or self.policy}

    def trusted(self) -> CommitPolicy:
        return load_commit_policy(self.policy_file)


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    keys = {n: make_key(tmp_path, n) for n in ("alice", "carol", "mallory")}
    policy = {
        "signers": [
            {"principal": keys["alice"].principal, "key": keys["alice"].public},
            # Carol's key expired long before any commit of this test.
            {
                "principal": keys["carol"].principal,
                "key": keys["carol"].public,
                "validAfter": "2019-01-01T00:00:00Z",
                "validBefore": "2020-01-01T00:00:00Z",
            },
        ]
    }
    policy_file = tmp_path / "commit-policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy))
    root = tmp_path / "fleet"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, timeout=60)
    return Fleet(root, keys, policy, policy_file)


@pytest.fixture
def sigstore(mini_sigstore: MiniSigstore) -> Iterator[MiniSigstore]:
    yield mini_sigstore


def test_signed_commit_publishes_and_the_sets_name_the_signer(
    fleet: Fleet, git_daemon: GitDaemon, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    name = f"signed-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    commit = fleet.commit("first", fleet.keys["alice"])
    prepared = prepare(fleet.dir, commit_policy=fleet.trusted())
    assert prepared.commit is not None and prepared.commit.ok
    sets = publish_and_verify(
        prepared, url=git_daemon.url_for(name), repo=repo, sigstore=mini_sigstore
    )
    for verified in sets.values():
        source = verified.deployment_set.source
        assert source.commit == commit == verified.statement.source_commit
        assert source.signed_by is not None
        assert source.signed_by.principal == "alice@example.com"
        assert source.signed_by.key == fleet.keys["alice"].fingerprint
        assert source.signed_by.policy == fleet.trusted().digest()
    # The set as a cluster admin reads it on the branch.
    text = subprocess.run(
        ["git", "--git-dir", str(repo), "show", "fleetlet/clusters/eu-1:set.yaml"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "principal: alice@example.com" in text
    # The publication's record and the branch commit say it too, for the operator.
    record = json.loads(git_show(repo, "refs/fleetlet/publication:publication.json"))
    assert record["source"]["commit"] == commit
    assert record["source"]["signedBy"] == {
        "principal": "alice@example.com",
        "key": fleet.keys["alice"].fingerprint,
    }
    message = git_show(repo, "-s", "--format=%B", "fleetlet/clusters/us-1")
    assert f"Source-Signed-By: alice@example.com {fleet.keys['alice'].fingerprint}" in message


def git_show(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(repo), "show", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


@pytest.mark.parametrize(
    ("who", "reason"),
    [
        (None, "unsigned"),
        ("mallory", "signed by key {fp}, which is not in the policy"),
        ("carol", "signed by carol@example.com ({fp}) at "),
    ],
)
def test_publish_refuses_a_commit_not_signed_as_the_policy_wants(
    fleet: Fleet, git_daemon: GitDaemon, tmp_path: Path, who: str | None, reason: str
) -> None:
    name = f"refused-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    key = fleet.keys[who] if who else None
    commit = fleet.commit("change", key)
    with (
        pytest.raises(UnsignedCommitError) as refused,
        BranchStore(url=git_daemon.url_for(name)) as store,
    ):
        publish(prepare(fleet.dir, commit_policy=fleet.trusted()), store, signer=None)
    message = str(refused.value)
    assert f"fleet commit {commit} is not signed as the commit policy requires" in message
    assert reason.format(fp=key.fingerprint if key else "") in message
    if who == "carol":
        assert "outside the key's validity" in message
        assert "until 2020-01-01T00:00:00Z" in message
    # What the policy wanted: its signers, by principal and key.
    assert f"alice@example.com ({fleet.keys['alice'].fingerprint})" in message
    assert "nothing was pushed" in message
    assert server_refs(repo, every=True) == {}


def test_the_commit_cannot_widen_the_policy_that_judges_it(
    fleet: Fleet, git_daemon: GitDaemon, tmp_path: Path
) -> None:
    """An attacker who can push adds their own key to fleet.yaml and signs with it: the hub's
    trusted copy decides, and the two disagree."""
    mallory = fleet.keys["mallory"]
    widened = {
        "signers": [
            *fleet.policy["signers"],
            {"principal": mallory.principal, "key": mallory.public},
        ]
    }
    commit = fleet.commit("widen", mallory, settings=fleet.settings(widened))
    prepared = prepare(fleet.dir, commit_policy=fleet.trusted())
    assert prepared.commit is not None and not prepared.commit.ok
    assert "fleet.yaml has policy sha256:" in prepared.commit.reason
    assert "the hub's trusted policy is" in prepared.commit.reason
    name = f"widen-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    with (
        pytest.raises(UnsignedCommitError, match=commit),
        BranchStore(url=git_daemon.url_for(name)) as store,
    ):
        publish(prepared, store, signer=None)
    assert server_refs(repo, every=True) == {}
    # Without a trusted copy, the fleet's own policy is not enough to publish.
    untrusted = prepare(fleet.dir)
    assert untrusted.commit is not None and not untrusted.commit.ok
    assert "the hub has no trusted copy" in untrusted.commit.reason


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_hub_diff_reports_and_hub_publish_refuses_on_the_command_line(
    fleet: Fleet, git_daemon: GitDaemon, tmp_path: Path
) -> None:
    name = f"cli-{tmp_path.name}.git"
    repo = git_daemon.create_bare(name)
    url = git_daemon.url_for(name)
    mallory = fleet.keys["mallory"]
    commit = fleet.commit("by-mallory", mallory)
    policy = ["--commit-policy", str(fleet.policy_file)]
    shown = cli("diff", str(fleet.dir), "--repo", url, "-q", *policy)
    assert shown.returncode == 0, shown.stderr
    assert f"fleet commit {commit} is not signed" in shown.stdout
    assert f"key {mallory.fingerprint}, which is not in the policy" in shown.stdout
    assert "hub publish would refuse it" in shown.stdout
    assert "eu-1: added" in shown.stdout
    as_json = cli("diff", str(fleet.dir), "--repo", url, "-q", "-o", "json", *policy)
    verdict = json.loads(as_json.stdout)["commit"]
    assert verdict["commit"] == commit
    assert verdict["signed"] is False
    assert verdict["signedBy"] == f"key {mallory.fingerprint}"
    refused = cli("publish", str(fleet.dir), "--repo", url, "--no-sign", "-q", *policy)
    assert refused.returncode != 0
    assert f"fleet commit {commit} is not signed as the commit policy requires" in refused.stderr
    assert server_refs(repo, every=True) == {}


def test_policy_mistakes_name_the_field(fleet: Fleet) -> None:
    bad = {"signers": [{"principal": "alice smith", "key": "ssh-ed25519 not-base64"}]}
    write_fleet(fleet.dir, clusters=CLUSTERS, bundles=[BUNDLE], settings=fleet.settings(bad))
    with pytest.raises(FleetRepoError) as found:
        prepare(fleet.dir)
    text = str(found.value)
    assert "fleet.yaml: commitSigning.signers[0].principal" in text
    assert "fleet.yaml: commitSigning.signers[0].key" in text


def test_the_cluster_shows_who_signed_on_each_bundledeployment(
    fleet: Fleet, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """What ``kubectl get bundledeployments -o yaml`` shows a cluster admin."""
    commit = fleet.commit("shown", fleet.keys["alice"])
    prepared = prepare(fleet.dir, commit_policy=fleet.trusted())
    (written,) = [p for p in render(prepared, tmp_path / "sets") if p.stem == "eu-1"]
    deployment_set = load_set(written.read_bytes(), origin=str(written))
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    bundles = BundleDeployments(kube=kube, owner=namespace)
    bundles.publish(deployment_set)
    try:
        shown = subprocess.run(
            [
                kubectl(),
                "--kubeconfig",
                str(crds.kubeconfig),
                "get",
                "bundledeployment",
                "web",
                "-o",
                "yaml",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        annotations = yaml.safe_load(shown)["metadata"]["annotations"]
        assert annotations[SIGNED_BY_ANNOTATION] == (
            f"alice@example.com {fleet.keys['alice'].fingerprint} commit {commit} "
            f"policy {fleet.trusted().digest()}"
        )
    finally:
        bundles.delete("web")


def test_an_edited_fleet_directory_is_not_a_signed_commit(fleet: Fleet) -> None:
    commit = fleet.commit("base", fleet.keys["alice"])
    (fleet.dir / "clusters" / "inventory.yaml").write_text(yaml.safe_dump({"clusters": CLUSTERS}))
    verdict = prepare(fleet.dir, commit_policy=fleet.trusted()).commit
    assert verdict is not None and not verdict.ok
    assert verdict.commit != commit  # a digest of the files, not the signed commit
    assert "the fleet directory has uncommitted changes" in verdict.refusal()


def test_the_hubs_policy_file_is_checked_like_fleet_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(yaml.safe_dump({"signers": [{"principal": "ops@example.com"}], "extra": 1}))
    with pytest.raises(FleetRepoError) as found:
        load_commit_policy(bad)
    text = str(found.value)
    assert str(bad) in text
    assert "signers[0].key" in text
    assert "extra" in text
