"""``hub publish`` / ``hub diff`` end to end: real registry, git daemon, http server, mini Sigstore.

What a fleet operator checks: each cluster branch holds a set that verifies for that cluster
only; a moved tag republishes exactly the clusters that use it with serial + 1; a rerun pushes
nothing; a publication near expiry is refreshed with the same content; every kind of failure
stops the run before anything reaches the git server; a rejected push is reported and a rerun
finishes the job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api import load_set
from agent.errors import WrongClusterError
from agent.verify import BRANCH_FILES, IdentityPolicy, TrustPolicy, verify_publication
from hub.errors import (
    FleetRepoError,
    PushRejectedError,
    ResolveError,
)
from hub.publish.flow import diff, prepare, publish
from hub.publish.git import BranchStore
from hub.publish.sign import PublicationSigner
from tests.realenv.gitserver import GitDaemon
from tests.realenv.registry import Registry
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_hub_fleet import write_fleet
from tests.test_hub_resolve import HttpFiles, make_git_source, push_image

CLUSTERS = [
    {"name": "eu-edge-1", "labels": {"region": "eu", "tier": "edge"}},
    {"name": "eu-core", "labels": {"region": "eu", "tier": "core"}},
    {"name": "us-edge-1", "labels": {"region": "us", "tier": "edge"}},
]


@pytest.fixture(scope="module")
def http_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpFiles]:
    server = HttpFiles(tmp_path_factory.mktemp("hub-http"))
    yield server
    server.close()


@dataclass
class World:
    """The content servers and a fleet that uses all of them."""

    registry: Registry
    git: GitDaemon
    http: HttpFiles
    sigstore: MiniSigstore
    tmp: Path
    git_url: str

    def fleet(self, name: str, *, reports_tag: str = "v1", **overrides: Any) -> Path:
        bundles: list[dict[str, Any]] = [
            {
                "name": "platform-a",
                "sources": [
                    {"kind": "image", "uri": f"{self.registry.host}/hub/e2e-platform", "tag": "v1"}
                ],
                "group": "platform",
                "targets": [{"clusterSelector": {}}],
            },
            {
                "name": "platform-b",
                "sources": [
                    {"kind": "git", "uri": self.git_url, "branch": "main", "directory": "deploy"}
                ],
                "group": "platform",
                "targets": [{"clusterSelector": {}}],
            },
            {
                "name": "web",
                "sources": [{"kind": "http", "uri": self.http.url("web-1.0.tgz")}],
                "format": "helm",
                "formatOptions": {"values": {"replicas": 2}},
                "dependsOn": ["platform"],
                "targets": [{"clusterSelector": {"matchLabels": {"tier": "edge"}}}],
                "overrides": [{"clusters": ["eu-edge-1"], "values": {"replicas": 1}}],
            },
            {
                "name": "reports",
                "sources": [
                    {
                        "kind": "image",
                        "uri": f"{self.registry.host}/hub/e2e-reports",
                        "tag": reports_tag,
                    }
                ],
                "targets": [
                    {
                        "clusterSelector": {
                            "matchExpressions": [
                                {"key": "region", "operator": "In", "values": ["eu"]}
                            ]
                        }
                    }
                ],
            },
        ]
        settings = {
            "name": "e2e",
            "repo": "https://fleet.example.invalid/e2e.git",
            "publication": {"expiresAfter": "7d", "refreshBefore": "1d"},
            "signing": {"identity": DEFAULT_IDENTITY, "issuer": self.sigstore.issuer},
            **overrides,
        }
        return write_fleet(self.tmp / name, clusters=CLUSTERS, bundles=bundles, settings=settings)

    def signer(self) -> PublicationSigner:
        return PublicationSigner.from_trust_config(
            trust_config=self.sigstore.trust_config_path, token=self.sigstore.mint_token()
        )

    def trust(self) -> TrustPolicy:
        return TrustPolicy(
            trusted_root=self.sigstore.trusted_root_path,
            identity=IdentityPolicy(issuer=self.sigstore.issuer, subject=DEFAULT_IDENTITY),
        )


@pytest.fixture(scope="module")
def world(
    registry: Registry,
    git_daemon: GitDaemon,
    http_files: HttpFiles,
    mini_sigstore: MiniSigstore,
    tmp_path_factory: pytest.TempPathFactory,
) -> World:
    tmp = tmp_path_factory.mktemp("hub-publish")
    push_image(registry, "hub/e2e-platform", "v1", tmp, "platform")
    push_image(registry, "hub/e2e-reports", "v1", tmp, "reports-1")
    # Unique per instance: other modules import this fixture, and the git daemon is shared.
    source_repo = f"hub-e2e-src-{tmp.name}.git"
    make_git_source(git_daemon, source_repo, tmp / "src")
    (http_files.root / "web-1.0.tgz").write_bytes(b"web chart archive bytes")
    return World(
        registry=registry,
        git=git_daemon,
        http=http_files,
        sigstore=mini_sigstore,
        tmp=tmp,
        git_url=git_daemon.url_for(source_repo),
    )


def server_refs(repo: Path, *, every: bool = False) -> dict[str, str]:
    """Branch -> commit (``every``: every ref, the publication head and staging refs too),
    read on the server's own bare repository with git."""
    out = subprocess.run(
        ["git", "--git-dir", str(repo), "for-each-ref", "--format=%(refname) %(objectname)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    refs = {ref: oid for ref, oid in (line.split(" ", 1) for line in out.splitlines())}
    return refs if every else {r: o for r, o in refs.items() if r.startswith("refs/heads/")}


def branch_files(repo: Path, cluster: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for name in BRANCH_FILES:
        done = subprocess.run(
            ["git", "--git-dir", str(repo), "show", f"fleetlet/clusters/{cluster}:{name}"],
            capture_output=True,
            timeout=60,
        )
        if done.returncode == 0:
            files[name] = done.stdout
    return files


def log_size(sigstore: MiniSigstore) -> int:
    return len(sigstore.log._leaves)


def test_publish_moves_tags_reruns_refreshes(world: World) -> None:
    repo = world.git.create_bare("hub-e2e-fleet.git")
    url = world.git.url_for("hub-e2e-fleet.git")
    fleet = world.fleet("fleet-1")

    def run(path: Path, now: datetime | None = None) -> Any:
        with BranchStore(url=url) as store:
            return publish(prepare(path), store, signer=world.signer(), now=now)

    # 1. First publish: three clusters, one signing event, every branch verifies for its
    #    cluster and only for it.
    events = log_size(world.sigstore)
    report = run(fleet)
    assert log_size(world.sigstore) == events + 1
    assert sorted(report.pushed) == ["eu-core", "eu-edge-1", "us-edge-1"]
    refs = server_refs(repo)
    assert sorted(refs) == [
        "refs/heads/fleetlet/clusters/eu-core",
        "refs/heads/fleetlet/clusters/eu-edge-1",
        "refs/heads/fleetlet/clusters/us-edge-1",
    ]
    # Beside the branches only the publication head: nothing staged is left behind.
    assert sorted(set(server_refs(repo, every=True)) - set(refs)) == ["refs/fleetlet/publication"]
    received = {}
    for cluster in ("eu-core", "eu-edge-1", "us-edge-1"):
        files = branch_files(repo, cluster)
        verified = verify_publication(
            files=files, cluster=cluster, last_serial=None, trust=world.trust()
        )
        assert verified.deployment_set.serial == 1
        received[cluster] = {e.name: e for e in verified.deployment_set.bundle_deployments}
        other = "eu-core" if cluster != "eu-core" else "us-edge-1"
        with pytest.raises(WrongClusterError):
            verify_publication(files=files, cluster=other, last_serial=None, trust=world.trust())
    # The objects written by the hub's own pack writer are sound git objects.
    fsck = subprocess.run(
        ["git", "--git-dir", str(repo), "fsck", "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fsck.returncode == 0, fsck.stderr
    assert sorted(received["eu-core"]) == ["platform-a", "platform-b", "reports"]
    assert sorted(received["eu-edge-1"]) == ["platform-a", "platform-b", "reports", "web"]
    assert sorted(received["us-edge-1"]) == ["platform-a", "platform-b", "web"]
    # Lockstep group, label selection and the per-cluster override, as agents receive them.
    assert received["eu-core"]["platform-b"].spec.group == "platform"
    assert received["eu-edge-1"]["web"].spec.format_options.values == {"replicas": 1}
    assert received["us-edge-1"]["web"].spec.format_options.values == {"replicas": 2}
    assert received["eu-edge-1"]["reports"].spec.sources[0].digest.startswith("sha256:")

    # 2. The reports tag moves to new content: exactly the clusters receiving reports are
    #    republished, with serial + 1; us-edge-1 keeps its commit.
    push_image(world.registry, "hub/e2e-reports", "v1", world.tmp, "reports-2")
    before = server_refs(repo)
    report = run(fleet)
    assert sorted(report.pushed) == ["eu-core", "eu-edge-1"]
    after = server_refs(repo)
    assert (
        after["refs/heads/fleetlet/clusters/us-edge-1"]
        == (before["refs/heads/fleetlet/clusters/us-edge-1"])
    )
    for cluster in ("eu-core", "eu-edge-1"):
        verified = verify_publication(
            files=branch_files(repo, cluster), cluster=cluster, last_serial=1, trust=world.trust()
        )
        assert verified.deployment_set.serial == 2

    # 3. Nothing changed: nothing signed, nothing pushed (not even a connection to push).
    events = log_size(world.sigstore)
    mark = world.git.request_count()
    report = run(fleet)
    assert report.pushed == ()
    services = [r.method for r in world.git.requests(since=mark) if "fleet" in r.path]
    assert "upload-pack" in services and "receive-pack" not in services
    assert log_size(world.sigstore) == events
    assert server_refs(repo) == after
    assert report.count("unchanged") == 3

    # 4. Six and a half days later the publications are within the 1 d refresh window: each
    #    cluster gets serial + 1 and identical content.
    old_sets = {c: load_set(branch_files(repo, c)["set.yaml"], origin=c) for c in received}
    later = datetime.now(UTC) + timedelta(days=6, hours=12)
    report = run(fleet, now=later)
    assert sorted(report.pushed) == ["eu-core", "eu-edge-1", "us-edge-1"]
    assert report.count("refreshed") == 3
    for cluster, old in old_sets.items():
        verified = verify_publication(
            files=branch_files(repo, cluster),
            cluster=cluster,
            last_serial=old.serial,
            trust=world.trust(),
            now=later,
        )
        assert verified.deployment_set.serial == old.serial + 1
        assert verified.deployment_set.bundle_deployments == old.bundle_deployments
        assert verified.deployment_set.groups == old.groups
        assert verified.deployment_set.expires_at > old.expires_at


@pytest.mark.parametrize("broken", ["tag", "branch", "http", "fleet"])
def test_failures_stop_the_publish_before_the_git_server(world: World, broken: str) -> None:
    repo = world.git.create_bare(f"hub-e2e-fail-{broken}.git")
    url = world.git.url_for(f"hub-e2e-fail-{broken}.git")
    fleet = world.fleet(f"fleet-fail-{broken}")
    with BranchStore(url=url) as store:
        publish(prepare(fleet), store, signer=None)
    before = server_refs(repo)
    bundle_file = fleet / "bundles"
    if broken == "tag":
        fleet = world.fleet(f"fleet-fail-{broken}", reports_tag="no-such-tag")
        expected: type[Exception] = ResolveError
        message = f"bundle 'reports': cannot resolve image {world.registry.host}/hub/e2e-reports"
    elif broken == "branch":
        doc = yaml.safe_load((bundle_file / "platform-b.yaml").read_text())
        doc["sources"][0]["branch"] = "no-such-branch"
        (bundle_file / "platform-b.yaml").write_text(yaml.safe_dump(doc))
        expected, message = ResolveError, "no branch 'no-such-branch'"
    elif broken == "http":
        doc = yaml.safe_load((bundle_file / "web.yaml").read_text())
        doc["sources"][0]["uri"] = world.http.url("missing.tgz")
        (bundle_file / "web.yaml").write_text(yaml.safe_dump(doc))
        expected, message = ResolveError, "bundle 'web': cannot resolve http"
    else:
        doc = yaml.safe_load((bundle_file / "web.yaml").read_text())
        doc["approval"] = "sometimes"
        doc["formatOptions"]["targetNamespace"] = "Not_A_Namespace"
        (bundle_file / "web.yaml").write_text(yaml.safe_dump(doc))
        expected, message = FleetRepoError, "bundles/web.yaml: approval"
    with pytest.raises(expected) as caught, BranchStore(url=url) as store:
        publish(prepare(fleet), store, signer=world.signer())
    assert message in str(caught.value)
    if broken == "fleet":
        # Both problems of the file, in one run.
        assert "bundles/web.yaml: formatOptions.targetNamespace" in str(caught.value)
    assert server_refs(repo) == before


def test_rejected_push_is_reported_and_a_rerun_finishes(world: World) -> None:
    hook = (
        "#!/bin/sh\n"
        'if [ "$1" = "refs/heads/fleetlet/clusters/eu-core" ] && [ -e "$GIT_DIR/deny" ]; then\n'
        '  echo "eu-core is frozen" >&2; exit 1\nfi\nexit 0\n'
    )
    repo = world.git.create_bare("hub-e2e-reject.git", hooks={"update": hook})
    (repo / "deny").write_text("")
    url = world.git.url_for("hub-e2e-reject.git")
    fleet = world.fleet("fleet-reject")
    with pytest.raises(PushRejectedError) as caught, BranchStore(url=url) as store:
        publish(prepare(fleet), store, signer=None)
    assert list(caught.value.rejected) == ["refs/heads/fleetlet/clusters/eu-core"]
    assert "rerun hub publish" in str(caught.value)
    # The branches and the head move in one atomic push: a refused branch moves nothing, so
    # no cluster ever holds a set of a publication that did not land whole.
    assert server_refs(repo, every=True) == {}
    (repo / "deny").unlink()
    with BranchStore(url=url) as store:
        report = publish(prepare(fleet), store, signer=None)
    assert sorted(report.pushed) == ["eu-core", "eu-edge-1", "us-edge-1"]
    assert len(server_refs(repo)) == 3


def test_diff_shows_bundles_and_fields(world: World) -> None:
    world.git.create_bare("hub-e2e-diff.git")
    url = world.git.url_for("hub-e2e-diff.git")
    fleet = world.fleet("fleet-diff")
    with BranchStore(url=url) as store:
        publish(prepare(fleet), store, signer=None)
    doc = yaml.safe_load((fleet / "bundles" / "web.yaml").read_text())
    doc["formatOptions"]["values"]["replicas"] = 5
    (fleet / "bundles" / "web.yaml").write_text(yaml.safe_dump(doc))
    (fleet / "bundles" / "reports.yaml").unlink()
    with BranchStore(url=url) as store:
        diffs = {d.cluster: d for d in diff(prepare(fleet), store)}
    assert diffs["eu-core"].status == "changed"
    assert [(b.name, b.change) for b in diffs["eu-core"].bundles] == [("reports", "removed")]
    us = diffs["us-edge-1"]
    assert [(b.name, b.change) for b in us.bundles] == [("web", "changed")]
    assert us.bundles[0].fields == (("formatOptions.values.replicas", 2, 5),)
    # eu-edge-1's own override still wins over the new base value.
    assert [(b.name, b.change) for b in diffs["eu-edge-1"].bundles] == [("reports", "removed")]


def fleetlet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fleetlet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleetlet"]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_cli_publish_signs_with_a_token_file_and_reports_json(world: World, tmp_path: Path) -> None:
    repo = world.git.create_bare("hub-e2e-cli.git")
    url = world.git.url_for("hub-e2e-cli.git")
    fleet = world.fleet("fleet-cli")
    token = tmp_path / "token"
    token.write_text(world.sigstore.mint_token())
    args = [
        "hub",
        "publish",
        str(fleet),
        "--repo",
        url,
        "--trust-config",
        str(world.sigstore.trust_config_path),
        "-o",
        "json",
    ]
    done = fleetlet(*args, "--identity-token", str(token))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["clusters"]["added"] == 3 and data["signed"] is True
    assert "signing one publication for 3 clusters" in done.stderr
    verify_publication(
        files=branch_files(repo, "eu-core"),
        cluster="eu-core",
        last_serial=None,
        trust=world.trust(),
    )
    # Second run, token from the environment: nothing to do.
    done = fleetlet(*args, env={"SIGSTORE_ID_TOKEN": world.sigstore.mint_token()})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pushed"] == []
    # Without any token: one clear line, exit code 1.
    env = {k: v for k, v in os.environ.items() if k != "SIGSTORE_ID_TOKEN"}
    done = subprocess.run(
        [shutil.which("fleetlet") or "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("fleetlet: no OIDC identity token")


def test_cli_diff_table(world: World) -> None:
    world.git.create_bare("hub-e2e-cli-diff.git")
    url = world.git.url_for("hub-e2e-cli-diff.git")
    fleet = world.fleet("fleet-cli-diff")
    done = fleetlet("hub", "diff", str(fleet), "--repo", url, "--cluster", "us-edge-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "us-edge-1: added"
    assert "  + web" in done.stdout.splitlines()
    # With --cluster the content is rendered for a preview; content the agent would refuse
    # (these test bundles hold no Kubernetes objects) is said, and the diff still shown.
    assert "  note: group platform: not previewed: " in done.stdout, done.stdout


def test_cli_errors_are_one_line(world: World, tmp_path: Path) -> None:
    fleet = world.fleet("fleet-cli-bad", reports_tag="gone")
    done = fleetlet("hub", "render", str(fleet), "--out", str(tmp_path / "out"), "-q")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("fleetlet: bundle 'reports': cannot resolve image")


def test_branches_written_by_others_are_compared_by_content(world: World, tmp_path: Path) -> None:
    """A branch tip without the hub's trailers (rewritten by hand) is read the slow way."""
    repo = world.git.create_bare("hub-e2e-foreign.git")
    url = world.git.url_for("hub-e2e-foreign.git")
    fleet = world.fleet("fleet-foreign")
    with BranchStore(url=url) as store:
        publish(prepare(fleet), store, signer=world.signer())
    work = tmp_path / "clone"
    env = {
        "GIT_AUTHOR_NAME": "op",
        "GIT_AUTHOR_EMAIL": "op@x",
        "GIT_COMMITTER_NAME": "op",
        "GIT_COMMITTER_EMAIL": "op@x",
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(
        ["git", "clone", "-q", "-b", "fleetlet/clusters/eu-core", url, str(work)],
        check=True,
        env=env,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        ["git", "commit", "-q", "--amend", "-m", "hand-made"],
        cwd=work,
        check=True,
        env=env,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        ["git", "push", "-q", "-f", "origin", "HEAD:fleetlet/clusters/eu-core"],
        cwd=work,
        check=True,
        env=env,
        capture_output=True,
        timeout=60,
    )
    before = server_refs(repo)
    with BranchStore(url=url) as store:
        report = publish(prepare(fleet), store, signer=world.signer())
    assert report.pushed == ()
    assert report.count("unchanged") == 3
    assert server_refs(repo) == before


def test_unsigned_branches_are_signed_by_the_next_signed_publish(world: World) -> None:
    repo = world.git.create_bare("hub-e2e-resign.git")
    url = world.git.url_for("hub-e2e-resign.git")
    fleet = world.fleet("fleet-resign")
    with BranchStore(url=url) as store:
        publish(prepare(fleet), store, signer=None)
    assert "statement.sigstore.json" not in branch_files(repo, "eu-core")
    with BranchStore(url=url) as store:
        report = publish(prepare(fleet), store, signer=world.signer())
    assert report.count("refreshed") == 3
    verified = verify_publication(
        files=branch_files(repo, "eu-core"), cluster="eu-core", last_serial=1, trust=world.trust()
    )
    assert verified.deployment_set.serial == 2


def test_publish_over_smart_http_with_basic_auth(world: World, git_http: Any) -> None:
    from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER

    repo = git_http.create_bare("hub-e2e-http.git")
    url = git_http.url_for("hub-e2e-http.git")
    fleet = world.fleet("fleet-http")
    with BranchStore(url=url, credentials=(GIT_USER, GIT_PASSWORD)) as store:
        report = publish(prepare(fleet), store, signer=None)
    assert sorted(report.pushed) == ["eu-core", "eu-edge-1", "us-edge-1"]
    assert len(server_refs(repo)) == 3
    with BranchStore(url=url, credentials=(GIT_USER, GIT_PASSWORD)) as store:
        assert publish(prepare(fleet), store, signer=None).pushed == ()


def test_a_signer_agents_would_refuse_stops_the_publish(world: World, tmp_path: Path) -> None:
    repo = world.git.create_bare("hub-e2e-wrong-signer.git")
    url = world.git.url_for("hub-e2e-wrong-signer.git")
    fleet = world.fleet("fleet-wrong-signer")
    token = tmp_path / "token"
    token.write_text(world.sigstore.mint_token(identity="intruder@fleet.test"))
    done = fleetlet(
        "hub",
        "publish",
        str(fleet),
        "--repo",
        url,
        "-q",
        "--trust-config",
        str(world.sigstore.trust_config_path),
        "--identity-token",
        str(token),
    )
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("fleetlet: the new publication would be refused by agents")
    assert "IdentityMismatch" in line
    assert server_refs(repo, every=True) == {}


def test_cli_no_sign_is_marked_unsafe(world: World) -> None:
    repo = world.git.create_bare("hub-e2e-nosign.git")
    url = world.git.url_for("hub-e2e-nosign.git")
    fleet = world.fleet("fleet-nosign")
    done = fleetlet("hub", "publish", str(fleet), "--repo", url, "--no-sign")
    assert done.returncode == 0, done.stderr
    assert "WARNING: --no-sign publishes UNSIGNED sets; agents refuse them" in done.stderr
    assert "publication: UNSIGNED" in done.stdout
    assert "3 cluster branches pushed" in done.stdout
    assert "statement.sigstore.json" not in branch_files(repo, "us-edge-1")


def test_removed_clusters_are_reported_and_left_alone(world: World) -> None:
    repo = world.git.create_bare("hub-e2e-orphan.git")
    url = world.git.url_for("hub-e2e-orphan.git")
    fleet = world.fleet("fleet-orphan")
    with BranchStore(url=url) as store:
        publish(prepare(fleet), store, signer=None)
    before = server_refs(repo)
    inventory = fleet / "clusters" / "inventory.yaml"
    doc = yaml.safe_load(inventory.read_text())
    doc["clusters"] = [c for c in doc["clusters"] if c["name"] != "us-edge-1"]
    doc["clusters"].append({"name": "lab-1", "labels": {"tier": "lab"}})
    inventory.write_text(yaml.safe_dump(doc))
    with BranchStore(url=url) as store:
        report = publish(prepare(fleet), store, signer=None)
    statuses = {c.cluster: c.status for c in report.changes}
    assert statuses == {
        "eu-core": "unchanged",
        "eu-edge-1": "unchanged",
        "lab-1": "added",
        "us-edge-1": "orphaned",
    }
    after = server_refs(repo)
    assert (
        after["refs/heads/fleetlet/clusters/us-edge-1"]
        == (before["refs/heads/fleetlet/clusters/us-edge-1"])
    )
    # lab-1 matches the platform bundles only (clusterSelector: {}): its set says so.
    lab = load_set(branch_files(repo, "lab-1")["set.yaml"], origin="lab-1")
    assert [e.name for e in lab.bundle_deployments] == ["platform-a", "platform-b"]


def test_publish_of_one_cluster_touches_only_its_branch(world: World) -> None:
    repo = world.git.create_bare("hub-e2e-one.git")
    url = world.git.url_for("hub-e2e-one.git")
    fleet = world.fleet("fleet-one")
    with BranchStore(url=url) as store:
        report = publish(prepare(fleet, only=["eu-core"]), store, signer=world.signer())
    assert report.pushed == ("eu-core",)
    assert list(server_refs(repo)) == ["refs/heads/fleetlet/clusters/eu-core"]
    verify_publication(
        files=branch_files(repo, "eu-core"),
        cluster="eu-core",
        last_serial=None,
        trust=world.trust(),
    )
