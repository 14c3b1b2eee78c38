"""Errors the hub raises, as subclasses of the one error root in :mod:`agent.errors`.

A retry can help with :class:`SourceUnavailableError` and :class:`PushRejectedError` (both
:class:`~agent.errors.TemporaryError`); the others fail the same way on the same input.
"""

from __future__ import annotations

from agent.errors import FieldProblem, PermanentError, TemporaryError, ValidationError


class FleetRepoError(ValidationError):
    """The fleet repo is invalid. ``problems`` holds every problem found, each naming the file
    (relative to the fleet directory) and the field."""


class ResolveError(PermanentError):
    """A source reference cannot be pinned (unknown tag or branch, 404, malformed digest).

    ``failures`` lists ``(bundle, reference, problem)`` for every reference that failed.
    """

    def __init__(self, failures: list[tuple[str, str, str]]) -> None:
        self.failures = list(failures)
        super().__init__(_describe(self.failures))


class SourceUnavailableError(TemporaryError):
    """A source server did not answer (connection refused, timeout, 5xx): retrying may help.

    ``failures`` lists ``(bundle, reference, problem)`` for every reference that failed.
    """

    def __init__(self, failures: list[tuple[str, str, str]], *, delay: float | None = None) -> None:
        self.failures = list(failures)
        super().__init__(_describe(self.failures), delay=delay)


class PublishError(PermanentError):
    """Publishing failed in a way a plain rerun does not fix (bad target repo, signing refused)."""


class GitTransportError(TemporaryError):
    """The git server could not be reached or the transfer failed; nothing was pushed."""


class PushRejectedError(TemporaryError):
    """The git server refused some branch updates (``rejected``: refname -> server message).

    Branches not listed in ``rejected`` were updated; rerunning ``hub publish`` finishes the job.
    """

    def __init__(self, rejected: dict[str, str], *, pushed: list[str]) -> None:
        self.rejected = dict(rejected)
        self.pushed = list(pushed)
        names = ", ".join(f"{ref} ({msg})" for ref, msg in sorted(self.rejected.items()))
        super().__init__(
            f"the git server rejected {len(self.rejected)} of "
            f"{len(self.rejected) + len(self.pushed)} branch updates: {names}; "
            "rerun hub publish to finish"
        )


def _describe(failures: list[tuple[str, str, str]]) -> str:
    parts = [
        f"bundle {bundle!r}: cannot resolve {ref}: {problem}" for bundle, ref, problem in failures
    ]
    return "; ".join(parts) or "cannot resolve sources"


__all__ = [
    "FieldProblem",
    "FleetRepoError",
    "GitTransportError",
    "PublishError",
    "PushRejectedError",
    "ResolveError",
    "SourceUnavailableError",
]
