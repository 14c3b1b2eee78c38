"""The poll loop: backoff that grows, is capped and resets; one run at a time; recovery by
itself when a real git server comes back; the agent's poll settings."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pygit2
import pytest

from agent.errors import PermanentError, TemporaryError
from agent.schedule import Backoff, OnBranchChange, Poller, RunOutcome
from agent.settings import PollSettings, RepoSettings, Settings, SettingsError
from agent.source.branch import BranchNotFoundError, BranchWatcher, GitUnavailableError
from tests.realenv.git_fixtures import GitServerFactory
from tests.realenv.gitserver import GitDaemon

SIGNATURE = pygit2.Signature("fleetlet hub", "hub@fleetlet.invalid", 1_700_000_000, 0)
FILES = ("set.yaml", "statement.json", "statement.sigstore.json", "proof.json")


def wait_for(condition: Callable[[], bool], *, timeout: float = 60.0, what: str) -> None:
    """Wait until ``condition()`` holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


class Script:
    """A reconcile that raises the queued errors in order, then succeeds."""

    def __init__(self, *errors: BaseException | None) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            error = self.errors.pop(0)
            if error is not None:
                raise error


def delays(poller: Poller, runs: int) -> list[float]:
    return [poller.tick().delay for _ in range(runs)]


# --- backoff, by the delays the poller computes -------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(initial=1.0, maximum=10.0)
    assert [backoff.failure() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    backoff.reset()
    assert backoff.failure() == 1.0
    assert backoff.failure(suggested=3.5) == 3.5
    assert backoff.failure(suggested=1e9) == 10.0
    assert backoff.failure() == 8.0  # suggested delays count as failures too
    for _ in range(2000):  # a very long outage does not overflow
        assert backoff.failure() == 10.0
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial=5.0, maximum=1.0)


def test_poller_backs_off_on_temporary_errors_and_resets_on_success() -> None:
    down = GitUnavailableError("git server down")
    script = Script(down, down, down, down, down, None, down, None)
    poller = Poller(interval=2.0, max_backoff=12.0, reconcile=script)
    assert delays(poller, 8) == [2.0, 4.0, 8.0, 12.0, 12.0, 2.0, 2.0, 2.0]
    assert script.calls == 8
    assert poller.backoff.failures == 0

    # A delay suggested by the failing code is honoured, within the cap.
    script = Script(TemporaryError("busy", delay=5.0), TemporaryError("x", delay=999.0), None)
    poller = Poller(interval=2.0, max_backoff=60.0, reconcile=script)
    assert delays(poller, 3) == [5.0, 60.0, 2.0]


def test_poller_permanent_error_is_reported_and_does_not_back_off() -> None:
    seen: list[RunOutcome] = []
    refused = PermanentError("signature invalid")
    down = TemporaryError("down")
    script = Script(down, down, refused, RuntimeError("bug"), None)
    poller = Poller(interval=3.0, max_backoff=30.0, reconcile=script, on_outcome=seen.append)
    assert delays(poller, 5) == [3.0, 6.0, 3.0, 3.0, 3.0]
    assert [o.error for o in seen] == [down, down, refused, script_error(seen[3]), None]
    assert [o.permanent for o in seen] == [False, False, True, False, False]
    assert poller.last == seen[-1]


def script_error(outcome: RunOutcome) -> BaseException:
    assert isinstance(outcome.error, RuntimeError)
    return outcome.error


def test_jitter_is_added_to_each_wait() -> None:
    values = iter([0.5, 0.25, 0.0])
    poller = Poller(
        interval=10.0,
        jitter=4.0,
        max_backoff=100.0,
        reconcile=Script(None, TemporaryError("x"), None),
        rng=lambda: next(values),
    )
    assert delays(poller, 3) == [12.0, 11.0, 10.0]
    with pytest.raises(ValueError, match="jitter"):
        Poller(interval=1.0, jitter=-1.0, reconcile=Script())
    with pytest.raises(ValueError, match="interval"):
        Poller(interval=0.0, reconcile=Script())


