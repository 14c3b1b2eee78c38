"""The agent's branch watcher against real git servers (git daemon, smart HTTP with basic auth).

What a user checks: an idle poll is one ref listing and no fetch (the server's own log), a moved
branch is fetched alone (the local repository's refs and object database), a server that is
down or refuses the password gives a clear error of the right kind.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pygit2
import pytest

from agent.errors import PermanentError, TemporaryError
from agent.source.branch import (
    BranchContentError,
    BranchNotFoundError,
    BranchWatcher,
    FetchTooLargeError,
    GitAuthError,
    GitUnavailableError,
)
from agent.source.credentials import (
    CredentialsConfigError,
    GitCredentials,
    credential_for,
)
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER, GitServerFactory
from tests.realenv.gitserver import GitDaemon, GitHttpServer

GitServer = GitDaemon | GitHttpServer
SIGNATURE = pygit2.Signature("fleetlet hub", "hub@fleetlet.invalid", 1_700_000_000, 0)


class _PushCallbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    def __init__(self, server: GitServer) -> None:
        super().__init__(
            credentials=pygit2.UserPass(server.username, server.password)
            if isinstance(server, GitHttpServer)
            else None
        )
        self.refused: dict[str, str] = {}

    def push_update_reference(self, refname: str, message: str | None) -> None:
        if message is not None:
            self.refused[refname] = message


class Hub:
    """Publishes cluster branches to a repository on a real server, as the hub does."""

    def __init__(self, server: GitServer, workdir: Path) -> None:
        self.server = server
        self.name = f"fleet-{uuid.uuid4().hex[:12]}.git"
        server.create_bare(self.name)
        self.url = server.url_for(self.name)
        self.repo = pygit2.init_repository(str(workdir / f"hub-{self.name}"), bare=True)
        self.repo.remotes.create("origin", self.url)

    def publish(self, cluster: str, files: Mapping[str, bytes]) -> str:
        """Commit ``files`` (replacing the previous tree) on the cluster's branch and push."""
        ref = f"refs/heads/fleetlet/clusters/{cluster}"
        index = pygit2.Index()
        for path, data in files.items():
            index.add(
                pygit2.IndexEntry(path, self.repo.create_blob(data), pygit2.enums.FileMode.BLOB)
            )
        parents = [self.repo.references[ref].target] if ref in self.repo.references else []
        oid = self.repo.create_commit(
            None, SIGNATURE, SIGNATURE, f"publish {cluster}", index.write_tree(self.repo), parents
        )
        self.repo.references.create(ref, oid, force=True)
        callbacks = _PushCallbacks(self.server)
        self.repo.remotes["origin"].push([ref], callbacks=callbacks)
        assert not callbacks.refused, callbacks.refused
        return str(oid)


def publication(cluster: str, serial: int) -> dict[str, bytes]:
    """The four files of a cluster branch; the set differs per cluster and serial."""
    return {
        "set.yaml": f"cluster: {cluster}\nserial: {serial}\n".encode(),
        "statement.json": f'{{"serial": {serial}}}'.encode(),
        "statement.sigstore.json": b'{"mediaType": "application/vnd.dev.sigstore.bundle"}',
        "proof.json": f'{{"cluster": "{cluster}", "serial": {serial}}}'.encode(),
    }


def credentials_for(server: GitServer) -> GitCredentials | None:
    if isinstance(server, GitHttpServer):
        return GitCredentials(username=server.username, password=server.password)
    return None


@pytest.fixture(params=["git", "http"])
def server(request: pytest.FixtureRequest) -> GitServer:
    """Each test runs over git:// and over smart HTTP with basic auth."""
    found: GitServer = request.getfixturevalue(
        "git_daemon" if request.param == "git" else "git_http"
    )
    return found


@pytest.fixture
def hub(server: GitServer, tmp_path: Path) -> Hub:
    return Hub(server, tmp_path)


def watcher_for(hub: Hub, cluster: str, cache: Path, *, protocol_v2: bool = False) -> BranchWatcher:
    return BranchWatcher(
        repo_url=hub.url,
        cluster=cluster,
        cache_dir=cache,
        credentials=credentials_for(hub.server),
        protocol_v2=protocol_v2,
    )


