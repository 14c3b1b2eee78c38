"""Confine a renderer (helm, kustomize, a format plugin's worker) before it runs.

Bundle content is hostile (a chart's ``.Files.Get``, a kustomization's paths, a plugin's
Python): whatever it makes its renderer do, the renderer may only

- read the bundle tree and its own program and libraries (:attr:`Confinement.read`,
  :attr:`Confinement.execute`),
- write its scratch directory (:attr:`Confinement.write`),
- and nothing else: no other file (the ServiceAccount token under
  ``/var/run/secrets/kubernetes.io/serviceaccount``, the agent's state, git credentials,
  ``/proc`` of the agent), no TCP connection or listening port, no socket of any family, no
  signal to a process outside its sandbox.

How, with the kernel's unprivileged mechanisms (no capability needed, so it works in a pod):

- ``no_new_privs`` (``prctl``), which the two others require;
- a seccomp filter that fails ``socket(2)`` and ``io_uring_setup(2)`` with ``EACCES`` (no
  network of any family, UDP included, and no io_uring to go around the filter);
- Landlock (Linux 5.13+): a ruleset handling every filesystem right the kernel knows, TCP
  bind and connect (ABI 4+), and the abstract-socket and signal scopes (ABI 6+), with rules
  for the paths above only.

They are applied in a short-lived thread of our own process that then starts the child and
ends: Landlock, seccomp and ``no_new_privs`` bind the calling thread and are inherited by the
processes it starts, so no Python runs between fork and exec (no ``preexec_fn``, which can
deadlock in a threaded agent and rules out ``vfork``), the agent's other threads stay free,
and the cost is one thread and a few system calls per render (see ``docs/benchmarks.md``).

Where the kernel has no Landlock (older than 5.13, or not enabled), renders keep their other
bounds (time, memory, output, environment, the checks before they run) and
:func:`support` says so; the agent logs it at start and exports
``fleetlet_agent_render_confinement``. A rule that cannot be applied where Landlock exists
fails the render (closed).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import gc
import os
import stat
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agent.errors import PermanentError

_T = TypeVar("_T")

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on every arch.
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_READ_DIR = 1 << 3
_TRUNCATE = 1 << 14
_IOCTL_DEV = 1 << 15
# Rights that apply to a file (the others only to a directory's entries).
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

# (audit arch, socket, io_uring_setup, first number of a foreign ABI sharing the arch or None)
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, 41, 425, 0x40000000),
    "aarch64": (0xC00000B7, 198, 425, None),
}

_SYSTEM_LIBRARIES = ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/local/lib")
_DEVICES_READ = ("/dev/urandom", "/dev/random")


class ConfinementError(PermanentError):
    """The renderer's confinement could not be set up where the kernel supports it (the
    render is not run unconfined)."""

    reason = "RenderFailed"


@dataclass(frozen=True, kw_only=True)
class Confinement:
    """What one renderer may reach: paths (files or directories, each with what is beneath)
    it may read, write, or execute. Paths that do not exist are left out."""

    read: tuple[Path, ...] = ()
    write: tuple[Path, ...] = ()
    execute: tuple[Path, ...] = ()
    listable: tuple[Path, ...] = ()
    """Directories whose entries (names, not contents) may be listed, beneath them too."""

    def readable(self, path: Path) -> bool:
        """Whether a file at ``path`` could be read under this confinement (is, or lies
        beneath, a path it may read, write or execute)."""
        real = os.path.realpath(path)
        for allowed in (*self.read, *self.write, *self.execute):
            base = os.path.realpath(allowed)
            if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
                return True
        return False

    def plus(
        self, *, read: Iterable[Path] = (), write: Iterable[Path] = (),
        execute: Iterable[Path] = ()
    ) -> Confinement:  # fmt: skip
        """This confinement with more paths."""
        return Confinement(
            read=self.read + tuple(read),
            write=self.write + tuple(write),
            execute=self.execute + tuple(execute),
            listable=self.listable,
        )


def for_tool(binary: Path, *, tree: Path, scratch: Path | None = None,
             also_execute: Iterable[Path] = ()) -> Confinement:  # fmt: skip
    """A static binary (helm, kustomize: Go) reading ``tree`` and writing ``scratch``."""
    return Confinement(
        read=(tree,),
        write=(scratch,) if scratch is not None else (),
        execute=(binary, *also_execute),
    )


def for_python(
    *, tree: Path | None, scratch: Path | None, path: Iterable[str], code: Path
) -> Confinement:
    """This interpreter (its program, standard library and the system's shared libraries)
    running with ``sys.path`` = ``[code, *path]``, reading ``tree`` and writing ``scratch``.

    ``code`` is fleetlet's code root: its entries may be listed (the import system needs that)
    but only its ``agent`` package read, so a root that is a source checkout or a home
    directory gives away nothing else."""
    import sysconfig  # here: only a plugin's worker needs it (a render starts sooner)

    read = [Path(p) for p in path] + [code / "agent"]
    for key in ("stdlib", "platstdlib"):
        read.append(Path(sysconfig.get_path(key)))
    libdir = sysconfig.get_config_var("LIBDIR")  # libpython, when it is a shared library
    libraries = [Path(p) for p in _SYSTEM_LIBRARIES] + ([Path(libdir)] if libdir else [])
    read += libraries
    read.append(Path("/etc/ld.so.cache"))
    if tree is not None:
        read.append(tree)
    return Confinement(
        read=tuple(read),
        listable=(code,),
        write=(scratch,) if scratch is not None else (),
        execute=(
            Path(sys.executable),
            Path(os.path.realpath(sys.executable)),
            *libraries,  # the loader and shared libraries are "executed"
        ),
    )


_NOWHERE = "http://127.0.0.1:9"
# Every proxy variable a Go or Python tool reads, at a closed local port.
_NO_PROXY: Mapping[str, str] = {
    "HTTP_PROXY": _NOWHERE,
    "HTTPS_PROXY": _NOWHERE,
    "http_proxy": _NOWHERE,
    "https_proxy": _NOWHERE,
    "NO_PROXY": "",
    "no_proxy": "",
}


# helm's whole environment (here, beside the other renderers', so that `fleetlet render`'s
# head start can start helm without importing the helm format): no cluster, no network, and no state. Its home and every ``HELM_*``
# directory lie under /dev/null, a file, so nothing there can be read or created (not even by
# root): no repositories, no registry logins, no plugins (so no post-renderer), no cache shared
# between renders. The registry configuration is /dev/null itself, because helm opens it on
# every start and takes "not a directory" for an error.
_HELM_NO_STATE = "/dev/null/fleetlet-helm"
HELM_ENVIRONMENT: Mapping[str, str] = {
    "PATH": "/usr/bin:/bin",
    "HOME": _HELM_NO_STATE,
    "HELM_CACHE_HOME": f"{_HELM_NO_STATE}/cache",
    "HELM_CONFIG_HOME": f"{_HELM_NO_STATE}/config",
    "HELM_DATA_HOME": f"{_HELM_NO_STATE}/data",
    "HELM_PLUGINS": f"{_HELM_NO_STATE}/plugins",
    "HELM_REGISTRY_CONFIG": "/dev/null",
    "HELM_REPOSITORY_CONFIG": f"{_HELM_NO_STATE}/config/repositories.yaml",
    "HELM_REPOSITORY_CACHE": f"{_HELM_NO_STATE}/cache/repository",
    "KUBECONFIG": f"{_HELM_NO_STATE}/kubeconfig",
    **_NO_PROXY,
}


def environment(*, scratch: Path | None, home: str = "/dev/null/fleetlet-render") -> dict[str, str]:
    """A renderer's whole environment (kustomize passes it on to helm): ``PATH``, temporary
    files in ``scratch``, a home under ``/dev/null`` where nothing can exist, proxies at a
    closed local port; nothing of the agent's (no token, no credentials)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "XDG_CONFIG_HOME": home,
        **_NO_PROXY,
    }
    if scratch is not None:
        env["TMPDIR"] = str(scratch)
    return env


