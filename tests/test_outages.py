"""Outages at every stage of an agent sync, each made two ways, then healed.

For each stage of a sync (poll, fetch of the set, content from the registry / git / http,
verification, dry run, apply, health wait, prune, status push) the server that stage needs is
taken away, ``refused`` (its process stopped) or ``hanging`` (SIGSTOP: connections accepted,
never answered), right before the stage (an agent failpoint where the server was used earlier
in the same sync), while a new version is published. The agent runs as ``fleetlet agent run``
does, through its poll job (:class:`~agent.schedule.AgentScheduler`, with a clock the test
moves). Each outage ends with:

- every call bounded: each run of the job returns, with a temporary error naming the server;
- bounded retries with backoff and jitter: runs during the backoff touch nothing, the next wait
  is twice as long plus less than the jitter;
- no partial group: the group is wholly on the previous version while the server is away (or,
  when the API server went away in the middle of the move, its intent is recorded and the move
  is finished or undone), and wholly on the new version once it is back;
- a clear reason in status: every BundleDeployment says Degraded with the reason (or, when the
  API server is away, the status document pushed to git does);
- the status delivered once the link is back: the status server holds the new version, Ready.

Then the API server restarting in the middle of an apply, and the hub away for longer than a
publication's life (the agent keeps running what it has and says ``Expired``).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.errors import TemporaryError
from agent.loop import Agent
from agent.report.metrics import Metrics
from agent.schedule import AgentScheduler, JobOutcome
from tests.outage import OutageWorld, Version, bounded, world_in
from tests.realenv.kube import Cluster
from tests.realenv.sigstore import MiniSigstore

INTERVAL = 1.0
JITTER = 0.5
LIFE = 15  # seconds a publication of the hub-away test lives


@dataclass(frozen=True)
class Stage:
    name: str
    component: str
    at: str | None
    """The agent step at which the server goes away (None: before the sync starts)."""
    reasons: frozenset[str]


STAGES = [
    Stage("poll", "fleet-git", None, frozenset({"GitUnavailable"})),
    Stage("fetch of the set", "fleet-git", "polled", frozenset({"GitUnavailable"})),
    Stage("content from the registry", "registry", None, frozenset({"RegistryUnavailable"})),
    Stage("content from git", "content-git", None, frozenset({"FetchFailed"})),
    Stage("content from http", "http", None, frozenset({"FetchFailed"})),
    Stage("verification", "apiserver", "fetched", frozenset({"ApiUnavailable"})),
    Stage("dry run", "apiserver", "apply:dry run", frozenset({"ApiUnavailable"})),
    Stage("apply", "apiserver", "apply:applying", frozenset({"ApiUnavailable"})),
    Stage("health wait", "apiserver", "health", frozenset({"ApiUnavailable"})),
    Stage("prune", "apiserver", "healthy", frozenset({"ApiUnavailable"})),
    Stage("status push", "status-git", None, frozenset({"GitUnavailable"})),
]
MODES = ["refused", "hanging"]


class Clock:
    """The scheduler's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def outage_cluster(
    tmp_path_factory: pytest.TempPathFactory, kube_binaries: dict[str, Path]
) -> Iterator[Cluster]:
    """A control plane of this module's own: its API server is stopped and frozen."""
    cluster = Cluster(
        name="outage",
        workdir=tmp_path_factory.mktemp("kube-outage"),
        binaries=kube_binaries,
        stop_grace=0.5,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()  # SIGKILL ends a frozen API server too


@pytest.fixture(scope="module")
def world(
    outage_cluster: Cluster,
    mini_sigstore: MiniSigstore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OutageWorld]:
    """The fleet of :mod:`tests.outage`, its agent synced on version 1."""
    for created in world_in(tmp_path_factory.mktemp("outage"), outage_cluster, mini_sigstore):
        created.publish(Version(1))
        agent = created.build_agent()
        settle(created, agent)
        created.assert_wholly_on(Version(1))
        yield created


def settle(world: OutageWorld, agent: Agent, *, attempts: int = 5) -> None:
    """Tick until a tick converges (every server is up): the start of every scenario."""
    error: Exception | None = None
    for _ in range(attempts):
        try:
            result = bounded(agent.tick)
        except TemporaryError as exc:
            error = exc
            time.sleep(1)
            continue
        if result.outbound is not None and result.outbound.converged:
            return
        error = None
    raise AssertionError(f"the agent did not converge: {error or agent.last}")


def scheduler(agent: Agent, clock: Clock) -> AgentScheduler:
    return AgentScheduler(
        poll=agent.poll,
        drift=agent.correct_drift,
        heartbeat=None,
        interval=INTERVAL,
        jitter=JITTER,
        max_backoff=30.0,
        clock=clock,
        rng=random.Random(21).random,
    )


def assert_failed(outcome: JobOutcome | None, stage: Stage, world: OutageWorld) -> JobOutcome:
    """The run ended (bounded), with a temporary error of the stage's reason naming the
    server, and a backoff."""
    assert outcome is not None
    error = outcome.error
    assert isinstance(error, TemporaryError), (stage.name, error)
    assert error.reason in stage.reasons, (stage.name, error.reason, str(error))
    assert world.address(stage.component) in str(error), (stage.name, str(error))
    return outcome


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name.replace(" ", "-"))
def test_an_outage_at_each_stage_ends_wholly_on_one_revision_with_its_reason_in_status(
    world: OutageWorld, stage: Stage, mode: str
) -> None:
    agent = world.agent
    assert agent is not None and agent.pusher is not None
    settle(world, agent)
    previous = world.version
    assert previous is not None
    target = world.next_version()
    world.publish(target)
    fault = world.fault(stage.component, mode)
    clock = Clock()
    jobs = scheduler(agent, clock)
    if stage.component == "status-git":
        return _status_push_outage(world, agent, jobs, fault, previous, target)
    if stage.at is None:
        fault.inject()
    else:
        world.trap.arm(stage.at, fault.inject)
    try:
        first = assert_failed(bounded(lambda: jobs.run("poll")), stage, world)
        assert fault.active, f"{stage.name}: the step {stage.at} was never reached"
        # Backoff: no poll is tried before it is over; the wait is the interval plus jitter.
        # (The drift job backs off on its own: a git server away does not stop it.)
        assert jobs.run("poll") is None
        assert INTERVAL <= first.delay < INTERVAL + JITTER
        if stage.component == "apiserver":
            # The cluster cannot be read: the status document pushed to git says why.
            document = world.status_document()
            assert document is not None
            for bundle in document.bundles:
                degraded = {c.type: c for c in bundle.conditions}["Degraded"]
                assert (degraded.status, degraded.reason) == ("True", "ApiUnavailable"), degraded
                assert world.address("apiserver") in degraded.message
        else:
            world.assert_wholly_on(previous)
            for bundle in world.names:
                conditions = world.conditions(bundle)
                degraded = conditions["Degraded"]
                assert degraded["status"] == "True" and degraded["reason"] in stage.reasons
                assert world.address(stage.component) in degraded["message"], degraded
                # What runs is as healthy as it was: Ready is not the link's to change.
                assert conditions["Ready"]["reason"] == "Healthy", conditions["Ready"]

        clock.now += first.delay
        second = assert_failed(bounded(lambda: jobs.run("poll")), stage, world)
        assert 2 * INTERVAL <= second.delay < 2 * INTERVAL + JITTER
    finally:
        world.trap.disarm()
        fault.heal()

    # Back: the group is wholly on the previous version, or its move is recorded (the API
    # server went away in the middle of it) and the next run finishes it.
    assert world.moving() or world.running() == world.expected(previous)
    for _ in range(3):
        clock.now += 60
        last = bounded(lambda: jobs.run("poll"))
        assert last is not None
        if last.error is None:
            break
    assert last.error is None, last.error
    assert jobs.backoff.failures == 0
    world.assert_wholly_on(target)
    assert not world.moving()
    _assert_ready_and_delivered(world, agent, target)


