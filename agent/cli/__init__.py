"""The agent's subcommands: ``agent run``, ``agent sync``, ``render``, ``health`` and a cluster
admin's ``preview``, ``approve`` and ``deny`` of approval requests.

:mod:`fleetlet.cli` calls :func:`register` to add them to its parser. The private modules are
``_arguments`` (the flags of each subcommand, registered at start-up, cheap) and ``_commands``
(what each subcommand does once parsed: the settings assembled from the flags, the agent built,
run or synced; each imports what it needs when it runs).
"""

from __future__ import annotations

from agent.cli._arguments import register
from agent.cli._commands import (
    EXIT_CONVERGED,
    EXIT_DEGRADED,
    EXIT_FAILED,
    EXIT_USAGE,
    _build_agent,
    settings_from_args,
    summary,
)

__all__ = [
    "EXIT_CONVERGED",
    "EXIT_DEGRADED",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "_build_agent",
    "register",
    "settings_from_args",
    "summary",
]
