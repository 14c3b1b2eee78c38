"""Status back to git, against real git servers (``git daemon`` and smart HTTP with basic auth).

What an operator checks: the document is on ``fleetlet/status/<cluster>``; pushes happen on a
change or when the heartbeat is due; an outage keeps the latest document and pushes it once
the server is back; nothing older overwrites newer; two clusters pushing at once never reject
each other; a sensitive output is never in clear in any object of the repository.
"""

from __future__ import annotations

import json
import shutil
import threading
from datetime import UTC, datetime
from pathlib import Path

import pygit2
import pytest

from agent.api.facts import FACTS_FILE, ReportedFacts, load_reported_facts
from agent.api.status import (
    STATUS_FILE,
    BundleStatusReport,
    ClusterStatus,
    OutputValue,
    Run,
    dump_status,
    load_status,
    message_summary,
    status_summary,
    status_to_dict,
)
from agent.errors import TemporaryError
from agent.render.facts import ClusterFacts
from agent.report.push import StatusPusher, StatusSupersededError
from agent.report.seal import (
    OutputPlace,
    generate_keypair,
    open_sealed,
    private_key_from_text,
    public_key_from_text,
    sensitive_output,
)
from agent.source.credentials import GitAuthError, GitCredentials
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER, GitServerFactory
from tests.realenv.gitserver import GitDaemon, GitHttpServer

T0 = 1_795_000_000.0  # 2026-11-18, a fixed clock for the heartbeat logic
HTTP_CREDENTIALS = GitCredentials(username=GIT_USER, password=GIT_PASSWORD)


def _place(cluster: str) -> OutputPlace:
    """Where the ``password`` output of :func:`status`'s run sits."""
    return OutputPlace(cluster=cluster, bundle="web", output="password", run=f"{cluster}.web.4.1")


def status(
    cluster: str, *, note: str = "applied", outputs: tuple[OutputValue, ...] = ()
) -> ClusterStatus:
    started = datetime(2026, 11, 22, 23, 0, 0, tzinfo=UTC)
    return ClusterStatus(
        schema_version=1,
        cluster=cluster,
        agent_version="0.1.0",
        heartbeat=started,
        sequence=0,
        last_accepted_serial=4,
        bundles=(
            BundleStatusReport(
                name="web",
                group="apps",
                runs=(
                    Run(
                        id=f"{cluster}.web.4.1",
                        operation="install",
                        serial=4,
                        started_at=started,
                        finished_at=started,
                        result="Succeeded",
                        message=note,
                        outputs=outputs,
                    ),
                ),
            ),
        ),
    )


def pusher_for(
    server: GitDaemon | GitHttpServer, repo: str, cluster: str, workdir: Path, **kwargs: float
) -> StatusPusher:
    credentials = HTTP_CREDENTIALS if isinstance(server, GitHttpServer) else None
    return StatusPusher(
        repo_url=server.url_for(repo),
        cluster=cluster,
        credentials=credentials,
        workdir=workdir,
        io_timeout=20.0,
        **kwargs,
    )


def branch_commit(server: GitDaemon | GitHttpServer, repo: str, cluster: str) -> pygit2.Commit:
    bare = pygit2.Repository(str(server.root / repo))
    commit = bare.revparse_single(f"refs/heads/fleetlet/status/{cluster}")
    assert isinstance(commit, pygit2.Commit)
    return commit


def remote_status(server: GitDaemon | GitHttpServer, repo: str, cluster: str) -> ClusterStatus:
    commit = branch_commit(server, repo, cluster)
    assert [entry.name for entry in commit.tree] == [STATUS_FILE]
    blob = commit.tree[STATUS_FILE]
    assert isinstance(blob, pygit2.Blob)
    return load_status(bytes(blob.data), origin=f"{repo}:{cluster}")


def same_content(a: ClusterStatus, b: ClusterStatus) -> bool:
    return a.bundles == b.bundles and a.last_accepted_serial == b.last_accepted_serial


