"""The stable API of format plugins (version :data:`PLUGIN_API_VERSION`), documented in
``docs/plugins.md``.

A format plugin is an object (or a class/factory called without arguments) named by an entry
point of the group ``fleetlet.formats``; the entry point's name is the format's name. It has:

- ``name`` (str): the format's name;
- ``render(tree, request) -> list[dict]``: the Kubernetes objects of the bundle tree
  (:class:`pathlib.Path`, read-only) for the :class:`RenderRequest`;
- optionally ``api_version`` (int, default 1): the plugin API version it was written for;
- optionally ``applies_patches`` (bool, default False): True when ``render`` applies
  ``request.patches`` itself (fleetlet applies them otherwise);
- optionally ``cache_identity(tools) -> str``: what, besides the tree and the request, shapes
  its output (a tool's version); it goes into the render cache key.

Plugins run in a child process of their own (:mod:`agent.render.plugins`), so what they
receive is plain data rebuilt there: the request's ``scope`` is the built-in kinds only and
its ``ownership`` is ``None`` (fleetlet applies namespaces and ownership after the plugin).

Errors: raise :class:`~agent.errors.TemporaryError` (with ``delay``) when a retry may help,
:class:`~agent.errors.PermanentError` (or :class:`InvalidManifestError` with a ``rule``) when
the same input will fail again; its message is shown to the user as is. Any other exception
is a permanent ``RenderFailed`` naming its type and message.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agent.errors import PermanentError, TemporaryError
from agent.render.facts import ClusterFacts
from agent.render.manifests import InvalidManifestError, Manifest
from agent.render.plain import RenderRequest

PLUGIN_API_VERSION = 1
"""The version of this API. A change that breaks plugins written for it gets a new number;
fleetlet refuses a plugin that declares a version it does not speak."""

SUPPORTED_API_VERSIONS = (1,)
"""The plugin API versions this fleetlet runs."""

ENTRY_POINT_GROUP = "fleetlet.formats"
"""The entry point group plugins register their format under."""


@runtime_checkable
class FormatPlugin(Protocol):
    """What a format plugin provides (see the module doc)."""

    name: str

    def render(self, tree: object, request: RenderRequest) -> list[Manifest]: ...


__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGIN_API_VERSION",
    "SUPPORTED_API_VERSIONS",
    "ClusterFacts",
    "FormatPlugin",
    "InvalidManifestError",
    "Manifest",
    "PermanentError",
    "RenderRequest",
    "TemporaryError",
]
