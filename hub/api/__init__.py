"""The hub's HTTP/JSON API over the aggregated fleet status (needs the ``hub`` extra)."""

from hub.api.app import (
    API_PREFIX,
    HubConfigError,
    create_app,
    load_tokens,
    openapi_document,
)

__all__ = ["API_PREFIX", "HubConfigError", "create_app", "load_tokens", "openapi_document"]
