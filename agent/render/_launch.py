"""One renderer's child process as it is started: its key, its start (confined, in its own
process group), its memory bound, and the head starts (:func:`start_early`) waiting to be taken
over by the render that asks for that very process.

Part of :mod:`agent.render._process` (which re-exports :func:`discard_early`), kept apart and
lean so that ``fleetlet render``'s head start (:mod:`agent.render.headstart`) can start helm or
kustomize before the rest of fleetlet loads: it imports ``subprocess`` and the kernel's side of
the confinement, nothing else of fleetlet's.
"""

from __future__ import annotations

import atexit
import contextlib  # subprocess loads it anyway
import os
import resource
import signal
import subprocess
import time

from agent.render._sandbox import Confinement, start_confined

TYPE_CHECKING = False  # typing itself is not imported: it costs ~2 ms at start
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    StrPath = str | os.PathLike[str]


class Launch:
    """One child process as :func:`run_tool` starts it, and its key: what makes two launches
    the same process (argv, directory, environment, stdin, confinement, memory bound; a
    render's fresh scratch directory stands for any other fresh one)."""

    def __init__(self, args: list[str], *, cwd: StrPath, max_memory: int, input: bytes | None,
                 env: Mapping[str, str] | None, confine: Confinement | None,
                 scratch: StrPath | None) -> None:  # fmt: skip
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

        self.confine = confine
        reach = None
        if confine is not None:
            reach = tuple(tuple(same(p) for p in group) for group in confine.reach())
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

    def start_confined(self) -> subprocess.Popen[bytes]:
        """:meth:`start` under its confinement, if it has one. The caller warns where the
        kernel cannot confine (:func:`agent.render.confine.run_confined`). Raises OSError,
        ConfinementError."""
        if self.confine is None:
            return self.start()
        return start_confined(self.confine, self.start)


class HeadStart:
    """A child process started before the render that needs it (:func:`start_early`)."""

    def __init__(self, proc: subprocess.Popen[bytes], started: float) -> None:
        self.proc = proc
        self.started = started
        self.adopted = False
        """Whether a :func:`run_tool` call took it over (else :func:`discard_early` kills it)."""


_HEAD_STARTS: dict[tuple[object, ...], HeadStart] = {}


def take_early(key: tuple[object, ...]) -> HeadStart | None:
    """The head start of the process with this key (:attr:`Launch.key`), now taken over (its
    :attr:`HeadStart.adopted` set); None when there is none."""
    early = _HEAD_STARTS.pop(key, None)
    if early is not None:
        early.adopted = True
    return early


def start_early(
    argv: Sequence[StrPath],
    *,
    cwd: StrPath,
    max_memory: int,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    confine: Confinement | None = None,
    scratch: StrPath | None = None,
) -> HeadStart:
    """Start now the process that :func:`run_tool` with the same arguments would start, bounded
    and confined as it would be. The ``run_tool`` call asking for that very process takes it
    over (its time bound counted from now); any other call starts its own. What no call takes
    over is killed by :func:`discard_early` (call it when the work is done; it also runs at
    exit). Raises OSError, ConfinementError when it cannot be started."""
    launch = Launch(
        [os.fspath(a) for a in argv], cwd=cwd, max_memory=max_memory, input=input, env=env,
        confine=confine, scratch=scratch,
    )  # fmt: skip
    started = time.monotonic()
    proc = launch.start_confined()
    try:
        bound(proc.pid, max_memory)
    except OSError:
        kill_group(proc)
        raise
    if not _HEAD_STARTS:
        atexit.register(discard_early)
    early = HeadStart(proc, started)
    previous = _HEAD_STARTS.pop(launch.key, None)
    _HEAD_STARTS[launch.key] = early
    if previous is not None:
        kill_group(previous.proc)
    return early


def discard_early() -> None:
    """Kill and reap every head start that no render took over."""
    while _HEAD_STARTS:
        _, early = _HEAD_STARTS.popitem()
        kill_group(early.proc)


def bound(pid: int, max_memory: int) -> None:
    """Limit the running child's writable memory and forbid core dumps (raises OSError)."""
    try:
        resource.prlimit(pid, resource.RLIMIT_DATA, (max_memory, max_memory))
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
    except ProcessLookupError:
        pass  # it has already exited (not yet reaped): nothing left to bound


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the tool's process group and reap the tool."""
    # Also when the tool exited: a child it left behind (kustomize's helm) must not outlive it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()


__all__ = [
    "HeadStart",
    "Launch",
    "bound",
    "discard_early",
    "kill_group",
    "start_early",
    "take_early",
]
