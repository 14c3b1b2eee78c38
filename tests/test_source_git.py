"""git sources against the real servers: a pinned commit and directory over git:// and over
smart HTTP with basic auth; refusals; the cache and the bare repository spare the network."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agent.source.archive import UnsafeArchiveError
from agent.source.cache import ContentCache
from agent.source.compose import ContentStore
from agent.source.content import AuthenticationError, Credentials, FetchError
from agent.source.git import CommitNotFoundError, GitContentError, GitFetcher
from tests.hostile import GIT_TREES, RawEntry, Src, commit_files, commit_raw_tree
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER, GitServerFactory
from tests.realenv.gitserver import GitDaemon, GitHttpServer

BUNDLE = {
    "deploy/01_ns.yaml": b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: g\n",
    "deploy/sub/02_cm.yaml": b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: g\n",
    "README.md": b"not part of the directory\n",
}


def _store(tmp_path: Path) -> ContentStore:
    cache = ContentCache(root=tmp_path / "cache", max_bytes=1 << 26)
    return ContentStore(cache=cache, git=GitFetcher(repos_dir=tmp_path / "repos"))


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_pinned_commit_and_directory_over_git_daemon(git_daemon: GitDaemon, tmp_path: Path) -> None:
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    bare = git_daemon.create_bare(name)
    pinned = commit_files(bare, tmp_path / "work", BUNDLE)
    # A later commit on the branch must not change what the pin names.
    commit_files(bare, tmp_path / "work", {"deploy/01_ns.yaml": b"changed later\n"})
    store = _store(tmp_path)
    source = Src("git", git_daemon.url_for(name), commit=pinned, directory="deploy")
    mark = git_daemon.request_count()

    tree = store.tree(source)
    again = store.tree(source)

    assert _tree(tree) == {
        "01_ns.yaml": BUNDLE["deploy/01_ns.yaml"],
        "sub/02_cm.yaml": BUNDLE["deploy/sub/02_cm.yaml"],
    }
    assert again == tree
    assert len(git_daemon.requests(since=mark)) == 1  # the cached commit cost nothing


def test_other_directory_of_a_fetched_commit_needs_no_fetch(
    git_daemon: GitDaemon, tmp_path: Path
) -> None:
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    bare = git_daemon.create_bare(name)
    pinned = commit_files(bare, tmp_path / "work", BUNDLE)
    fetcher = GitFetcher(repos_dir=tmp_path / "repos")
    fetcher.fetch(
        uri=git_daemon.url_for(name), commit=pinned, directory="deploy", dest=tmp_path / "a"
    )
    mark = git_daemon.request_count()

    fetcher.fetch(uri=git_daemon.url_for(name), commit=pinned, directory=None, dest=tmp_path / "b")

    assert git_daemon.requests(since=mark) == []
    assert fetcher.fetches == 1
    assert _tree(tmp_path / "b") == BUNDLE


def test_pinned_commit_over_http_with_basic_auth(git_http: GitHttpServer, tmp_path: Path) -> None:
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    bare = git_http.create_bare(name)
    pinned = commit_files(bare, tmp_path / "work", BUNDLE)
    store = _store(tmp_path)

    tree = store.compose(
        [
            Src(
                "git",
                git_http.url_for(name),
                commit=pinned,
                directory="deploy",
                auth="git-creds",
                destination="app",
            )
        ],
        tmp_path / "bundle",
        credentials={"git-creds": Credentials(username=GIT_USER, password=GIT_PASSWORD)}.get,
    )

    assert _tree(tree) == {
        "app/01_ns.yaml": BUNDLE["deploy/01_ns.yaml"],
        "app/sub/02_cm.yaml": BUNDLE["deploy/sub/02_cm.yaml"],
    }


@pytest.mark.parametrize("credentials", [None, Credentials(username=GIT_USER, password="wrong")])
def test_http_without_or_with_wrong_password_is_refused(
    git_http: GitHttpServer, tmp_path: Path, credentials: Credentials | None
) -> None:
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    bare = git_http.create_bare(name)
    pinned = commit_files(bare, tmp_path / "work", BUNDLE)
    mark = git_http.request_count()

    with pytest.raises(AuthenticationError) as refused:
        GitFetcher(repos_dir=tmp_path / "repos").fetch(
            uri=git_http.url_for(name),
            commit=pinned,
            directory=None,
            dest=tmp_path / "out",
            credentials=credentials,
        )

    assert refused.value.reason == "AuthenticationFailed"
    assert git_http.url_for(name) in str(refused.value)
    # One challenge and at most one answer: no loop against the server.
    assert 1 <= len(git_http.requests(since=mark)) <= 2


def test_commit_not_on_the_remote(git_daemon: GitDaemon, tmp_path: Path) -> None:
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    bare = git_daemon.create_bare(name)
    commit_files(bare, tmp_path / "work", BUNDLE)
    with pytest.raises(CommitNotFoundError):
        GitFetcher(repos_dir=tmp_path / "repos").fetch(
            uri=git_daemon.url_for(name), commit="0" * 40, directory=None, dest=tmp_path / "out"
        )


def test_missing_directory_is_refused(git_daemon: GitDaemon, tmp_path: Path) -> None:
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    pinned = commit_files(git_daemon.create_bare(name), tmp_path / "work", BUNDLE)
    with pytest.raises(GitContentError) as refused:
        GitFetcher(repos_dir=tmp_path / "repos").fetch(
            uri=git_daemon.url_for(name), commit=pinned, directory="nope", dest=tmp_path / "out"
        )
    assert refused.value.rule == "DirectoryNotFound" and refused.value.file == "nope"


def test_symlink_leaving_the_tree_is_refused(git_daemon: GitDaemon, tmp_path: Path) -> None:
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    pinned = commit_files(
        git_daemon.create_bare(name),
        tmp_path / "work",
        BUNDLE,
        links={"deploy/passwd": "../../../etc/passwd"},
    )
    with pytest.raises(UnsafeArchiveError) as refused:
        GitFetcher(repos_dir=tmp_path / "repos").fetch(
            uri=git_daemon.url_for(name), commit=pinned, directory="deploy", dest=tmp_path / "out"
        )
    assert refused.value.rule == "SymlinkEscapes" and refused.value.file == "passwd"


def test_git_server_down_is_a_temporary_error_then_recovers(
    git_server_factory: GitServerFactory, tmp_path: Path
) -> None:
    server = git_server_factory("daemon")
    name = f"src-{uuid.uuid4().hex[:8]}.git"
    pinned = commit_files(server.create_bare(name), tmp_path / "work", BUNDLE)
    store = _store(tmp_path)
    source = Src("git", server.url_for(name), commit=pinned)
    server.kill()

    with pytest.raises(FetchError) as down:
        store.tree(source)

    assert down.value.reason == "FetchFailed"
    assert server.url_for(name) in str(down.value)
    server.start()
    assert _tree(store.tree(source)) == BUNDLE


@pytest.mark.parametrize(
    ("case", "entries", "rule", "path"), GIT_TREES, ids=[c[0] for c in GIT_TREES]
)
def test_a_hostile_git_tree_is_refused_with_its_rule(
    git_daemon: GitDaemon,
    tmp_path: Path,
    case: str,
    entries: list[RawEntry],
    rule: str,
    path: str,
) -> None:
    # Trees git itself would not write, served by a real git server: each is content
    # refused for good (never a crash, never a temporary error retried forever).
    name = f"hostile-{case}-{uuid.uuid4().hex[:6]}.git"
    pinned = commit_raw_tree(git_daemon.create_bare(name), entries)
    store = _store(tmp_path)
    with pytest.raises(UnsafeArchiveError) as refused:
        store.tree(Src("git", git_daemon.url_for(name), commit=pinned))
    assert refused.value.rule == rule, str(refused.value)
    assert refused.value.file == path
    assert store.cache.keys() == []
