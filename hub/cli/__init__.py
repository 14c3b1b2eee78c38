"""The hub's subcommands: ``hub render|publish|diff|recipients|shards|serve|agent-key|tokens|
channel-token`` and ``installations`` (``hub rollout`` lives in :mod:`hub.rollout.command`,
which builds on this package's helpers; ``fleetlet.cli`` adds it under ``hub``).

Progress goes to stderr, results (a summary table, or ``-o json|yaml``) to stdout. Every
failure is raised as a :class:`~agent.errors.FleetletError`; ``fleetlet.cli`` prints it as one
line and exits 1.

The rooms: :mod:`hub.cli._parser` (the command tree: every subcommand's arguments),
:mod:`hub.cli._context` (what every command starts from: progress, usage errors, the prepared
fleet, git and registry credentials), :mod:`hub.cli._signing` (the signer from the flags), and
one module per group of command bodies (:mod:`~hub.cli._publish` for render and publish,
:mod:`~hub.cli._diff`, :mod:`~hub.cli._clusters` for shards and recipients, :mod:`~hub.cli._keys`
for tokens and keys). Callers import from ``hub.cli``, never from the private modules.
"""

from __future__ import annotations

from hub.cli._context import (
    COMMIT_POLICY_ENV,
    GIT_PASSWORD_ENV,
    GIT_USERNAME_ENV,
    TOKEN_ENV,
    TRUST_CONFIG_ENV,
    Progress,
    UsageError,
    _emit,
    branch_stores,
)
from hub.cli._parser import register, register_installations
from hub.cli._signing import agents_trust_policy, signer_from_args

__all__ = [
    "COMMIT_POLICY_ENV",
    "GIT_PASSWORD_ENV",
    "GIT_USERNAME_ENV",
    "TOKEN_ENV",
    "TRUST_CONFIG_ENV",
    "Progress",
    "UsageError",
    "_emit",
    "agents_trust_policy",
    "branch_stores",
    "register",
    "register_installations",
    "signer_from_args",
]