def test_on_branch_change_applies_each_commit_once() -> None:
    branch: list[str | None] = ["c1"]
    applied: list[str] = []
    failures: dict[str, BaseException] = {}

    def apply(commit: str) -> None:
        applied.append(commit)
        if commit in failures:
            raise failures.pop(commit)

    gate = OnBranchChange(poll=lambda: branch[0], apply=apply)
    gate()
    gate()
    assert applied == ["c1"]
    assert gate.settled == "c1"

    # A temporary failure is retried on the next run; a permanent one waits for a new commit.
    branch[0] = "c2"
    failures["c2"] = TemporaryError("registry down")
    with pytest.raises(TemporaryError):
        gate()
    gate()
    assert applied == ["c1", "c2", "c2"]
    branch[0] = "c3"
    failures["c3"] = PermanentError("serial not newer")
    with pytest.raises(PermanentError):
        gate()
    gate()
    assert applied == ["c1", "c2", "c2", "c3"]

    # A deleted branch is reported once, then the gate waits for it to come back.
    branch[0] = None
    with pytest.raises(BranchNotFoundError):
        gate()
    gate()
    branch[0] = "c4"
    gate()
    assert applied[-1] == "c4"

    # Seeded with what the cluster already runs: nothing to do until the branch moves.
    seeded = OnBranchChange(poll=lambda: "c4", apply=apply, settled="c4")
    seeded()
    assert applied[-1] == "c4" and len(applied) == 5


# --- the scheduler, for real ----------------------------------------------------------------


def test_never_two_runs_at_once_and_stop_is_clean() -> None:
    active = 0
    most = 0
    runs = 0
    lock = threading.Lock()

    def slow() -> None:
        nonlocal active, most, runs
        with lock:
            active += 1
            most = max(most, active)
        time.sleep(0.3)  # much longer than the interval
        with lock:
            active -= 1
            runs += 1

    poller = Poller(interval=0.02, max_backoff=1.0, reconcile=slow)
    poller.start()
    try:
        wait_for(lambda: runs >= 3, what="three slow runs")
    finally:
        # As a signal handler would: stop from another thread while the main one waits.
        threading.Thread(target=poller.stop).start()
        assert poller.wait(timeout=60)
    assert most == 1
    assert not poller.running
    stopped_at = poller.runs
    assert active == 0  # stop() waited for the run in progress
    time.sleep(0.1)
    assert poller.runs == stopped_at


def publish(repo: pygit2.Repository, server: GitDaemon, cluster: str, serial: int) -> str:
    ref = f"refs/heads/fleetlet/clusters/{cluster}"
    index = pygit2.Index()
    for name in FILES:
        data = f"{name} {cluster} {serial}\n".encode()
        index.add(pygit2.IndexEntry(name, repo.create_blob(data), pygit2.enums.FileMode.BLOB))
    parents = [repo.references[ref].target] if ref in repo.references else []
    oid = repo.create_commit(None, SIGNATURE, SIGNATURE, "p", index.write_tree(repo), parents)
    repo.references.create(ref, oid, force=True)
    refused: list[str] = []

    class Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
        def push_update_reference(self, refname: str, message: str | None) -> None:
            if message:
                refused.append(message)

    repo.remotes["origin"].push([ref], callbacks=Callbacks())
    assert not refused
    return str(oid)


@pytest.fixture
def private_daemon(git_server_factory: GitServerFactory) -> Iterator[GitDaemon]:
    server = git_server_factory("daemon")
    assert isinstance(server, GitDaemon)
    yield server


