"""A fleet sharded over several repositories: real ``git daemon`` repositories, real signing.

What an operator checks: each cluster's branch is in its shard's repository only and the agent
pointed there sees it; one signature covers every shard; moving a cluster between shards never
shows its agent an older serial, and the old branch goes away once the move is old enough; two
hubs publishing at once never mix their publications, and a publication committed by a hub
that died half-way is finished by the next one, while one never committed is never seen.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.api import load_set
from agent.source.branch import BranchWatcher
from agent.verify import BRANCH_FILES, IdentityPolicy, TrustPolicy, verify_publication
from hub.errors import FleetRepoError, GitTransportError
from hub.fleet.load import load_fleet
from hub.fleet.shards import assign, fleet_shards, hash_key, jump_hash
from hub.publish import commit
from hub.publish.flow import PublishReport, prepare, publish
from hub.publish.ledger import HEAD_REF, STAGING_PREFIX, HeadRecord
from hub.publish.shards import ShardedStore
from hub.publish.sign import PublicationSigner
from tests.realenv.gitserver import GitDaemon
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.test_hub_fleet import write_fleet

SHARDS = 3
DIGEST = "sha256:" + "ab" * 32


def clusters(count: int = 12, pinned: dict[str, int] | None = None) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        name = f"store-{i:02d}"
        labels = {"region": "eu" if i % 2 else "us"}
        if pinned and name in pinned:
            labels["fleetlet.io/shard"] = str(pinned[name])
        out.append({"name": name, "labels": labels})
    return out


def bundles(replicas: int = 1) -> list[dict[str, Any]]:
    return [
        {
            "name": "web",
            "sources": [{"kind": "image", "uri": "registry.example/web", "digest": DIGEST}],
            "format": "helm",
            "formatOptions": {"values": {"replicas": replicas}},
            "targets": [{"clusterSelector": {}}],
        },
        {
            "name": "metrics",
            "sources": [{"kind": "image", "uri": "registry.example/metrics", "digest": DIGEST}],
            "targets": [{"clusterSelector": {"matchLabels": {"region": "eu"}}}],
        },
    ]


@dataclass
class Shards:
    git: GitDaemon
    sigstore: MiniSigstore
    tmp: Path
    stem: str

    @property
    def template(self) -> str:
        return self.git.url_for(f"{self.stem}-{{shard}}.git")

    def path(self, shard: int) -> Path:
        return self.git.root / f"{self.stem}-{shard}.git"

    def url(self, shard: int) -> str:
        return self.git.url_for(f"{self.stem}-{shard}.git")

    def fleet(self, name: str, *, replicas: int = 1, **kw: Any) -> Path:
        settings = {
            "name": "shop",
            "repo": "https://fleet.example.invalid/shop.git",
            "publication": {"expiresAfter": "7d", "refreshBefore": "1d"},
            "signing": {"identity": DEFAULT_IDENTITY, "issuer": self.sigstore.issuer},
            "shards": {"count": SHARDS},
        }
        return write_fleet(
            self.tmp / name, clusters=clusters(**kw), bundles=bundles(replicas), settings=settings
        )

    def publish(
        self, fleet: Path, *, cache: str = "hub", now: datetime | None = None, **kw: Any
    ) -> PublishReport:
        prepared = prepare(fleet)
        urls = fleet_shards(prepared.fleet).urls(self.template)
        with ShardedStore(urls=urls, cache_dir=self.tmp / cache) as store:
            return publish(prepared, store, signer=self.signer(), now=now, **kw)

    def signer(self) -> PublicationSigner:
        return PublicationSigner.from_trust_config(
            trust_config=self.sigstore.trust_config_path, token=self.sigstore.mint_token()
        )

    def trust(self) -> TrustPolicy:
        return TrustPolicy(
            trusted_root=self.sigstore.trusted_root_path,
            identity=IdentityPolicy(issuer=self.sigstore.issuer, subject=DEFAULT_IDENTITY),
        )

    def refs(self, shard: int) -> dict[str, str]:
        out = subprocess.run(
            [
                "git",
                "--git-dir",
                str(self.path(shard)),
                "for-each-ref",
                "--format=%(refname) %(objectname)",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        return dict(line.split(" ", 1) for line in out.splitlines())

    def branches(self, shard: int) -> dict[str, str]:
        prefix = "refs/heads/fleetlet/clusters/"
        return {r[len(prefix) :]: o for r, o in self.refs(shard).items() if r.startswith(prefix)}

    def fsck(self, shard: int) -> None:
        """git's own strict check of a shard's repository passes."""
        done = subprocess.run(
            ["git", "--git-dir", str(self.path(shard)), "fsck", "--strict"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr

    def files(self, shard: int, cluster: str) -> dict[str, bytes]:
        out = {}
        for name in BRANCH_FILES:
            done = subprocess.run(
                [
                    "git",
                    "--git-dir",
                    str(self.path(shard)),
                    "show",
                    f"fleetlet/clusters/{cluster}:{name}",
                ],
                capture_output=True,
                timeout=60,
            )
            if done.returncode == 0:
                out[name] = done.stdout
        return out


_stems = iter(range(1000))


@pytest.fixture(params=["carried", "staged"])
def commit_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the other shards' commits wait for the commit point: carried by it (a small
    publication) or staged in each shard first (a large one: forced here)."""
    if request.param == "staged":
        monkeypatch.setattr(commit, "CARRY_MAX", -1)
    return str(request.param)


