"""The real git servers of the test environment, driven through pygit2 (libgit2).

Both transports the agent and hub use are exercised: git:// (``git daemon`` with push) and smart
HTTP with basic auth. Commits are made without a work tree, as the hub makes them.
"""

from __future__ import annotations

import gzip
import http.client
import os
import subprocess
import uuid
from base64 import b64encode
from collections.abc import Iterator, Mapping
from pathlib import Path

import pygit2
import pytest

from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER, GitServerFactory
from tests.realenv.gitserver import GitDaemon, GitHttpServer

SIGNATURE = pygit2.Signature("fleetlet test", "test@fleetlet.invalid", 1_700_000_000, 0)
REFUSE_LOCKED = """#!/bin/sh
# Refuse any update of refs/heads/locked, accept the rest.
while read old new ref; do
  if [ "$ref" = refs/heads/locked ]; then
    echo "branch locked by policy" >&2
    exit 1
  fi
done
exit 0
"""


class PushRejectedError(Exception):
    """The server refused at least one ref update of a push."""


class Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    """Credentials (optional) and a record of what the server said about each pushed ref."""

    def __init__(self, credentials: pygit2.UserPass | None = None) -> None:
        super().__init__(credentials=credentials)
        self.updates: dict[str, str | None] = {}

    def push_update_reference(self, refname: str, message: str | None) -> None:
        # libgit2 reports a server-side refusal only here; push() itself returns normally.
        self.updates[refname] = message


class CredentialsRefusedError(Exception):
    """The server asked again for credentials it had just been given: they are wrong."""


class OneShotCredentials(Callbacks):
    """Offers the credentials once; being asked again means the server refused them."""

    def __init__(self, username: str, password: str) -> None:
        super().__init__()
        self.username = username
        self.password = password
        self.asked = 0

    def credentials(
        self, url: str, username_from_url: str | None, allowed_types: int
    ) -> pygit2.UserPass:
        self.asked += 1
        if self.asked > 1:
            raise CredentialsRefusedError(
                f"{url}: server refused the credentials of {self.username}"
            )
        return pygit2.UserPass(self.username, self.password)


def push(remote: pygit2.Remote, specs: list[str], callbacks: Callbacks) -> None:
    """Push and raise PushRejectedError if the server refused any ref update."""
    remote.push(specs, callbacks=callbacks)
    refused = {ref: msg for ref, msg in callbacks.updates.items() if msg is not None}
    if refused:
        raise PushRejectedError(f"{remote.url}: server rejected {refused}")


def commit_files(
    repo: pygit2.Repository, ref: str, files: Mapping[str, bytes], message: str
) -> pygit2.Oid:
    """Commit ``files`` on top of ``ref`` (if it exists) without a work tree; move ``ref``."""
    index = pygit2.Index()
    parents: list[pygit2.Oid] = []
    if ref in repo.references:
        parent = repo.references[ref].peel(pygit2.Commit)
        parents.append(parent.id)
        index.read_tree(parent.tree)
    for path, data in files.items():
        index.add(pygit2.IndexEntry(path, repo.create_blob(data), pygit2.enums.FileMode.BLOB))
    tree = index.write_tree(repo)
    oid = repo.create_commit(None, SIGNATURE, SIGNATURE, message, tree, parents)
    repo.references.create(ref, oid, force=True)
    return oid


def file_at(repo: pygit2.Repository, rev: str, path: str) -> bytes:
    blob = repo.revparse_single(f"{rev}:{path}")
    assert isinstance(blob, pygit2.Blob)
    return bytes(blob.data)


GitServer = GitDaemon | GitHttpServer


@pytest.fixture(params=["git", "http"])
def server(request: pytest.FixtureRequest) -> GitServer:
    """Each test runs once over git:// and once over smart HTTP with basic auth."""
    name = "git_daemon" if request.param == "git" else "git_http"
    found: GitServer = request.getfixturevalue(name)
    return found


def credentials_for(server: GitServer) -> pygit2.UserPass | None:
    if isinstance(server, GitHttpServer):
        return pygit2.UserPass(server.username, server.password)
    return None


@pytest.fixture
def repo_name() -> str:
    return f"fleet-{uuid.uuid4().hex[:12]}.git"


