"""The agent's jobs: backoff that grows, is capped and resets; poll and drift never at once, the
heartbeat even while a poll is slow; recovery by itself when a real git server comes back; the
agent's settings from its flags and FLEETLET_* variables."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pygit2
import pytest

from agent.errors import PermanentError, TemporaryError
from agent.schedule import AgentScheduler, Backoff, JobOutcome
from agent.settings import PollSettings, RepoSettings, SettingsError
from agent.source.branch import BranchWatcher, GitUnavailableError
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
    """A job that raises the queued errors in order, then succeeds."""

    def __init__(self, *errors: BaseException | None) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            error = self.errors.pop(0)
            if error is not None:
                raise error


class Clock:
    """A monotonic clock the test moves: each job run happens once the backoff is over."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scheduler(script: Callable[[], None], clock: Clock, **kw: object) -> AgentScheduler:
    return AgentScheduler(
        poll=script,
        drift=script,
        heartbeat=None,
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )


def delays(jobs: AgentScheduler, clock: Clock, runs: int) -> list[float]:
    """The backoff after each of ``runs`` poll runs (each run when the previous wait ended)."""
    out = []
    for _ in range(runs):
        outcome = jobs.run("poll")
        assert outcome is not None
        out.append(outcome.delay)
        clock.now += outcome.delay
    return out


# --- backoff, by the delays the scheduler computes ------------------------------------------


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


def test_jobs_back_off_on_temporary_errors_and_reset_on_success() -> None:
    down = GitUnavailableError("git server down")
    clock = Clock()
    script = Script(down, down, down, down, down, None, down, None)
    jobs = scheduler(script, clock, interval=2.0, max_backoff=12.0)
    assert delays(jobs, clock, 8) == [2.0, 4.0, 8.0, 12.0, 12.0, 0.0, 2.0, 0.0]
    assert script.calls == 8
    assert jobs.backoff.failures == 0

    # A delay suggested by the failing code is honoured, within the cap.
    script = Script(TemporaryError("busy", delay=5.0), TemporaryError("x", delay=999.0), None)
    jobs = scheduler(script, clock, interval=2.0, max_backoff=60.0)
    assert delays(jobs, clock, 3) == [5.0, 60.0, 0.0]


def test_runs_during_a_backoff_do_nothing_and_each_job_backs_off_on_its_own() -> None:
    clock = Clock()
    script = Script(TemporaryError("git server down"), None, None)
    jobs = scheduler(script, clock, interval=2.0, max_backoff=60.0)
    first = jobs.run("poll")
    assert first is not None and first.delay == 2.0
    assert jobs.run("poll") is None  # within the poll's backoff
    assert script.calls == 1
    # The drift pass does not wait on the poll's backoff: the cluster keeps being corrected.
    assert jobs.run("drift") == JobOutcome("drift", None)
    assert script.calls == 2
    clock.now += 2.0
    assert jobs.run("poll") == JobOutcome("poll", None)
    assert script.calls == 3


def test_a_drift_pass_that_succeeds_does_not_cut_the_polls_backoff_short() -> None:
    # Found in CI: with the git server away, the drift pass (which needs only the API server)
    # succeeded between polls and reset the shared backoff, so the polls never slowed down.
    down = GitUnavailableError("git server down")
    clock = Clock()
    polls = Script(down, down, down)
    jobs = AgentScheduler(
        poll=polls, drift=lambda: None, heartbeat=None, clock=clock, interval=1.0, max_backoff=60.0
    )
    waits = []
    for _ in range(3):
        outcome = jobs.run("poll")
        assert outcome is not None
        waits.append(outcome.delay)
        assert jobs.run("drift") == JobOutcome("drift", None)
        clock.now += outcome.delay
    assert waits == [1.0, 2.0, 4.0]
    assert jobs.backoff.failures == 3


def test_a_permanent_error_is_reported_and_does_not_back_off() -> None:
    seen: list[JobOutcome] = []
    refused = PermanentError("signature invalid")
    down = TemporaryError("down")
    clock = Clock()
    script = Script(down, down, refused, RuntimeError("bug"), None)
    jobs = scheduler(script, clock, interval=3.0, max_backoff=30.0, on_outcome=seen.append)
    assert delays(jobs, clock, 5) == [3.0, 6.0, 0.0, 3.0, 0.0]
    assert [o.error for o in seen] == [down, down, refused, seen[3].error, None]
    assert isinstance(seen[3].error, RuntimeError)  # a bug backs off too, rather than spin
    assert [o.permanent for o in seen] == [False, False, True, False, False]
    assert jobs.last == seen[-1]


def test_jitter_is_added_to_each_backoff() -> None:
    values = iter([0.5, 0.25])
    clock = Clock()
    jobs = scheduler(
        Script(TemporaryError("x"), TemporaryError("y"), None),
        clock,
        interval=10.0,
        jitter=4.0,
        max_backoff=100.0,
        rng=lambda: next(values),
    )
    assert delays(jobs, clock, 3) == [12.0, 21.0, 0.0]
    with pytest.raises(ValueError, match="jitter"):
        scheduler(Script(), clock, interval=1.0, jitter=-1.0)
    with pytest.raises(ValueError, match="interval"):
        scheduler(Script(), clock, interval=0.0)