@dataclass(frozen=True)
class Support:
    """What the kernel here offers to confine renderers."""

    landlock_abi: int
    """The Landlock ABI version (0: none)."""
    seccomp: bool
    """Whether the socket filter can be installed (an architecture fleetlet knows)."""
    detail: str = field(default="")
    """Why Landlock is missing, when it is."""

    @property
    def confined(self) -> bool:
        """Whether renderers are confined to their files (Landlock)."""
        return self.landlock_abi > 0

    @property
    def network(self) -> str:
        """How the network is closed to renderers: ``landlock+seccomp``, ``seccomp`` or ``none``."""
        parts = [name for name, on in (("landlock", self.landlock_abi >= 4),
                                       ("seccomp", self.seccomp)) if on]  # fmt: skip
        return "+".join(parts) or "none"

    def describe(self) -> str:
        """One line for the log."""
        if self.confined:
            return (
                f"renderers confined: Landlock ABI {self.landlock_abi} (files"
                f"{', TCP' if self.landlock_abi >= 4 else ''}"
                f"{', signals' if self.landlock_abi >= 6 else ''}), "
                f"sockets {'denied (seccomp)' if self.seccomp else 'not filtered'}"
            )
        return (
            f"renderers NOT confined to their files: {self.detail}; they keep their time, "
            f"memory and output bounds{', sockets denied (seccomp)' if self.seccomp else ''}"
        )


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def _syscall(*args: object) -> int:
    return int(_libc().syscall(*args))


