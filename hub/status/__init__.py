"""The hub's view of the fleet, aggregated from the agents' ``fleetlet/status/<cluster>`` branches."""

from hub.status.aggregate import (
    STATES,
    FleetStatus,
    RefreshResult,
    StatusCacheError,
    StatusDocumentError,
    installation_state,
    parse_status,
)

__all__ = [
    "STATES",
    "FleetStatus",
    "RefreshResult",
    "StatusCacheError",
    "StatusDocumentError",
    "installation_state",
    "parse_status",
]