@pytest.fixture
def publisher(server: GitServer, repo_name: str, tmp_path: Path) -> Iterator[pygit2.Repository]:
    """A local bare repository with ``origin`` pointing at a fresh repository on the server."""
    server.create_bare(repo_name)
    repo = pygit2.init_repository(str(tmp_path / "publisher.git"), bare=True)
    repo.remotes.create("origin", server.url_for(repo_name))
    yield repo
    repo.free()


def test_clone_incremental_fetch_and_push(
    server: GitServer, publisher: pygit2.Repository, repo_name: str, tmp_path: Path
) -> None:
    creds = credentials_for(server)
    first = commit_files(
        publisher, "refs/heads/main", {"clusters/a/set.yaml": b"serial: 1\n"}, "one"
    )
    callbacks = Callbacks(creds)
    push(publisher.remotes["origin"], ["refs/heads/main"], callbacks)
    assert callbacks.updates == {"refs/heads/main": None}

    clone = pygit2.clone_repository(
        server.url_for(repo_name),
        str(tmp_path / "agent.git"),
        bare=True,
        callbacks=Callbacks(creds),
    )
    assert clone.references["refs/remotes/origin/main"].target == first
    assert file_at(clone, "refs/remotes/origin/main", "clusters/a/set.yaml") == b"serial: 1\n"

    # Someone else publishes a second commit: one new file in the same directory.
    second = commit_files(publisher, "refs/heads/main", {"clusters/a/statement.json": b"{}"}, "two")
    push(publisher.remotes["origin"], ["refs/heads/main"], Callbacks(creds))
    progress = clone.remotes["origin"].fetch(callbacks=Callbacks(creds))
    # Only what the second commit added: the commit, three trees (/, clusters, clusters/a) and
    # the new blob. Nothing of the first commit travels again.
    assert progress.received_objects == 5
    assert clone.references["refs/remotes/origin/main"].target == second
    assert file_at(clone, "refs/remotes/origin/main", "clusters/a/statement.json") == b"{}"

    # The agent pushes status to its own branch.
    status = commit_files(clone, "refs/heads/status", {"status.yaml": b"phase: Ready\n"}, "st")
    callbacks = Callbacks(creds)
    push(clone.remotes["origin"], ["refs/heads/status:refs/heads/fleetlet/status/a"], callbacks)
    assert callbacks.updates == {"refs/heads/fleetlet/status/a": None}
    on_server = pygit2.Repository(str(server.root / repo_name))
    assert on_server.references["refs/heads/fleetlet/status/a"].target == status
    assert on_server.references["refs/heads/main"].target == second


def test_list_heads_finds_one_branch_without_fetching(
    server: GitServer, publisher: pygit2.Repository, repo_name: str, tmp_path: Path
) -> None:
    creds = credentials_for(server)
    tips = {
        ref: commit_files(publisher, ref, {"set.yaml": ref.encode()}, ref)
        for ref in ("refs/heads/fleetlet/clusters/a", "refs/heads/fleetlet/clusters/b")
    }
    push(publisher.remotes["origin"], list(tips), Callbacks(creds))

    agent = pygit2.init_repository(str(tmp_path / "agent.git"), bare=True)
    remote = agent.remotes.create("origin", server.url_for(repo_name))
    mark = server.request_count()
    heads = remote.list_heads(callbacks=Callbacks(creds))
    mine = [h for h in heads if h.name == "refs/heads/fleetlet/clusters/b"]
    assert len(mine) == 1
    assert mine[0].oid == tips["refs/heads/fleetlet/clusters/b"]
    # A ref listing only: no object came over, no pack was asked for.
    assert mine[0].oid not in agent.odb
    seen = server.requests(since=mark)
    if isinstance(server, GitDaemon):
        assert [(r.method, r.path) for r in seen] == [("upload-pack", f"/{repo_name}")]
    else:
        assert {r.path for r in seen} == {f"/{repo_name}/info/refs"}
        assert seen[-1].status == 200