@functools.cache
def support() -> Support:
    """What this kernel offers (asked once)."""
    seccomp = sys.platform == "linux" and os.uname().machine in _SECCOMP_ARCH
    if sys.platform != "linux":
        return Support(0, False, f"{sys.platform} has no Landlock")
    abi = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if abi < 0:
        code = ctypes.get_errno()
        why = {
            errno.ENOSYS: "the kernel has no Landlock (Linux 5.13+ with CONFIG_SECURITY_LANDLOCK)",
            errno.EOPNOTSUPP: "Landlock is built in but not enabled (lsm= boot parameter)",
        }.get(code, f"Landlock unavailable ({os.strerror(code)})")
        return Support(0, seccomp, why)
    return Support(int(abi), seccomp)


def run_confined(confinement: Confinement | None, start: Callable[[], _T]) -> _T:
    """``start()`` (which starts the child process) from a thread confined by
    ``confinement``: the child inherits the confinement. ``None``: just ``start()``.

    Raises ConfinementError when the confinement cannot be applied on a kernel that supports
    it; whatever ``start`` raises.
    """
    if confinement is None:
        return start()
    found = support()
    if not found.confined:
        _warn_once(found)
        if sys.platform != "linux":
            return start()  # no prctl, no seccomp: the other bounds only
    ruleset = _ruleset(confinement, found.landlock_abi) if found.confined else None
    outcome: list[object] = []

    def confined() -> None:
        try:
            _restrict_thread(ruleset, found)
            outcome.append(start())
        except BaseException as exc:  # carried to the caller's thread
            outcome.append(exc)

    try:
        with _no_collection():
            thread = threading.Thread(target=confined, name="fleetlet-confined-start")
            thread.start()
            thread.join()
    finally:
        if ruleset is not None:
            os.close(ruleset)
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result  # type: ignore[return-value]