def test_poller_recovers_by_itself_when_the_git_server_is_back(
    private_daemon: GitDaemon, tmp_path: Path
) -> None:
    name = f"fleet-{uuid.uuid4().hex[:8]}.git"
    private_daemon.create_bare(name)
    hub = pygit2.init_repository(str(tmp_path / "hub.git"), bare=True)
    hub.remotes.create("origin", private_daemon.url_for(name))
    first = publish(hub, private_daemon, "edge", 1)

    watcher = BranchWatcher(
        repo_url=private_daemon.url_for(name), cluster="edge", cache_dir=tmp_path / "agent"
    )
    received: list[bytes] = []
    outcomes: list[RunOutcome] = []
    gate = OnBranchChange(
        poll=watcher.poll, apply=lambda c: received.append(watcher.fetch(c)["set.yaml"])
    )
    poller = Poller(
        interval=0.1, jitter=0.05, max_backoff=0.4, reconcile=gate, on_outcome=outcomes.append
    )
    with poller:
        wait_for(lambda: received == [b"set.yaml edge 1\n"], what="the first publication")
        # Idle: the poller keeps listing refs without fetching again.
        polls = watcher.polls
        wait_for(lambda: watcher.polls >= polls + 3, what="idle polls")
        assert watcher.fetches == 1
        assert gate.settled == first

        private_daemon.kill()
        wait_for(
            lambda: poller.backoff.failures >= 3, what="three failed polls while the server is down"
        )
        errors = [o.error for o in outcomes if o.error is not None]
        assert all(isinstance(e, GitUnavailableError) for e in errors)
        # The waits grew while the server was down, up to the cap.
        waits = [o.delay for o in outcomes if o.error is not None][:3]
        assert waits[0] < waits[1] < waits[2] <= 0.4 + 0.05

        private_daemon.start()
        second = publish(hub, private_daemon, "edge", 2)
        wait_for(lambda: gate.settled == second, what="the publication made after recovery")
        assert poller.backoff.failures == 0
    assert received == [b"set.yaml edge 1\n", b"set.yaml edge 2\n"]
    assert watcher.fetches == 2


# --- settings -------------------------------------------------------------------------------


def test_settings_from_env(tmp_path: Path) -> None:
    env = {
        "FLEETLET_REPO": "https://git.example.invalid/fleet.git",
        "FLEETLET_CLUSTER": "edge-7",
        "FLEETLET_TRUSTED_ROOT": str(tmp_path / "trusted_root.json"),
        "FLEETLET_IDENTITY": "https://hub.example.invalid/ci",
        "FLEETLET_ISSUER": "https://issuer.example.invalid",
        "FLEETLET_POLL_INTERVAL": "15",
        "FLEETLET_GIT_TOKEN": "t0k",
    }
    settings = Settings.from_env(env)
    assert settings.repo.cluster == "edge-7"
    assert settings.repo.credentials is not None and settings.repo.credentials.kind == "token"
    assert settings.poll.interval == 15.0 and settings.poll.jitter == 5.0
    assert settings.trust.issuer == "https://issuer.example.invalid"
    assert settings.repo.protocol_v2 is True
    assert not Settings.from_env({**env, "FLEETLET_GIT_PROTOCOL_V2": "false"}).repo.protocol_v2
    assert "t0k" not in repr(settings)

    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "username").write_text("bot")
    (secret / "password").write_text("pw")
    mounted = Settings.from_env({**env, "FLEETLET_GIT_CREDENTIALS_DIR": str(secret)})
    assert mounted.repo.credentials is not None and mounted.repo.credentials.kind == "basic"

    with pytest.raises(SettingsError, match="FLEETLET_CLUSTER must be set"):
        Settings.from_env({k: v for k, v in env.items() if k != "FLEETLET_CLUSTER"})
    with pytest.raises(SettingsError, match="FLEETLET_POLL_INTERVAL: expected seconds"):
        Settings.from_env({**env, "FLEETLET_POLL_INTERVAL": "soon"})
    with pytest.raises(SettingsError, match="cluster"):
        RepoSettings(url="git://x/y.git", cluster="a/b")
    with pytest.raises(SettingsError, match="max backoff"):
        PollSettings(interval=60.0, max_backoff=10.0)
