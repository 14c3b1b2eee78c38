"""The long-lived half of ``fleetlet agent run``: poll, check for drift, heartbeat, and start a
worker when there is work (see :mod:`agent.runner`).

:class:`Supervisor` gives :class:`~agent.schedule.AgentScheduler` its three jobs:

- :meth:`Supervisor.poll`: one ``ls-refs`` of the cluster's branch. When the branch is where
  the last worker left it (the commit the cluster runs, or one refused for good), nothing else
  happens: an idle poll is that one request. Otherwise, and while the last worker left work
  pending (a temporary failure), a failed target's retry is due or a worker failed, a
  ``tick`` worker runs. While a group awaits a decision, each poll also compares the
  resourceVersions of the request and ApprovalPolicies it waits on with those its worker
  read (:mod:`agent.runner.decisions`), and a ``tick`` worker runs only once they differ.
- :meth:`Supervisor.drift`: the fingerprint of what the accepted set owns
  (:mod:`agent.runner.fingerprint`); when it is what it was just before the last successful
  outbound pass, nothing changed and nothing runs; otherwise a ``drift`` worker runs.
- :meth:`Supervisor.heartbeat`: the status document pushed when it changed or is due; while a
  worker runs, the document it writes as it progresses.

A worker's errors come back as the same temporary or permanent errors the scheduler already
backs off on; a worker that died or hung raises :class:`~agent.runner.launcher.WorkerFailedError`
(temporary: backoff), is counted in the metrics, said in the status document at once, and on
the BundleDeployments by the next worker.

:meth:`Supervisor.stop` (``agent run`` got SIGTERM or SIGINT) ends the running worker at once
and starts no other; a worker stopped that way is not a failure: nothing is counted or said.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from agent.api.facts import load_reported_facts
from agent.api.models import Condition
from agent.api.status import ClusterStatus, load_status
from agent.errors import (
    ConfigurationError,
    FleetletError,
    PermanentError,
    TemporaryError,
    ValidationError,
)
from agent.report import trace
from agent.report.metrics import Metrics
from agent.report.push import StatusPusher
from agent.runner.decisions import changed
from agent.runner.fingerprint import Fingerprint, take
from agent.runner.launcher import WorkerFailedError, WorkerLauncher, WorkerStoppedError
from agent.runner.protocol import Job, JobError, JobResult
from agent.runner.reader import ClusterReader, ReaderError
from agent.runner.relay import replay
from agent.settings import AgentSettings, settings_to_dict
from agent.source.branch import BranchNotFoundError, BranchWatcher

log = logging.getLogger(__name__)

WORKER_FAILED = "WorkerFailed"


class JobRefusedError(PermanentError):
    """A worker's job ended with a permanent error (a refused publication: the next polls are
    idle until the branch moves); ``reason`` is the worker's."""


class JobFailedError(TemporaryError):
    """A worker's job ended with a temporary error (a server away); ``reason`` is the
    worker's."""