_collection = threading.Lock()
_collection_holds = 0
_collection_was_on = False


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection while a confined thread runs Python: a finalizer it ran
    (another object's temporary directory) would find itself confined too. Counted, so that
    renders started at once from several threads restore it once, as it was."""
    global _collection_holds, _collection_was_on
    with _collection:
        if _collection_holds == 0:
            _collection_was_on = gc.isenabled()
            gc.disable()
        _collection_holds += 1
    try:
        yield
    finally:
        with _collection:
            _collection_holds -= 1
            if _collection_holds == 0 and _collection_was_on:
                gc.enable()


@functools.cache
def _warn_once(found: Support) -> None:
    # The agent says it at start; `fleetlet render` and `hub diff` say it at their first render.
    import logging  # here: a confined render logs nothing (and starts sooner without it)

    logging.getLogger("agent.render").warning("%s", found.describe())


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise ConfinementError(f"cannot confine the renderer: {what}: {os.strerror(code)}")
    return result


def _ruleset(confinement: Confinement, abi: int) -> int:
    """A Landlock ruleset fd for ``confinement`` (closed by the caller)."""
    handled = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    if abi >= 2:
        handled |= 1 << 13  # REFER
    if abi >= 3:
        handled |= _TRUNCATE
    if abi >= 5:
        handled |= _IOCTL_DEV
    fields = [handled]
    if abi >= 4:
        fields.append(_NET_BIND_TCP | _NET_CONNECT_TCP)
    if abi >= 6:
        fields.append(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    attr = ctypes.create_string_buffer(struct.pack(f"={len(fields)}Q", *fields))
    fd = _check(_syscall(_SYS_CREATE_RULESET, attr, ctypes.c_size_t(len(attr.raw)), 0), "ruleset")
    try:
        reading = _READ_FILE | _READ_DIR
        writing = handled & ~_EXECUTE & ~(1 << 6) & ~(1 << 11)  # no exec, no devices
        rules = [(p, _READ_DIR) for p in confinement.listable]
        rules += [(p, reading) for p in confinement.read]
        rules += [(p, writing) for p in confinement.write]
        rules += [(p, reading | _EXECUTE) for p in confinement.execute]
        rules += [(Path("/dev/null"), _READ_FILE | _WRITE_FILE | (handled & _TRUNCATE))]
        rules += [(Path(p), _READ_FILE) for p in _DEVICES_READ]
        for path, rights in rules:
            _add_rule(fd, path, rights & handled)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_rule(ruleset: int, path: Path, rights: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfinementError(f"cannot confine the renderer: {path}: {exc.strerror}") from exc
    try:
        if not stat.S_ISDIR(os.fstat(target).st_mode):
            rights &= _FILE_RIGHTS
        attr = ctypes.create_string_buffer(struct.pack("=Qi", rights, target))
        _check(_syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, attr, 0), f"rule {path}")
    finally:
        os.close(target)


@functools.cache
def _seccomp_program() -> bytes:
    """A classic BPF program failing socket(2) and io_uring_setup(2) with EACCES, and every
    system call of a foreign ABI (x32, i386 on x86_64)."""
    arch, socket_nr, uring_nr, foreign = _SECCOMP_ARCH[os.uname().machine]
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EACCES

    def insn(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    body = [
        insn(ld_abs, 0, 0, 4),  # arch
        insn(jeq, 1, 0, arch),
        insn(ret, 0, 0, deny),
        insn(ld_abs, 0, 0, 0),  # syscall number
    ]
    if foreign is not None:
        body.append(insn(jge, 3, 0, foreign))
    body += [
        insn(jeq, 2, 0, socket_nr),
        insn(jeq, 1, 0, uring_nr),
        insn(ret, 0, 0, allow),
        insn(ret, 0, 0, deny),
    ]
    return b"".join(body)


def _restrict_thread(ruleset: int | None, found: Support) -> None:
    """Bind the calling thread (and what it starts) by no_new_privs, the socket filter and
    the Landlock ruleset. Raises ConfinementError."""
    libc = _libc()
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if found.seccomp:
        program = _seccomp_program()
        filters = ctypes.create_string_buffer(program)
        fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(filters))
        fprog_buffer = ctypes.create_string_buffer(fprog)
        _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog_buffer, 0, 0), "seccomp")
    if ruleset is not None:
        _check(_syscall(_SYS_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")


CONFINED_HINT = (
    "renderers run confined: they may read only the bundle tree and their own program, write "
    "only their scratch directory, and open no socket"
)
"""Appended to a confined renderer's failure that looks like a refused access."""


def explain_refusal(message: str) -> str | None:
    """When ``message`` (a renderer's failure) looks like an access the confinement refused,
    the message with :data:`CONFINED_HINT`; else None."""
    lowered = message.lower()
    refused = "permission denied" in lowered or "operation not permitted" in lowered
    if refused and (support().confined or support().seccomp):
        return f"{message} ({CONFINED_HINT})"
    return None


__all__ = [
    "CONFINED_HINT",
    "Confinement",
    "ConfinementError",
    "Support",
    "environment",
    "explain_refusal",
    "for_python",
    "for_tool",
    "run_confined",
    "support",
]