def _assert_ready_and_delivered(world: OutageWorld, agent: Agent, target: Version) -> None:
    for bundle in world.names:
        conditions = world.conditions(bundle)
        assert conditions["Ready"]["status"] == "True", (bundle, conditions["Ready"])
        assert conditions["Degraded"]["status"] == "False", (bundle, conditions["Degraded"])
        # Each bundle counts its own objects (not its group's).
        resources = world.status(bundle)["resources"]
        objects = world.object_count(bundle, target)
        assert (resources["total"], resources["ready"]) == (objects, objects), (bundle, resources)
    assert agent.pusher is not None and not agent.pusher.pending
    document = world.status_document()
    assert document is not None
    web = document.bundle(world.names["web"])
    assert web is not None and web.applied_revision is not None
    serial = web.applied_revision.serial
    assert agent.accepted is not None and serial == agent.accepted.serial
    for bundle in document.bundles:
        shown = {c.type: c.status for c in bundle.conditions}
        assert shown["Ready"] == "True" and shown["Degraded"] == "False", bundle.name


def _status_push_outage(
    world: OutageWorld,
    agent: Agent,
    jobs: AgentScheduler,
    fault: object,
    previous: Version,
    target: Version,
) -> None:
    """The status server away: the sync itself goes on; the status stays pending, retried
    with backoff (each push bounded), and is delivered once the server is back."""
    from tests.outage import Fault

    assert isinstance(fault, Fault)
    pusher = agent.pusher
    assert pusher is not None
    before = world.status_document()
    fault.inject()
    try:
        outcome = bounded(lambda: jobs.run("poll"))
        assert outcome is not None and outcome.error is None, outcome
        world.assert_wholly_on(target)  # the cluster moved; only its status is held back
        assert pusher.pending and pusher.failures == 1
        error = pusher.last_error
        assert isinstance(error, TemporaryError) and error.reason == "GitUnavailable"
        assert world.address("status-git") in str(error)
        assert world.status_document() == before
        # Backoff: heartbeats before it is over try nothing; the wait doubles, with jitter.
        first_wait = (pusher.retry_at or 0) - time.time()
        attempts = pusher.attempts
        bounded(agent.heartbeat)
        assert pusher.attempts == attempts
        _sleep_until(pusher.retry_at)
        bounded(agent.heartbeat)
        assert pusher.attempts == attempts + 1 and pusher.failures == 2
        assert (pusher.retry_at or 0) - time.time() > first_wait
    finally:
        fault.heal()
    _sleep_until(pusher.retry_at)
    bounded(agent.heartbeat)
    assert not pusher.pending and pusher.failures == 0
    _assert_ready_and_delivered(world, agent, target)
    assert previous != target