class Supervisor:
    """See the module docstring. Thread-safe: the poll and drift jobs share one thread (the
    scheduler's ``work`` executor), the heartbeat has its own."""

    def __init__(
        self,
        *,
        settings: AgentSettings,
        launcher: WorkerLauncher,
        watcher: BranchWatcher,
        metrics: Metrics,
        pusher: StatusPusher | None = None,
        reader: ClusterReader | None = None,
        log_level: str = "info",
        log_format: str = "text",
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``reader``: metadata-only LISTs for the drift checks (None: every drift check runs a
        worker)."""
        self.cluster = settings.repo.cluster
        trace.for_cluster(self.cluster)
        self.metrics = metrics
        self.pusher = pusher
        self._settings = settings_to_dict(settings)
        self._progress_interval = max(1.0, settings.poll.heartbeat / 2)
        self._launcher = launcher
        self._watcher = watcher
        self._reader = reader
        self._log = (log_level, log_format)
        self._wall = wall
        self.ticks = 0
        """Runs of the poll and drift jobs (the probe's liveness)."""
        self.last: JobResult | None = None
        """The last worker's result (the probe's readiness: a first one came back)."""
        self._known: JobResult | None = None
        self._verified: Fingerprint | None = None
        self._failures = 0
        self._failure: str | None = None
        self._poll_problem: tuple[str, str] | None = None
        """(reason, message) of the last failed poll, said on every bundle, until one works."""
        self._progress_seen = 0.0
        self._lock = threading.Lock()
        self.channel: Callable[[], bool] | None = None
        """Whether the hub's notification channel is up (None: no channel configured); said
        in the status document as ``notifyChannel``."""
        self.fatal: ConfigurationError | None = None
        """The first worker could not build the agent: ``agent run`` stops with this."""
        self.on_fatal: Callable[[], None] | None = None

    @property
    def reader(self) -> ClusterReader | None:
        """The small door to the API server (None: the credentials are of another kind); the
        agent-upgrade loop uses it too (:mod:`agent.runner.objects`)."""
        return self._reader

    # -- the jobs -----------------------------------------------------------------------------

    def poll(self) -> None:
        """The poll job. Raises what the scheduler backs off on (see the module docstring)."""
        self.ticks += 1
        started = time.perf_counter()
        known = self._known
        trace.mark("agent:poll")
        try:
            commit = self._watcher.poll()
        except FleetletError as exc:
            seconds = time.perf_counter() - started
            self.metrics.poll_finished("failed", seconds)
            self.metrics.sync_finished("error", seconds)
            said = self._poll_problem[0] if self._poll_problem is not None else None
            if known is not None and exc.reason != said:
                # A new problem: a tick worker meets it too and says it on every bundle.
                self._poll_problem = (exc.reason, str(exc))
                with contextlib.suppress(FleetletError):
                    self._work("tick")
            elif known is not None and (known.pending or self._due() or self._decided(known)):
                # The cluster keeps correcting what it runs while the git server is away.
                with contextlib.suppress(FleetletError):
                    self._work("drift")
            raise
        trace.mark("agent:ls-refs")
        if self._poll_problem is not None:
            # The server is back: a tick takes the problem off every bundle.
            self._poll_problem = None
            self._work("tick")
            return
        if known is None or self._failure is not None or known.pending or self._due():
            self._work("tick")
            return
        if commit is None:
            self.metrics.sync_finished("error", time.perf_counter() - started)
            raise BranchNotFoundError(
                f"{self._watcher.repo_url}: no branch {self._watcher.ref} (nothing published "
                f"for cluster {self.cluster!r} yet)"
            )
        if commit == known.commit:
            outcome = "unchanged"
        elif commit == known.refused_commit:
            outcome = "refused-before"
        else:
            # A new publication: no fingerprint first. It would only serve the next drift
            # check, and a move writes the BundleDeployments it covers, so that check runs
            # a worker anyway; the move waits for no LIST.
            self._work("tick", fingerprint=False)
            return
        if self._decided(known):
            self._work("tick")
            return
        seconds = time.perf_counter() - started
        self.metrics.poll_finished(outcome, seconds)
        self.metrics.sync_finished("failed" if known.failed else "success", seconds)

    def drift(self) -> None:
        """The drift job. Raises what the scheduler backs off on."""
        self.ticks += 1
        known = self._known
        if known is None or self._failure is not None or known.pending or self._due():
            self._work("drift")
            return
        now = self._fingerprint(known)
        if now is not None and now == self._verified:
            self.metrics.drift_checked("unchanged")
            return
        self.metrics.drift_checked("unknown" if now is None else "changed")
        self._work("drift", before=now)

    def heartbeat(self) -> None:
        """The heartbeat job: the document a running worker wrote last, then a push when one
        is due. Raises the pusher's errors (the scheduler logs them)."""
        if self.pusher is None:
            return
        if self._launcher.running is not None:
            self._take_progress(self._launcher.progress)
        latest = self.pusher.latest
        if latest is not None and latest.notify_channel != self._channel_state():
            with contextlib.suppress(FleetletError, ValueError):
                self.pusher.update(self._with_channel(latest))
        if self.pusher.latest is not None:
            # This job runs every heartbeat interval: a heartbeat is due by definition (the
            # pusher's own clock would skip one whenever the job fires a moment early).
            self.pusher.push()

    def awaiting(self) -> bool:
        """Whether a group waits for a decision on an approval request (the polls check it)."""
        known = self._known
        return bool(known is not None and known.awaiting)

    def stop(self) -> None:
        """End the running worker now and start no other (``agent run`` is stopping): the jobs
        then return at once. Safe in a signal handler."""
        self._launcher.stop()

    # -- workers ------------------------------------------------------------------------------

    def _due(self) -> bool:
        known = self._known
        return bool(known and known.wake_at is not None and self._wall() >= known.wake_at)

    def _decided(self, known: JobResult) -> bool:
        """Whether what a group awaiting a decision waits on changed since its worker read it
        (a decision, an edit, a deletion, an ApprovalPolicy), or cannot be checked here: then
        a worker looks (:mod:`agent.runner.decisions`)."""
        if not known.awaiting:
            return False
        result = "unknown"
        if self._reader is not None:
            try:
                result = "changed" if changed(self._reader, known.awaiting) else "unchanged"
            except ReaderError as exc:
                log.info("%s: approval check: %s (a worker looks instead)", self.cluster, exc)
        self.metrics.approval_checked(result)
        return result != "unchanged"

    def _fingerprint(self, known: JobResult | None) -> Fingerprint | None:
        if self._reader is None or known is None or known.watch is None:
            return None
        try:
            return take(self._reader, known.watch)
        except ReaderError as exc:
            log.info("%s: drift check: %s (a worker checks instead)", self.cluster, exc)
            return None

    def _work(
        self, job: Job, *, before: Fingerprint | None = None, fingerprint: bool = True
    ) -> JobResult | None:
        """Run ``job`` in a worker and take in its result (None: :meth:`stop` ended or
        prevented it). ``fingerprint=False``: none is taken before (the next drift check
        then runs a worker).

        Raises WorkerFailedError, JobFailedError, JobRefusedError, ConfigurationError (the
        first worker: ``fatal``)."""
        with self._lock:
            first = self._known is None
            if before is None and fingerprint:
                before = self._fingerprint(self._known)
            level, fmt = self._log
            trace.mark(f"agent:{job}-worker")
            try:
                run = self._launcher.run(
                    job,
                    settings=self._settings,
                    progress_interval=self._progress_interval,
                    previous_failure=self._failure,
                    inbound_problem=self._poll_problem if job == "drift" else None,
                    known_commits=tuple(
                        c
                        for c in (
                            (self._known.commit, self._known.refused_commit) if self._known else ()
                        )
                        if c
                    ),
                    log_level=level,
                    log_format=fmt,
                )
            except WorkerFailedError as exc:
                self._worker_failed(job, exc)
                raise
            except WorkerStoppedError as exc:
                # Asked for: the next agent resumes what it interrupted, as after any kill.
                log.info("%s: %s", self.cluster, exc)
                return None
            self._failures, self._failure = 0, None
            trace.mark(f"agent:{job}-worker-done")
            result = run.result
            self.metrics.worker_finished(job, run.seconds, max_rss=run.max_rss)
            replay(self.metrics, result.metrics)
            self.last = self._known = result
            # What this pass verified is what was there just before it started.
            self._verified = before if result.error is None else None
            if result.status is not None:
                self._take_status(result.status, result.facts)
            log.info("%s", result.summary)
            if result.error is not None:
                raise self._error(result.error, first=first)
            return result

    def _error(self, error: JobError, *, first: bool) -> FleetletError:
        if error.kind == "configuration":
            fatal = ConfigurationError(error.message)
            if first:
                self.fatal = fatal
                if self.on_fatal is not None:
                    self.on_fatal()
                return fatal
            # The cluster changed under a running agent (CRDs removed): try again later.
            failed: FleetletError = JobFailedError(error.message)
        elif error.kind == "permanent":
            failed = JobRefusedError(error.message)
        else:
            failed = JobFailedError(error.message, delay=error.delay)
        failed.reason = error.reason
        return failed

    def _worker_failed(self, job: Job, exc: WorkerFailedError) -> None:
        self._failures += 1
        self._failure = (
            f"{exc}; retried with backoff (failure {self._failures} in a row of the agent's "
            f"{job} worker)"
        )
        self._verified = None
        self.metrics.worker_finished(job, exc.seconds, failure=exc.cause)
        log.error("%s: %s", self.cluster, self._failure)
        if self.pusher is None or self.pusher.latest is None:
            return
        with contextlib.suppress(FleetletError, ValueError):
            self.pusher.update(_with_failure(self.pusher.latest, self._failure))
            self.pusher.tick()

    # -- status -------------------------------------------------------------------------------

    def _take_status(self, data: bytes, facts: bytes | None) -> None:
        if self.pusher is None:
            return
        try:
            self.pusher.update(
                self._with_channel(load_status(data, origin="the worker's status document")),
                facts=None
                if facts is None
                else load_reported_facts(facts, origin="the worker's cluster facts"),
            )
            self.pusher.tick()
            trace.mark("agent:status-pushed")
        except ValidationError as exc:
            log.warning("%s: the worker's status document is unreadable: %s", self.cluster, exc)
        except FleetletError as exc:
            # Kept pending (also across restarts) and pushed when the server is back.
            log.warning("%s: status not pushed yet: %s", self.cluster, exc)

    def _take_progress(self, path: Path) -> None:
        assert self.pusher is not None
        try:
            changed = path.stat().st_mtime
            if changed == self._progress_seen:
                return
            self._progress_seen = changed
            self.pusher.update(self._with_channel(load_status(path.read_bytes(), origin=str(path))))
        except (OSError, ValidationError):
            return  # not written yet, or being replaced: the next heartbeat reads it

    def _channel_state(self) -> str | None:
        channel = self.channel
        return None if channel is None else ("up" if channel() else "down")

    def _with_channel(self, doc: ClusterStatus) -> ClusterStatus:
        """``doc`` saying whether the channel is up (the worker does not know)."""
        return dataclasses.replace(doc, notify_channel=self._channel_state())


def _with_failure(doc: ClusterStatus, message: str) -> ClusterStatus:
    """``doc`` with Progressing and Degraded saying the worker failed on every bundle (Ready
    says what it said: what runs in the cluster has not been seen to change)."""
    now = datetime.now(UTC).replace(microsecond=0)
    bundles = []
    for bundle in doc.bundles:
        kept = [c for c in bundle.conditions if c.type not in ("Progressing", "Degraded")]
        old = {c.type: c for c in bundle.conditions}
        added = [
            Condition(
                type=kind,
                status="True",
                reason=WORKER_FAILED,
                message=message[:4096],
                last_transition_time=old[kind].last_transition_time
                if kind in old and old[kind].status == "True"
                else now,
            )
            for kind in ("Progressing", "Degraded")
        ]
        bundles.append(dataclasses.replace(bundle, conditions=tuple(kept + added)))
    return dataclasses.replace(doc, bundles=tuple(bundles))


__all__ = ["WORKER_FAILED", "JobFailedError", "JobRefusedError", "Supervisor"]