@pytest.fixture
def shards(git_daemon: GitDaemon, mini_sigstore: MiniSigstore, tmp_path: Path) -> Iterator[Shards]:
    stem = f"shards-{next(_stems)}"
    for shard in range(SHARDS):
        git_daemon.create_bare(f"{stem}-{shard}.git")
    yield Shards(git=git_daemon, sigstore=mini_sigstore, tmp=tmp_path, stem=stem)


# --- which shard -----------------------------------------------------------------------------


def test_shards_are_a_stable_hash_unless_a_label_pins_them(tmp_path: Path) -> None:
    # The hash is part of the contract with every deployed agent: these values never change.
    assert [jump_hash(hash_key(f"store-{i:02d}"), 16) for i in range(6)] == [
        jump_hash(hash_key(f"store-{i:02d}"), 16) for i in range(6)
    ]
    assert jump_hash(0, 1) == 0 and all(0 <= jump_hash(k, 7) < 7 for k in range(1000))
    names = [f"cluster-{i:05d}" for i in range(10_000)]
    before = {n: jump_hash(hash_key(n), 10) for n in names}
    after = {n: jump_hash(hash_key(n), 11) for n in names}
    moved = [n for n in names if before[n] != after[n]]
    # Going from 10 to 11 shards moves about 1/11 of the clusters, all to the new shard.
    assert 600 < len(moved) < 1200 and {after[n] for n in moved} == {10}
    counts = [list(before.values()).count(s) for s in range(10)]
    assert min(counts) > 850 and max(counts) < 1150

    settings = {"shards": {"count": 4}}
    fleet = write_fleet(
        tmp_path / "f",
        clusters=[
            {"name": "a", "labels": {"fleetlet.io/shard": "3"}},
            {"name": "b", "labels": {}},
        ],
        bundles=bundles(),
        settings=settings,
    )
    shard_map = fleet_shards(load_fleet(fleet))
    assert shard_map.shard_of("a") == 3
    assert shard_map.shard_of("b") == jump_hash(hash_key("b"), 4)
    bad = load_fleet(
        write_fleet(
            tmp_path / "g",
            clusters=[{"name": "c", "labels": {"fleetlet.io/shard": "9"}}],
            bundles=bundles(),
            settings=settings,
        )
    )
    with pytest.raises(FleetRepoError, match=r"c: labels.fleetlet.io/shard: expected a shard"):
        assign(bad.settings.shards, bad.clusters)
    with pytest.raises(FleetRepoError, match=r"\{shard\}"):
        shard_map.urls("git://example/one-repo.git")
    # What the operator hands each agent: its shard's repositories, from the CLI.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetlet",
            "hub",
            "shards",
            str(fleet),
            "-o",
            "json",
            "--repo",
            "git://h/c-{shard}.git",
            "--status-repo",
            "git://h/s-{shard}.git",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = {r["cluster"]: r for r in json.loads(done.stdout)["clusters"]}
    assert rows["a"] == {
        "cluster": "a",
        "shard": 3,
        "repo": "git://h/c-3.git",
        "statusRepo": "git://h/s-3.git",
    }
    assert rows["b"]["repo"] == f"git://h/c-{shard_map.shard_of('b')}.git"


# --- publishing over shards ------------------------------------------------------------------


