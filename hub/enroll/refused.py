"""The one error of enrollment: a request or decision refused, with its HTTP status."""

from __future__ import annotations

from agent.errors import PermanentError


class EnrollRefused(PermanentError):
    """An enrollment request or decision refused: ``status`` (HTTP) and the reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
