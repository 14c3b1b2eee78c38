"""The hub under load (issue 37): ``python -m hub.serve`` (uvicorn, a real port) over a real
``git daemon``, loaded by many threads while agents' status moves.

Agents put a summary of their document in each status commit and the daemon filters
(``uploadpack.allowFilter``), so the hub fetches commits only and a page's documents on
demand: the path this exercises. Also: every list paged, bounded selectors, a slow client cut
off by the header timeout, a busy or stalled hub answering 503 with Retry-After, two replicas
answering alike.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from hub.api.tokens import write_clear_tokens
from tests.realenv.gitserver import GitDaemon
from tests.realenv.hubserver import serving_hub
from tests.statusfleet import cluster_document, synthetic_fleet
from tests.test_hub_status import StatusPusher, new_repo

TOKEN = "load-token-0123456789"
CLUSTERS = 40


@dataclass
class Fleet:
    repo: str
    pusher: StatusPusher
    states: dict[str, dict[str, str]]
    sequence: Counter[str]
    tokens: Path

    def move(self, names: list[str]) -> None:
        """New documents for ``names`` (one push, as their agents would)."""
        for name in names:
            self.sequence[name] += 1
        self.pusher.push(
            {n: cluster_document(n, self.states[n], sequence=self.sequence[n]) for n in names}
        )


def _fleet(server: GitDaemon, workdir: Path, stem: str) -> Fleet:
    tokens = workdir / "tokens.yaml"
    write_clear_tokens(tokens, {TOKEN: "read"})
    repo = new_repo(server, stem)
    clusters = synthetic_fleet(CLUSTERS, bundles=6)
    fleet = Fleet(
        repo,
        StatusPusher(repo, workdir / "agents"),
        {c.name: c.states for c in clusters},
        Counter(),
        tokens,
    )
    fleet.move(sorted(fleet.states))
    return fleet


def _get(url: str, path: str, **params: Any) -> requests.Response:
    return requests.get(
        url + path, params=params, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitDaemon]:
    """A git daemon of this module's own: the tests stop and freeze it."""
    with GitDaemon(workdir=tmp_path_factory.mktemp("load-daemon")) as server:
        yield server  # type: ignore[misc]