def fetched_paths(server: GitServer, since: int) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in server.requests(since=since)]


def local_refs(watcher: BranchWatcher) -> set[str]:
    return set(pygit2.Repository(str(watcher.path)).references)


def in_local_odb(watcher: BranchWatcher, oid: str) -> bool:
    return pygit2.Oid(hex=oid) in pygit2.Repository(str(watcher.path)).odb


def blob_id(data: bytes) -> str:
    return str(pygit2.hash(data))


def test_idle_poll_is_one_ref_listing_and_no_fetch(
    server: GitServer, hub: Hub, tmp_path: Path
) -> None:
    tip = hub.publish("edge-1", publication("edge-1", 1))
    watcher = watcher_for(hub, "edge-1", tmp_path / "agent")
    assert watcher.fetch(tip) == publication("edge-1", 1)
    objects_before = sorted(str(o) for o in pygit2.Repository(str(watcher.path)).odb)

    mark = server.request_count()
    assert watcher.poll() == tip
    if isinstance(server, GitDaemon):
        # One upload-pack connection: the ref advertisement, then the client hangs up.
        assert fetched_paths(server, mark) == [("upload-pack", f"/{hub.name}")]
    else:
        # The ref advertisement only (an unauthenticated try, then with credentials): no
        # POST to git-upload-pack, so no negotiation and no pack.
        seen = server.requests(since=mark)
        assert {(r.method, r.path) for r in seen} == {("GET", f"/{hub.name}/info/refs")}
        assert [r.status for r in seen] == [401, 200]
    assert sorted(str(o) for o in pygit2.Repository(str(watcher.path)).odb) == objects_before

    # The commit is known: reading it again costs no request at all.
    mark = server.request_count()
    assert watcher.fetch(tip) == publication("edge-1", 1)
    assert server.request_count() == mark


def v2_requests(server: GitDaemon) -> int:
    return server.log_path.read_text().count('Extended attribute "protocol": version=2')


def test_protocol_v2_poll_asks_for_one_ref(server: GitServer, hub: Hub, tmp_path: Path) -> None:
    tips = {c: hub.publish(c, publication(c, 1)) for c in ("edge-1", "edge-2")}
    watcher = watcher_for(hub, "edge-1", tmp_path / "agent", protocol_v2=True)
    assert watcher.fetch(tips["edge-1"]) == publication("edge-1", 1)
    objects_before = sorted(str(o) for o in pygit2.Repository(str(watcher.path)).odb)

    mark = server.request_count()
    if isinstance(server, GitDaemon):
        v2_before = v2_requests(server)
        assert watcher.poll() == tips["edge-1"]
        assert fetched_paths(server, mark) == [("upload-pack", f"/{hub.name}")]
        assert v2_requests(server) == v2_before + 1
    else:
        assert watcher.poll() == tips["edge-1"]
        # Credentials up front (no 401 round trip); the POST is the ls-refs command.
        seen = server.requests(since=mark)
        assert [(r.method, r.path, r.status) for r in seen] == [
            ("GET", f"/{hub.name}/info/refs", 200),
            ("POST", f"/{hub.name}/git-upload-pack", 200),
        ]
    assert sorted(str(o) for o in pygit2.Repository(str(watcher.path)).odb) == objects_before
    assert watcher_for(hub, "edge-2", tmp_path / "two", protocol_v2=True).poll() == tips["edge-2"]
    assert watcher_for(hub, "edge", tmp_path / "none", protocol_v2=True).poll() is None


