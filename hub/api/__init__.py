"""The hub's HTTP/JSON API over the aggregated fleet status.

- :mod:`hub.api.app`: the Starlette application (needs the ``hub`` extra);
- :mod:`hub.api.tokens`: bearer tokens, stored hashed;
- :mod:`hub.api.metrics`: the hub's Prometheus metrics.

Nothing from :mod:`hub.api.app` is re-exported here, so ``hub publish`` and the metrics work
without the web framework installed.
"""

from hub.api.tokens import HubConfigError, load_tokens

__all__ = ["HubConfigError", "load_tokens"]
