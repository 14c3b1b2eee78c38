"""Start a worker process for one job, wait for it (bounded), read what it did.

:meth:`WorkerLauncher.run` writes the :class:`~agent.runner.protocol.JobRequest`, starts
``python -m agent.runner.worker REQUEST`` in a session of its own and waits for it up to the
timeout. A worker that does not exit in time is killed with SIGKILL: crash safety makes that
safe at any point (the next worker resumes or returns the interrupted move). However it ends,
what is left of its session (helm, kustomize, a plugin, their children) is killed with it.
Every way a worker can fail without a result (killed by a signal, an exit code, a timeout, an
unreadable result) raises :class:`WorkerFailedError`, a temporary error: the scheduler backs
off.

With ``warm`` (``agent run --warm-worker``) the next worker is started as soon as the last one
ended, as a *standby*: ``python -m agent.runner.worker --standby REQUEST`` imports what a job
needs, then waits for a line on its stdin; :meth:`~WorkerLauncher.run` writes the request and
that line instead of starting a process. It runs the whole job in one process (no second
step: sigstore stays loaded) and exits as any worker. The start and imports (1-2 s on a quiet
machine, several under load) then happen before the move is known, not after: a lower
commit-to-Ready for the standby's memory while it waits. A standby that died is replaced by a
worker started then, as without ``warm``.

:meth:`WorkerLauncher.stop` (``agent run`` got SIGTERM or SIGINT) ends the running worker at
once: SIGTERM to its process group, SIGKILL after :attr:`~WorkerLauncher.stop_grace` seconds
if it is still there (a worker killed at any point is safe, as above). That worker, and any
:meth:`~WorkerLauncher.run` after it, raises :class:`WorkerStoppedError`: a stop that was
asked for, not a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.errors import FleetletError, TemporaryError
from agent.runner.protocol import JobRequest, JobResult, write_atomically

FailureCause = Literal["signal", "exit", "timeout", "result"]
FAILURE_CAUSES: tuple[FailureCause, ...] = ("signal", "exit", "timeout", "result")
_Ending = Literal["exited", "timeout", "stopped"]


class WorkerStoppedError(FleetletError):
    """The worker was not run, or was ended before it wrote its result, because
    :meth:`WorkerLauncher.stop` was called: not a failure (nothing to retry or report)."""

    reason = "WorkerStopped"


class WorkerFailedError(TemporaryError):
    """A worker ended without a result: killed (``cause`` ``signal``: the OOM killer, a
    node's kill, a crash), exited with an error code (``exit``), did not finish within the
    timeout and was killed (``timeout``), or wrote no readable result (``result``)."""

    reason = "WorkerFailed"

    def __init__(self, message: str, *, cause: FailureCause, seconds: float) -> None:
        super().__init__(message)
        self.cause = cause
        self.seconds = seconds


@dataclass(frozen=True, kw_only=True)
class WorkerRun:
    """A worker that wrote its result: the result, how long it ran, its peak memory."""

    result: JobResult
    seconds: float
    max_rss: int
    """The worker's peak resident memory in bytes (``ru_maxrss`` of its rusage)."""


class WorkerLauncher:
    """Runs workers, one at a time, with request and result files under ``workdir``."""

    def __init__(
        self,
        *,
        workdir: Path,
        timeout: float,
        python: str = sys.executable,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        stop_grace: float = 5.0,
        warm: bool = False,
    ) -> None:
        """``timeout``: seconds a worker may run; ``environ``: its environment (default: this
        process's, which carries ``FLEETLET_*``, ``PYTHONPATH`` and credentials' paths);
        ``stop_grace``: seconds a worker has after :meth:`stop`'s SIGTERM before SIGKILL;
        ``warm``: keep a standby worker (module docstring)."""
        self.workdir = Path(workdir)
        self.timeout = timeout
        self.stop_grace = stop_grace
        self._python = python
        self._environ = environ
        self._clock = clock
        self._lock = threading.Lock()
        # Guards ``running`` and ``_stopping`` between run()'s thread and stop(). Reentrant:
        # stop() runs in a signal handler, which may interrupt the main thread inside stop().
        self._state = threading.Condition(threading.RLock())
        self._stopping = False
        self.running: int | None = None
        """The pid of the worker running now (None: none)."""
        self.warm = warm
        self._standby: subprocess.Popen[bytes] | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)

    @property
    def progress(self) -> Path:
        """Where a running worker writes its status document (for the heartbeats)."""
        return self.workdir / "progress.json"

    def run(
        self,
        job: Literal["tick", "drift"],
        *,
        settings: Mapping[str, object],
        progress_interval: float,
        previous_failure: str | None = None,
        inbound_problem: tuple[str, str] | None = None,
        known_commits: tuple[str, ...] = (),
        log_level: str = "info",
        log_format: str = "text",
    ) -> WorkerRun:
        """Run ``job`` in a new worker and wait for it (at most :attr:`timeout`).

        Raises WorkerFailedError (no result: see the class), WorkerStoppedError (:meth:`stop`
        was called before it started or while it ran), OSError (the worker cannot be started).
        """
        with self._lock:
            request = JobRequest(
                job=job,
                settings=settings,
                result=self.workdir / "result.json",
                progress=self.progress,
                progress_interval=progress_interval,
                parent_pid=os.getpid(),
                previous_failure=previous_failure,
                inbound_problem=inbound_problem,
                known_commits=known_commits,
                log_level=log_level,
                log_format=log_format,
            )
            for stale in (request.result, request.progress):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
            path = self.workdir / "request.json"
            # Settings only, no secret: credentials stay in their files and variables.
            write_atomically(path, request.to_json())
            started = self._clock()
            # Started under the state lock: a stop() in between cannot miss this worker.
            with self._state:
                if self._stopping:
                    raise WorkerStoppedError(f"the {job} worker was not started: stopping")
                worker = self._wake_standby() or self._start(path)
                self.running = worker.pid
            try:
                ending = self._wait(worker)
            finally:
                with self._state:
                    self.running = None
                _kill_session(worker.pid)
                # Reaped here, with its rusage: the Popen object must not wait for it again.
                _pid, status, usage = os.wait4(worker.pid, 0)
                worker.returncode = os.waitstatus_to_exitcode(status)
            max_rss = int(usage.ru_maxrss) * 1024
            seconds = self._clock() - started
            if self.warm:
                with self._state:
                    if not self._stopping:
                        self._standby = self._start(path, standby=True)
            return self._outcome(job, request.result, status, max_rss, ending, seconds)

    def _start(self, path: Path, *, standby: bool = False) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [self._python, "-m", "agent.runner.worker", *(["--standby"] if standby else []),
             str(path)],
            stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
            env=dict(self._environ) if self._environ is not None else None,
            start_new_session=True,
        )  # fmt: skip

    def _wake_standby(self) -> subprocess.Popen[bytes] | None:
        """The standby worker told to read the request (None: there is none, or it died)."""
        standby, self._standby = self._standby, None
        if standby is None:
            return None
        if standby.poll() is None and standby.stdin is not None:
            try:
                standby.stdin.write(b"go\n")
                standby.stdin.close()
                return standby
            except OSError:
                pass  # it died just now
        _kill_session(standby.pid)
        with contextlib.suppress(ChildProcessError):
            standby.wait()
        return None

    def close(self) -> None:
        """End the standby worker, if any (the agent is stopping)."""
        with self._state:
            standby, self._standby = self._standby, None
        if standby is not None:
            _kill_session(standby.pid)
            with contextlib.suppress(ChildProcessError):
                standby.wait()

    def stop(self) -> None:
        """End the running worker (SIGTERM to its process group now, SIGKILL after
        :attr:`stop_grace` seconds, by :meth:`run`'s thread) and start no other. Returns at
        once: safe in a signal handler. Idempotent."""
        with self._state:
            self._stopping = True
            if self.running is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.running, signal.SIGTERM)
            if self._standby is not None:  # it has done nothing: no grace needed
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._standby.pid, signal.SIGKILL)
            self._state.notify_all()

    def _wait(self, worker: subprocess.Popen[bytes]) -> _Ending:
        """Wait until the worker has exited (not reaping it); kill it past the timeout, or past
        the grace after :meth:`stop`. Returns how its wait ended."""
        outcome: list[bool] = []

        def wait() -> None:
            # Not reaped: until run() reaps it, its pid (its session's id) is not reused.
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)
            with self._state:
                outcome.append(True)
                self._state.notify_all()

        waiter = threading.Thread(target=wait, name="worker-waiter", daemon=True)
        waiter.start()
        with self._state:
            self._state.wait_for(lambda: bool(outcome) or self._stopping, self.timeout)
            ending: _Ending = "stopped" if self._stopping else "exited"
            if ending == "stopped" and not outcome:
                # stop() sent SIGTERM: a worker that ignores it (or is stopped) gets SIGKILL.
                self._state.wait_for(lambda: bool(outcome), self.stop_grace)
            elif not outcome:
                ending = "timeout"
        if not outcome:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.pid, signal.SIGKILL)
            waiter.join()
        return ending

    def _outcome(
        self,
        job: str,
        result_path: Path,
        status: int,
        max_rss: int,
        ending: _Ending,
        seconds: float,
    ) -> WorkerRun:
        what = f"the {job} worker"
        if ending == "stopped":
            try:
                # It may have finished just before the stop: then its result counts.
                result = JobResult.from_json(result_path.read_bytes())
            except (OSError, ValueError):
                raise WorkerStoppedError(
                    f"{what} was stopped after {seconds:.0f} s: the agent is stopping"
                ) from None
            return WorkerRun(result=result, seconds=seconds, max_rss=max_rss)
        if ending == "timeout":
            raise WorkerFailedError(
                f"{what} did not finish within {self.timeout:g} s and was killed",
                cause="timeout",
                seconds=seconds,
            )
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            name = signal.Signals(number).name if number in signal.valid_signals() else "?"
            raise WorkerFailedError(
                f"{what} was killed by signal {number} ({name}) after {seconds:.0f} s"
                + (" (out of memory?)" if number == signal.SIGKILL else ""),
                cause="signal",
                seconds=seconds,
            )
        try:
            result = JobResult.from_json(result_path.read_bytes())
        except (OSError, ValueError) as exc:
            code = os.waitstatus_to_exitcode(status)
            cause: FailureCause = "exit" if code != 0 else "result"
            raise WorkerFailedError(
                f"{what} exited with code {code} after {seconds:.0f} s without a result ({exc})",
                cause=cause,
                seconds=seconds,
            ) from exc
        return WorkerRun(result=result, seconds=seconds, max_rss=max_rss)