def test_refused_push_is_detected(server: GitServer, repo_name: str, tmp_path: Path) -> None:
    creds = credentials_for(server)
    server.create_bare(repo_name, hooks={"pre-receive": REFUSE_LOCKED})
    repo = pygit2.init_repository(str(tmp_path / "publisher.git"), bare=True)
    remote = repo.remotes.create("origin", server.url_for(repo_name))
    commit_files(repo, "refs/heads/locked", {"x": b"x"}, "x")

    callbacks = Callbacks(creds)
    remote.push(["refs/heads/locked"], callbacks=callbacks)  # returns normally...
    assert callbacks.updates == {"refs/heads/locked": "pre-receive hook declined"}
    with pytest.raises(PushRejectedError, match="pre-receive hook declined"):
        push(remote, ["refs/heads/locked"], Callbacks(creds))
    assert "refs/heads/locked" not in pygit2.Repository(str(server.root / repo_name)).references


def test_non_fast_forward_is_refused(server: GitServer, repo_name: str, tmp_path: Path) -> None:
    creds = credentials_for(server)
    server.create_bare(repo_name, config={"receive.denyNonFastForwards": "true"})
    repo = pygit2.init_repository(str(tmp_path / "publisher.git"), bare=True)
    remote = repo.remotes.create("origin", server.url_for(repo_name))
    base = commit_files(repo, "refs/heads/main", {"a": b"1"}, "base")
    ahead = commit_files(repo, "refs/heads/main", {"a": b"2"}, "ahead")
    push(remote, ["refs/heads/main"], Callbacks(creds))

    # A rewritten history: libgit2 itself refuses a non-forced non-fast-forward...
    diverged = repo.create_commit(
        None, SIGNATURE, SIGNATURE, "diverged", repo[ahead].peel(pygit2.Commit).tree_id, [base]
    )
    repo.references.create("refs/heads/main", diverged, force=True)
    with pytest.raises(pygit2.GitError, match="non-fastforwardable"):
        push(remote, ["refs/heads/main"], Callbacks(creds))
    # ...and a forced one is refused by the server, reported only through the callback.
    with pytest.raises(PushRejectedError, match="refs/heads/main"):
        push(remote, ["+refs/heads/main"], Callbacks(creds))
    assert pygit2.Repository(str(server.root / repo_name)).references["refs/heads/main"].target == (
        ahead
    )


def _http_repo(git_http: GitHttpServer, tmp_path: Path) -> tuple[str, pygit2.Remote]:
    name = f"private-{uuid.uuid4().hex[:12]}.git"
    git_http.create_bare(name)
    owner = pygit2.init_repository(str(tmp_path / "owner.git"), bare=True)
    commit_files(owner, "refs/heads/main", {"secret.yaml": b"s: 1\n"}, "s")
    owner_remote = owner.remotes.create("origin", git_http.url_for(name))
    push(owner_remote, ["refs/heads/main"], Callbacks(pygit2.UserPass(GIT_USER, GIT_PASSWORD)))
    stranger = pygit2.init_repository(str(tmp_path / "stranger.git"), bare=True)
    return name, stranger.remotes.create("origin", git_http.url_for(name))


def test_http_refuses_missing_credentials(git_http: GitHttpServer, tmp_path: Path) -> None:
    name, remote = _http_repo(git_http, tmp_path)
    mark = git_http.request_count()
    with pytest.raises(pygit2.AuthError, match="authentication required"):
        remote.fetch()
    seen = git_http.requests(since=mark)
    assert [(r.path, r.status) for r in seen] == [(f"/{name}/info/refs", 401)]


def test_http_refuses_wrong_password(git_http: GitHttpServer, tmp_path: Path) -> None:
    name, remote = _http_repo(git_http, tmp_path)

    # Static credentials: libgit2 replays them a bounded number of times, then gives up.
    mark = git_http.request_count()
    with pytest.raises(pygit2.GitError, match="authentication replays"):
        remote.fetch(callbacks=Callbacks(pygit2.UserPass(GIT_USER, "wrong")))
    seen = git_http.requests(since=mark)
    assert 0 < len(seen) <= 16  # libgit2's replay limit is 15: no endless loop
    assert {r.status for r in seen} == {401}

    # Credentials offered once: the second ask is the refusal, named as such.
    mark = git_http.request_count()
    with pytest.raises(CredentialsRefusedError, match=f"refused the credentials of {GIT_USER}"):
        remote.fetch(callbacks=OneShotCredentials(GIT_USER, "wrong"))
    assert [r.status for r in git_http.requests(since=mark)] == [401, 401]

    # A push with a wrong password changes nothing on the server.
    repo = pygit2.init_repository(str(tmp_path / "pusher.git"), bare=True)
    commit_files(repo, "refs/heads/main", {"evil": b"x"}, "evil")
    pusher = repo.remotes.create("origin", git_http.url_for(name))
    before = pygit2.Repository(str(git_http.root / name)).references["refs/heads/main"].target
    with pytest.raises(CredentialsRefusedError):
        pusher.push(["+refs/heads/main"], callbacks=OneShotCredentials(GIT_USER, "wrong"))
    after = pygit2.Repository(str(git_http.root / name)).references["refs/heads/main"].target
    assert after == before


