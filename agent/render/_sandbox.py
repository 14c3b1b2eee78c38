"""The kernel's side of a renderer's confinement: what it may reach (:class:`Confinement`),
and the Landlock ruleset, seccomp filter and ``no_new_privs`` that enforce it on a child
process (:func:`start_confined`). :mod:`agent.render.confine` is the public face (why, the
renderers' confinements and environments, what the kernel here supports).

Lean on purpose: ``fleetlet render``'s head start (:mod:`agent.render.headstart`) starts helm
through this module before the rest of fleetlet loads, so it imports no more than ``ctypes``
and ``threading`` (no dataclasses, pathlib, re or typing: together about 15 ms of a 45 ms
helm run).
"""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import stat
import struct
import sys
import threading

from agent.errors import PermanentError

TYPE_CHECKING = False  # typing itself is not imported: it costs ~2 ms at start
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import TypeVar

    _T = TypeVar("_T")
    StrPath = str | os.PathLike[str]

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

_DEVICES_READ = ("/dev/urandom", "/dev/random")


class ConfinementError(PermanentError):
    """The renderer's confinement could not be set up where the kernel supports it (the
    render is not run unconfined)."""

    reason = "RenderFailed"


class Confinement:
    """What one renderer may reach: paths (files or directories, each with what is beneath)
    it may read, write, or execute. Paths that do not exist are left out. Immutable."""

    __slots__ = ("execute", "listable", "read", "write")

    read: tuple[StrPath, ...]
    write: tuple[StrPath, ...]
    execute: tuple[StrPath, ...]
    listable: tuple[StrPath, ...]
    """Directories whose entries (names, not contents) may be listed, beneath them too."""

    def __init__(
        self, *, read: Iterable[StrPath] = (), write: Iterable[StrPath] = (),
        execute: Iterable[StrPath] = (), listable: Iterable[StrPath] = (),
    ) -> None:  # fmt: skip
        for name, paths in (("read", read), ("write", write), ("execute", execute),
                            ("listable", listable)):  # fmt: skip
            object.__setattr__(self, name, tuple(paths))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Confinement is immutable ({name})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Confinement) and self.reach() == other.reach()

    def __hash__(self) -> int:
        return hash(self.reach())

    def __repr__(self) -> str:
        return (
            f"Confinement(read={self.read!r}, write={self.write!r}, "
            f"execute={self.execute!r}, listable={self.listable!r})"
        )

    def reach(self) -> tuple[tuple[str, ...], ...]:
        """The four groups of paths as text (read, write, execute, listable)."""
        groups = (self.read, self.write, self.execute, self.listable)
        return tuple(tuple(os.fspath(p) for p in group) for group in groups)

    def readable(self, path: StrPath) -> bool:
        """Whether a file at ``path`` could be read under this confinement (is, or lies
        beneath, a path it may read, write or execute)."""
        real = os.path.realpath(path)
        for allowed in (*self.read, *self.write, *self.execute):
            base = os.path.realpath(allowed)
            if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
                return True
        return False

    def plus(
        self, *, read: Iterable[StrPath] = (), write: Iterable[StrPath] = (),
        execute: Iterable[StrPath] = ()
    ) -> Confinement:  # fmt: skip
        """This confinement with more paths."""
        return Confinement(
            read=self.read + tuple(read),
            write=self.write + tuple(write),
            execute=self.execute + tuple(execute),
            listable=self.listable,
        )


def for_tool(binary: StrPath, *, tree: StrPath, scratch: StrPath | None = None,
             also_execute: Iterable[StrPath] = ()) -> Confinement:  # fmt: skip
    """A static binary (helm, kustomize: Go) reading ``tree`` and writing ``scratch``."""
    return Confinement(
        read=(tree,),
        write=(scratch,) if scratch is not None else (),
        execute=(binary, *also_execute),
    )


_libc_handle: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _libc_handle
    if _libc_handle is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.prctl.restype = ctypes.c_int
        _libc_handle = libc
    return _libc_handle


def _syscall(*args: object) -> int:
    return int(_libc().syscall(*args))


_probed: tuple[int, bool, str] | None = None


def probe() -> tuple[int, bool, str]:
    """What this kernel offers, asked once: (the Landlock ABI, 0 for none; whether the
    socket filter can be installed; why Landlock is missing, when it is)."""
    global _probed
    if _probed is None:
        _probed = _probe()
    return _probed