def test_one_signature_covers_every_shard(shards: Shards) -> None:
    fleet = shards.fleet("fleet")
    events = len(shards.sigstore.log._leaves)
    # Written by two worker processes, as a large publication is.
    report = shards.publish(fleet, writers=2)
    assert len(shards.sigstore.log._leaves) == events + 1  # one signing event, three shards
    assert len(report.pushed) == 12 and report.shards_pushed == (0, 1, 2)
    shard_map = fleet_shards(load_fleet(fleet))
    statements = set()
    for shard in range(SHARDS):
        held = shards.branches(shard)
        # Each branch lives in its own shard only.
        assert sorted(held) == sorted(n for n, s in shard_map.assignment.items() if s == shard)
        for cluster in held:
            files = shards.files(shard, cluster)
            statements.add(files["statement.json"])
            verified = verify_publication(
                files=files, cluster=cluster, last_serial=None, trust=shards.trust()
            )
            assert verified.deployment_set.serial == 1
        refs = shards.refs(shard)
        assert not [r for r in refs if r.startswith(STAGING_PREFIX)]
        assert (HEAD_REF in refs) == (shard == 0)
        shards.fsck(shard)
    assert len(statements) == 1  # the Merkle tree spans the shards
    # The agent, told only its own shard's repository, finds its branch there.
    cluster = "store-03"
    home = shard_map.shard_of(cluster)
    watcher = BranchWatcher(
        repo_url=shards.url(home), cluster=cluster, cache_dir=shards.tmp / "agent"
    )
    assert watcher.poll() == shards.branches(home)[cluster]
    assert load_set(watcher.fetch(watcher.poll() or "")["set.yaml"], origin="x").serial == 1
    # A rerun publishes nothing and pushes to no shard.
    again = shards.publish(fleet)
    assert again.pushed == () and again.count("unchanged") == 12


def test_a_changed_cluster_touches_only_its_shard(shards: Shards) -> None:
    shards.publish(shards.fleet("fleet"))
    before = {s: shards.refs(s) for s in range(SHARDS)}
    fleet = shards.fleet("fleet", replicas=1)
    doc = (fleet / "bundles" / "web.yaml").read_text()
    (fleet / "bundles" / "web.yaml").write_text(
        doc + "overrides:\n- clusters: [store-05]\n  values: {replicas: 3}\n"
    )
    home = fleet_shards(load_fleet(fleet)).shard_of("store-05")
    pushes_before = shards.git.requests()
    report = shards.publish(fleet)
    assert report.pushed == ("store-05",) and report.shards_pushed == (home,)
    # One push moves the head (shard 0), carrying the commit; one more moves the branch in
    # its own shard, if that is not shard 0: nothing is staged for so small a publication.
    served = shards.git.requests(since=len(pushes_before))
    pushes = sorted(r.path for r in served if r.method == "receive-pack")
    assert pushes == sorted({f"/{shards.stem}-0.git", f"/{shards.stem}-{home}.git"})
    for shard in range(SHARDS):
        after = shards.refs(shard)
        changed = {r for r in after if after[r] != before[shard].get(r)}
        expected = {"refs/heads/fleetlet/clusters/store-05"} if shard == home else set()
        if shard == 0:
            expected.add(HEAD_REF)
        assert changed == expected


# --- moving a cluster ------------------------------------------------------------------------