# --- the scheduler, for real ----------------------------------------------------------------


def test_poll_and_drift_never_run_at_once_the_heartbeat_does_and_stop_is_clean() -> None:
    active = 0
    most = 0
    runs = 0
    beats_during_a_run = 0
    lock = threading.Lock()

    def slow() -> None:
        nonlocal active, most, runs
        with lock:
            active += 1
            most = max(most, active)
        time.sleep(0.3)  # much longer than the intervals
        with lock:
            active -= 1
            runs += 1

    def beat() -> None:
        nonlocal beats_during_a_run
        with lock:
            if active:
                beats_during_a_run += 1

    jobs = AgentScheduler(
        poll=slow,
        drift=slow,
        heartbeat=beat,
        interval=0.02,
        drift_interval=0.03,
        heartbeat_interval=0.05,
        max_backoff=1.0,
    )
    jobs.start()
    try:
        wait_for(lambda: runs >= 4 and beats_during_a_run >= 2, what="slow runs and heartbeats")
    finally:
        # As a signal handler would: stop from another thread while the main one waits.
        threading.Thread(target=jobs.stop).start()
        assert jobs.wait(timeout=60)
    assert most == 1  # poll and drift never overlapped, nor stacked
    assert not jobs.running
    stopped_at = jobs.runs
    assert active == 0  # stop() waited for the run in progress
    time.sleep(0.1)
    assert jobs.runs == stopped_at


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


def test_the_poll_job_recovers_by_itself_when_the_git_server_is_back(
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
    settled: list[str] = []

    def poll() -> None:
        # As the inbound pipeline does: fetch a commit only once.
        commit = watcher.poll()
        if commit is not None and commit not in settled:
            received.append(watcher.fetch(commit)["set.yaml"])
            settled.append(commit)

    outcomes: list[JobOutcome] = []
    jobs = AgentScheduler(
        poll=poll,
        drift=lambda: None,
        heartbeat=None,
        interval=0.1,
        jitter=0.05,
        max_backoff=0.4,
        on_outcome=outcomes.append,
    )
    with jobs:
        wait_for(lambda: received == [b"set.yaml edge 1\n"], what="the first publication")
        # Idle: the job keeps listing refs without fetching again.
        polls = watcher.polls
        wait_for(lambda: watcher.polls >= polls + 3, what="idle polls")
        assert watcher.fetches == 1
        assert settled == [first]

        private_daemon.kill()
        # Counted from the outcomes reported, not the backoff's counter: a failure is counted
        # a moment before its outcome is reported.
        wait_for(
            lambda: sum(o.error is not None for o in outcomes) >= 3,
            what="three failed polls while the server is down",
        )
        errors = [o.error for o in outcomes if o.error is not None]
        assert all(isinstance(e, GitUnavailableError) for e in errors)
        # The waits grew while the server was down, up to the cap.
        waits = [o.delay for o in outcomes if o.error is not None][:3]
        assert waits[0] < waits[1] < waits[2] <= 0.4 + 0.05

        private_daemon.start()
        second = publish(hub, private_daemon, "edge", 2)
        wait_for(lambda: second in settled, what="the publication made after recovery")
        assert jobs.backoff.failures == 0
    assert received == [b"set.yaml edge 1\n", b"set.yaml edge 2\n"]
    assert watcher.fetches == 2


# --- settings -------------------------------------------------------------------------------


def test_settings_come_from_flags_whose_defaults_are_the_fleetlet_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.cli import settings_from_args
    from fleetlet.cli import build_parser

    env = {
        "FLEETLET_REPO": "https://git.example.invalid/fleet.git",
        "FLEETLET_CLUSTER": "edge-7",
        "FLEETLET_TRUSTED_ROOT": str(tmp_path / "trusted_root.json"),
        "FLEETLET_IDENTITY": "https://hub.example.invalid/ci",
        "FLEETLET_ISSUER": "https://issuer.example.invalid",
        "FLEETLET_POLL_INTERVAL": "15",
        "FLEETLET_DRIFT_INTERVAL": "120",
        "FLEETLET_GIT_PROTOCOL": "0",
        "FLEETLET_PARALLEL_GROUPS": "2",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = settings_from_args(build_parser().parse_args(["agent", "run"]))
    assert settings.repo.cluster == "edge-7"
    assert settings.poll.interval == 15.0 and settings.poll.jitter == 5.0
    assert settings.poll.drift_interval == 120.0
    assert settings.trust.issuer == "https://issuer.example.invalid"
    assert settings.repo.protocol_v2 is False
    assert settings.reconcile.parallel_groups == 2
    # A flag wins over its variable.
    flagged = settings_from_args(
        build_parser().parse_args(["agent", "run", "--interval", "7", "--git-protocol", "2"])
    )
    assert flagged.poll.interval == 7.0 and flagged.repo.protocol_v2 is True

    monkeypatch.delenv("FLEETLET_IDENTITY")
    with pytest.raises(SettingsError, match="--identity"):
        settings_from_args(build_parser().parse_args(["agent", "run"]))
    with pytest.raises(SettingsError, match="cluster"):
        RepoSettings(url="git://x/y.git", cluster="a/b")
    with pytest.raises(SettingsError, match="max backoff"):
        PollSettings(interval=60.0, max_backoff=10.0)
