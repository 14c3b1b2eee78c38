"""The agent's one door to a Kubernetes API server (the only package importing ``kubernetes``).

:class:`KubeClient` wraps the ``kubernetes`` package's ``ApiClient`` and dynamic client: API
discovery (cached on disk and in memory), get/list, server-side apply (with server-side dry
run), delete, and impersonation of a ServiceAccount. Objects go in and come out as plain dicts.

Every failure is converted once, here: the API server's refusals become :class:`KubeApiError`
subclasses (:class:`ConflictError`, :class:`ForbiddenError`, :class:`InvalidError`,
:class:`NotFoundError`, :class:`ApiNotServedError`) that keep the server's own message, and an
unreachable, overloaded or slow server becomes :class:`ApiUnavailableError`, a
:class:`~agent.errors.TemporaryError`. Every request has a bounded timeout.

``kubernetes`` is imported lazily, when a client is first built: importing it costs ~26 MB of
resident memory, which commands that never talk to a cluster should not pay.

Callers import from here; the private modules are, bottom up: ``_errors`` (the errors and the
one conversion of the client library's failures), ``_refs`` (naming one object),
``_transport`` (the connection: configuration, timeouts, impersonation, discovery, raw reads)
and ``_client`` (:class:`KubeClient`: the operations on objects, over the transport).
"""

from __future__ import annotations

from agent.kube._client import CONTENT_FIELD_MANAGER, LIST_FROM, STATE_FIELD_MANAGER, KubeClient
from agent.kube._errors import (
    ApiNotServedError,
    ApiUnavailableError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    KubeApiError,
    KubeconfigError,
    KubeError,
    NotFoundError,
)
from agent.kube._refs import Object, ObjectRef, RefLike

__all__ = [
    "CONTENT_FIELD_MANAGER",
    "LIST_FROM",
    "STATE_FIELD_MANAGER",
    "ApiNotServedError",
    "ApiUnavailableError",
    "ConflictError",
    "ForbiddenError",
    "InvalidError",
    "KubeApiError",
    "KubeClient",
    "KubeError",
    "KubeconfigError",
    "NotFoundError",
    "Object",
    "ObjectRef",
    "RefLike",
]
