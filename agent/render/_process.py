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

import atexit
import contextlib
import os
import resource
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.errors import PermanentError
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
    launch = _Launch(args, cwd=cwd, max_memory=max_memory, input=input, env=env,
                     confine=confine, scratch=scratch)  # fmt: skip
    remaining = timeout
    early = _HEAD_STARTS.pop(launch.key, None)
    if early is not None:
        # The very process this call would start, started earlier (:func:`start_early`):
        # bounded from its start, its time counted from its start.
        early.adopted = True
        proc = early.proc
        remaining -= time.monotonic() - early.started
    else:
        try:
            proc = run_confined(confine, launch.start)
        except OSError as exc:
            raise ToolFailedError(f"{tool}: cannot start {args[0]}: {exc}", tool=tool) from exc
        try:
            _bound(proc.pid, max_memory)
        except OSError as exc:
            _kill_group(proc)
            raise ToolFailedError(f"{tool}: cannot bound its memory: {exc}", tool=tool) from exc
    try:
        stdout, stderr, overflow = _communicate(proc, input, remaining, max_output)
    finally:
        _kill_group(proc)
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


class _Launch:
    """One child process as :func:`run_tool` starts it, and its key: what makes two launches
    the same process (argv, directory, environment, stdin, confinement, memory bound; a
    render's fresh scratch directory stands for any other fresh one)."""

    def __init__(self, args: list[str], *, cwd: Path, max_memory: int, input: bytes | None,
                 env: Mapping[str, str] | None, confine: Confinement | None,
                 scratch: Path | None) -> None:  # fmt: skip
        self.args = args
        self.cwd = cwd
        self.input = input
        path = os.environ.get("PATH", "/usr/bin:/bin")
        self.env = dict(env) if env is not None else {"PATH": path}
        # A soft limit below the hard one: the Go runtime collects harder instead of dying early.
        self.env.setdefault("GOMEMLIMIT", str(max_memory * 3 // 4))
        here = os.fspath(scratch) if scratch is not None else None

        def same(text: str) -> str:
            return text.replace(here, "<scratch>") if here else text

        reach = None
        if confine is not None:
            groups = (confine.read, confine.write, confine.execute, confine.listable)
            reach = tuple(tuple(same(os.fspath(p)) for p in group) for group in groups)
        self.key: tuple[object, ...] = (
            tuple(same(a) for a in args),
            same(os.path.realpath(cwd)),
            tuple(sorted((k, same(v)) for k, v in self.env.items())),
            input,
            reach,
            max_memory,
        )

    def start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.args,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.PIPE if self.input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,  # its own process group: a timeout kills its children too
        )


class HeadStart:
    """A child process started before the render that needs it (:func:`start_early`)."""

    def __init__(self, proc: subprocess.Popen[bytes], started: float) -> None:
        self.proc = proc
        self.started = started
        self.adopted = False
        """Whether a :func:`run_tool` call took it over (else :func:`discard_early` kills it)."""


_HEAD_STARTS: dict[tuple[object, ...], HeadStart] = {}


def start_early(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path,
    max_memory: int,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    confine: Confinement | None = None,
    scratch: Path | None = None,
) -> HeadStart:
    """Start now the process that :func:`run_tool` with the same arguments would start, bounded
    and confined as it would be. The ``run_tool`` call asking for that very process takes it
    over (its time bound counted from now); any other call starts its own. What no call takes
    over is killed by :func:`discard_early` (call it when the work is done; it also runs at
    exit). Raises OSError, ConfinementError when it cannot be started."""
    launch = _Launch(
        [os.fspath(a) for a in argv], cwd=cwd, max_memory=max_memory, input=input, env=env,
        confine=confine, scratch=scratch,
    )  # fmt: skip
    started = time.monotonic()
    proc = run_confined(confine, launch.start)
    try:
        _bound(proc.pid, max_memory)
    except OSError:
        _kill_group(proc)
        raise
    if not _HEAD_STARTS:
        atexit.register(discard_early)
    early = HeadStart(proc, started)
    previous = _HEAD_STARTS.pop(launch.key, None)
    _HEAD_STARTS[launch.key] = early
    if previous is not None:
        _kill_group(previous.proc)
    return early


def discard_early() -> None:
    """Kill and reap every head start that no render took over."""
    while _HEAD_STARTS:
        _, early = _HEAD_STARTS.popitem()
        _kill_group(early.proc)


def _bound(pid: int, max_memory: int) -> None:
    """Limit the running child's writable memory and forbid core dumps (raises OSError)."""
    try:
        resource.prlimit(pid, resource.RLIMIT_DATA, (max_memory, max_memory))
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
    except ProcessLookupError:
        pass  # it has already exited (not yet reaped): nothing left to bound


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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the tool's process group and reap the tool."""
    # Also when the tool exited: a child it left behind (kustomize's helm) must not outlive it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()


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