def test_protocol_v2_poll_errors_and_fallback(
    git_server_factory: GitServerFactory, git_http: GitHttpServer, tmp_path: Path
) -> None:
    hub = Hub(git_http, tmp_path)
    tip = hub.publish("edge", publication("edge", 1))
    wrong = BranchWatcher(
        repo_url=hub.url,
        cluster="edge",
        cache_dir=tmp_path / "wrong",
        credentials=GitCredentials(username=GIT_USER, password="not-the-password"),
        protocol_v2=True,
    )
    mark = git_http.request_count()
    with pytest.raises(
        GitAuthError, match=f"HTTP 401: .*refused the basic credentials of {GIT_USER}"
    ):
        wrong.poll()
    assert [r.status for r in git_http.requests(since=mark)] == [401]
    anonymous = BranchWatcher(
        repo_url=hub.url, cluster="edge", cache_dir=tmp_path / "anon", protocol_v2=True
    )
    with pytest.raises(GitAuthError, match="none are configured"):
        anonymous.poll()

    # Credentials in the URL, and other schemes (here a local path): the libgit2 listing.
    in_url = hub.url.replace("http://", f"http://{GIT_USER}:{GIT_PASSWORD}@")
    assert (
        BranchWatcher(
            repo_url=in_url, cluster="edge", cache_dir=tmp_path / "in-url", protocol_v2=True
        ).poll()
        == tip
    )
    local = BranchWatcher(
        repo_url=str(git_http.root / hub.name),
        cluster="edge",
        cache_dir=tmp_path / "local",
        protocol_v2=True,
    )
    assert local.poll() == tip

    private = git_server_factory("daemon")
    private_hub = Hub(private, tmp_path)
    private_tip = private_hub.publish("edge", publication("edge", 1))
    watcher = watcher_for(private_hub, "edge", tmp_path / "agent", protocol_v2=True)
    with pytest.raises(GitUnavailableError, match="no such repository"):
        BranchWatcher(
            repo_url=private.url_for("missing.git"),
            cluster="edge",
            cache_dir=tmp_path / "missing",
            protocol_v2=True,
        ).poll()
    private.kill()
    with pytest.raises(GitUnavailableError, match="Connection refused"):
        watcher.poll()
    private.start()
    assert watcher.poll() == private_tip


def test_moved_branch_fetches_only_that_branch(server: GitServer, hub: Hub, tmp_path: Path) -> None:
    first = hub.publish("edge-1", publication("edge-1", 1))
    other_first = hub.publish("edge-2", publication("edge-2", 1))
    watcher = watcher_for(hub, "edge-1", tmp_path / "agent")
    assert watcher.fetch(first)["set.yaml"] == b"cluster: edge-1\nserial: 1\n"

    second = hub.publish("edge-1", publication("edge-1", 2))
    other_second = hub.publish("edge-2", publication("edge-2", 2))
    mark = server.request_count()
    assert watcher.poll() == second
    assert watcher.fetch(second) == publication("edge-1", 2)
    if isinstance(server, GitDaemon):
        # The listing of the poll, and one fetch.
        assert fetched_paths(server, mark) == [("upload-pack", f"/{hub.name}")] * 2
    else:
        posts = [r for r in server.requests(since=mark) if r.method == "POST"]
        assert [(r.path, r.status) for r in posts] == [(f"/{hub.name}/git-upload-pack", 200)]

    assert local_refs(watcher) == {"refs/remotes/origin/fleetlet/clusters/edge-1"}
    assert watcher.local_commit() == second
    for oid in (other_first, other_second, blob_id(b"cluster: edge-2\nserial: 2\n")):
        assert not in_local_odb(watcher, oid)


def test_two_clusters_in_one_repo_each_fetch_their_own(
    server: GitServer, hub: Hub, tmp_path: Path
) -> None:
    tips = {c: hub.publish(c, publication(c, 7)) for c in ("north", "south")}
    hub.repo.references.create("refs/tags/v1", pygit2.Oid(hex=tips["south"]))
    callbacks = _PushCallbacks(server)
    hub.repo.remotes["origin"].push(["refs/tags/v1"], callbacks=callbacks)
    assert not callbacks.refused

    for mine, theirs in (("north", "south"), ("south", "north")):
        watcher = watcher_for(hub, mine, tmp_path / mine)
        commit = watcher.poll()
        assert commit == tips[mine]
        files = watcher.fetch(commit)
        assert files["set.yaml"] == f"cluster: {mine}\nserial: 7\n".encode()
        # Neither the other branch nor the tag pointing at it came over.
        assert local_refs(watcher) == {f"refs/remotes/origin/fleetlet/clusters/{mine}"}
        assert not in_local_odb(watcher, tips[theirs])
        assert not in_local_odb(watcher, blob_id(f"cluster: {theirs}\nserial: 7\n".encode()))
        assert not in_local_odb(watcher, blob_id(publication(theirs, 7)["proof.json"]))


