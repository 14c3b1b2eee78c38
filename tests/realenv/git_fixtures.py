"""pytest fixtures: git servers on loopback (``git daemon`` with push, smart HTTP with basic auth).

``git_daemon`` and ``git_http`` are shared by the whole session: do not stop them, and give
each test its own repository name. Tests that take a git server down use
``git_server_factory``, whose servers are killed at the test's end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.realenv.gitserver import GitDaemon, GitHttpServer

GIT_USER = "fleetlet"
GIT_PASSWORD = "git-test-password"

GitServerFactory = Callable[[str], GitDaemon | GitHttpServer]


@pytest.fixture(scope="session")
def git_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitDaemon]:
    """A running ``git daemon`` (git://, push enabled), shared by the session."""
    server = GitDaemon(workdir=tmp_path_factory.mktemp("git-daemon"))
    with server:
        yield server


@pytest.fixture(scope="session")
def git_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitHttpServer]:
    """A running smart HTTP git server with basic auth (GIT_USER/GIT_PASSWORD), shared."""
    server = GitHttpServer(
        workdir=tmp_path_factory.mktemp("git-http"), username=GIT_USER, password=GIT_PASSWORD
    )
    with server:
        yield server


@pytest.fixture
def git_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServerFactory]:
    """Start private git servers: ``factory("daemon")`` or ``factory("http")``; killed at end."""
    started: list[GitDaemon | GitHttpServer] = []

    def factory(kind: str) -> GitDaemon | GitHttpServer:
        workdir = tmp_path_factory.mktemp(f"git-{kind}-private")
        server: GitDaemon | GitHttpServer
        if kind == "daemon":
            server = GitDaemon(workdir=workdir)
        elif kind == "http":
            server = GitHttpServer(workdir=workdir, username=GIT_USER, password=GIT_PASSWORD)
        else:
            raise ValueError(f"unknown git server kind {kind!r}: use 'daemon' or 'http'")
        started.append(server)
        server.start()
        return server

    yield factory
    for server in started:
        server.kill()