@pytest.mark.parametrize("kind", ["daemon", "http"])
def test_status_arrives_on_the_branch_as_fast_forward_commits(
    kind: str,
    git_daemon: GitDaemon,
    git_http: GitHttpServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    server: GitDaemon | GitHttpServer = git_daemon if kind == "daemon" else git_http
    repo = f"status-arrives-{kind}.git"
    server.create_bare(repo)
    pusher = pusher_for(server, repo, "edge-a", tmp_path_factory.mktemp("agent"))

    assert pusher.update(status("edge-a"), now=T0)
    first = pusher.push(now=T0)
    remote = remote_status(server, repo, "edge-a")
    assert remote == pusher.latest
    assert remote.sequence == first.sequence == 1
    assert remote.heartbeat == datetime.fromtimestamp(T0, tz=UTC)
    assert str(branch_commit(server, repo, "edge-a").id) == first.commit

    assert pusher.update(status("edge-a", note="upgraded"), now=T0 + 5)
    second = pusher.push(now=T0 + 5)
    commit = branch_commit(server, repo, "edge-a")
    assert str(commit.id) == second.commit
    # On top of the previous tip: a fast-forward, history kept.
    assert [str(p) for p in commit.parent_ids] == [first.commit]
    remote = remote_status(server, repo, "edge-a")
    assert remote.sequence == 2
    assert remote.bundles[0].runs[0].message == "upgraded"
    # The commit's message carries the document's summary: what a hub's fleet-wide view
    # reads, without the document.
    summary = message_summary(commit.raw_message)
    assert summary is not None
    assert json.loads(summary) == status_summary(status_to_dict(remote))
    assert json.loads(summary)["bundles"]["web"]["runs"][0]["result"] == "Succeeded"


def test_the_agents_formats_are_written_into_every_document(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-formats.git"
    git_daemon.create_bare(repo)
    pusher = StatusPusher(
        repo_url=git_daemon.url_for(repo),
        cluster="edge-f",
        credentials=None,
        workdir=tmp_path_factory.mktemp("agent"),
        formats=["plain", "jsonnet", "helm", "plain"],
    )
    pusher.update(status("edge-f"), now=T0)
    pusher.push(now=T0)
    remote = remote_status(git_daemon, repo, "edge-f")
    assert remote.formats == ("helm", "jsonnet", "plain")
    assert remote.schema_version == 2


def test_pushes_only_on_change_or_when_the_heartbeat_is_due(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-heartbeat.git"
    git_daemon.create_bare(repo)
    pusher = pusher_for(
        git_daemon, repo, "edge-b", tmp_path_factory.mktemp("agent"), heartbeat_interval=60.0
    )
    assert not pusher.should_push(T0)  # nothing to say yet
    assert pusher.tick(T0) is None

    pusher.update(status("edge-b"), now=T0)
    assert pusher.should_push(T0)
    assert pusher.tick(T0) is not None
    assert not pusher.should_push(T0 + 1)

    # The same content again is no change: no new document, no push before the heartbeat.
    assert not pusher.update(status("edge-b"), now=T0 + 10)
    assert not pusher.should_push(T0 + 59)
    assert pusher.tick(T0 + 59) is None
    assert remote_status(git_daemon, repo, "edge-b").sequence == 1

    # The heartbeat: the same content, written again with a new time and sequence.
    assert pusher.should_push(T0 + 60)
    beat = pusher.tick(T0 + 60)
    assert beat is not None
    remote = remote_status(git_daemon, repo, "edge-b")
    assert remote.sequence == 2
    assert remote.heartbeat == datetime.fromtimestamp(T0 + 60, tz=UTC)

    # A change is pushed at once, heartbeat due or not.
    assert pusher.update(status("edge-b", note="drift corrected"), now=T0 + 61)
    assert pusher.should_push(T0 + 61)
    assert pusher.tick(T0 + 61) is not None
    remote = remote_status(git_daemon, repo, "edge-b")
    assert remote.sequence == 3
    assert remote.bundles[0].runs[0].message == "drift corrected"
    assert pusher.pushes == 3


def test_wrong_password_fails_clearly_after_two_requests(
    git_http: GitHttpServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-wrong-password.git"
    git_http.create_bare(repo)
    pusher = StatusPusher(
        repo_url=git_http.url_for(repo),
        cluster="edge-c",
        credentials=GitCredentials(username=GIT_USER, password="not-the-password"),
        workdir=tmp_path_factory.mktemp("agent"),
    )
    pusher.update(status("edge-c"), now=T0)
    before = git_http.request_count()
    with pytest.raises(GitAuthError, match="refused the basic credentials"):
        pusher.push(now=T0)
    assert git_http.request_count() - before <= 2
    assert pusher.pending


def test_outage_keeps_the_latest_and_pushes_it_when_the_server_is_back(
    git_server_factory: GitServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = git_server_factory("daemon")
    repo = "status-outage.git"
    server.create_bare(repo)
    workdir = tmp_path_factory.mktemp("agent")
    pusher = pusher_for(server, repo, "edge-d", workdir, rng=lambda: 0.5)  # type: ignore[arg-type]
    pusher.update(status("edge-d", note="first"), now=T0)
    pusher.push(now=T0)

    server.stop()
    pusher.update(status("edge-d", note="during the outage"), now=T0 + 1)
    with pytest.raises(TemporaryError):
        pusher.tick(T0 + 1)
    pusher.update(status("edge-d", note="latest"), now=T0 + 2)
    # A backoff after the failure (half of it at random): the next tick does not try yet...
    assert pusher.retry_at is not None and pusher.retry_at > T0 + 2
    assert pusher.tick(T0 + 2) is None and pusher.attempts == 2
    # ... and once it is over tries again, and waits longer after this second failure.
    first_retry = pusher.retry_at
    with pytest.raises(TemporaryError):
        pusher.tick(first_retry)
    assert pusher.attempts == 3 and pusher.failures == 2
    assert pusher.retry_at - first_retry > first_retry - (T0 + 1)
    assert pusher.pending
    # Kept on disk too: an agent restarted during the outage still has it.
    restarted = pusher_for(server, repo, "edge-d", workdir)
    assert restarted.pending and restarted.latest == pusher.latest

    server.start()
    result = restarted.tick(T0 + 3)
    assert result is not None and not restarted.pending
    remote = remote_status(server, repo, "edge-d")
    assert remote.bundles[0].runs[0].message == "latest"
    assert remote.sequence == result.sequence
    # Sequences only grow: 1 (first), 2, 3 (kept), and this push's.
    assert remote.sequence >= 3


def test_an_older_document_never_overwrites_a_newer_one(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-older.git"
    git_daemon.create_bare(repo)
    current = tmp_path_factory.mktemp("agent-current")
    pusher = pusher_for(git_daemon, repo, "edge-e", current)
    pusher.update(status("edge-e", note="one"), now=T0)
    pusher.push(now=T0)

    # An old replica: the same state as now, then it falls behind.
    old_dir = tmp_path_factory.mktemp("agent-old") / "state"
    shutil.copytree(current, old_dir)
    old = pusher_for(git_daemon, repo, "edge-e", old_dir)

    pusher.update(status("edge-e", note="two"), now=T0 + 1)
    pusher.push(now=T0 + 1)
    pusher.update(status("edge-e", note="three"), now=T0 + 2)
    newest = pusher.push(now=T0 + 2)

    old.update(status("edge-e", note="stale view"), now=T0 + 3)
    with pytest.raises(StatusSupersededError, match="not older than ours"):
        old.push(now=T0 + 3)
    remote = remote_status(git_daemon, repo, "edge-e")
    assert remote.sequence == newest.sequence
    assert remote.bundles[0].runs[0].message == "three"
    assert str(branch_commit(git_daemon, repo, "edge-e").id) == newest.commit

    # A new agent with no state at all (a lost volume) continues after the remote sequence.
    fresh = pusher_for(git_daemon, repo, "edge-e", tmp_path_factory.mktemp("agent-fresh"))
    fresh.update(status("edge-e", note="after restart"), now=T0 + 4)
    result = fresh.push(now=T0 + 4)
    assert result.sequence == newest.sequence + 1
    assert remote_status(git_daemon, repo, "edge-e").bundles[0].runs[0].message == "after restart"


def test_two_agents_pushing_at_the_same_moment_never_reject_each_other(
    git_http: GitHttpServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-two-agents.git"
    git_http.create_bare(repo)
    rounds = 30
    clusters = ["edge-f", "edge-g"]
    pushers = {
        c: pusher_for(git_http, repo, c, tmp_path_factory.mktemp(f"agent-{c}")) for c in clusters
    }
    barrier = threading.Barrier(len(clusters))
    errors: list[BaseException] = []

    def agent(cluster: str) -> None:
        try:
            for n in range(rounds):
                pushers[cluster].update(status(cluster, note=f"round {n}"), now=T0 + n)
                barrier.wait(timeout=120)
                pushers[cluster].push(now=T0 + n)
        except BaseException as exc:  # reported below, with the round it happened in
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=agent, args=(c,)) for c in clusters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    for cluster in clusters:
        remote = remote_status(git_http, repo, cluster)
        assert remote.cluster == cluster
        assert remote.sequence == rounds
        assert remote.bundles[0].runs[0].message == f"round {rounds - 1}"
        # One commit per round, each on top of the one before.
        commit = branch_commit(git_http, repo, cluster)
        depth = 1
        while commit.parents:
            commit = commit.parents[0]
            depth += 1
        assert depth == rounds
        assert pushers[cluster].pushes == rounds
        # Not even refused and tried again: separate branches do not race.
        assert pushers[cluster].retries == 0


def test_a_sensitive_output_is_sealed_and_never_in_clear_in_the_repository(
    git_http: GitHttpServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-sealed.git"
    git_http.create_bare(repo)
    secret = "db-password-7f3a9c1e5b"
    private_text, public_text = generate_keypair()
    hub_public = public_key_from_text(public_text)
    outputs = (
        OutputValue(name="endpoint", value="10.0.0.7"),
        sensitive_output(secret, hub_public, place=_place("edge-h")),
    )
    pusher = pusher_for(git_http, repo, "edge-h", tmp_path_factory.mktemp("agent"))
    pusher.update(status("edge-h", outputs=outputs), now=T0)
    pusher.push(now=T0)
    # An agent without a hub key: the value is omitted, on another cluster's branch.
    other = pusher_for(git_http, repo, "edge-i", tmp_path_factory.mktemp("agent-other"))
    omit = sensitive_output(secret, None, place=_place("edge-i"))
    other.update(status("edge-i", outputs=(omit,)), now=T0)
    other.push(now=T0)

    bare = pygit2.Repository(str(git_http.root / repo))
    branches = [r for r in bare.references if r.startswith("refs/heads/")]
    assert sorted(branches) == [
        "refs/heads/fleetlet/status/edge-h",
        "refs/heads/fleetlet/status/edge-i",
    ]
    needles = [secret.encode(), secret.encode("utf-16-le")]
    objects = 0
    for oid in bare.odb:
        data = bare.odb.read(oid)[1]
        objects += 1
        assert not any(n in data for n in needles), f"clear value in object {oid}"
    assert objects >= 6  # two commits, two trees, two blobs at least
    for name in ("edge-h", "edge-i"):
        raw = bytes(branch_commit(git_http, repo, name).tree[STATUS_FILE].data)
        assert secret.encode() not in raw

    run = remote_status(git_http, repo, "edge-h").bundles[0].runs[0]
    sealed = run.output("password")
    assert sealed is not None and sealed.sealed is not None and sealed.value is None
    opened = open_sealed(private_key_from_text(private_text), sealed.sealed, place=_place("edge-h"))
    assert opened.value == secret
    assert run.output("endpoint") == OutputValue(name="endpoint", value="10.0.0.7")
    omitted = remote_status(git_http, repo, "edge-i").bundles[0].runs[0].output("password")
    assert omitted == OutputValue(name="password", omitted=True)


class _RacedPusher(StatusPusher):
    """A pusher whose branch is moved by another writer between its fetch and its push."""

    other: StatusPusher | None = None

    def _commit(self, doc: ClusterStatus, tip: pygit2.Oid | None, now: float) -> pygit2.Oid:
        if self.other is not None:
            other, self.other = self.other, None
            other.push(now=now)
        return super()._commit(doc, tip, now)


def test_a_writer_racing_on_the_same_branch_is_detected_not_overwritten(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-race.git"
    git_daemon.create_bare(repo)
    pusher = _RacedPusher(
        repo_url=git_daemon.url_for(repo),
        cluster="edge-j",
        credentials=None,
        workdir=tmp_path_factory.mktemp("agent"),
    )
    pusher.update(status("edge-j", note="ours"), now=T0)
    pusher.push(now=T0)
    # A second writer of the same branch (say, a new pod with an empty volume).
    other = pusher_for(git_daemon, repo, "edge-j", tmp_path_factory.mktemp("agent-other"))
    other.update(status("edge-j", note="theirs"), now=T0 + 1)
    pusher.other = other
    pusher.update(status("edge-j", note="ours again"), now=T0 + 1)
    with pytest.raises(StatusSupersededError):
        pusher.push(now=T0 + 1)
    # The server refused our commit (not a fast-forward any more); we fetched again, saw a
    # document as new as ours, and left it there.
    assert pusher.retries == 1
    remote = remote_status(git_daemon, repo, "edge-j")
    assert remote.bundles[0].runs[0].message == "theirs"
    assert remote.sequence == 2


def test_a_writer_between_two_of_our_pushes_is_detected_not_overwritten(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-between.git"
    git_daemon.create_bare(repo)
    pusher = pusher_for(git_daemon, repo, "edge-k", tmp_path_factory.mktemp("agent"))
    pusher.update(status("edge-k", note="ours"), now=T0)
    pusher.push(now=T0)
    # Another writer while we are idle: our next push, built on what we pushed last, is
    # refused by the server; we fetch, see a document as new as ours, and leave it there.
    other = pusher_for(git_daemon, repo, "edge-k", tmp_path_factory.mktemp("agent-other"))
    other.update(status("edge-k", note="theirs"), now=T0 + 1)
    other.push(now=T0 + 1)
    pusher.update(status("edge-k", note="ours again"), now=T0 + 2)
    with pytest.raises(StatusSupersededError):
        pusher.push(now=T0 + 2)
    assert remote_status(git_daemon, repo, "edge-k").bundles[0].runs[0].message == "theirs"


def test_a_push_after_our_own_fetches_nothing_first(
    git_http: GitHttpServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-one-exchange.git"
    git_http.create_bare(repo)
    pusher = pusher_for(git_http, repo, "edge-l", tmp_path_factory.mktemp("agent"))
    pusher.update(status("edge-l", note="one"), now=T0)
    pushed = pusher.push(now=T0)
    # Another pusher of ours after a restart (no state): it fetches first.
    again = pusher_for(git_http, repo, "edge-l", tmp_path_factory.mktemp("agent-restarted"))
    again.update(status("edge-l", note="restarted"), now=T0 + 1)
    before = git_http.request_count()
    pushed = again.push(now=T0 + 1)
    with_fetch = git_http.request_count() - before
    again.update(status("edge-l", note="two"), now=T0 + 2)
    before = git_http.request_count()
    second = again.push(now=T0 + 2)
    # No fetch before it (the branch's tip is the commit it pushed; the push says so).
    assert git_http.request_count() - before < with_fetch
    tip = branch_commit(git_http, repo, "edge-l")
    assert str(tip.id) == second.commit and [str(p.id) for p in tip.parents] == [pushed.commit]
    assert remote_status(git_http, repo, "edge-l").bundles[0].runs[0].message == "two"


def test_the_local_repository_stays_small_and_history_stays_linear(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-recycle.git"
    git_daemon.create_bare(repo)
    workdir = tmp_path_factory.mktemp("agent")
    pusher = pusher_for(
        git_daemon, repo, "edge-k", workdir, heartbeat_interval=1.0, recycle_every=3
    )
    pusher.update(status("edge-k"), now=T0)
    for n in range(8):
        assert pusher.tick(T0 + n) is not None
        # Shallow fetches, and a new local repository every 3 pushes: never the whole history.
        local = pygit2.Repository(str(workdir / "status.git"))
        assert sum(1 for _ in local.odb) <= 3 * 3 + 3
    commit = branch_commit(git_daemon, repo, "edge-k")
    sequences = []
    while True:
        blob = commit.tree[STATUS_FILE]
        assert isinstance(blob, pygit2.Blob)
        sequences.append(load_status(bytes(blob.data), origin="history").sequence)
        if not commit.parents:
            break
        assert len(commit.parents) == 1
        commit = commit.parents[0]
    assert sequences == list(range(8, 0, -1))


def test_a_bounded_document_stays_marked_truncated_through_heartbeats(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = "status-bounded.git"
    git_daemon.create_bare(repo)
    pusher = pusher_for(
        git_daemon, repo, "edge-l", tmp_path_factory.mktemp("agent"), max_bytes=4096
    )
    pusher.update(status("edge-l", note="x" * 30_000), now=T0)
    pusher.push(now=T0)
    first = remote_status(git_daemon, repo, "edge-l")
    assert first.truncated
    assert first.bundles[0].runs[0].message.endswith("…[truncated]")
    pusher.push(now=T0 + 120)  # a heartbeat
    again = remote_status(git_daemon, repo, "edge-l")
    assert again.sequence == first.sequence + 1 and again.truncated
    assert len(dump_status(again)) <= 4096


def test_cluster_facts_go_beside_the_status_document_and_travel_only_when_they_change(
    git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """cluster.json (the facts hub diff renders with) sits beside status.json in the same
    commit, the same blob while the facts do not change, and is carried over by an agent that
    has not rendered since its start; status.json itself does not grow."""
    repo = "status-facts.git"
    git_daemon.create_bare(repo)
    workdir = tmp_path_factory.mktemp("agent")
    pusher = pusher_for(git_daemon, repo, "edge-c", workdir)
    facts = ReportedFacts(
        cluster="edge-c",
        facts=ClusterFacts.of(kube_version="v1.32.1", api_versions=["v1", "apps/v1"]),
        installed=frozenset({"web"}),
    )
    assert pusher.update(status("edge-c"), now=T0, facts=facts)
    pusher.push(now=T0)

    def blobs() -> dict[str, str]:
        commit = branch_commit(git_daemon, repo, "edge-c")
        return {entry.name: str(entry.id) for entry in commit.tree}

    first = blobs()
    assert sorted(first) == [FACTS_FILE, STATUS_FILE]
    tree = branch_commit(git_daemon, repo, "edge-c").tree
    reported = load_reported_facts(tree[FACTS_FILE].data, origin="test")
    assert reported == facts
    assert b"v1.32.1" not in tree[STATUS_FILE].data  # the aggregator's document is untouched

    # The same facts again: no new document; a status change keeps the same facts blob.
    assert not pusher.update(status("edge-c"), now=T0 + 1, facts=facts)
    assert pusher.update(status("edge-c", note="upgraded"), now=T0 + 2, facts=facts)
    pusher.push(now=T0 + 2)
    second = blobs()
    assert second[FACTS_FILE] == first[FACTS_FILE]
    assert second[STATUS_FILE] != first[STATUS_FILE]

    # New facts alone make a new document.
    newer = ReportedFacts(cluster="edge-c", facts=facts.facts, installed=frozenset())
    assert pusher.update(status("edge-c", note="upgraded"), now=T0 + 3, facts=newer)
    pusher.push(now=T0 + 3)
    assert blobs()[FACTS_FILE] != first[FACTS_FILE]

    # A new agent pod (empty workdir) that has not rendered yet keeps what the branch has.
    fresh = pusher_for(git_daemon, repo, "edge-c", tmp_path_factory.mktemp("agent-2"))
    assert fresh.update(status("edge-c", note="restarted"), now=T0 + 4)
    fresh.push(now=T0 + 4)
    tree = branch_commit(git_daemon, repo, "edge-c").tree
    assert load_reported_facts(tree[FACTS_FILE].data, origin="test") == newer
