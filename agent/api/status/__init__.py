"""The status document an agent pushes to ``fleetlet/status/<cluster>`` (``status.json``).

The document (``ClusterStatus``) is JSON in canonical RFC 8785 bytes. ``schemaVersion`` 2
added ``formats`` (what the agent can render); documents of version 1 are still read, and a
reader treats their missing ``formats`` as "not reported". On
the wire ``bundles`` and each run's ``outputs`` are JSON objects keyed by name; in Python they
are tuples of typed objects carrying their ``name`` (unique, as the wire keys are), because the
declaration machinery of :mod:`agent.api.validation` types lists of objects, not maps. So:

- use :func:`load_status` / :func:`dump_status` (or :func:`status_from_dict` /
  :func:`status_to_dict`) for the wire form, never the generic ``to_dict``/``canonical_bytes``;
- problems are reported with wire paths (``bundles.web.runs[0].outputs.ip.sealed``).

Fields at their default (``driftCount: 0``, a ``null``) are left out of the bytes, except
``bundles`` and ``truncated``, always written; a reader treats a missing field as its default. :func:`bound_status` keeps a
document under a size bound whatever the fleet does (history trimmed oldest-first, messages
cut with :data:`TRUNCATION_MARKER`, ``truncated`` set).

Each status commit also carries, in its message, the document's *summary*
(:func:`status_summary`, after :data:`SUMMARY_TRAILER`): the document cut down to what a
fleet-wide view reads (who, when, each bundle's conditions, newest run and applied serial), in
the same shape. A hub reading 100,000 clusters fetches the commits alone and reads their
summaries: a tenth of the bytes, and no tree or document to fetch.

Callers (the agent's report push, the hub's status readers and views) import from here; the
private modules are ``_document`` (the typed document), ``_wire`` (its wire form, read and
written), ``_summary`` (the summary a status commit's message carries) and ``_bound`` (the
size bound).
"""

from __future__ import annotations

from agent.api.status._bound import bound_status
from agent.api.status._document import (
    MAX_LOAD_BYTES,
    MAX_REQUESTS,
    MAX_STATUS_BYTES,
    SCHEMA_VERSION,
    STATUS_BRANCH_PREFIX,
    STATUS_FILE,
    TRUNCATION_MARKER,
    BundleStatusReport,
    ClusterStatus,
    HealthSummary,
    OutputValue,
    Refusal,
    RequestReport,
    Run,
    RunCounts,
    RunOperation,
    status_branch,
)
from agent.api.status._summary import (
    SUMMARY_TRAILER,
    message_summary,
    status_summary,
    summary_message,
)
from agent.api.status._wire import dump_status, load_status, status_from_dict, status_to_dict

__all__ = [
    "MAX_LOAD_BYTES",
    "MAX_REQUESTS",
    "MAX_STATUS_BYTES",
    "SCHEMA_VERSION",
    "STATUS_BRANCH_PREFIX",
    "STATUS_FILE",
    "SUMMARY_TRAILER",
    "TRUNCATION_MARKER",
    "BundleStatusReport",
    "ClusterStatus",
    "HealthSummary",
    "OutputValue",
    "Refusal",
    "RequestReport",
    "Run",
    "RunCounts",
    "RunOperation",
    "bound_status",
    "dump_status",
    "load_status",
    "message_summary",
    "status_branch",
    "status_from_dict",
    "status_summary",
    "status_to_dict",
    "summary_message",
]