def test_missing_branch_and_missing_file_are_permanent_errors(
    server: GitServer, hub: Hub, tmp_path: Path
) -> None:
    present = hub.publish("present", publication("present", 1))
    absent = watcher_for(hub, "absent", tmp_path / "absent")
    assert absent.poll() is None
    with pytest.raises(BranchNotFoundError, match="fleetlet/clusters/absent does not exist"):
        absent.fetch(present)
    assert local_refs(absent) == set()
    assert not in_local_odb(absent, present)

    partial = publication("partial", 1)
    del partial["proof.json"]
    tip = hub.publish("partial", partial)
    watcher = watcher_for(hub, "partial", tmp_path / "partial")
    with pytest.raises(BranchContentError, match=r"proof\.json is missing") as caught:
        watcher.fetch(tip)
    assert caught.value.reason == "BranchContentInvalid"
    assert isinstance(caught.value, PermanentError)


def test_commit_no_longer_on_the_branch_is_temporary(git_daemon: GitDaemon, tmp_path: Path) -> None:
    hub = Hub(git_daemon, tmp_path)
    hub.publish("c", publication("c", 1))
    watcher = watcher_for(hub, "c", tmp_path / "agent")
    # A commit that exists nowhere (the branch was force-pushed between poll and fetch).
    with pytest.raises(GitUnavailableError, match="no longer on") as caught:
        watcher.fetch("0" * 39 + "1")
    assert caught.value.delay == 0.0
    with pytest.raises(ValueError, match="not a full commit id"):
        watcher.fetch("HEAD")


def test_fetch_is_bounded_in_bytes(git_daemon: GitDaemon, tmp_path: Path) -> None:
    hub = Hub(git_daemon, tmp_path)
    big = {**publication("big", 1), "set.yaml": os.urandom(512 * 1024)}
    tip = hub.publish("big", big)
    watcher = BranchWatcher(
        repo_url=hub.url, cluster="big", cache_dir=tmp_path / "agent", max_fetch_bytes=64 * 1024
    )
    with pytest.raises(FetchTooLargeError, match="exceeds 65536 bytes"):
        watcher.fetch(tip)
    assert local_refs(watcher) == set()


def test_invalid_cluster_name_is_refused(tmp_path: Path) -> None:
    for name in ("", "a/b", "..", "x..y", "bad name", "a.lock"):
        with pytest.raises(ValueError, match="not a valid git branch component"):
            BranchWatcher(repo_url="git://127.0.0.1:1/x.git", cluster=name, cache_dir=tmp_path)


@pytest.mark.parametrize("kind", ["daemon", "http"])
def test_server_down_is_temporary_and_poll_recovers(
    git_server_factory: GitServerFactory, kind: str, tmp_path: Path
) -> None:
    private = git_server_factory(kind)
    hub = Hub(private, tmp_path)
    tip = hub.publish("edge", publication("edge", 1))
    watcher = watcher_for(hub, "edge", tmp_path / "agent")
    assert watcher.poll() == tip

    private.kill()
    with pytest.raises(GitUnavailableError, match="Connection refused") as caught:
        watcher.poll()
    assert isinstance(caught.value, TemporaryError)
    assert caught.value.reason == "GitUnavailable"
    with pytest.raises(GitUnavailableError, match="cannot fetch"):
        watcher.fetch(tip)

    private.start()
    assert watcher.poll() == tip
    assert watcher.fetch(tip) == publication("edge", 1)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server on loopback that accepts connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


