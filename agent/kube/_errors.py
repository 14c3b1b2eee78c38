"""The errors of talking to a Kubernetes API server, and their one conversion from the
``kubernetes`` client's and urllib3's exceptions (:func:`_converted`).

Part of :mod:`agent.kube`; every request of its transport and client runs inside
:func:`_converted`. Callers catch these through :mod:`agent.kube`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agent.errors import ConfigurationError, FleetletError, PermanentError, TemporaryError

_MANAGER_IN_CAUSE = re.compile(r'conflict with "([^"]+)"')
_WEBHOOK_NAME = re.compile(r'webhook "([^"]+)"')
_WEBHOOK_FAILURE = re.compile(r"calling webhook|webhook .* (failed|error)", re.IGNORECASE)
# --- errors ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """One cause in the API server's ``Status.details.causes`` (e.g. a field manager conflict)."""

    reason: str
    message: str
    field: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class KubeError(FleetletError):
    """Root of the errors of talking to a Kubernetes API server.

    ``reason`` is a CamelCase word for conditions; ``target`` names the object or request
    (e.g. ``Deployment apps/v1 shop/web``); ``status`` is the HTTP status (None: no answer).
    """

    reason: str = "KubeError"
    target: str = ""
    status: int | None = None


class ApiUnavailableError(KubeError, TemporaryError):
    """The API server did not answer in time, could not be reached, or asked us to come back
    later (429/5xx). ``delay`` carries the server's Retry-After when it sent one."""

    reason = "ApiUnavailable"

    def __init__(
        self,
        message: str,
        *,
        target: str = "",
        status: int | None = None,
        delay: float | None = None,
    ) -> None:
        TemporaryError.__init__(self, message, delay=delay)
        self.target = target
        self.status = status


class KubeconfigError(KubeError, ConfigurationError):
    """The kubeconfig (or in-cluster configuration) cannot be loaded."""

    reason = "KubeconfigInvalid"


class KubeApiError(KubeError, PermanentError):
    """The API server refused a request. ``server_message`` is its message, verbatim;
    ``causes`` its detailed causes; ``reason`` the server's CamelCase reason when the class has
    none of its own (BadRequest, Unauthorized, Gone, ...)."""

    reason = "ApiError"

    def __init__(
        self,
        server_message: str,
        *,
        target: str = "",
        status: int | None = None,
        reason: str | None = None,
        causes: tuple[Cause, ...] = (),
    ) -> None:
        super().__init__(f"{target}: {server_message}" if target else server_message)
        self.server_message = server_message
        self.target = target
        self.status = status
        self.causes = causes
        if reason and type(self) is KubeApiError:
            self.reason = reason


class ConflictError(KubeApiError):
    """409: fields owned by other field managers (``managers`` names them), or a stale write."""

    reason = "Conflict"

    @property
    def managers(self) -> list[str]:
        """The other field managers named by the conflict, in the server's order."""
        found: list[str] = []
        for cause in self.causes:
            for name in _MANAGER_IN_CAUSE.findall(cause.message):
                if name not in found:
                    found.append(name)
        if not found:
            found = list(dict.fromkeys(_MANAGER_IN_CAUSE.findall(self.server_message)))
        return found


class ForbiddenError(KubeApiError):
    """403: RBAC (or an admission policy) does not allow this user the request."""

    reason = "Forbidden"


class InvalidError(KubeApiError):
    """422: the object does not validate; ``causes`` lists each invalid field."""

    reason = "Invalid"


class NotFoundError(KubeApiError):
    """404: the object (or its namespace) does not exist."""

    reason = "NotFound"


class ApiNotServedError(KubeApiError):
    """The API server does not serve this apiVersion/kind (no CRD installed, API disabled)."""

    reason = "ApiNotServed"


class WebhookError(KubeApiError):
    """An admission webhook could not be called or failed (the API server answers 500 and
    names it): the object is refused, the API server itself is fine. ``webhook`` is its name
    when the message gives it."""

    reason = "WebhookFailed"

    @property
    def webhook(self) -> str | None:
        found = _WEBHOOK_NAME.search(self.server_message)
        return found.group(1) if found else None


_BY_STATUS: dict[int, type[KubeApiError]] = {
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidError,
}
# Worth a retry: throttled, server errors, gateway problems. 0: the client library's code for
# a failure below HTTP (TLS handshake interrupted, request not sendable).
_TEMPORARY = {0, 429, 500, 502, 503, 504}


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


def _from_api_exception(exc: Any, target: str) -> KubeError:
    """Convert a ``kubernetes`` ApiException (or dynamic-client subclass) to our errors."""
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    document: dict[str, Any] = {}
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and body.strip():
        with contextlib.suppress(ValueError):
            loaded = json.loads(body)
            if isinstance(loaded, dict):
                document = loaded
    message = str(document.get("message") or body or getattr(exc, "reason", "") or "no message")
    if status == 500 and _WEBHOOK_FAILURE.search(message):
        # One object's admission webhook is down: a refusal of that object, not an outage.
        return WebhookError(message, target=target, status=status, reason="WebhookFailed")
    if status in _TEMPORARY:
        return ApiUnavailableError(
            f"{target}: API server answered {status or 'nothing usable'}: {message}",
            target=target,
            status=status or None,
            delay=_retry_after(getattr(exc, "headers", None)),
        )
    details = document.get("details")
    raw_causes = details.get("causes") if isinstance(details, dict) else None
    causes = tuple(
        Cause(
            reason=str(c.get("reason") or ""),
            message=str(c.get("message") or ""),
            field=str(c.get("field") or ""),
        )
        for c in (raw_causes if isinstance(raw_causes, list) else [])
        if isinstance(c, dict)
    )
    cls = _BY_STATUS.get(status, KubeApiError)
    return cls(
        message,
        target=target,
        status=status,
        reason=str(document.get("reason") or "") or None,
        causes=causes,
    )


_POOL_PREFIX = re.compile(r"^HTTPS?Connection(?:Pool)?\([^)]*\): ")


def _cause(exc: BaseException) -> str:
    """What went wrong below HTTP, in a few words: urllib3's innermost reason without its
    connection-pool preamble (``Read timed out. (read timeout=2.0)``, ``Failed to establish
    a new connection: [Errno 111] Connection refused``)."""
    inner = getattr(exc, "reason", None)
    seen = exc if not isinstance(inner, BaseException) else inner
    return _POOL_PREFIX.sub("", str(seen)) or type(seen).__name__


@contextlib.contextmanager
def _converted(target: str, server: str = "") -> Iterator[None]:
    """Turn the ``kubernetes``/urllib3/socket exceptions raised inside into KubeErrors;
    ``server`` (its URL) is named when it cannot be reached."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except KubeError:
        raise
    except ApiException as exc:
        raise _from_api_exception(exc, target) from exc
    except (HTTPError, OSError) as exc:
        where = f" {server}" if server else ""
        raise ApiUnavailableError(
            f"{target}: API server{where} unreachable: {_cause(exc)}", target=target
        ) from exc
