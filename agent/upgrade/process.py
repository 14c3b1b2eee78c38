"""The upgrade half of ``agent run``: one agent acts at a time, and a new one proves itself
before the old one stops acting.

Read top to bottom, an upgrade of the acting agent (:meth:`Upgrades.attempt`):

1. **want**: the accepted set pins an agent image (:mod:`agent.upgrade.desired`) other than
   the one this agent runs, not tried yet for that set;
2. **pull**: the image by digest (:mod:`agent.upgrade.artifact`);
3. **start** the candidate: ``agent run`` again, same flags, from the image, with
   ``FLEETLET_AGENT_CANDIDATE`` set; the old agent goes on acting;
4. **self-check** (in the candidate, acting on nothing): it started, reaches the API server and
   git, and verifies the set the cluster runs (signature, identity, inclusion proof) with its
   own code, in a child process (:mod:`agent.upgrade.selfcheck`); then it says so on the Lease
   (:mod:`agent.upgrade.lease`);
5. **hand over**: the old agent finishes its running job, stops acting and gives the candidate
   the Lease; the candidate runs one sync (poll, verify, reconcile) and says it proved itself;
6. **done**: the old agent stays only as the candidate's parent (the process the demo or the
   service manager started; in a pod, the new ReplicaSet's pod replaces it), and the candidate
   acts and renews the Lease.

Any step that fails, or a candidate that exits or has not proved itself within the deadline
(``FLEETLET_AGENT_UPGRADE_DEADLINE``, 120 s), is rolled back by the agent that still runs: it
stops the candidate, takes the Lease back, goes on acting, and records the failure, which the
agent entry's report says (RolledBack, with the serial that asked for it): the hub's rollout
halts there and reverts. The same image is not tried again until a newer set asks for it.
An agent installed with ``--self-upgrade=off`` tries nothing: the entry reports
``UpgradeDisabled`` (:mod:`agent.upgrade.rights`) until it runs with the rights.

While nothing happens the loop costs the supervisor little: it talks to the API server through
the supervisor's small door (:mod:`agent.runner.objects`, never the ``kubernetes`` package),
renews the Lease every third of its duration (one PATCH every 10 s), and reads the upgrade
ConfigMap only when the supervisor accepted a new set, else once every drift interval. An
agent that finds another holding the Lease (it could not renew in time and another took it)
stops acting until that Lease expires and it takes it back.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agent.errors import FleetletError
from agent.upgrade.desired import (
    Desired,
    Record,
    UpgradeStore,
    agent_report,
    with_agent_report,
)
from agent.upgrade.lease import FAILED, IDENTITY, PROVEN, READY, AgentLease
from agent.upgrade.rights import SelfUpgrade, UpgradeDisabledError, disabled_message

if TYPE_CHECKING:  # the artifact module brings the OCI client: loaded only for a pull
    from agent.upgrade.artifact import AgentImage

log = logging.getLogger(__name__)

ENV_CANDIDATE = "FLEETLET_AGENT_CANDIDATE"
"""Set in a candidate agent: the attempt it is (``<digest>/<since>``)."""
ENV_IMAGE = "FLEETLET_AGENT_IMAGE"
"""The digest of the agent image this process runs (unset: started from elsewhere)."""
ENV_VERSION = "FLEETLET_AGENT_VERSION"
ENV_DEADLINE = "FLEETLET_AGENT_UPGRADE_DEADLINE"


class UpgradeFailed(FleetletError):
    """A candidate did not prove itself; ``reason`` says at which step."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Upgrades:
    """The upgrade half of one ``agent run`` process (see the module docstring)."""

    def __init__(
        self, *, settings: Any, supervisor: Any, rights: SelfUpgrade = SelfUpgrade.ON
    ) -> None:
        self.settings = settings
        self.supervisor = supervisor
        self.rights = rights
        """What ``agent install --self-upgrade`` granted (:mod:`agent.upgrade.rights`)."""
        self.kube = _client(settings, supervisor)
        namespace = settings.namespace
        self.store = UpgradeStore(self.kube, namespace)
        self.identity = f"{socket.gethostname()}-{os.getpid()}"
        self.lease = AgentLease(self.kube, namespace, self.identity)
        self.image = os.environ.get(ENV_IMAGE, "")
        self.version = os.environ.get(ENV_VERSION, "")[:64]
        self.attempt_id = os.environ.get(ENV_CANDIDATE)
        self.deadline = float(os.environ.get(ENV_DEADLINE) or 120.0)
        self.interval: float = min(max(settings.poll.interval, 1.0), 5.0)
        """Seconds between the loop's checks; most make no request (see :meth:`_check`)."""
        self.reread = max(float(settings.poll.drift_interval), self.interval)
        """Seconds after which the desired image and the record are read again though no new
        set was accepted (the drift check's interval)."""
        self.lost = False
        """Another agent took the Lease: this one does not act until it can take it back."""
        self._renew_due = 0.0
        self._read: tuple[float, str | None] | None = None
        """(when, the accepted commit) of the last read of the upgrade ConfigMap."""
        self._desired: Desired | None = None
        self._record = Record()
        self.acting = threading.Event()
        self.stopped = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.handed_over = False
        self.unleased = False
        self._job = threading.Lock()
        self._report: Any = None
        self._thread: threading.Thread | None = None
        pusher = supervisor.pusher
        if pusher is not None:
            pusher.amend = lambda doc: with_agent_report(doc, self._report, self.version)

    # -- the jobs of the scheduler, gated on acting -------------------------------------------

    def gate(self, job: Callable[[], None], *, exclusive: bool = True) -> Callable[[], None]:
        """``job`` run only while this agent acts (``exclusive``: a hand-over waits for it)."""

        def gated() -> None:
            if not self.acting.is_set():
                return
            if not exclusive:
                job()
                return
            with self._job:
                if self.acting.is_set():
                    job()

        return gated

    # -- start and stop ----------------------------------------------------------------------

    def start(self) -> None:
        """Before the scheduler starts: an agent started as itself takes the Lease (waiting for
        a crashed holder's to expire); a candidate checks itself, waits for the Lease and proves
        itself with one sync, or exits (raises) so the agent that acts rolls it back."""
        if self.attempt_id is not None:
            self._prove()
        else:
            try:
                self._take_lease(wait=4 * self.lease.duration)
            except UpgradeFailed:
                raise
            except FleetletError as exc:
                # The API server away (nobody acts on it then) or an older RBAC without
                # leases: act, and take the Lease as soon as it can be had.
                log.warning("acting without the Lease until it can be taken: %s", exc)
                self.unleased = True
        self.acting.set()
        self._thread = threading.Thread(target=self._loop, name="agent-upgrade", daemon=True)
        self._thread.start()

    def _take_lease(self, *, wait: float) -> bool:
        """The Lease held, and the record saying which image acts. Raises UpgradeFailed when
        another live agent holds it past ``wait``; the KubeClient's errors."""
        if not self.lease.acquire(wait=wait, stopped=self.stopped):
            if wait == 0:
                return False
            raise UpgradeFailed(
                "LeaseHeld",
                f"another agent holds Lease {self.lease.namespace}/fleetlet-agent and renews it",
            )
        self.unleased = False
        self._renew_due = time.monotonic() + self.lease.renew_every
        self._read_store()
        if self._record.running != self.image:
            self._save(Record(running=self.image, version=self.version, at=_now()))
        return True

    def _read_store(self) -> tuple[Desired | None, Record]:
        """The upgrade ConfigMap read now (and kept: this agent writes the record itself)."""
        last = self.supervisor.last
        commit = last.commit if last is not None else None
        self._desired, self._record = self.store.read()
        self._read = (time.monotonic(), commit)
        return self._desired, self._record

    def _save(self, record: Record) -> None:
        self.store.save_record(record)
        self._record = record

    def stop(self) -> None:
        """``agent run`` stops: so does the candidate or the agent that took over. Safe in a
        signal handler."""
        self.stopped.set()
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    def finish(self) -> None:
        """After the scheduler stopped: the candidate's (or successor's) end, killed past 15 s;
        the Lease released if this agent holds it (whoever comes next takes it at once)."""
        child = self.child
        if child is not None:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if self.acting.is_set() and not self.unleased:
            # Bounded: a frozen API server must not hold agent run (the Lease then expires).
            releasing = threading.Thread(target=self._release, name="lease-release", daemon=True)
            releasing.start()
            releasing.join(timeout=2.0)

    def _release(self) -> None:
        try:
            view = self.lease.read()
            if view is not None and view.holder == self.identity:
                self.lease.hand_to("", view=view)
        except FleetletError as exc:
            log.warning("the Lease was not released (it expires by itself): %s", exc)

    # -- the candidate's side ----------------------------------------------------------------

    def _prove(self) -> None:
        attempt = self.attempt_id or ""
        try:
            self._self_check()
        except Exception as exc:
            reason = exc.reason if isinstance(exc, FleetletError) else "SelfCheckFailed"
            self.lease.say(FAILED, f"{attempt} {reason}: {exc}")
            raise UpgradeFailed(reason, f"candidate {attempt}: self-check: {exc}") from exc
        self.lease.say(IDENTITY, self.identity)
        self.lease.say(READY, attempt)
        log.info("candidate %s: self-check passed; waiting for the Lease", attempt)
        deadline = time.monotonic() + self.deadline
        while True:
            view = self.lease.read()
            if view is not None and view.holder == self.identity:
                break
            if self.stopped.is_set() or time.monotonic() > deadline:
                raise UpgradeFailed("NotHandedOver", "the acting agent did not hand the Lease over")
            time.sleep(0.5)
        if self.supervisor.pusher is not None:
            self.supervisor.pusher.resume()
        try:
            self.supervisor.poll()  # the one sync, as the acting agent now
        except Exception as exc:
            reason = exc.reason if isinstance(exc, FleetletError) else "SyncFailed"
            self.lease.say(FAILED, f"{attempt} {reason}: first sync: {exc}")
            raise UpgradeFailed(reason, f"candidate {attempt}: first sync: {exc}") from exc
        _desired, before = self._read_store()
        self._save(
            Record(
                running=self.image,
                version=self.version,
                previous=before.running,
                attempt=self.image,
                attempt_since=before.attempt_since,
                attempt_serial=before.attempt_serial,
                state="Succeeded",
                message="the new agent proved itself and acts",
                at=_now(),
            )
        )
        self.lease.say(PROVEN, attempt)
        log.info("candidate %s: proved itself (one sync); acting", attempt)

    def _self_check(self) -> None:
        """Start, API server, git, the running set verified (in a child process: sigstore
        stays out of this one, :mod:`agent.upgrade.selfcheck`): nothing acted on."""
        from agent.upgrade.selfcheck import check

        self.kube.server_version()
        check(self.settings, timeout=self.deadline)

    # -- the acting agent's side -------------------------------------------------------------

    def _loop(self) -> None:
        parent = os.getppid()
        while not self.stopped.wait(self._pause()):
            if self.attempt_id is not None and os.getppid() != parent:
                # The process that started this one is gone (killed): so is this agent, as a
                # container's processes end with it; whoever restarts it starts over.
                log.error("the agent that started this one is gone: stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            try:
                self._check()
            except Exception as exc:  # the API server away: the next check tries again
                log.warning("agent upgrade check: %s", exc)

    def _pause(self) -> float:
        """Seconds to the next check: :attr:`interval`, or less when a renewal is due sooner."""
        if self.handed_over or not (self.acting.is_set() or self.lost):
            return self.interval
        return min(self.interval, max(self._renew_due - time.monotonic(), 0.05))

    def _check(self) -> None:
        """One check of the loop. Requests only when one is due: the Lease renewed every third
        of its duration, and the upgrade ConfigMap read when the supervisor accepted a new set
        (a new commit) or :attr:`reread` seconds passed; otherwise nothing leaves the process."""
        if self.handed_over:
            self._watch_successor()
            return
        if not (self.acting.is_set() or self.lost):
            return
        now = time.monotonic()
        if now >= self._renew_due:
            self._renew_due = now + self.lease.renew_every
            if self.unleased or self.lost:
                try:
                    if not self._take_lease(wait=0):
                        return
                except FleetletError as exc:
                    log.debug("the Lease still cannot be taken: %s", exc)
                    return
                if self.lost:
                    log.warning("this agent holds the Lease again: acting")
                    self.lost = False
                    if self.supervisor.pusher is not None:
                        self.supervisor.pusher.resume()
                    self.acting.set()
            else:
                try:
                    held = self.lease.renew()
                except FleetletError:
                    self._renew_due = now + self.interval  # the API server away: soon again
                    raise
                if not held:
                    self._lose()
                    return
        if self.lost:
            return
        if self._read_due(now):
            desired, record = self._read_store()
        else:
            desired, record = self._desired, self._record
        if (
            desired is not None
            and desired.digest
            and desired.digest != self.image
            and not self._tried(desired, record)
        ):
            self.attempt(desired, record)
            if self.handed_over:
                return  # the successor reports from now on
            desired, record = self._read_store()
        self._show(agent_report(desired, record))

    def _tried(self, desired: Desired, record: Record) -> bool:
        """Whether the record is of an attempt at ``desired`` (made once per ``since``); one
        refused for want of rights is not, once this agent has them (installed again), nor one
        still in progress when the agent has none (installed ``off`` in the middle of it)."""
        if record.attempt != desired.digest or record.attempt_since != desired.since:
            return False
        if self.rights is SelfUpgrade.OFF and record.state == "Progressing":
            return False
        return not (
            record.reason == UpgradeDisabledError.reason and self.rights is not SelfUpgrade.OFF
        )

    def _read_due(self, now: float) -> bool:
        last = self.supervisor.last
        commit = last.commit if last is not None else None
        return self._read is None or self._read[1] != commit or now - self._read[0] >= self.reread

    def _lose(self) -> None:
        """Another agent holds the Lease (this one could not renew it in time): stop acting
        (the running job ends first) until it can be taken back."""
        view = self.lease.read()
        log.error(
            "another agent (%s) holds Lease %s/fleetlet-agent: this agent stops acting until it "
            "can take it back",
            view.holder if view is not None else "none",
            self.lease.namespace,
        )
        self.acting.clear()
        with self._job:
            self.lost = True

    def _show(self, report: Any) -> None:
        """The agent entry's report into the status document (pushed when it changed)."""
        if report == self._report:
            return
        self._report = report
        pusher = self.supervisor.pusher
        if pusher is not None and pusher.latest is not None:
            with_agent = pusher.latest
            if pusher.update(with_agent):
                pusher.tick()

    def attempt(self, desired: Desired, record: Record) -> None:
        """One upgrade to ``desired`` (see the module docstring); rolled back on failure. With
        ``--self-upgrade=off`` none: the attempt is recorded refused (UpgradeDisabled)."""
        if self.rights is SelfUpgrade.OFF:
            self._refuse(desired, record)
            return
        begun = _fields(self._attempt(desired, record))
        start = Record(
            **{**begun, "state": "Progressing", "message": "pulling the new agent image"}
        )
        self._save(start)
        self._show(agent_report(desired, start))
        log.info("upgrading the agent to %s (serial %s)", desired.digest, desired.serial)
        try:
            self._try(desired, start)
        except FleetletError as exc:
            if self.stopped.is_set():
                # Not the candidate's failure: the next start tries again.
                self._roll_back(desired, Record(running=self.image, version=self.version), "", "")
                return
            self._roll_back(desired, start, exc.reason, str(exc))

    def _attempt(self, desired: Desired, record: Record) -> Record:
        """The record of an attempt at ``desired`` begun now, by this agent (its state, reason
        and message still to say)."""
        return Record(
            running=self.image,
            version=self.version,
            previous=record.previous,
            attempt=desired.digest,
            attempt_since=desired.since,
            attempt_serial=desired.serial,
            at=_now(),
        )

    def _refuse(self, desired: Desired, record: Record) -> None:
        """The agent was installed without the rights to upgrade itself: nothing is pulled or
        started; the record says so in one line, reported as a failure of this cluster."""
        begun = _fields(self._attempt(desired, record))
        refused = Record(**{**begun, "state": "Failed", "reason": UpgradeDisabledError.reason,
                            "message": disabled_message(desired.digest)})  # fmt: skip
        self._save(refused)
        log.error("agent upgrade to %s: %s", desired.digest, refused.message)
        self._show(agent_report(desired, refused))

    def _pull(self, desired: Desired) -> AgentImage:
        """The release ``desired`` names, pulled by digest into the agent's cache. Raises what
        the OCI client and ``artifact.pull`` raise."""
        # Here, not at the top: the OCI client (oras) is no part of an idle agent run.
        from agent.source.oci import OciFetcher, OciSettings
        from agent.upgrade.artifact import pull

        net = self.settings.network
        fetcher = OciFetcher(
            settings=OciSettings(
                plain_http=self.settings.plain_http_registries,
                connect_timeout=net.connect_timeout,
                timeout=net.read_timeout,
                attempts=net.attempts,
            )
        )
        return pull(
            fetcher,
            uri=desired.uri,
            digest=desired.digest,
            cache=self.settings.repo.cache_dir / "agent-images",
        )

    def _try(self, desired: Desired, start: Record) -> None:
        image = self._pull(desired)
        attempt = f"{desired.digest}/{desired.since}"
        env = {
            **os.environ,
            "PYTHONPATH": str(image.root),
            ENV_CANDIDATE: attempt,
            ENV_IMAGE: desired.digest,
            ENV_VERSION: image.version,
        }
        self.child = subprocess.Popen(
            [sys.executable, "-m", "fleetlet", *sys.argv[1:]], cwd=image.root, env=env
        )
        log.info("candidate agent %s started (pid %s)", image.version, self.child.pid)
        self._progress(desired, start, f"candidate {image.version} checks itself")
        deadline = time.monotonic() + self.deadline
        self._await(READY, attempt, deadline, "its self-check")
        # Hand over: the job running now ends first; no job starts after.
        self.acting.clear()
        with self._job:
            self.lease.hand_to(self._candidate_identity())
        self.handed_over = True
        self._progress(desired, start, f"candidate {image.version} holds the Lease; first sync")
        self._await(PROVEN, attempt, deadline, "one successful sync")
        log.info("agent %s proved itself and acts; this agent stops acting", image.version)
        self._report = None  # the successor reports now

    def _candidate_identity(self) -> str:
        assert self.child is not None
        return f"{socket.gethostname()}-{self.child.pid}"

    def _progress(self, desired: Desired, start: Record, message: str) -> None:
        now = Record(**{**_fields(start), "message": message})
        self._save(now)
        self._show(agent_report(desired, now))

    def _await(self, key: str, attempt: str, deadline: float, what: str) -> None:
        child = self.child
        assert child is not None
        while True:
            view = self.lease.read()
            said = view.annotations if view is not None else {}
            if said.get(key) == attempt:
                return
            failed = said.get(FAILED, "")
            if failed.startswith(attempt + " "):
                reason, _, message = failed[len(attempt) + 1 :].partition(": ")
                raise UpgradeFailed(reason or "SelfCheckFailed", message or failed)
            code = child.poll()
            if code is not None:
                raise UpgradeFailed(
                    "CannotStart" if key == READY else "Exited",
                    f"the candidate exited (code {code}) before {what}",
                )
            if time.monotonic() > deadline:
                raise UpgradeFailed(
                    "DeadlineExceeded",
                    f"the candidate did not pass {what} within {self.deadline:.0f}s",
                )
            if self.stopped.is_set():
                raise UpgradeFailed("Stopped", "agent run is stopping")
            time.sleep(0.5)

    def _roll_back(self, desired: Desired, start: Record, reason: str, message: str) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.child = None
        self.handed_over = False
        self.lease.hand_to(self.identity)
        if not reason:  # stopping: the attempt is forgotten, not failed
            self._save(start)
            return
        failed = Record(
            **{
                **_fields(start),
                "state": "Failed",
                "reason": reason,
                "message": message,
                "at": _now(),
            }
        )
        self._save(failed)
        self._renew_due = time.monotonic() + self.lease.renew_every
        if self.supervisor.pusher is not None:
            self.supervisor.pusher.resume()
        self.acting.set()
        log.error("agent upgrade to %s rolled back: %s: %s", desired.digest, reason, message)
        self._show(agent_report(desired, failed))

    def _watch_successor(self) -> None:
        """The successor acts; should it exit, this agent acts again (it still runs)."""
        child = self.child
        if child is None or child.poll() is None or self.stopped.is_set():
            return
        log.error("the agent that took over exited (code %s): acting again", child.returncode)
        self.child = None
        self.handed_over = False
        if self.lease.acquire(wait=4 * self.lease.duration, stopped=self.stopped):
            self._renew_due = time.monotonic() + self.lease.renew_every
            self._save(Record(running=self.image, version=self.version, at=_now()))
            if self.supervisor.pusher is not None:
                self.supervisor.pusher.resume()
            self.acting.set()


def _client(settings: Any, supervisor: Any) -> Any:
    """The supervisor's small door to the API server (:mod:`agent.runner.objects`: no
    ``kubernetes`` package in ``agent run``); a KubeClient only where the door cannot
    authenticate (a kubeconfig with an exec plugin, say)."""
    reader = getattr(supervisor, "reader", None)
    if reader is not None:
        from agent.runner.objects import ObjectDoor

        return ObjectDoor(reader)
    from agent.kube import KubeClient

    net = settings.network
    return KubeClient(
        kubeconfig=settings.kubeconfig,
        connect_timeout=net.connect_timeout,
        read_timeout=net.read_timeout,
    )


def _fields(record: Record) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(record)


__all__ = ["ENV_CANDIDATE", "ENV_IMAGE", "ENV_VERSION", "UpgradeFailed", "Upgrades"]
