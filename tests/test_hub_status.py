"""Hub status aggregation against real git servers: status branches pushed like agents do.

Each test pushes ``status.json`` documents (commits built without a work tree, one branch per
cluster, one push) to its own repository on the session's git daemon or smart-HTTP server,
then aggregates them with :class:`hub.status.FleetStatus`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pygit2
import pytest
import rfc8785

from agent.api.status import summary_message
from hub.errors import GitTransportError
from hub.status import FleetStatus
from hub.status.document import installation_state
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER
from tests.realenv.gitserver import GitDaemon, GitHttpServer, free_port

_SIG = pygit2.Signature("agent", "agent@fleetlet.invalid", 1_700_000_000, 0)
_repo_names = itertools.count()


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_run(
    cluster: str,
    bundle: str,
    serial: int,
    attempt: int,
    *,
    result: str = "Succeeded",
    operation: str = "install",
    outputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": f"{cluster}.{bundle}.{serial}.{attempt}",
        "operation": operation,
        "serial": serial,
        "sourceDigests": ["sha256:" + "ab" * 32],
        "startedAt": "2026-11-22T23:00:00Z",
        "finishedAt": "2026-11-22T23:01:00Z",
        "result": result,
        "failedObject": "apps/v1 Deployment web/web" if result != "Succeeded" else None,
        "message": "ok" if result == "Succeeded" else "Deployment web/web not Available",
        "counts": {"created": 1, "configured": 0, "unchanged": 3, "pruned": 0},
        "outputs": dict(outputs or {}),
    }


def make_bundle(runs: list[dict[str, Any]], *, ready: bool = True) -> dict[str, Any]:
    return {
        "group": "apps",
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "Healthy" if ready else "HealthCheckFailed",
                "message": "",
                "lastTransitionTime": "2026-11-22T23:01:00Z",
                "observedGeneration": 3,
            }
        ],
        "appliedRevision": {"serial": runs[0]["serial"], "sources": ["sha256:" + "ab" * 32]}
        if runs
        else None,
        "lastHealthyRevision": None,
        "health": {"status": "Current" if ready else "Failed", "message": ""},
        "driftCount": 0,
        "runs": runs,
    }


def make_status(
    cluster: str,
    *,
    sequence: int = 1,
    heartbeat: datetime | None = None,
    bundles: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A status document per the fixed schema (default: one Ready bundle ``web``)."""
    if bundles is None:
        bundles = {"web": make_bundle([make_run(cluster, "web", 1, 1)])}
    return {
        "apiVersion": "fleetlet.io/v1alpha1",
        "kind": "ClusterStatus",
        "schemaVersion": 1,
        "cluster": cluster,
        "agentVersion": "0.1.0",
        "heartbeat": stamp(heartbeat or datetime.now(UTC)),
        "sequence": sequence,
        "lastAcceptedSerial": 1,
        "lastRefusal": None,
        "bundles": dict(bundles),
        "truncated": False,
    }


class _PushCallbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    def __init__(self, credentials: Any = None) -> None:
        super().__init__(credentials=credentials)
        self.rejected: dict[str, str] = {}

    def push_update_reference(self, refname: str, message: str | None) -> None:
        if message:
            self.rejected[refname] = message


