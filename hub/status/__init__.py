"""The hub's view of the fleet, aggregated from the agents' ``fleetlet/status/<cluster>`` branches.

The names below are imported on first use (importing one module of this package loads only
what that module needs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub.status.aggregate import FleetStatus
    from hub.status.document import STATES, StatusDocumentError, installation_state, parse_status
    from hub.status.shard import StatusCacheError
    from hub.status.view import RefreshResult

_WHERE = {
    "STATES": "hub.status.document",
    "FleetStatus": "hub.status.aggregate",
    "RefreshResult": "hub.status.view",
    "StatusCacheError": "hub.status.shard",
    "StatusDocumentError": "hub.status.document",
    "installation_state": "hub.status.document",
    "parse_status": "hub.status.document",
}

__all__ = [
    "STATES",
    "FleetStatus",
    "RefreshResult",
    "StatusCacheError",
    "StatusDocumentError",
    "installation_state",
    "parse_status",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hub.status' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
