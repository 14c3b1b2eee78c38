"""The hub's view of the fleet, aggregated from the agents' ``fleetlet/status/<cluster>`` branches."""

from hub.status.aggregate import FleetStatus
from hub.status.document import STATES, StatusDocumentError, installation_state, parse_status
from hub.status.shard import StatusCacheError
from hub.status.view import RefreshResult

__all__ = [
    "STATES",
    "FleetStatus",
    "RefreshResult",
    "StatusCacheError",
    "StatusDocumentError",
    "installation_state",
    "parse_status",
]