class StatusPusher:
    """Pushes status documents like agents do: a commit per document, one branch per cluster,
    the document's summary in the commit's message (``summaries=False``: as agents before
    summaries did)."""

    def __init__(
        self,
        url: str,
        workdir: Path,
        credentials: tuple[str, str] | None = None,
        *,
        summaries: bool = True,
    ) -> None:
        self.url = url
        self.repo = pygit2.init_repository(str(workdir), bare=True)
        self.credentials = credentials
        self.summaries = summaries

    def push(self, documents: Mapping[str, dict[str, Any] | bytes]) -> None:
        """Commit each document on its cluster's branch and push all branches in one push."""
        specs = []
        for cluster, document in documents.items():
            data = document if isinstance(document, bytes) else rfc8785.dumps(document)
            builder = self.repo.TreeBuilder()
            builder.insert("status.json", self.repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
            ref = f"refs/heads/fleetlet/status/{cluster}"
            parents = [self.repo.references[ref].target] if ref in self.repo.references else []
            message = f"status of {cluster}"
            if self.summaries and isinstance(document, dict):
                message = summary_message(document)
            oid = self.repo.create_commit(ref, _SIG, _SIG, message, builder.write(), parents)
            assert oid
            specs.append(f"+{ref}:{ref}")
        callbacks = _PushCallbacks(
            credentials=pygit2.UserPass(*self.credentials) if self.credentials else None
        )
        self.repo.remotes.create_anonymous(self.url).push(specs, callbacks=callbacks)
        # pygit2's push returns normally when the server refused: refusals come here.
        assert not callbacks.rejected, callbacks.rejected


def new_repo(server: GitDaemon | GitHttpServer, stem: str) -> str:
    name = f"{stem}-{next(_repo_names)}.git"
    server.create_bare(name)
    return server.url_for(name)


def upload_packs(server: GitDaemon, path: str) -> int:
    """upload-pack connections (listings and fetches) the daemon served for ``path``."""
    return len([r for r in server.requests() if r.path == path and r.method == "upload-pack"])


def object_count(status: FleetStatus) -> int:
    return len(set(status.repo.odb))  # a fixed thin pack may repeat a delta base


def test_aggregates_clusters_and_installations(git_daemon: GitDaemon, tmp_path: Path) -> None:
    url = new_repo(git_daemon, "status-agg")
    pusher = StatusPusher(url, tmp_path / "agents")
    rolled = [
        make_run("edge-b", "web", 2, 1, result="RolledBack", operation="upgrade"),
        make_run("edge-b", "web", 1, 1),
    ]
    pusher.push(
        {
            "edge-a": make_status("edge-a"),
            "edge-b": make_status("edge-b", bundles={"web": make_bundle(rolled)}),
            "edge-c": make_status(
                "edge-c",
                bundles={
                    "web": make_bundle(
                        [make_run("edge-c", "web", 1, 1, result="Failed")], ready=False
                    )
                },
            ),
        }
    )
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub", stale_after=timedelta(minutes=5))
    result = status.refresh()
    assert result.listed == 3 and result.moved == ["edge-a", "edge-b", "edge-c"]
    assert [c["name"] for c in status.clusters()] == ["edge-a", "edge-b", "edge-c"]
    assert not any(c["stale"] or c["error"] for c in status.clusters())
    states = {i["name"]: i["state"] for i in status.installations()}
    assert states == {"edge-a/web": "Ready", "edge-b/web": "RolledBack", "edge-c/web": "Degraded"}
    assert [i["name"] for i in status.installations(state="RolledBack")] == ["edge-b/web"]
    assert [i["name"] for i in status.installations(cluster="edge-c")] == ["edge-c/web"]
    assert status.installations(bundle="db") == []
    # "latest" is the newest SUCCEEDED run, not the newest run.
    latest = status.run("edge-b", "web", "latest")
    assert latest is not None and latest["id"] == "edge-b.web.1.1"
    assert status.run("edge-c", "web", "latest") is None
    assert [r["result"] for r in status.runs("edge-b", "web") or []] == ["RolledBack", "Succeeded"]


def test_refresh_fetches_only_moved_branches(git_daemon: GitDaemon, tmp_path: Path) -> None:
    url = new_repo(git_daemon, "status-moved")
    pusher = StatusPusher(url, tmp_path / "agents")
    names = [f"c{i:02d}" for i in range(20)]
    pusher.push({n: make_status(n) for n in names})
    # Each branch has some history (heartbeats): a new hub takes the tips alone.
    pusher.push({n: make_status(n, sequence=2) for n in names})
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    assert len(status.refresh().moved) == 20
    objects = object_count(status)
    # The server filters: one commit per branch, its summary in its message; no tree, no
    # document, no older commit.
    assert objects == 20
    assert status.cluster("c05")["sequence"] == 2  # type: ignore[index]
    path = "/" + url.rsplit("/", 1)[1]

    before = upload_packs(git_daemon, path)
    result = status.refresh()
    assert result.moved == [] and result.listed == 20
    assert upload_packs(git_daemon, path) == before + 1
    assert object_count(status) == objects  # nothing fetched

    pusher.push({"c03": make_status("c03", sequence=3), "c17": make_status("c17", sequence=3)})
    before = upload_packs(git_daemon, path)
    result = status.refresh()
    assert result.moved == ["c03", "c17"]
    # One connection, which brought exactly the two new commits.
    assert upload_packs(git_daemon, path) == before + 1
    assert object_count(status) == objects + 2
    assert status.cluster("c03")["sequence"] == 3  # type: ignore[index]
    assert status.cluster("c04")["sequence"] == 2  # type: ignore[index]
    # A page that shows the document fetches it then: its tree and the document.
    document = status.document("c03")
    assert document is not None and document["sequence"] == 3 and document["bundles"]
    assert object_count(status) == objects + 2 + 2
    # A page of installations (their runs are in the documents) fetches the documents it
    # lacks in one request.
    before = upload_packs(git_daemon, path)
    page = status.installations(limit=10)
    assert [i["cluster"] for i in page] == names[:10]
    assert all(i["lastRun"]["result"] == "Succeeded" for i in page)
    assert upload_packs(git_daemon, path) == before + 1


@pytest.mark.parametrize("server", ["filtering", "not filtering"])
@pytest.mark.parametrize("agents", ["with summaries", "before summaries"])
def test_the_view_is_the_same_whatever_the_server_and_the_agents_write(
    git_daemon: GitDaemon, tmp_path: Path, server: str, agents: str
) -> None:
    """Summaries in the commits' messages, or documents alone (agents before summaries); a
    server that filters (commits alone) or not: the hub shows the same fleet."""
    name = f"status-same-{next(_repo_names)}.git"
    config = {"uploadpack.allowFilter": "false"} if server == "not filtering" else {}
    git_daemon.create_bare(name, config=config)
    url = git_daemon.url_for(name)
    now = datetime.now(UTC)
    documents = {
        "ok": make_status("ok"),
        "rolled": make_status(
            "rolled",
            sequence=4,
            bundles={
                "web": make_bundle(
                    [
                        make_run("rolled", "web", 3, 1, result="RolledBack"),
                        make_run("rolled", "web", 2, 1),
                    ],
                    ready=False,
                ),
                "db": make_bundle([make_run("rolled", "db", 3, 1, result="Failed")], ready=False),
            },
        ),
        "quiet": make_status("quiet", heartbeat=now - timedelta(minutes=30)),
    }
    StatusPusher(url, tmp_path / "agents", summaries=agents == "with summaries").push(documents)
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    assert sorted(status.refresh().moved) == sorted(documents)
    expected = FleetStatus(repo_url=url, cache_dir=tmp_path / "reference")
    # The reference reads every document itself (no summary, no filter).
    for shard in expected._shards:
        shard.v2 = False
    expected.refresh()
    seen = {n: (status.cluster(n, now=now), status.cells(n, now=now)) for n in documents}
    assert seen == {
        n: (expected.cluster(n, now=now), expected.cells(n, now=now)) for n in documents
    }
    assert seen["rolled"][1] == {"web": "RolledBack", "db": "Degraded"}
    assert seen["quiet"][1] == {"web": "Stale"}
    assert status.installations() == expected.installations()
    assert status.document("rolled") == expected.document("rolled")


def test_restarted_hub_starts_warm(git_daemon: GitDaemon, tmp_path: Path) -> None:
    url = new_repo(git_daemon, "status-warm")
    StatusPusher(url, tmp_path / "agents").push({n: make_status(n) for n in ("a", "b")})
    FleetStatus(repo_url=url, cache_dir=tmp_path / "hub").refresh()

    restarted = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    assert [c["name"] for c in restarted.clusters()] == ["a", "b"]  # before any git traffic
    assert restarted.refresh().moved == []


def test_stale_clusters(git_daemon: GitDaemon, tmp_path: Path) -> None:
    url = new_repo(git_daemon, "status-stale")
    now = datetime.now(UTC)
    StatusPusher(url, tmp_path / "agents").push(
        {
            "quiet": make_status("quiet", heartbeat=now - timedelta(minutes=10)),
            "alive": make_status("alive", heartbeat=now - timedelta(seconds=30)),
        }
    )
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub", stale_after=timedelta(minutes=5))
    status.refresh()
    stale = {c["name"]: c["stale"] for c in status.clusters(now=now)}
    assert stale == {"alive": False, "quiet": True}
    states = {i["cluster"]: i["state"] for i in status.installations(now=now)}
    assert states == {"alive": "Ready", "quiet": "Stale"}
    # The clock, not a refresh, makes a cluster stale.
    later = now + timedelta(minutes=6)
    assert all(c["stale"] for c in status.clusters(now=later))


def test_malformed_document_is_isolated(git_daemon: GitDaemon, tmp_path: Path) -> None:
    url = new_repo(git_daemon, "status-bad")
    pusher = StatusPusher(url, tmp_path / "agents")
    pusher.push(
        {
            "good": make_status("good"),
            "garbage": b"{not json",
            "wrongkind": {**make_status("wrongkind"), "kind": "Something"},
            "liar": make_status("someone-else"),
        }
    )
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    result = status.refresh()
    assert sorted(result.errors) == ["garbage", "liar", "wrongkind"]
    clusters = {c["name"]: c for c in status.clusters()}
    assert clusters["good"]["error"] is None and not clusters["good"]["stale"]
    assert "not JSON" in clusters["garbage"]["error"]
    assert "kind" in clusters["wrongkind"]["error"]
    assert "someone-else" in clusters["liar"]["error"]
    assert clusters["garbage"]["stale"]  # no heartbeat known: never shown as fresh
    assert [i["name"] for i in status.installations()] == ["good/web"]

    # A later bad document keeps the last good one, marked; a good one clears the error.
    pusher.push({"good": b"[]"})
    status.refresh()
    good = status.cluster("good")
    assert good is not None and good["error"] and good["sequence"] == 1
    pusher.push({"good": make_status("good", sequence=2)})
    status.refresh()
    good = status.cluster("good")
    assert good is not None and good["error"] is None and good["sequence"] == 2


def test_older_sequence_never_replaces_newer(git_daemon: GitDaemon, tmp_path: Path) -> None:
    url = new_repo(git_daemon, "status-seq")
    pusher = StatusPusher(url, tmp_path / "agents")
    pusher.push({"a": make_status("a", sequence=5)})
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    status.refresh()
    pusher.push({"a": make_status("a", sequence=4)})
    status.refresh()
    a = status.cluster("a")
    assert a is not None and a["sequence"] == 5 and "older" in a["error"]


def test_smart_http_with_basic_auth(git_http: GitHttpServer, tmp_path: Path) -> None:
    url = new_repo(git_http, "status-http")
    creds = (GIT_USER, GIT_PASSWORD)
    StatusPusher(url, tmp_path / "agents", creds).push({"h1": make_status("h1")})
    status = FleetStatus(repo_url=url, credentials=creds, cache_dir=tmp_path / "hub")
    assert status.refresh().moved == ["h1"]
    assert [i["name"] for i in status.installations()] == ["h1/web"]
    # A warm refresh asks for the moved tip only (protocol v2 over smart HTTP).
    StatusPusher(url, tmp_path / "agents", creds).push({"h1": make_status("h1", sequence=2)})
    assert status.refresh().moved == ["h1"]
    assert status.cluster("h1")["sequence"] == 2  # type: ignore[index]
    wrong = FleetStatus(repo_url=url, credentials=(GIT_USER, "wrong"), cache_dir=tmp_path / "hub2")
    with pytest.raises(GitTransportError, match="cannot list status branches"):
        wrong.refresh()


def test_many_moved_branches_fetch_in_one_wildcard_fetch(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    # Past the explicit-refspec limit the fetch uses one wildcard; still only moved objects.
    url = new_repo(git_daemon, "status-many")
    pusher = StatusPusher(url, tmp_path / "agents")
    names = [f"m{i:03d}" for i in range(100)]
    pusher.push({n: make_status(n) for n in names})
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    status.refresh()
    objects = object_count(status)
    moved = names[:70]
    pusher.push({n: make_status(n, sequence=2) for n in moved})
    path = "/" + url.rsplit("/", 1)[1]
    before = upload_packs(git_daemon, path)
    assert status.refresh().moved == moved
    assert upload_packs(git_daemon, path) == before + 1
    assert object_count(status) == objects + 70  # the new commits alone: the server filters
    assert {c["name"]: c["sequence"] for c in status.clusters()} == {
        n: 2 if n in moved else 1 for n in names
    }


def test_empty_repository_and_unreachable_server(git_daemon: GitDaemon, tmp_path: Path) -> None:
    url = new_repo(git_daemon, "status-empty")
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    result = status.refresh()
    assert (result.listed, result.moved) == (0, [])
    assert status.clusters() == [] and status.installations() == []
    gone = FleetStatus(repo_url=f"git://127.0.0.1:{free_port()}/x.git", cache_dir=tmp_path / "x")
    with pytest.raises(GitTransportError, match="cannot list status branches"):
        gone.refresh()


def _answers(status: FleetStatus) -> dict[str, Any]:
    """What a hub answers, without what depends on the moment of asking."""
    from hub.status.queries import StatusQueries

    queries = StatusQueries(status)
    clusters = [
        {k: v for k, v in c.items() if k != "heartbeatAgeSeconds"} for c in status.clusters()
    ]
    return {
        "clusters": clusters,
        "installations": status.installations(),
        "matrix": {k: v for k, v in queries.matrix().items() if k != "items"},
        "rows": [
            {k: v for k, v in row.items() if k != "heartbeatAgeSeconds"}
            for row in queries.matrix()["items"]
        ],
    }


def test_status_over_shards_follows_a_moving_cluster(git_daemon: GitDaemon, tmp_path: Path) -> None:
    urls = [new_repo(git_daemon, "status-shard") for _ in range(2)]
    old_shard = StatusPusher(urls[0], tmp_path / "agents-0")
    new_shard = StatusPusher(urls[1], tmp_path / "agents-1")
    then = datetime.now(UTC) - timedelta(minutes=2)
    history = [make_run("mover", "web", 2, 1), make_run("mover", "web", 1, 1)]
    old_shard.push(
        {
            "mover": make_status(
                "mover", sequence=7, heartbeat=then, bundles={"web": make_bundle(history)}
            ),
            "a": make_status("a"),
        }
    )
    new_shard.push({"b": make_status("b")})
    status = FleetStatus(repo_url=urls, cache_dir=tmp_path / "hub")
    assert status.refresh().listed == 3
    assert status.cluster("mover")["sequence"] == 7  # type: ignore[index]
    # The agent moved and starts afresh in its new shard (sequence 1, its runs kept in the
    # cluster): the newer document wins, the old one is no longer shown but nothing is lost.
    moved_runs = [make_run("mover", "web", 3, 1), *history]
    new_shard.push(
        {"mover": make_status("mover", sequence=1, bundles={"web": make_bundle(moved_runs)})}
    )
    status.refresh()
    mover = status.cluster("mover")
    assert mover is not None and mover["sequence"] == 1 and not mover["stale"]
    runs = status.runs("mover", "web") or []
    assert [r["id"] for r in runs] == ["mover.web.3.1", "mover.web.2.1", "mover.web.1.1"]
    assert [c["name"] for c in status.clusters()] == ["a", "b", "mover"]
    # Another replica, with its own cache, reading the same shards, answers the same; so does
    # this one restarted from its cache, before any git traffic.
    replica = FleetStatus(repo_url=list(reversed(urls)), cache_dir=tmp_path / "replica")
    replica.refresh()
    restarted = FleetStatus(repo_url=urls, cache_dir=tmp_path / "hub")
    expected = _answers(status)
    assert _answers(replica) == expected
    assert _answers(restarted) == expected


def test_a_branch_moving_during_a_refresh_is_read_all_the_same(
    git_daemon: GitDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hub.errors import GitTransportError
    from hub.status import fetch

    url = new_repo(git_daemon, "status-race")
    pusher = StatusPusher(url, tmp_path / "agents")
    pusher.push({"a": make_status("a"), "b": make_status("b")})
    status = FleetStatus(repo_url=url, cache_dir=tmp_path / "hub")
    status.refresh()
    real = fetch.Session.fetch_pack
    sequence = iter(range(2, 10))

    def racing(self: fetch.Session, wants: list[str], haves: list[str], **kw: Any) -> Any:
        # The agent pushes again between the hub's listing and its fetch (protocol v2 makes
        # them two requests).
        pusher.push({"a": make_status("a", sequence=next(sequence) + 1)})
        return real(self, wants, haves, **kw)

    monkeypatch.setattr(fetch.Session, "fetch_pack", racing)
    pusher.push({"a": make_status("a", sequence=next(sequence))})
    # This git serves the tip the listing named: the view is what the listing said...
    assert status.refresh().moved == ["a"]
    assert status.cluster("a")["sequence"] == 2  # type: ignore[index]

    def refusing(self: fetch.Session, wants: list[str], haves: list[str], **kw: Any) -> Any:
        pusher.push({"a": make_status("a", sequence=next(sequence) + 1)})
        raise GitTransportError("the git server says: upload-pack: not our ref")

    # ... and a server that refuses a tip that moved away is asked again, by libgit2, which
    # lists and fetches in one exchange.
    monkeypatch.setattr(fetch.Session, "fetch_pack", refusing)
    assert status.refresh().moved == ["a"]
    a = status.cluster("a")
    assert a is not None and a["sequence"] == 5 and a["error"] is None


def test_a_rolled_back_run_is_history_once_a_newer_set_is_running_healthy() -> None:
    """After a rollout reverts a failed revision, the agent accepts the newer set, whose target
    is what it runs: Ready, though its newest run is still the rolled back one. While a set
    still wants the failed revision, the agent says Ready False, RolledBack."""
    rolled = make_bundle(
        [
            make_run("edge-a", "web", 3, 1, result="RolledBack", operation="upgrade"),
            make_run("edge-a", "web", 1, 1),
        ]
    )
    rolled["appliedRevision"] = {"serial": 1, "sources": ["sha256:" + "ab" * 32]}
    assert installation_state(rolled, stale=False, accepted=4) == "Ready"
    assert installation_state(rolled, stale=False, accepted=3) == "RolledBack"
    assert installation_state(rolled, stale=False) == "RolledBack"
    blocked = {
        **rolled,
        "conditions": [{**rolled["conditions"][0], "status": "False", "reason": "RolledBack"}],
    }
    assert installation_state(blocked, stale=False, accepted=4) == "RolledBack"


@pytest.mark.parametrize("outputs", [["ip"], True, "ip=1"])
def test_a_document_whose_run_outputs_are_not_an_object_is_bad(outputs: object) -> None:
    """Regression (found by fuzzing): such a document passed the hub's check and made
    ``GET .../runs/<id>/outputs`` answer 500; it is now refused, naming the field."""
    import json

    from hub.status.document import StatusDocumentError, parse_status

    seed = Path(__file__).parent / "fuzz" / "corpus" / "status" / "status.json"
    doc = json.loads(seed.read_text())
    assert parse_status(json.dumps(doc).encode(), origin="edge-1")["bundles"]["conf"]["runs"]
    doc["bundles"]["conf"]["runs"][0]["outputs"] = outputs
    with pytest.raises(StatusDocumentError, match=r"bundles\.conf\.runs\[0\]\.outputs"):
        parse_status(json.dumps(doc).encode(), origin="edge-1")


def test_an_installation_whose_conditions_or_runs_are_malformed_gets_a_state() -> None:
    # Found by the fuzzer: a condition whose type is an object made the hub fail (500).
    odd_type = {"conditions": [{"type": {"x": "Ready"}, "status": "True"}], "runs": []}
    assert installation_state(odd_type, stale=False) == "Progressing"
    not_lists = {"conditions": 3, "runs": {"0": {"result": "Failed"}}}
    assert installation_state(not_lists, stale=False) == "Progressing"
    ready = {"conditions": [{"type": "Ready", "status": "True", "reason": "Healthy"}, 7]}
    assert installation_state(ready, stale=False) == "Ready"
