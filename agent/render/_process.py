"""Run an external renderer (helm, kustomize) as a bounded child process.

:func:`run_tool` gives the child a time bound (killed, with its whole process group, when it
runs over), a memory bound (``RLIMIT_DATA``, plus ``GOMEMLIMIT`` so a Go tool collects garbage
before it reaches the hard limit), a cap on what it may print, no core dumps, and only the
environment it is given.

The limits are set with ``prlimit(2)`` on the child the moment it has ``exec``'d, not between
fork and exec: a ``preexec_fn`` runs Python in the forked child (which can deadlock in a threaded
agent, and rules out ``vfork``), and util-linux's ``prlimit`` as a wrapper costs one more exec,
about 0.8 ms of a 40 ms helm render. In the microseconds between exec and the limit the tool
is still starting its runtime; what it writes after that counts against the bound, and a limit
that cannot be set stops the tool (fails closed).

Why ``RLIMIT_DATA`` and not ``RLIMIT_AS``: the Go runtime reserves about 750 MiB of address space
at start (measured with helm 4.3: it cannot start below ``ulimit -v`` 800 MiB), so an address
space limit bounds nothing useful; reserved, inaccessible mappings do not count against
``RLIMIT_DATA``, while every page of heap the tool writes does (helm renders a small chart in
about 96 MiB of it). A failure becomes one of our errors with the
tail of the tool's own message, so a broken chart reads as helm's reason, not as a traceback.

The child is started confined when the caller says how (``confine``: :mod:`agent.render.confine`,
the tree to read, a scratch directory to write, no network); a refused access then reads as the
tool's own error with the confinement named.

:func:`start_early` starts such a child ahead of the call that needs it (``fleetlet render``'s
head start, :mod:`agent.render.headstart`): :func:`run_tool` takes it over only when it asks for
that very process, and :func:`discard_early` kills what no call took.

Every error here is permanent: the same tree and options render the same way, so retrying a
timeout or an out-of-memory would only burn the agent's CPU again (``reason`` says which).
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.errors import PermanentError
from agent.render._launch import (
    HeadStart,
    Launch,
    bound,
    discard_early,
    kill_group,
    start_early,
    take_early,
)
from agent.render.confine import Confinement, explain_refusal, run_confined

DEFAULT_MAX_OUTPUT = 64 * 1024 * 1024
"""Bytes a tool may write to stdout (a render bigger than this is refused)."""
_MAX_STDERR = 64 * 1024
_STDERR_TAIL_LINES = 12


class ToolError(PermanentError):
    """An external tool failed; ``tool`` names it, the message carries its own words."""

    reason = "RenderFailed"

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool


class ToolFailedError(ToolError):
    """The tool exited with an error (its stderr's tail is in the message)."""

    reason = "RenderFailed"


class ToolTimeoutError(ToolError):
    """The tool ran longer than its time bound and was killed."""

    reason = "RenderTimeout"


class ToolMemoryError(ToolError):
    """The tool needed more memory than its bound."""

    reason = "RenderOutOfMemory"


class ToolOutputTooLargeError(ToolError):
    """The tool printed more than the output cap and was killed."""

    reason = "RenderTooLarge"


def run_tool(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path,
    timeout: float,
    max_memory: int,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    confine: Confinement | None = None,
    scratch: Path | None = None,
) -> bytes:
    """Run ``argv`` in ``cwd`` and return its stdout.

    ``timeout`` in seconds; ``max_memory`` in bytes of writable memory; ``env`` is the child's
    whole environment (default: only ``PATH``), so nothing of the agent's leaks into a tool;
    ``input`` is written to its stdin (else stdin is empty); ``confine``: what the tool may
    reach (:mod:`agent.render.confine`; every renderer passes one), None for no confinement;
    ``scratch``: the fresh, empty directory of this render that ``argv``, ``env`` or
    ``confine`` name, if any (a head start's own scratch directory stands for it, see
    :func:`start_early`).

    Raises ToolFailedError (non-zero exit, with its stderr), ToolTimeoutError,
    ToolMemoryError, ToolOutputTooLargeError, and ToolFailedError when it cannot be started.
    """
    args = [os.fspath(a) for a in argv]
    tool = Path(args[0]).name
    launch = Launch(args, cwd=cwd, max_memory=max_memory, input=input, env=env,
                    confine=confine, scratch=scratch)  # fmt: skip
    remaining = timeout
    early = take_early(launch.key)
    if early is not None:
        # The very process this call would start, started earlier (:func:`start_early`):
        # bounded from its start, its time counted from its start.
        proc = early.proc
        remaining -= time.monotonic() - early.started
    else:
        try:
            proc = run_confined(confine, launch.start)
        except OSError as exc:
            raise ToolFailedError(f"{tool}: cannot start {args[0]}: {exc}", tool=tool) from exc
        try:
            bound(proc.pid, max_memory)
        except OSError as exc:
            kill_group(proc)
            raise ToolFailedError(f"{tool}: cannot bound its memory: {exc}", tool=tool) from exc
    try:
        stdout, stderr, overflow = _communicate(proc, input, remaining, max_output)
    finally:
        kill_group(proc)
    message = _tail(stderr)
    if confine is not None:
        message = explain_refusal(message) or message
    if overflow == "time":
        raise ToolTimeoutError(f"{tool} ran longer than {timeout:g} s and was stopped", tool=tool)
    if overflow == "output":
        raise ToolOutputTooLargeError(
            f"{tool} printed more than {max_output} bytes and was stopped", tool=tool
        )
    if proc.returncode != 0:
        if _out_of_memory(stderr, proc.returncode):
            raise ToolMemoryError(
                f"{tool} needed more than {max_memory // (1024 * 1024)} MiB of memory"
                + (f": {message}" if message else ""),
                tool=tool,
            )
        status = (
            f"killed by signal {-proc.returncode}"
            if proc.returncode < 0
            else f"exit code {proc.returncode}"
        )
        raise ToolFailedError(f"{tool} failed ({status}): {message or 'no message'}", tool=tool)
    return stdout


def _communicate(
    proc: subprocess.Popen[bytes], input: bytes | None, timeout: float, max_output: int
) -> tuple[bytes, bytes, str | None]:
    """Feed stdin, collect stdout (capped) and stderr (its tail), within ``timeout``.

    Returns (stdout, stderr, overflow) where overflow is None, "time" or "output".
    """
    deadline = time.monotonic() + timeout
    out = bytearray()
    err = bytearray()
    pending = memoryview(input or b"")
    with selectors.DefaultSelector() as selector:
        assert proc.stdout is not None and proc.stderr is not None
        selector.register(proc.stdout, selectors.EVENT_READ, "out")
        selector.register(proc.stderr, selectors.EVENT_READ, "err")
        if proc.stdin is not None:
            if pending:
                os.set_blocking(proc.stdin.fileno(), False)
                selector.register(proc.stdin, selectors.EVENT_WRITE, "in")
            else:
                proc.stdin.close()
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), "time"
            for key, _ in selector.select(remaining):
                stream = key.fileobj
                if key.data == "in":
                    try:
                        written = os.write(proc.stdin.fileno(), pending[: 1 << 16])  # type: ignore[union-attr]
                    except BrokenPipeError:
                        written = len(pending)  # the tool stopped reading; its exit says why
                    pending = pending[written:]
                    if not pending:
                        selector.unregister(stream)
                        proc.stdin.close()  # type: ignore[union-attr]
                    continue
                chunk = os.read(stream.fileno(), 1 << 16)  # type: ignore[union-attr]
                if not chunk:
                    selector.unregister(stream)
                    stream.close()  # type: ignore[union-attr]
                elif key.data == "out":
                    out += chunk
                    if len(out) > max_output:
                        return bytes(out), bytes(err), "output"
                else:
                    err += chunk
                    if len(err) > 2 * _MAX_STDERR:
                        del err[: len(err) - _MAX_STDERR]
    if not _wait_exit(proc, max(deadline - time.monotonic(), 0.001)):
        return bytes(out), bytes(err), "time"
    return bytes(out), bytes(err), None


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait at most ``timeout`` seconds for the tool to exit; whether it did.

    A pidfd wakes us the moment it exits: ``Popen.wait(timeout=...)`` polls with sleeps that
    grow to 50 ms, which added about half a millisecond to every helm render.
    """
    if proc.poll() is not None:
        return True
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # not Linux 5.3+: the polling wait
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            return False
    finally:
        os.close(pidfd)
    proc.wait()
    return True


def _out_of_memory(stderr: bytes, returncode: int) -> bool:
    text = stderr.decode("utf-8", "replace").lower()
    return (
        "out of memory" in text
        or "cannot allocate memory" in text
        or "memory allocation failed" in text
        # Killed without a word (the kernel's OOM killer) or a runtime that crashed while
        # it could not map its own structures (Go under a very small limit).
        or (returncode < 0 and -returncode in (signal.SIGKILL, signal.SIGSEGV) and not text)
    )


def _tail(stderr: bytes) -> str:
    """The tool's own words: a Go crash's first line (not its stack), else the last lines."""
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    crash = [ln for ln in lines if ln.startswith(("panic:", "fatal error:"))]
    if crash:
        return crash[0]
    return " | ".join(lines[-_STDERR_TAIL_LINES:])


__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "HeadStart",
    "ToolError",
    "ToolFailedError",
    "ToolMemoryError",
    "ToolOutputTooLargeError",
    "ToolTimeoutError",
    "discard_early",
    "run_tool",
    "start_early",
]