@pytest.fixture
def restore_git_timeouts() -> Iterator[None]:
    """libgit2's timeouts are process-wide: put back what the test changed."""
    saved = (pygit2.settings.server_connect_timeout, pygit2.settings.server_timeout)
    yield
    pygit2.settings.server_connect_timeout, pygit2.settings.server_timeout = saved


@pytest.mark.parametrize("protocol_v2", [False, True])
@pytest.mark.parametrize("scheme", ["git", "http"])
def test_silent_server_times_out_as_temporary(
    silent_server: str, scheme: str, protocol_v2: bool, restore_git_timeouts: None, tmp_path: Path
) -> None:
    watcher = BranchWatcher(
        repo_url=f"{scheme}://{silent_server}/fleet.git",
        cluster="edge",
        cache_dir=tmp_path,
        connect_timeout=1.0,
        io_timeout=1.0,
        protocol_v2=protocol_v2,
    )
    with pytest.raises(GitUnavailableError, match="timed out"):
        watcher.poll()


def test_wrong_password_is_a_clear_permanent_error(git_http: GitHttpServer, tmp_path: Path) -> None:
    hub = Hub(git_http, tmp_path)
    tip = hub.publish("edge", publication("edge", 1))
    wrong = BranchWatcher(
        repo_url=hub.url,
        cluster="edge",
        cache_dir=tmp_path / "wrong",
        credentials=GitCredentials(username=GIT_USER, password="not-the-password"),
    )
    for operation in (wrong.poll, lambda: wrong.fetch(tip)):
        mark = git_http.request_count()
        with pytest.raises(GitAuthError, match=f"refused the basic credentials of {GIT_USER}"):
            operation()
        # The v2 poll sends the credentials up front (one request); libgit2 answers the
        # challenge once (two). Never the 15 replays of a plain UserPass.
        statuses = [r.status for r in git_http.requests(since=mark)]
        assert statuses in ([401], [401, 401])
    assert local_refs(wrong) == set()

    anonymous = BranchWatcher(
        repo_url=hub.url, cluster="edge", cache_dir=tmp_path / "anon", protocol_v2=False
    )
    mark = git_http.request_count()
    with pytest.raises(GitAuthError, match="none are configured") as caught:
        anonymous.poll()
    assert caught.value.reason == "GitAuthFailed"
    assert isinstance(caught.value, PermanentError)
    assert [r.status for r in git_http.requests(since=mark)] == [401]


def test_token_and_mounted_secret_credentials(git_http: GitHttpServer, tmp_path: Path) -> None:
    hub = Hub(git_http, tmp_path)
    tip = hub.publish("edge", publication("edge", 1))
    token = GitCredentials(username=GIT_USER, token=GIT_PASSWORD)
    assert BranchWatcher(
        repo_url=hub.url, cluster="edge", cache_dir=tmp_path / "token", credentials=token
    ).fetch(tip) == publication("edge", 1)

    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "username").write_text(GIT_USER + "\n")
    (secret / "password").write_text(GIT_PASSWORD + "\n")
    mounted = GitCredentials.from_files(secret)
    assert mounted.kind == "basic"
    watcher = BranchWatcher(
        repo_url=hub.url, cluster="edge", cache_dir=tmp_path / "mounted", credentials=mounted
    )
    assert watcher.poll() == tip


# --- credentials, without a server ----------------------------------------------------------


def test_credentials_from_env_and_files(tmp_path: Path) -> None:
    env = {"FLEETLET_GIT_USERNAME": "bot", "FLEETLET_GIT_TOKEN": "t0k", "OTHER": "x"}
    creds = GitCredentials.from_env(environ=env)
    assert (creds.kind, creds.username, creds.token) == ("token", "bot", "t0k")
    assert GitCredentials.from_env(environ={}).kind == "none"
    assert "t0k" not in repr(creds)

    key = tmp_path / "ssh-privatekey"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    ssh = GitCredentials.from_files(tmp_path)
    assert ssh.kind == "ssh"
    assert ssh.ssh_key == key

    with pytest.raises(CredentialsConfigError, match="has no password or token"):
        GitCredentials.from_env(environ={"FLEETLET_GIT_USERNAME": "bot"})
    with pytest.raises(CredentialsConfigError, match="not both"):
        GitCredentials(password="p", token="t")
    with pytest.raises(CredentialsConfigError, match="does not exist"):
        GitCredentials.from_files(tmp_path / "missing")