def _kill_session(sid: int) -> None:
    """SIGKILL the worker (pid ``sid``, its session's leader) and every process of its session,
    and wait until all are dead. Raises OSError only when ``/proc`` cannot be listed.

    Its process group is not enough: ``run_tool`` starts helm, kustomize and plugins in process
    groups of their own (so that a render timeout kills a tool's children too), and a tool left
    behind would run on with no one to enforce its time bound. They stay in the worker's
    session (none of them calls setsid). A process the agent inherited (as its container's
    first process, or a subreaper) is reaped, else it would stay a zombie; the others are only
    waited for until they are dead (their parent reaps them). The worker itself must be our
    child: it is left unreaped, for its caller to reap with its rusage.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(sid, signal.SIGKILL)
    # Once it is dead it forks no more, its children are reparented, and its pid stays reserved.
    os.waitid(os.P_PID, sid, os.WEXITED | os.WNOWAIT)
    me = os.getpid()
    while True:
        left = False
        for name in os.listdir("/proc"):
            try:
                if not name.isdigit() or int(name) == sid or os.getsid(int(name)) != sid:
                    continue
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            pid = int(name)
            state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
            ours = int(parent) == me
            if state in ("Z", "X") and not ours:
                continue  # dead: its parent reaps it
            left = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if ours:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        if not left:
            return
        time.sleep(0.01)  # the next pass finds the killed dead, or their children reparented


__all__ = [
    "FAILURE_CAUSES",
    "FailureCause",
    "WorkerFailedError",
    "WorkerLauncher",
    "WorkerRun",
    "WorkerStoppedError",
]