@pytest.mark.parametrize("workers", [1, 2])
def test_many_threads_load_pages_while_status_moves(
    daemon: GitDaemon, tmp_path: Path, workers: int
) -> None:
    fleet = _fleet(daemon, tmp_path, "load")
    names = sorted(fleet.states)
    extra = ["--tokens", str(fleet.tokens), "--workers", str(workers)]
    with serving_hub(fleet.repo, tmp_path, extra, refresh="200ms") as url:
        stop = threading.Event()
        answers: Counter[int] = Counter()
        problems: list[str] = []
        lock = threading.Lock()

        def agents() -> None:
            # 10% of the clusters move every 0.2 s, 40 times.
            rng = random.Random(1)
            for _ in range(40):
                if stop.is_set():
                    return
                fleet.move(rng.sample(names, CLUSTERS // 10))
                time.sleep(0.2)

        def client(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(40):
                name = rng.choice(names)
                bundle = rng.choice(sorted(fleet.states[name]))
                path, params = rng.choice(
                    [
                        ("/api/v1/installations", {"offset": rng.randrange(200), "limit": 50}),
                        ("/api/v1/installations", {"cluster": name}),
                        (f"/api/v1/installations/{name}/{bundle}", {}),
                        (f"/api/v1/installations/{name}/{bundle}/runs", {}),
                        (f"/api/v1/clusters/{name}", {}),
                        ("/api/v1/matrix", {"label": "region=eu", "limit": 20}),
                    ]
                )
                answer = _get(url, path, **params)
                with lock:
                    answers[answer.status_code] += 1
                    if answer.status_code != 200:
                        problems.append(f"{path} {params}: {answer.status_code} {answer.text}")
                    elif path == "/api/v1/installations" and "cluster" in params:
                        # The documents were fetched on demand: every installation is there.
                        got = {i["bundle"] for i in answer.json()["items"]}
                        if got != set(fleet.states[name]):
                            problems.append(f"{name}: installations {got}")

        pushing = threading.Thread(target=agents)
        pushing.start()
        clients = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        stop.set()
        pushing.join()
        assert problems == [], problems[:5]
        assert answers == {200: 16 * 40}
        assert _get(url, "/healthz").status_code == 200  # alive
    log = (tmp_path / "hub.log").read_text()
    assert "Traceback" not in log and "Error" not in log, log[-3000:]
    # Pack files stored by many threads at once: none left half-written.
    packs = tmp_path / "cache" / "status.git" / "objects" / "pack"
    assert [p.name for p in packs.iterdir() if p.name.startswith("tmp_")] == []


def test_two_replicas_answer_alike(daemon: GitDaemon, tmp_path: Path) -> None:
    fleet = _fleet(daemon, tmp_path, "replicas")
    fleet.move(sorted(fleet.states)[:5])
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    extra = ["--tokens", str(fleet.tokens)]
    with serving_hub(fleet.repo, one, extra) as a, serving_hub(fleet.repo, two, extra) as b:
        for path, params in [
            ("/api/v1/matrix", {"limit": 500}),
            ("/api/v1/matrix", {"label": "tier=store", "state": "Degraded"}),
            ("/api/v1/installations", {"limit": 500}),
            ("/api/v1/installations", {"cluster": "store-eu-002"}),
            ("/api/v1/installations/store-eu-002/shop-frontend", {}),
        ]:
            first, second = _get(a, path, **params), _get(b, path, **params)
            assert first.status_code == second.status_code == 200
            assert _without_ages(first.json()) == _without_ages(second.json()), path


def _without_ages(value: Any) -> Any:
    """An answer without the heartbeats' ages (they are computed at each answer)."""
    if isinstance(value, dict):
        return {k: _without_ages(v) for k, v in value.items() if k != "heartbeatAgeSeconds"}
    if isinstance(value, list):
        return [_without_ages(v) for v in value]
    return value


def test_lists_are_paged_and_selectors_bounded(daemon: GitDaemon, tmp_path: Path) -> None:
    fleet = _fleet(daemon, tmp_path, "bounds")
    with serving_hub(fleet.repo, tmp_path, ["--tokens", str(fleet.tokens)]) as url:
        unpaged = _get(url, "/api/v1/installations").json()
        assert (len(unpaged["items"]), unpaged["limit"], unpaged["offset"]) == (100, 100, 0)
        assert unpaged["total"] > 100
        assert _get(url, "/api/v1/clusters").json()["limit"] == 100
        for path in ("/api/v1/installations", "/api/v1/clusters", "/api/v1/matrix"):
            answer = _get(url, path, limit=501)
            assert answer.status_code == 400
            assert answer.json() == {"error": "limit must be between 1 and 500, got 501"}
        many = ",".join(f"k{i}=v" for i in range(21))
        answer = _get(url, "/api/v1/matrix", label=many)
        assert (answer.status_code, answer.json()) == (
            400,
            {"error": "label filter: 21 requirements, at most 20 are accepted"},
        )
        long = "region in (" + "eu," * 400 + "us)"
        answer = _get(url, "/api/v1/matrix", label=long)
        assert (answer.status_code, answer.json()) == (
            400,
            {"error": f"label must be at most 1024 characters, got {len(long)}"},
        )
        document = _get(url, "/api/v1/openapi.json").json()
        limit = next(
            p
            for p in document["paths"]["/api/v1/installations"]["get"]["parameters"]
            if p["name"] == "limit"
        )
        assert (limit["schema"]["default"], limit["schema"]["maximum"]) == (100, 500)


def _slow_headers(port: int, *, pause: float) -> tuple[bytes, int]:
    """Send a request's headers a byte every ``pause`` seconds until the server answers or
    closes; (what it answered, how many bytes of the headers were sent)."""
    headers = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 400
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.settimeout(pause)
        for sent, byte in enumerate(headers):
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                return b"", sent
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return b"", sent
            return answer, sent
    return b"", len(headers)


def test_a_slow_client_is_cut_off_by_the_header_timeout(daemon: GitDaemon, tmp_path: Path) -> None:
    fleet = _fleet(daemon, tmp_path, "slowloris")
    extra = ["--tokens", str(fleet.tokens), "--header-timeout", "1s"]
    with serving_hub(fleet.repo, tmp_path, extra) as url:
        port = int(url.rsplit(":", 1)[1])
        answer, sent = _slow_headers(port, pause=0.05)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert b"the request headers took too long to come" in answer
        assert sent < 400  # cut off long before the headers ended
        # A connection that says nothing is closed too; a normal client is unaffected.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
            assert idle.recv(4096).startswith(b"HTTP/1.1 408")
            assert idle.recv(4096) == b""
        assert _get(url, "/api/v1/clusters").status_code == 200


def test_documents_that_cannot_be_fetched_give_503_with_retry_after(
    daemon: GitDaemon, tmp_path: Path
) -> None:
    fleet = _fleet(daemon, tmp_path, "unfetchable")
    extra = ["--tokens", str(fleet.tokens), "--request-timeout", "2s"]
    extra += ["--concurrency", "1", "--queue", "0"]
    names = iter(sorted(fleet.states))
    with serving_hub(fleet.repo, tmp_path, extra, refresh="1h") as url:
        # A hung server: the page that needs a document gets 503 when its time is up, and
        # meanwhile the one place is taken: another request is told the hub is busy.
        daemon.freeze()
        try:
            slow: list[requests.Response] = []
            cluster = next(names)

            def page() -> None:
                for _ in range(400):  # until it has the place (the other client may have it)
                    slow[:] = [_get(url, "/api/v1/installations", cluster=cluster)]
                    if "busy" not in slow[0].text:
                        return

            waiting = threading.Thread(target=page)
            waiting.start()
            busy = None
            while waiting.is_alive() and busy is None:
                answer = _get(url, f"/api/v1/clusters/{sorted(fleet.states)[0]}")
                if answer.status_code == 503:
                    busy = answer
                time.sleep(0.01)
            waiting.join()
        finally:
            daemon.thaw()
        assert busy is not None, (slow[0].status_code, slow[0].text, answer.status_code)
        assert busy.headers["Retry-After"] == "1"
        assert busy.json()["error"].startswith("the hub is busy: 1 API requests in progress")
        assert slow[0].status_code == 503 and slow[0].headers["Retry-After"] == "5"
        assert slow[0].json() == {
            "error": "no answer within 2s (the hub is overloaded or a git server is slow); "
            "retry later"
        }
        # A server that is down: 503 at once, with the reason and a Retry-After.
        daemon.stop()
        try:
            answer = _get(url, "/api/v1/installations", cluster=next(names))
            assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
            assert answer.json()["error"].startswith(
                f"status documents of {fleet.repo} cannot be fetched now: "
            )
            # ... and pages whose documents are at hand are still answered.
            assert _get(url, f"/api/v1/clusters/{sorted(fleet.states)[0]}").status_code == 200
        finally:
            daemon.start()
        # Back: after the Retry-After, the page is answered.
        cluster = next(names)
        for _ in range(200):
            answer = _get(url, "/api/v1/installations", cluster=cluster)
            if answer.status_code != 503:
                break
            time.sleep(0.1)
        assert answer.status_code == 200 and answer.json()["items"]
    assert "Traceback" not in (tmp_path / "hub.log").read_text()


def _processes_of(port: int) -> list[str]:
    """The command lines of the hub serving ``port`` and of its children."""
    found: dict[int, tuple[int, str]] = {}  # pid -> (parent, command line)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError, IndexError):
                continue
            found[int(entry.name)] = (parent, command)
    hub = next(
        pid for pid, (_, cmd) in found.items() if "hub.serve" in cmd and f"127.0.0.1:{port}" in cmd
    )
    return [found[hub][1]] + [cmd for parent, cmd in found.values() if parent == hub]


def test_worker_processes_serve_one_shared_view(daemon: GitDaemon, tmp_path: Path) -> None:
    fleet = _fleet(daemon, tmp_path, "workers")
    names = sorted(fleet.states)
    (tmp_path / "multi").mkdir()
    (tmp_path / "single").mkdir()
    extra = ["--tokens", str(fleet.tokens)]
    with (
        serving_hub(fleet.repo, tmp_path / "multi", [*extra, "--workers", "2"]) as multi,
        serving_hub(fleet.repo, tmp_path / "single", extra) as single,
    ):
        commands = _processes_of(int(multi.rsplit(":", 1)[1]))
        assert sum("multiprocessing" in c and "spawn" in c for c in commands) >= 2, commands
        # Status moves: every worker shows it (each request a new connection: any worker).
        moved = names[:4]
        fleet.move(moved)
        for _ in range(300):
            seen = [_get(multi, f"/api/v1/clusters/{n}").json()["sequence"] for n in moved * 3]
            if seen == [2] * 12:
                break
            time.sleep(0.1)
        assert seen == [2] * 12
        for _ in range(300):
            if _get(single, f"/api/v1/clusters/{moved[-1]}").json()["sequence"] == 2:
                break
            time.sleep(0.1)
        # ... and they answer as one hub does.
        for path, params in [
            ("/api/v1/matrix", {"limit": 500}),
            ("/api/v1/installations", {"limit": 500}),
            (f"/api/v1/installations/{moved[0]}/shop-frontend", {}),
        ]:
            answers = [_get(url, path, **params) for url in (multi, multi, single)]
            assert [a.status_code for a in answers] == [200] * 3
            assert _without_ages(answers[0].json()) == _without_ages(answers[2].json()), path
            assert _without_ages(answers[1].json()) == _without_ages(answers[2].json()), path
    log = (tmp_path / "multi" / "hub.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_a_following_view_reads_moves_and_removals_from_the_shared_file(
    daemon: GitDaemon, tmp_path: Path
) -> None:
    from hub.status.aggregate import FleetStatus

    fleet = _fleet(daemon, tmp_path, "follow")
    names = sorted(fleet.states)
    writer = FleetStatus(repo_url=fleet.repo, cache_dir=tmp_path / "cache")
    writer.refresh()
    reader = FleetStatus(repo_url=fleet.repo, cache_dir=tmp_path / "cache", follow=True)
    assert reader.names() == names
    assert reader.refresh().moved == []  # nothing new since it loaded the file
    fleet.move(names[:3])
    fleet.pusher.repo.remotes.create_anonymous(fleet.repo).push(
        [f":refs/heads/fleetlet/status/{names[-1]}"]
    )
    writer.refresh()
    result = reader.refresh()
    assert (result.moved, result.removed) == (names[:3], [names[-1]])
    assert reader.names() == writer.names() == names[:-1]
    assert [reader.view(n) for n in names[:3]] == [writer.view(n) for n in names[:3]]
    # A document is read by the follower from the shared cache (fetched there if missing).
    assert reader.document(names[0]) == writer.document(names[0])
    assert reader.document(names[0])["sequence"] == 2
