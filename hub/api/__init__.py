"""The hub's HTTP/JSON API over the aggregated fleet status (needs the ``hub`` extra)."""

from hub.api.app import API_PREFIX, create_app, openapi_document
from hub.api.tokens import HubConfigError, load_tokens

__all__ = ["API_PREFIX", "HubConfigError", "create_app", "load_tokens", "openapi_document"]