def test_moving_a_cluster_never_shows_its_agent_an_older_serial(shards: Shards) -> None:
    cluster = "store-04"
    fleet = shards.fleet("fleet", pinned={cluster: 0})
    shards.publish(fleet)

    accepted: dict[str, int | None] = {"serial": None, "commit": None}

    def agent_sees(shard: int) -> int:
        """What the agent, pointed at ``shard``, does with the branch there (as agent/sync.py:
        the same commit as accepted before is no news; anything else is verified)."""
        watcher = BranchWatcher(
            repo_url=shards.url(shard), cluster=cluster, cache_dir=shards.tmp / f"a{shard}"
        )
        commit = watcher.poll()
        assert commit is not None
        if commit != accepted["commit"]:
            verified = verify_publication(
                files=watcher.fetch(commit),
                cluster=cluster,
                last_serial=accepted["serial"],  # type: ignore[arg-type]
                trust=shards.trust(),
            )
            accepted.update(serial=verified.deployment_set.serial, commit=commit)
        return accepted["serial"]  # type: ignore[return-value]

    assert agent_sees(0) == 1
    # The operator moves the cluster to shard 2: one publication puts the same commit, with
    # the next serial, on both its old and its new shard.
    moved = shards.fleet("fleet", pinned={cluster: 2})
    report = shards.publish(moved)
    change = next(c for c in report.changes if c.cluster == cluster)
    assert (change.status, change.serial_after, change.shards) == ("moved", 2, (2, 0))
    assert shards.branches(0)[cluster] == shards.branches(2)[cluster]
    assert agent_sees(0) == 2
    # Re-pointed at its new shard the agent finds the commit it already accepted.
    assert agent_sees(2) == 2
    # A change while moving reaches both shards.
    changed = shards.fleet("fleet", pinned={cluster: 2}, replicas=4)
    shards.publish(changed)
    assert shards.branches(0)[cluster] == shards.branches(2)[cluster]
    assert agent_sees(2) == 3
    # Once the move is older than the publication validity (7d), the old branch is deleted;
    # the sets are then due for a refresh too, with a higher serial still.
    later = datetime.now(UTC) + timedelta(days=8)
    report = shards.publish(changed, now=later)
    assert (cluster, 0) in report.removed
    assert cluster not in shards.branches(0)
    files = shards.files(2, cluster)
    verified = verify_publication(
        files=files, cluster=cluster, last_serial=3, trust=shards.trust(), now=later
    )
    assert verified.deployment_set.serial == 4
    # Moving back starts above every serial it ever had.
    back = shards.fleet("fleet", pinned={cluster: 0}, replicas=4)
    report = shards.publish(back, now=later)
    change = next(c for c in report.changes if c.cluster == cluster)
    assert change.status == "moved" and change.serial_after == 5


# --- many hubs -------------------------------------------------------------------------------


def statements(shards: Shards) -> dict[str, bytes]:
    return {
        c: shards.files(s, c)["statement.json"] for s in range(SHARDS) for c in shards.branches(s)
    }


