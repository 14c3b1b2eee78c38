"""The one error the mini Sigstore's services raise; the HTTP server turns it into a reply."""

from __future__ import annotations


class ServiceError(Exception):
    """A request a mini Sigstore service refuses, with the HTTP status to answer."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
