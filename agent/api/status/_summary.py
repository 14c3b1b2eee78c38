"""The document's summary a status commit carries in its message (after :data:`SUMMARY_TRAILER`):
what a fleet-wide view reads, in the document's shape.

Part of :mod:`agent.api.status`; written with each status commit, read by the hub's
fleet-wide views without fetching the document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.api.canonical import canonical_bytes

SUMMARY_TRAILER = "Fleetlet-Summary"
_SUMMARY_KEYS = (
    "apiVersion",
    "kind",
    "schemaVersion",
    "cluster",
    "agentVersion",
    "heartbeat",
    "sequence",
    "lastAcceptedSerial",
    "lastRefusal",
    "notifyChannel",
)


def status_summary(document: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a document in wire form: its top-level identity and times, and per
    bundle its conditions (type, status, reason), its newest run (id, result, serial) and its
    applied revision's serial. A document itself, with only those fields."""
    bundles: dict[str, Any] = {}
    for name, bundle in (document.get("bundles") or {}).items():
        item: dict[str, Any] = {}
        conditions = [
            {k: c[k] for k in ("type", "status", "reason") if k in c}
            for c in bundle.get("conditions") or []
        ]
        if conditions:
            item["conditions"] = conditions
        runs = bundle.get("runs") or []
        if runs:
            item["runs"] = [{k: runs[0][k] for k in ("id", "result", "serial") if k in runs[0]}]
        applied = bundle.get("appliedRevision") or {}
        if "serial" in applied:
            item["appliedRevision"] = {"serial": applied["serial"]}
        bundles[name] = item
    summary = {k: document[k] for k in _SUMMARY_KEYS if k in document}
    summary["bundles"] = bundles
    return summary


def summary_message(document: Mapping[str, Any]) -> str:
    """A status commit's message: a subject line, then :data:`SUMMARY_TRAILER` and the
    canonical JSON of :func:`status_summary` on one line."""
    summary = canonical_bytes(status_summary(document)).decode("utf-8")
    return (
        f"status of {document.get('cluster')}: sequence {document.get('sequence')}\n\n"
        f"{SUMMARY_TRAILER}: {summary}\n"
    )


def message_summary(message: bytes) -> bytes | None:
    """The summary's JSON bytes in a status commit's message, or None when it has none."""
    marker = b"\n" + SUMMARY_TRAILER.encode() + b": "
    at = message.rfind(marker)
    if at < 0:
        return None
    end = message.find(b"\n", at + len(marker))
    return message[at + len(marker) : end if end >= 0 else len(message)]