def test_credential_answers_per_kind(tmp_path: Path) -> None:
    types = pygit2.enums.CredentialType
    url = "ssh://git.example.invalid/fleet.git"
    ssh = GitCredentials(ssh_key=tmp_path / "id_ed25519", ssh_user="deploy")
    name = credential_for(ssh, url=url, username_from_url=None, allowed=types.USERNAME)
    assert isinstance(name, pygit2.Username)
    key = credential_for(
        ssh, url=url, username_from_url=None, allowed=types.SSH_KEY | types.USERPASS_PLAINTEXT
    )
    assert isinstance(key, pygit2.Keypair)
    assert key.credential_tuple[0] == "deploy"
    assert key.credential_tuple[2] == str(tmp_path / "id_ed25519")

    token = GitCredentials(token="t0k")
    answer = credential_for(
        token, url=url, username_from_url=None, allowed=types.USERPASS_PLAINTEXT
    )
    assert isinstance(answer, pygit2.UserPass)
    assert answer.credential_tuple == ("x-access-token", "t0k")

    with pytest.raises(GitAuthError, match="refused the token credentials"):
        credential_for(
            token, url=url, username_from_url=None, allowed=types.USERPASS_PLAINTEXT, attempt=2
        )
    with pytest.raises(GitAuthError, match="configured credentials are token"):
        credential_for(token, url=url, username_from_url=None, allowed=types.SSH_KEY)


def test_cache_reused_by_another_cluster_or_broken_is_made_clean(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    hub = Hub(git_daemon, tmp_path)
    tips = {c: hub.publish(c, publication(c, 1)) for c in ("old-name", "new-name")}
    cache = tmp_path / "agent"
    BranchWatcher(repo_url=hub.url, cluster="old-name", cache_dir=cache).fetch(tips["old-name"])

    renamed = BranchWatcher(repo_url=hub.url, cluster="new-name", cache_dir=cache)
    assert local_refs(renamed) == set()
    assert renamed.fetch(tips["new-name"]) == publication("new-name", 1)
    assert local_refs(renamed) == {"refs/remotes/origin/fleetlet/clusters/new-name"}

    (renamed.path / "HEAD").write_text("garbage\n")  # a crash left the cache unreadable
    again = BranchWatcher(repo_url=hub.url, cluster="new-name", cache_dir=cache)
    assert again.fetch(tips["new-name"]) == publication("new-name", 1)


def test_many_publications_hold_a_bounded_number_of_files_and_packs(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    """Each fetch adds a pack file; libgit2 would keep every one open (a descriptor per
    publication ever received) and the cache would keep them all: both are bounded."""
    from agent.source.branch import MAX_OPEN_PACKS
    from tests.test_schedule import publish

    name = f"many-{uuid.uuid4().hex[:8]}.git"
    git_daemon.create_bare(name)
    hub = pygit2.init_repository(str(tmp_path / "hub.git"), bare=True)
    hub.remotes.create("origin", git_daemon.url_for(name))
    watcher = BranchWatcher(
        repo_url=git_daemon.url_for(name),
        cluster="edge",
        cache_dir=tmp_path / "agent",
        recycle_packs=8,
    )
    packs = tmp_path / "agent" / "branch.git" / "objects" / "pack"
    before = len(os.listdir("/proc/self/fd"))
    most = 0
    for serial in range(1, 31):
        commit = publish(hub, git_daemon, "edge", serial)
        assert watcher.poll() == commit
        assert watcher.fetch(commit)["set.yaml"] == f"set.yaml edge {serial}\n".encode()
        most = max(most, len(os.listdir("/proc/self/fd")) - before)
        assert len(list(packs.glob("*.pack"))) <= 8
    assert watcher.fetches == 30
    assert most <= MAX_OPEN_PACKS + 2, most
