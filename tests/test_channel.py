"""The agents' notification channel (issue 33): a real ``hub serve`` over a real git server.

The hub watches the cluster branches and tells each connected agent ``look`` when its branch
moved; a channel token opens its own cluster's channel and nothing else. The agent
(``agent run --notify-url``) polls when told, polls at its normal interval while the hub is
away, and reconnects: every publication arrives, with or without the hub.
"""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from agent.kube import KubeClient
from agent.schedule import AgentScheduler
from hub.api.tokens import write_clear_tokens
from hub.channel import write_channel_tokens
from tests.fleetlab import REPO_ROOT, Lab, configmap, live, namespace_manifest
from tests.realenv.gitserver import free_port
from tests.realenv.hubserver import serving_hub
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

EDGE1, EDGE2, ADMIN = "edge-1-channel-token", "edge-2-channel-token", "admin-api-token"


class Stream:
    """A channel held open in a thread; ``events`` are the event names received."""

    def __init__(self, base: str, cluster: str, token: str) -> None:
        parts = urlsplit(base)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        self.conn.request(
            "GET",
            f"/api/v1/clusters/{cluster}/events",
            headers={"Authorization": f"Bearer {token}"},
        )
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.content_type = self.response.getheader("content-type")
        self.events: list[str] = []
        self.pings = 0
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        event = ""
        try:
            while line := self.response.readline():
                text = line.decode().rstrip("\r\n")
                if text.startswith("event:"):
                    event = text[6:].strip()
                elif text.startswith(":"):
                    self.pings += 1
                elif not text and event:
                    self.events.append(event)
                    event = ""
        except (OSError, ValueError, AttributeError):
            pass  # closed by the test (http.client has no clean way to interrupt a read)

    def close(self) -> None:
        self.conn.close()