def test_git_cli_clones_and_pushes_over_http(git_http: GitHttpServer, tmp_path: Path) -> None:
    """The bridge also serves the git CLI (protocol v2, its own request shapes)."""
    name = f"cli-{uuid.uuid4().hex[:12]}.git"
    git_http.create_bare(name)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }
    url = git_http.url_for(name).replace("http://", f"http://{GIT_USER}:{GIT_PASSWORD}@")
    work = tmp_path / "work"

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    git("clone", "--quiet", url, str(work))
    (work / "a.yaml").write_text("a: 1\n")
    git("-C", str(work), "add", "a.yaml")
    git("-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    git("-C", str(work), "push", "--quiet", "origin", "HEAD:refs/heads/main")
    head = git("-C", str(work), "rev-parse", "HEAD").strip()
    assert git("ls-remote", url, "refs/heads/main").split() == [head, "refs/heads/main"]


def test_http_bridge_decodes_chunked_and_gzip_bodies(
    git_http: GitHttpServer, tmp_path: Path
) -> None:
    """A fetch request sent gzip-compressed with chunked transfer encoding gets its pack."""
    name, _ = _http_repo(git_http, tmp_path)
    tip = pygit2.Repository(str(git_http.root / name)).references["refs/heads/main"].target

    def pkt(line: str) -> bytes:
        return f"{len(line) + 4:04x}{line}".encode()

    body = gzip.compress(pkt(f"want {tip}\n") + b"0000" + pkt("done\n"))
    chunks = [body[i : i + 17] for i in range(0, len(body), 17)]
    token = b64encode(f"{GIT_USER}:{GIT_PASSWORD}".encode()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", git_http.port, timeout=30)
    try:
        conn.request(
            "POST",
            f"/{name}/git-upload-pack",
            body=iter(chunks),
            headers={
                "Authorization": f"Basic {token}",
                "Content-Type": "application/x-git-upload-pack-request",
                "Content-Encoding": "gzip",
                "Transfer-Encoding": "chunked",
            },
            encode_chunked=True,
        )
        response = conn.getresponse()
        payload = response.read()
    finally:
        conn.close()
    assert response.status == 200
    assert response.getheader("Content-Type") == "application/x-git-upload-pack-result"
    assert payload.startswith(b"0008NAK\n")
    assert b"PACK" in payload


@pytest.mark.parametrize("kind", ["daemon", "http"])
def test_server_down_then_back_on_same_address(
    git_server_factory: GitServerFactory, kind: str, tmp_path: Path
) -> None:
    private = git_server_factory(kind)
    creds = credentials_for(private)
    private.create_bare("fleet.git")
    repo = pygit2.init_repository(str(tmp_path / "publisher.git"), bare=True)
    remote = repo.remotes.create("origin", private.url_for("fleet.git"))
    tip = commit_files(repo, "refs/heads/main", {"a": b"1"}, "a")
    push(remote, ["refs/heads/main"], Callbacks(creds))

    private.kill()
    # A fresh Remote object: libgit2 keeps transport state in the one that pushed.
    with pytest.raises(pygit2.GitError, match=r"failed to connect.*Connection refused"):
        repo.remotes["origin"].list_heads(callbacks=Callbacks(creds))

    url = private.url_for("fleet.git")
    private.start()
    assert private.url_for("fleet.git") == url
    heads = {h.name: h.oid for h in repo.remotes["origin"].list_heads(callbacks=Callbacks(creds))}
    assert heads["refs/heads/main"] == tip