def _sleep_until(when: float | None) -> None:
    if when is not None:
        time.sleep(max(0.0, when - time.time()) + 0.05)


def test_the_api_server_restarting_in_the_middle_of_an_apply(world: OutageWorld) -> None:
    """Stopped after the first objects were written and started again while the apply goes
    on: the move is finished (in this sync or the next), never left half-done."""
    agent = world.agent
    assert agent is not None
    settle(world, agent)
    target = world.next_version()
    world.publish(target)
    restarted = threading.Event()

    def restart() -> None:
        def run() -> None:
            world.cluster.stop_apiserver()
            world.cluster.start_apiserver()
            world.cluster.restart_controllers()
            restarted.set()

        threading.Thread(target=run, daemon=True).start()

    world.trap.arm("apply:applying", restart)
    try:
        try:
            bounded(agent.tick)
        except TemporaryError as exc:
            assert exc.reason == "ApiUnavailable", exc
        assert restarted.wait(120)
    finally:
        world.trap.disarm()
    assert world.moving() or world.running() == world.expected(target)
    settle(world, agent)
    world.assert_wholly_on(target)
    assert not world.moving()
    _assert_ready_and_delivered(world, agent, target)


def test_the_api_server_away_in_the_middle_of_a_rollback(world: OutageWorld) -> None:
    """A broken version rolls back; the API server goes away after the previous revision was
    re-applied: the rollback is finished by the next sync, and its reason is said once."""
    agent = world.agent
    assert agent is not None
    settle(world, agent)
    previous = world.version
    assert previous is not None
    broken = world.next_version(broken=True)
    world.publish(broken, health_timeout=6)
    fault = world.fault("apiserver", "refused")
    world.trap.arm("rollback:applied", fault.inject)
    try:
        with pytest.raises(TemporaryError):
            bounded(agent.tick)
        assert fault.active, "the rollback never reached the re-applied step"
    finally:
        world.trap.disarm()
        fault.heal()
    assert world.moving()  # the rollback is recorded, to be finished
    with contextlib.suppress(TemporaryError):
        bounded(agent.tick)
    world.assert_wholly_on(previous)
    assert not world.moving()
    for bundle in ("web", "conf", "remote"):
        ready = world.conditions(bundle)["Ready"]
        assert ready["reason"] == "RolledBack", ready
        assert ready["message"].count("HealthCheckFailed") == 1, ready["message"]
    # The next good publication moves on (and leaves the world as the next test expects it).
    target = world.next_version()
    world.publish(target)
    settle(world, agent)
    world.assert_wholly_on(target)