def _probe() -> tuple[int, bool, str]:
    if sys.platform != "linux":
        return 0, False, f"{sys.platform} has no Landlock"
    seccomp = os.uname().machine in _SECCOMP_ARCH
    abi = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if abi < 0:
        code = ctypes.get_errno()
        why = {
            errno.ENOSYS: "the kernel has no Landlock (Linux 5.13+ with CONFIG_SECURITY_LANDLOCK)",
            errno.EOPNOTSUPP: "Landlock is built in but not enabled (lsm= boot parameter)",
        }.get(code, f"Landlock unavailable ({os.strerror(code)})")
        return 0, seccomp, why
    return int(abi), seccomp, ""


def start_confined(confinement: Confinement, start: Callable[[], _T]) -> _T:
    """``start()`` (which starts the child process) from a thread confined by
    ``confinement``: the child inherits the confinement. Where the kernel has no Landlock,
    the thread keeps ``no_new_privs`` and the socket filter (on Linux), or nothing else.

    Raises ConfinementError when the confinement cannot be applied on a kernel that supports
    it; whatever ``start`` raises.
    """
    abi, seccomp, _ = probe()
    if sys.platform != "linux":
        return start()  # no prctl, no seccomp: the other bounds only
    ruleset = _ruleset(confinement, abi) if abi > 0 else None
    outcome: list[object] = []

    def confined() -> None:
        try:
            _restrict_thread(ruleset, seccomp)
            outcome.append(start())
        except BaseException as exc:  # carried to the caller's thread
            outcome.append(exc)

    _hold_collection()
    try:
        thread = threading.Thread(target=confined, name="fleetlet-confined-start")
        thread.start()
        thread.join()
    finally:
        _release_collection()
        if ruleset is not None:
            os.close(ruleset)
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result  # type: ignore[return-value]


# No cyclic garbage collection while a confined thread runs Python: a finalizer it ran (another
# object's temporary directory) would find itself confined too. Counted, so that renders
# started at once from several threads restore it once, as it was.
_collection = threading.Lock()
_collection_holds = 0
_collection_was_on = False


def _hold_collection() -> None:
    global _collection_holds, _collection_was_on
    with _collection:
        if _collection_holds == 0:
            _collection_was_on = gc.isenabled()
            gc.disable()
        _collection_holds += 1


def _release_collection() -> None:
    global _collection_holds
    with _collection:
        _collection_holds -= 1
        if _collection_holds == 0 and _collection_was_on:
            gc.enable()


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
        rules: list[tuple[StrPath, int]] = [(p, _READ_DIR) for p in confinement.listable]
        rules += [(p, reading) for p in confinement.read]
        rules += [(p, writing) for p in confinement.write]
        rules += [(p, reading | _EXECUTE) for p in confinement.execute]
        rules += [("/dev/null", _READ_FILE | _WRITE_FILE | (handled & _TRUNCATE))]
        rules += [(p, _READ_FILE) for p in _DEVICES_READ]
        for path, rights in rules:
            _add_rule(fd, path, rights & handled)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _add_rule(ruleset: int, path: StrPath, rights: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfinementError(
            f"cannot confine the renderer: {os.fspath(path)}: {exc.strerror}"
        ) from exc
    try:
        if not stat.S_ISDIR(os.fstat(target).st_mode):
            rights &= _FILE_RIGHTS
        attr = ctypes.create_string_buffer(struct.pack("=Qi", rights, target))
        _check(
            _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, attr, 0),
            f"rule {os.fspath(path)}",
        )
    finally:
        os.close(target)


_program: bytes | None = None


def seccomp_program() -> bytes:
    """A classic BPF program failing socket(2) and io_uring_setup(2) with EACCES, and every
    system call of a foreign ABI (x32, i386 on x86_64)."""
    global _program
    if _program is not None:
        return _program
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
    _program = b"".join(body)
    return _program


def _restrict_thread(ruleset: int | None, seccomp: bool) -> None:
    """Bind the calling thread (and what it starts) by no_new_privs, the socket filter and
    the Landlock ruleset. Raises ConfinementError."""
    libc = _libc()
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if seccomp:
        program = seccomp_program()
        filters = ctypes.create_string_buffer(program)
        fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(filters))
        fprog_buffer = ctypes.create_string_buffer(fprog)
        _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, fprog_buffer, 0, 0), "seccomp")
    if ruleset is not None:
        _check(_syscall(_SYS_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")


__all__ = [
    "Confinement",
    "ConfinementError",
    "for_tool",
    "probe",
    "seccomp_program",
    "start_confined",
]