def head_record(shards: Shards) -> HeadRecord:
    data = subprocess.run(
        ["git", "--git-dir", str(shards.path(0)), "show", f"{HEAD_REF}:publication.json"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    return HeadRecord.from_bytes(data)


def test_two_hubs_publishing_at_once_never_interleave(shards: Shards, commit_mode: str) -> None:
    shards.publish(shards.fleet("base"))
    first, second = shards.fleet("one", replicas=2), shards.fleet("two", replicas=3)
    winner_done = threading.Event()
    seen_while_losing: list[dict[int, dict[str, str]]] = []
    results: dict[str, Any] = {}

    def slow_progress(message: str) -> None:
        if message.startswith("writing") and not winner_done.is_set():
            # Hub one has signed; hub two publishes entirely before hub one stages.
            winner_done.wait(timeout=120)
        if message.startswith("another hub committed"):
            # Hub one staged everything and lost: agents still see hub two's sets only.
            seen_while_losing.append({s: shards.refs(s) for s in range(SHARDS)})

    def hub_one() -> None:
        try:
            results["one"] = shards.publish(first, cache="hub-one", progress=slow_progress)
        except Exception as exc:  # reported below
            results["one"] = exc

    thread = threading.Thread(target=hub_one)
    thread.start()
    results["two"] = shards.publish(second, cache="hub-two")
    winner_statements = statements(shards)
    winner_branches = {s: shards.branches(s) for s in range(SHARDS)}
    winner_done.set()
    thread.join(timeout=300)
    one, two = results["one"], results["two"]
    assert isinstance(one, PublishReport), one
    assert two.attempts == 1 and one.attempts == 2
    # After hub one staged everything and lost, every branch still held hub two's
    # publication, and hub one had removed what it staged.
    assert len(seen_while_losing) == 1
    prefix = "refs/heads/fleetlet/clusters/"
    for shard, refs in seen_while_losing[0].items():
        branches = {r[len(prefix) :]: o for r, o in refs.items() if r.startswith(prefix)}
        assert branches == winner_branches[shard]
        assert not [r for r in refs if r.startswith(STAGING_PREFIX)]
    assert len(set(winner_statements.values())) == 1
    # Hub one then published on top: every cluster of every shard holds ONE publication,
    # the one the head names, with hub one's content and serial 3.
    final = statements(shards)
    assert len(set(final.values())) == 1
    assert (
        head_record(shards).statement_sha256
        == hashlib.sha256(next(iter(final.values()))).hexdigest()
    )
    for shard in range(SHARDS):
        for cluster in shards.branches(shard):
            deployment_set = load_set(shards.files(shard, cluster)["set.yaml"], origin=cluster)
            assert deployment_set.serial == 3
            web = next(e for e in deployment_set.bundle_deployments if e.name == "web")
            assert web.spec.format_options.values == {"replicas": 2}
        assert not [r for r in shards.refs(shard) if r.startswith(STAGING_PREFIX)]


def test_a_committed_publication_is_finished_by_the_next_hub(
    shards: Shards, monkeypatch: pytest.MonkeyPatch, commit_mode: str
) -> None:
    shards.publish(shards.fleet("base"))
    before = {s: shards.branches(s) for s in range(SHARDS)}
    fleet = shards.fleet("next", replicas=5)
    real_apply = commit.Writer.apply

    def network_gone(self: Any, store: Any, updates: Any, staged: Any) -> Any:
        raise GitTransportError(f"git push to {store.url} failed: connection reset")

    monkeypatch.setattr(commit.Writer, "apply", network_gone)
    with pytest.raises(GitTransportError):
        shards.publish(fleet, cache="dead-hub")
    monkeypatch.setattr(commit.Writer, "apply", real_apply)
    record = head_record(shards)
    # Committed (the head names it, shard 0's branches moved with it), not yet applied
    # elsewhere: the other shards still show the previous publication, never a mix within one
    # cluster. Their commits wait under staging refs in their shards, or carried by the
    # head's commit in shard 0.
    for shard in (1, 2):
        assert shards.branches(shard) == before[shard]
    if commit_mode == "staged":
        assert sorted(record.staging) == [1, 2] and not record.carried
        for shard in (1, 2):
            assert STAGING_PREFIX + record.publication in shards.refs(shard)
    else:
        assert sorted(record.carried) == [1, 2] and not record.staging
        for shard in (1, 2):
            assert not [r for r in shards.refs(shard) if r.startswith(STAGING_PREFIX)]
    # The next hub (another cache, another process in real life) finishes it first.
    report = shards.publish(fleet, cache="next-hub")
    assert report.pushed == ()  # nothing left to do once the committed one is applied
    final = statements(shards)
    assert len(set(final.values())) == 1
    for shard in range(SHARDS):
        assert not [r for r in shards.refs(shard) if r.startswith(STAGING_PREFIX)]
        for cluster in shards.branches(shard):
            files = shards.files(shard, cluster)
            assert load_set(files["set.yaml"], origin=cluster).serial == 2
            verify_publication(files=files, cluster=cluster, last_serial=1, trust=shards.trust())
        shards.fsck(shard)


def test_a_publication_never_committed_is_never_seen(
    shards: Shards, monkeypatch: pytest.MonkeyPatch, commit_mode: str
) -> None:
    shards.publish(shards.fleet("base"))
    before = {s: shards.branches(s) for s in range(SHARDS)}
    head_before = shards.refs(0)[HEAD_REF]

    def crash(*args: Any, **kwargs: Any) -> None:
        raise GitTransportError("git push failed: connection reset")

    monkeypatch.setattr(commit, "commit_point", crash)
    with pytest.raises(GitTransportError):
        shards.publish(shards.fleet("next", replicas=7), cache="dead-hub")
    for shard in range(SHARDS):
        assert shards.branches(shard) == before[shard]
        assert not [r for r in shards.refs(shard) if r.startswith(STAGING_PREFIX)]
    assert shards.refs(0)[HEAD_REF] == head_before


def change_web(fleet: Path, cluster: str, replicas: int) -> None:
    # One overrides list, replaced each time (a key twice is refused, as Kubernetes does).
    doc = (fleet / "bundles" / "web.yaml").read_text().split("overrides:\n")[0]
    (fleet / "bundles" / "web.yaml").write_text(
        doc + f"overrides:\n- clusters: [{cluster}]\n  values: {{replicas: {replicas}}}\n"
    )


def test_the_hub_that_published_last_lists_no_shard(shards: Shards) -> None:
    fleet = shards.fleet("fleet")
    shards.publish(fleet)
    cluster = "store-05"
    home = fleet_shards(load_fleet(fleet)).shard_of(cluster)
    change_web(fleet, cluster, 3)
    since = len(shards.git.requests())
    report = shards.publish(fleet)
    assert report.pushed == (cluster,)
    # Nothing moved the shards since this hub's last publish: it asked shard 0 for its head
    # and listed no repository (100,000 refs at 100,000 clusters).
    served = shards.git.requests(since=since)
    assert [r.path for r in served if r.method == "upload-pack"] == [f"/{shards.stem}-0.git"]
    assert load_set(shards.files(home, cluster)["set.yaml"], origin=cluster).serial == 2
    # Another hub (its own cache) publishes: this hub's record no longer matches the head, so
    # its next run lists every shard and builds on what the other hub wrote.
    change_web(fleet, cluster, 4)
    shards.publish(fleet, cache="other-hub")
    change_web(fleet, cluster, 5)
    since = len(shards.git.requests())
    report = shards.publish(fleet)
    assert report.pushed == (cluster,)
    listed = {r.path for r in shards.git.requests(since=since) if r.method == "upload-pack"}
    assert listed == {f"/{shards.stem}-{s}.git" for s in range(SHARDS)}
    deployment_set = load_set(shards.files(home, cluster)["set.yaml"], origin=cluster)
    web = next(e for e in deployment_set.bundle_deployments if e.name == "web")
    assert deployment_set.serial == 4 and web.spec.format_options.values == {"replicas": 5}


def test_a_branch_moved_by_hand_is_noticed_by_the_hub_that_published_last(
    shards: Shards,
) -> None:
    fleet = shards.fleet("fleet")
    shards.publish(fleet)
    shard_map = fleet_shards(load_fleet(fleet))
    # Two clusters of shard 0, whose branches move in the commit point's atomic push.
    cluster, other = [n for n in sorted(shard_map.assignment) if shard_map.shard_of(n) == 0][:2]
    # Someone points the cluster's branch at the other's commit, by hand.
    branches = shards.branches(0)
    ref = f"refs/heads/fleetlet/clusters/{cluster}"
    subprocess.run(
        ["git", "--git-dir", str(shards.path(0)), "update-ref", ref, branches[other]],
        check=True,
        timeout=60,
    )
    messages: list[str] = []
    change_web(fleet, cluster, 3)
    report = shards.publish(fleet, progress=messages.append)
    # The compare-and-swap refused the hub's update, nothing moved, and the run listed every
    # shard and published on top of what the branch holds now.
    assert any("listing every shard" in m for m in messages), messages
    assert report.pushed == (cluster,) and report.attempts == 1
    files = shards.files(0, cluster)
    verified = verify_publication(files=files, cluster=cluster, last_serial=1, trust=shards.trust())
    assert verified.deployment_set.serial == 2


def test_two_hub_serve_replicas_on_the_same_shards_answer_the_same(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    import requests

    from tests.realenv.hubserver import serving_hub
    from tests.test_hub_status import StatusPusher, make_bundle, make_run, make_status

    stem = f"status-replicas-{next(_stems)}"
    for shard in range(2):
        git_daemon.create_bare(f"{stem}-{shard}.git")
    template = git_daemon.url_for(f"{stem}-{{shard}}.git")
    for shard in range(2):
        pusher = StatusPusher(template.replace("{shard}", str(shard)), tmp_path / f"p{shard}")
        pusher.push(
            {
                f"s{shard}-c{i}": make_status(
                    f"s{shard}-c{i}",
                    bundles={
                        "web": make_bundle(
                            [
                                make_run(
                                    f"s{shard}-c{i}",
                                    "web",
                                    1,
                                    1,
                                    result="failed" if i % 2 else "succeeded",
                                )
                            ],
                            ready=i % 2 == 0,
                        )
                    },
                )
                for i in range(4)
            }
        )
    paths = [
        "/api/v1/clusters",
        "/api/v1/installations",
        "/api/v1/installations?state=Degraded&limit=2&offset=1",
        "/api/v1/matrix?state=Degraded",
        "/api/v1/installations/s1-c1/web",
    ]

    def answers(base: str) -> list[Any]:
        out = []
        for path in paths:
            answer = requests.get(base + path, timeout=30)
            assert answer.status_code == 200, answer.text
            out.append(_timeless(answer.json()))
        return out

    extra = ["--allow-anonymous", "--shards", "2"]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    with (
        serving_hub(template, tmp_path / "one", extra) as one,
        serving_hub(template, tmp_path / "two", extra) as two,
    ):
        first = answers(one)
        assert len(first[0]["items"]) == 8
        assert first[2]["total"] == 4 and len(first[2]["items"]) == 2
        assert first == answers(two)


def _timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "heartbeatAgeSeconds"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value
