"""The one error root of fleetlet, and the split between errors a retry can help and the rest.

Every error fleetlet raises on purpose is a :class:`FleetletError`. Code that decides whether to
try again looks only at :class:`TemporaryError` (a retry may succeed, after ``delay`` seconds)
versus :class:`PermanentError` (the same input will fail the same way).
"""

from __future__ import annotations


class FleetletError(Exception):
    """Root of every error fleetlet raises on purpose.

    ``reason`` is the CamelCase word a condition or a status document reports for it
    (:mod:`agent.api.reasons` lists the condition reasons); each subclass names its own.
    """

    reason: str = "Failed"


class TemporaryError(FleetletError):
    """A failure that may go away by itself (a server down, a timeout).

    ``reason`` defaults to ``Unavailable``.

    ``delay`` is the suggested wait in seconds before retrying, or ``None`` to let the caller's
    backoff decide.
    """

    reason = "Unavailable"

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(FleetletError):
    """A failure that retrying the same input cannot fix (bad input, refused verification)."""


class ConfigurationError(PermanentError):
    """The agent's or the command's own configuration is unusable (a missing flag, a bad
    kubeconfig, an empty trust policy): the command exits 2, not 1."""

    reason = "ConfigurationInvalid"


class NotImplementedYetError(PermanentError):
    """A command or feature whose issue has not landed yet."""

    reason = "NotImplemented"


# --- the contract: documents that do not validate ------------------------------------------


class FieldProblem:
    """One problem in a document: where (``path``), what was expected, what was found."""

    __slots__ = ("expected", "found", "path")

    def __init__(self, *, path: str, expected: str, found: str) -> None:
        self.path = path
        self.expected = expected
        self.found = found

    def __str__(self) -> str:
        return f"{self.path}: expected {self.expected}, got {self.found}"

    def __repr__(self) -> str:
        return f"FieldProblem({self})"


class ValidationError(PermanentError):
    """A document (set, statement, fleet file) does not follow the schema.

    ``problems`` lists every problem found (not only the first); ``origin`` names the file or
    source the document came from.
    """

    reason = "ValidationFailed"

    def __init__(self, problems: list[FieldProblem], *, origin: str = "") -> None:
        self.problems = list(problems)
        self.origin = origin
        where = f"{origin}: " if origin else ""
        lines = "; ".join(str(p) for p in self.problems) or "invalid document"
        super().__init__(f"{where}{lines}")


class FloatingReferenceError(ValidationError):
    """A source in a set is not pinned (a tag, a branch, a URL without a hash)."""

    reason = "FloatingReference"


# --- verification of a publication (each failed check is its own type) ----------------------


class VerificationError(PermanentError):
    """A publication was refused. ``reason`` is the CamelCase condition reason reported."""

    reason = "VerificationFailed"


class TrustConfigError(VerificationError, ConfigurationError):
    """The agent's own trust configuration is unusable (no trusted root, empty identity policy)."""

    reason = "TrustConfigInvalid"


class SignatureError(VerificationError):
    """The signature over the publication statement is invalid (or the statement was edited)."""

    reason = "SignatureInvalid"


class UntrustedSignerError(VerificationError):
    """The signing certificate does not chain to the configured trusted root."""

    reason = "UntrustedSigner"


class IdentityMismatchError(VerificationError):
    """The signer's identity (SAN) or OIDC issuer is not the one the policy expects."""

    reason = "IdentityMismatch"


class InclusionProofError(VerificationError):
    """This cluster's set is not in the signed Merkle tree (set edited, or proof for another leaf)."""

    reason = "InclusionProofInvalid"


class WrongClusterError(VerificationError):
    """The set is addressed to another cluster."""

    reason = "WrongCluster"


class ReplayError(VerificationError):
    """The set's serial is not greater than the last serial this cluster accepted."""

    reason = "SerialNotNewer"


class ExpiredError(VerificationError):
    """The publication has expired (or is not valid yet beyond the clock-skew allowance)."""

    reason = "PublicationExpired"


class ValidityTooLongError(VerificationError):
    """The publication stays valid further into the future than this agent accepts."""

    reason = "ValidityTooLong"


class StatementMismatchError(VerificationError):
    """The set disagrees with the signed statement (source, or a longer life than signed)."""

    reason = "StatementMismatch"