def _wait(predicate: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _move(url: str, cluster: str, work: Path) -> None:
    """Push a new commit to ``cluster``'s branch (what a publish does to it)."""
    if not (work / ".git").exists():
        subprocess.run(["git", "init", "-q", str(work)], check=True)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", f"move {cluster}"], check=True)
    subprocess.run(
        [*git, "push", "-q", "--force", url, f"HEAD:refs/heads/fleetlet/clusters/{cluster}"],
        check=True,
    )


@pytest.fixture
def channel_hub(git_daemon: object, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A hub serving the channel of edge-1 and edge-2; yields (its URL, the branches' repo)."""
    server = git_daemon
    name = f"branches-{tmp_path.name}.git"
    server.create_bare(name)  # type: ignore[attr-defined]
    status = f"status-{tmp_path.name}.git"
    server.create_bare(status)  # type: ignore[attr-defined]
    url = server.url_for(name)  # type: ignore[attr-defined]
    _move(url, "edge-1", tmp_path / "work")
    write_clear_tokens(tmp_path / "tokens.yaml", {ADMIN: "admin"})
    write_channel_tokens(tmp_path / "channel.yaml", {"edge-1": EDGE1, "edge-2": EDGE2})
    extra = ["--tokens", str(tmp_path / "tokens.yaml"), "--channel-tokens",
             str(tmp_path / "channel.yaml"), "--channel-repo", url, "--channel-watch", "200ms",
             "--channel-keepalive", "300ms"]  # fmt: skip
    with serving_hub(server.url_for(status), tmp_path, extra) as hub:  # type: ignore[attr-defined]
        yield hub, url


def test_a_channel_token_opens_its_own_clusters_channel_and_nothing_else(
    channel_hub: tuple[str, str],
) -> None:
    hub, _ = channel_hub
    own = Stream(hub, "edge-1", EDGE1)
    try:
        assert own.status == 200
        assert own.content_type == "text/event-stream"
    finally:
        own.close()
    other = Stream(hub, "edge-2", EDGE1)
    assert other.status == 403
    assert "another cluster" in other.response.read().decode()
    assert Stream(hub, "edge-1", "forged").status == 401
    assert Stream(hub, "edge-1", "").status == 401
    # Not an API token: the rest of the API is closed to it.
    for path in ("/api/v1/clusters", "/api/v1/clusters/edge-1", "/api/v1/installations"):
        answer = requests.get(
            f"{hub}{path}", headers={"Authorization": f"Bearer {EDGE1}"}, timeout=10
        )
        assert answer.status_code == 401, path
    # ...and an admin API token is not a channel token.
    assert Stream(hub, "edge-1", ADMIN).status == 401
    # The API's OpenAPI document lists the channel where it is served, with its answers.
    from openapi_spec_validator import validate as validate_spec

    document = requests.get(
        f"{hub}/api/v1/openapi.json", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    ).json()
    validate_spec(document)
    events = document["paths"]["/api/v1/clusters/{cluster}/events"]["get"]
    assert set(events["responses"]) >= {"200", "401", "403", "503"}
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert (
        requests.get(
            f"{hub}/api/v1/clusters", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        ).status_code
        == 200
    )


def test_a_branch_move_is_told_to_that_clusters_channels_only(
    channel_hub: tuple[str, str], tmp_path: Path
) -> None:
    hub, url = channel_hub
    one, two = Stream(hub, "edge-1", EDGE1), Stream(hub, "edge-2", EDGE2)
    try:
        _wait(lambda: one.pings >= 3 and two.pings >= 3, "both channels open, kept alive")
        _move(url, "edge-2", tmp_path / "work")  # a new branch: edge-2's first publication
        _wait(lambda: two.events == ["look"], "edge-2 told to look")
        _move(url, "edge-1", tmp_path / "work")
        _wait(lambda: one.events == ["look"], "edge-1 told to look")
        # The same wake-up told edge-2 of its move and would have told edge-1 had it moved.
        assert two.events == ["look"]
    finally:
        one.close()
        two.close()


def test_each_hub_replica_learns_of_a_move_from_git_itself(
    channel_hub: tuple[str, str], git_daemon: object, tmp_path: Path
) -> None:
    """Two ``hub serve`` processes, nothing shared between them but the git server: an agent
    is told whichever one it is connected to."""
    first, url = channel_hub
    extra = ["--allow-anonymous", "--channel-tokens", str(tmp_path / "channel.yaml"),
             "--channel-repo", url, "--channel-watch", "200ms"]  # fmt: skip
    (tmp_path / "second").mkdir()
    status = git_daemon.url_for(f"status-{tmp_path.name}.git")  # type: ignore[attr-defined]
    with serving_hub(status, tmp_path / "second", extra) as second:
        one, two = Stream(first, "edge-1", EDGE1), Stream(second, "edge-1", EDGE1)
        try:
            _wait(lambda: one.pings and two.pings, "a channel open on each replica")
            _move(url, "edge-1", tmp_path / "work")
            _wait(lambda: one.events == ["look"] and two.events == ["look"], "both told")
        finally:
            one.close()
            two.close()


def test_a_hub_that_published_lists_the_branches_at_once(
    channel_hub: tuple[str, str], tmp_path: Path
) -> None:
    """A rollout step's publish pokes the watch: the move is listed (from git, as always) and
    told without waiting for the next --channel-watch tick (an hour here)."""
    from hub.channel import BranchWatcher

    _, url = channel_hub
    told: list[list[str]] = []
    watcher = BranchWatcher(urls=[url], moved=told.append, interval=3600)
    watcher.start()
    try:
        _wait(lambda: watcher.listings == 1, "the first listing")
        _move(url, "edge-1", tmp_path / "work")
        time.sleep(1)
        assert told == []  # the next tick is an hour away
        watcher.poke(("edge-1",))
        _wait(lambda: told == [["edge-1"]], "the move told after the poke")
        assert watcher.listings == 2
    finally:
        watcher.stop()


def test_a_flood_of_notifications_gives_one_more_poll_and_the_slow_poll_waits_for_its_time() -> (
    None
):
    """A notification is never trusted: forged, replayed or another cluster's, it can only
    make the agent poll. Those that arrive while a poll runs collapse into one more poll."""
    running, release = threading.Event(), threading.Event()
    polls: list[float] = []

    def poll() -> None:
        polls.append(time.monotonic())
        running.set()
        release.wait(30)

    up = [True]
    scheduler = AgentScheduler(
        poll=poll, drift=lambda: None, heartbeat=None, interval=3600,
        channel_up=lambda: up[0], channel_interval=3600,
    )  # fmt: skip
    scheduler.start()  # the first poll is immediate
    try:
        _wait(running.is_set, "the first poll")
        for _ in range(100):
            scheduler.poll_now()
        release.set()
        _wait(lambda: len(polls) == 2, "the poll the notifications asked for")
        time.sleep(1)
        assert len(polls) == 2
        assert scheduler.told == 1
        # The interval's poll is skipped while the channel is up and the slow poll not due...
        assert scheduler.run("poll") is None
        assert len(polls) == 2
        # ...and runs again at every interval once the channel is down...
        up[0] = False
        assert scheduler.run("poll") is not None
        assert len(polls) == 3
        # ...or while a group waits for a decision made in the cluster (no hub can tell it).
        up[0] = True
        assert scheduler.run("poll") is None
        scheduler.keep_polling = lambda: True
        assert scheduler.run("poll") is not None
        assert len(polls) == 4
    finally:
        scheduler.stop()


def _standbys(parent: int) -> set[int]:
    """The standby workers (``--warm-worker``) of the agent ``parent``."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"agent.runner.worker" in cmdline and b"--standby" in cmdline:
            found.add(int(proc.name))
    return found


def _publish(lab: Lab, name: str, ns: str, value: str) -> None:
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"value": value})}
    digest = lab.push("cfg", files, tag=value)
    lab.publish([{"name": name, "sources": [lab.source("cfg", digest)]}])


def test_a_publish_reaches_the_agent_through_the_channel_and_polling_covers_the_hub_away(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The agent polls every 2 s without the channel and every hour with it: with the channel
    up, only the notification explains a publication applied within the test's timeouts.
    With ``--warm-worker`` a standby worker waits, loaded, and does the next move."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("chan"), lab.name("cfg")
    _publish(lab, name, ns, "one")
    write_clear_tokens(tmp_path / "tokens.yaml", {ADMIN: "admin"})
    write_channel_tokens(tmp_path / "channel.yaml", {"edge-1": EDGE1})
    (tmp_path / "edge-1.token").write_text(EDGE1 + "\n")
    port = free_port()
    hub_args = ["--tokens", str(tmp_path / "tokens.yaml"), "--channel-tokens",
                str(tmp_path / "channel.yaml"), "--channel-repo", lab.url,
                "--channel-watch", "300ms"]  # fmt: skip
    log = tmp_path / "agent.log"

    def value() -> str | None:
        cm = live(kube, "v1", "ConfigMap", "c", ns)
        return None if cm is None else str(cm["data"]["value"])

    def said(text: str) -> int:
        return log.read_text().count(text)

    hub = serving_hub(lab.status_url, tmp_path, hub_args, port=port)
    hub.__enter__()
    agent = subprocess.Popen(
        [sys.executable, "-m", "fleetlet", "agent", "run",
         *lab.agent_args("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent"),
         "--interval", "2", "--jitter", "0.2", "--notify-poll-interval", "3600", "--warm-worker",
         "--notify-url", f"http://127.0.0.1:{port}",
         "--notify-token-file", str(tmp_path / "edge-1.token")],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    try:
        _wait(lambda: value() == "one", "the first publication (the first poll)", 120)
        _wait(lambda: said("notify channel up") == 1, "the channel up")
        time.sleep(3)  # the poll interval passed at least once: quiet while the channel is up
        _wait(lambda: len(_standbys(agent.pid)) == 1, "a standby worker waiting")
        (standby,) = _standbys(agent.pid)
        _publish(lab, name, ns, "two")
        _wait(lambda: value() == "two", "the second publication, told by the channel", 120)
        assert said("notify channel down") == 0, "the channel dropped: polling may explain it"

        # The status document says the channel is up: the hub shows it per cluster and on
        # every installation (`fleetlet installations list`'s CHANNEL column).
        def shown() -> tuple[object, object]:
            auth = {"Authorization": f"Bearer {ADMIN}"}
            base = f"http://127.0.0.1:{port}/api/v1"
            cluster = requests.get(f"{base}/clusters/edge-1", headers=auth, timeout=10).json()
            items = requests.get(f"{base}/installations", headers=auth, timeout=10).json()
            return cluster.get("notifyChannel"), items["items"][0].get("notifyChannel")

        _wait(lambda: shown() == ("up", "up"), "the hub showing the channel up")
        # The standby did the move (it is gone) and another one waits for the next.
        _wait(lambda: _standbys(agent.pid) - {standby}, "the next standby worker")
        assert standby not in _standbys(agent.pid)

        # The hub killed mid-stream: the agent polls at its 2 s interval again.
        hub.__exit__(None, None, None)
        _wait(lambda: said("notify channel down") >= 1, "the agent seeing the channel drop")
        _publish(lab, name, ns, "three")
        _wait(lambda: value() == "three", "the third publication, found by polling", 120)

        # The hub back where it was: the agent reconnects and is told again.
        hub = serving_hub(lab.status_url, tmp_path, hub_args, port=port)
        hub.__enter__()
        _wait(lambda: said("notify channel up") == 2, "the channel up again", 120)
        time.sleep(3)
        downs = said("notify channel down")
        _publish(lab, name, ns, "four")
        _wait(lambda: value() == "four", "the fourth publication, told by the channel", 120)
        assert said("notify channel down") == downs
        waiting = _standbys(agent.pid)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
        _wait(lambda: not any(Path(f"/proc/{p}").exists() for p in waiting), "the standby gone")
    finally:
        hub.__exit__(None, None, None)
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        print(log.read_text()[-5000:])  # shown when the test fails


class ForgedHub:
    """Not the hub: a server that speaks the channel's protocol to whoever connects (no token
    checked) and sends what the test gives it. What a forger or a replaying proxy can do."""

    def __init__(self) -> None:
        import http.server
        import queue

        self.sent: queue.Queue[bytes] = queue.Queue()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b": ping\n\n")
                self.wfile.flush()
                while True:
                    try:
                        body = hub.sent.get(timeout=0.5)
                    except queue.Empty:
                        body = b": ping\n\n"
                    self.wfile.write(body)
                    self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_forged_replayed_and_other_clusters_notifications_cost_at_most_one_ls_refs_each(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    """The agent trusts nothing in a notification: one that names another cluster, one from a
    server that is not the hub, the same one replayed, each makes it list its branch at most
    once (one ``upload-pack`` request to the desired-state repository) and nothing else: no
    fetch, no worker, nothing applied. An event it does not know is ignored."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    ns, name = lab.name("forge"), lab.name("cfg")
    _publish(lab, name, ns, "one")
    forged = ForgedHub()
    (tmp_path / "token").write_text("not-a-channel-token\n")
    log = tmp_path / "agent.log"

    def listings() -> int:
        return sum(
            1
            for r in lab.git.requests()
            if r.method == "upload-pack" and r.path.endswith(lab.repo_name)
        )

    def workers() -> int:
        return log.read_text().count("agent.runner.supervisor")

    def settled() -> int:
        """The listings once none came for 2 s."""
        count, quiet_since = listings(), time.monotonic()
        while time.monotonic() - quiet_since < 2:
            time.sleep(0.2)
            now = listings()
            if now != count:
                count, quiet_since = now, time.monotonic()
        return count

    agent = subprocess.Popen(
        [sys.executable, "-m", "fleetlet", "agent", "run",
         *lab.agent_args("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent"),
         "--interval", "3600", "--notify-poll-interval", "3600",
         "--notify-url", forged.url, "--notify-token-file", str(tmp_path / "token")],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    try:
        _wait(
            lambda: (
                (live(kube, "v1", "ConfigMap", "c", ns) or {}).get("data", {}).get("value") == "one"
            ),
            "the first publication",
            120,
        )
        _wait(lambda: "notify channel up" in log.read_text(), "the (forged) channel up")
        _wait(lambda: workers() >= 1, "the first worker's summary")
        before, ran = settled(), workers()
        applied = live(kube, "v1", "ConfigMap", "c", ns)
        assert applied is not None

        # Another cluster's notification (or one carrying a commit): data is never read.
        forged.sent.put(
            b'event: look\ndata: {"cluster": "edge-2", "commit": "' + b"f" * 40 + b'"}\n\n'
        )
        _wait(lambda: listings() == before + 1, "the one ls-refs it asks for")
        assert settled() == before + 1
        # Replayed five times: each may cost one ls-refs (those arriving while one runs
        # collapse into one more), never a fetch or a worker.
        for _ in range(5):
            forged.sent.put(b"event: look\ndata: \n\n")
        _wait(lambda: listings() > before + 1, "the replays' ls-refs")
        after = settled()
        assert before + 2 <= after <= before + 6
        # An event the agent does not know: nothing at all.
        forged.sent.put(b'event: deploy\ndata: {"manifests": "..."}\n\n')
        time.sleep(2)
        assert settled() == after
        assert workers() == ran, "a notification started a worker"
        now = live(kube, "v1", "ConfigMap", "c", ns)
        assert now is not None
        assert now["metadata"]["resourceVersion"] == applied["metadata"]["resourceVersion"]
        assert "notify channel down" not in log.read_text()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    finally:
        forged.close()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        print(log.read_text()[-5000:])  # shown when the test fails