def test_the_hub_away_longer_than_a_publication_lives(world: OutageWorld) -> None:
    """The hub stops publishing and the git server goes away for longer than the running
    publication's life: the agent keeps running (and correcting) what it has, and every
    bundle says Expired, in the cluster and in the status it pushes. A newer publication
    clears it."""
    agent = world.agent
    assert agent is not None and agent.pusher is not None
    settle(world, agent)
    running = world.next_version()
    world.publish(running, expires_after=f"{LIFE}s")
    settle(world, agent)
    world.assert_wholly_on(running)
    assert agent.accepted is not None
    serial = agent.accepted.serial
    away = world.fault("fleet-git", "refused")
    away.inject()
    try:
        # Past its life and the agent's clock-skew allowance (1 s here; the agent's clock has
        # whole seconds).
        _sleep_until(agent.accepted.expires_at.timestamp() + 2.5)
        # Someone edits a managed object meanwhile: still put back.
        world.kube.apply(
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "settings", "namespace": world.ns}, "data": {"value": "edited"}},
            field_manager="someone-else", force=True,
        )  # fmt: skip
        with pytest.raises(TemporaryError):
            bounded(agent.tick)
        world.assert_wholly_on(running)
        for bundle in world.names:
            conditions = world.conditions(bundle)
            ready = conditions["Ready"]
            assert (ready["status"], ready["reason"]) == ("False", "Expired"), ready
            assert f"serial {serial}" in ready["message"]
            assert conditions["Degraded"]["status"] == "True"
        assert not agent.pusher.pending
        document = world.status_document()
        assert document is not None
        for report in document.bundles:
            shown = {c.type: (c.status, c.reason) for c in report.conditions}
            assert shown["Ready"] == ("False", "Expired"), report.name
    finally:
        away.heal()
    # The hub is back and publishes again: the new publication is accepted and moves.
    target = world.next_version()
    world.publish(target)
    settle(world, agent)
    world.assert_wholly_on(target)
    _assert_ready_and_delivered(world, agent, target)


def test_agent_run_says_a_git_server_away_and_an_expired_publication_on_every_bundle(
    world: OutageWorld,
) -> None:
    """The same, through ``fleetlet agent run``'s supervisor and its worker processes (the
    poll is the supervisor's, the workers are new processes each time): the git server away
    is said on every bundle and taken off once it is back, and an expired publication is said
    while the branch does not move. Last in this module: it leaves the in-process agent's view
    of the cluster behind."""
    from agent.assemble import build_supervisor
    from agent.cli import settings_from_args
    from fleetlet.cli import build_parser

    args = build_parser().parse_args(["agent", "run", *world.agent_args()])
    supervisor = build_supervisor(settings_from_args(args), log_level="info", log_format="text")
    running = world.next_version()
    world.publish(running, expires_after=f"{LIFE}s")
    bounded(supervisor.poll)
    world.assert_wholly_on(running)

    away = world.fault("fleet-git", "refused")
    away.inject()
    try:
        with pytest.raises(TemporaryError):
            bounded(supervisor.poll)
        for bundle in world.names:
            degraded = world.conditions(bundle)["Degraded"]
            assert (degraded["status"], degraded["reason"]) == ("True", "GitUnavailable"), degraded
            assert world.address("fleet-git") in degraded["message"]
        # A drift worker (it does not poll) keeps saying it.
        bounded(lambda: supervisor._work("drift"))
        assert world.conditions("web")["Degraded"]["reason"] == "GitUnavailable"
    finally:
        away.heal()
    bounded(supervisor.poll)
    for bundle in world.names:
        conditions = world.conditions(bundle)
        assert conditions["Degraded"]["status"] == "False", conditions["Degraded"]
        assert conditions["Ready"]["status"] == "True", conditions["Ready"]

    # The branch does not move and the publication expires: the next poll starts a worker
    # that says so (the supervisor alone would stay idle).
    assert supervisor.last is not None and supervisor.last.wake_at is not None
    _sleep_until(supervisor.last.wake_at)
    bounded(supervisor.poll)
    for bundle in world.names:
        ready = world.conditions(bundle)["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "Expired"), ready
    world.assert_wholly_on(running)
    # Said once: the polls after it are idle again.
    before = _worker_runs(supervisor.metrics)
    assert before > 0
    bounded(supervisor.poll)
    assert _worker_runs(supervisor.metrics) == before


def _worker_runs(metrics: Metrics) -> float:
    """Worker runs the supervisor counted, of every job and result."""
    return sum(
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "fleetlet_agent_worker_runs_total"
    )
