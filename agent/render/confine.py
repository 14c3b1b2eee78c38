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

The kernel calls and :class:`Confinement` itself live in ``_sandbox``, the environments in
``_toolenv``: both lean, so that ``fleetlet render``'s head start (:mod:`agent.render.headstart`)
starts helm through them before the rest of fleetlet loads. This module re-exports them.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agent.render._sandbox import (
    Confinement,
    ConfinementError,
    for_tool,
    probe,
    start_confined,
)
from agent.render._toolenv import HELM_ENVIRONMENT, environment

_T = TypeVar("_T")

_SYSTEM_LIBRARIES = ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/local/lib")


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
def support() -> Support:
    """What this kernel offers (asked once)."""
    abi, seccomp, detail = probe()
    return Support(abi, seccomp, detail)


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
    return start_confined(confinement, start)


@functools.cache
def _warn_once(found: Support) -> None:
    # The agent says it at start; `fleetlet render` and `hub diff` say it at their first render.
    import logging  # here: a confined render logs nothing (and starts sooner without it)

    logging.getLogger("agent.render").warning("%s", found.describe())


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
    "HELM_ENVIRONMENT",
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
