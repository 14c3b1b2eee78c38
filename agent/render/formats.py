"""The format registry: ``plain``, ``helm``, ``kustomize`` and ``registry+v1`` built in,
plugins through the ``fleetlet.formats`` entry points.

A format is an object with a ``name`` and ``render(tree, request) -> list[dict]`` returning
Kubernetes objects (see :class:`Format`). A plugin package declares, in its
``pyproject.toml``::

    [project.entry-points."fleetlet.formats"]
    myformat = "my_package.module:MyFormat"

The plugin API is :mod:`agent.render.plugin_api` (documented in ``docs/plugins.md``); a
plugin is never imported by the agent: :class:`~agent.render.plugins.PluginFormat` runs it in
a bounded child process. :func:`render_objects` validates every object a format returns and
applies the bundle's ``patches`` (unless the format says it applied them itself:
``applies_patches``, as the kustomize format does in its one build); :func:`render_bundle`
then finishes them (target namespace, ownership labels) the same way for all formats, so no
plugin can skip that. A built-in format of the API (:data:`agent.api.BUILTIN_FORMATS`) that
this build does not carry fails with :class:`FormatNotAvailableError`; installing a plugin of
that name makes it available without any change here or in ``fleetlet render``.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent.errors import FleetletError, NotImplementedYetError, PermanentError
from agent.render.manifests import InvalidManifestError, Manifest, validate_object
from agent.render.plain import RenderRequest, finish
from agent.render.tools import ToolSettings

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint


@runtime_checkable
class Format(Protocol):
    """What a format provides."""

    name: str

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]: ...


class UnknownFormatError(PermanentError):
    """No built-in format or installed plugin has this name."""

    reason = "UnknownFormat"


class FormatNotAvailableError(UnknownFormatError, NotImplementedYetError):
    """A format the API names (helm, registry+v1) that this build does not carry yet."""


class FormatFailedError(InvalidManifestError):
    """A built-in format failed with an error that is not one of fleetlet's."""

    reason = "RenderFailed"


# The built-in formats, each imported when first used (a render needs one: ``fleetlet
# render`` of a chart never imports the kustomize or OLM code).
_BUILTIN: dict[str, tuple[str, str]] = {
    "plain": ("agent.render.plain", "PlainFormat"),
    "helm": ("agent.render.helm", "HelmFormat"),
    "kustomize": ("agent.render.kustomize", "KustomizeFormat"),
    "registry+v1": ("agent.render.registry_v1", "RegistryV1Format"),
}
# Each format once loaded: built-in or plugin.
_LOADED: dict[str, Format] = {}


@functools.cache
def _plugins() -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points

    from agent.render.plugin_api import ENTRY_POINT_GROUP

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_formats() -> list[str]:
    """Names of the built-in formats and of the installed plugins."""
    return sorted({*_BUILTIN, *_LOADED, *_plugins()})


def get_format(name: str) -> Format:
    """The format called ``name``: a built-in one, or an installed plugin (run in a bounded
    child process, :mod:`agent.render.plugins`; it is not imported here).

    Raises UnknownFormatError if none is installed under that name.
    """
    if name in _LOADED:
        return _LOADED[name]
    if name in _BUILTIN:
        module, cls = _BUILTIN[name]
        loaded: Format = getattr(importlib.import_module(module), cls)()
        _LOADED[name] = loaded
        return loaded
    from agent.api.models import BUILTIN_FORMATS
    from agent.render.plugins import PluginFormat

    entry = _plugins().get(name)
    if entry is None and name in BUILTIN_FORMATS:
        raise FormatNotAvailableError(
            f"format {name!r} is not available in this build "
            f"(available: {', '.join(available_formats())})"
        )
    if entry is None:
        raise UnknownFormatError(
            f"unknown format {name!r} (available: {', '.join(available_formats())})"
        )
    plugin = PluginFormat(name=name, entry=entry)
    _LOADED[name] = plugin
    return plugin


def applies_patches(renderer: Format, tools: ToolSettings) -> bool:
    """Whether ``renderer`` applies a bundle's patches itself (kustomize, a plugin that says
    so). Raises what asking a plugin raises (PluginLoadError, PluginError)."""
    from agent.render.plugins import PluginFormat

    if isinstance(renderer, PluginFormat):
        return renderer.applies_patches_for(tools)
    return bool(getattr(renderer, "applies_patches", False))


def render_bundle(tree: Path, *, format: str, request: RenderRequest) -> list[Manifest]:
    """Render ``tree`` with the named format, validate, patch and finish every object.

    Raises what :func:`render_objects` and :func:`~agent.render.plain.finish` raise.
    """
    return finish(render_objects(tree, format=format, request=request), request)


def render_objects(tree: Path, *, format: str, request: RenderRequest) -> list[Manifest]:
    """Render ``tree`` with the named format, validate every object and apply
    ``request.patches``: everything but the finishing (what the render cache keeps).

    Raises UnknownFormatError, InvalidManifestError (FormatFailedError when a plugin fails
    with an error of its own, PatchFailedError) and the format's own FleetletErrors.
    """
    renderer = get_format(format)
    # A plugin says whether it applies patches before it renders (fails early if it is broken).
    patched_by_format = applies_patches(renderer, request.tools) if request.patches else False
    try:
        raw = renderer.render(tree, request)
    except FleetletError:
        raise
    except Exception as exc:  # a plugin's own failure becomes one clear refusal
        raise FormatFailedError(
            f"format {format!r} failed: {type(exc).__name__}: {exc}",
            source=request.source,
            rule="FormatFailed",
        ) from exc
    if not isinstance(raw, list):
        raise InvalidManifestError(
            f"format {format!r} returned a {type(raw).__name__}, not a list",
            source=request.source,
            rule="BadFormatOutput",
        )
    objects = [
        validate_object(obj, source=request.source, file=f"{format} output", index=i)
        for i, obj in enumerate(raw)
    ]
    if not request.patches or patched_by_format:
        return objects
    from agent.render.patches import apply_patches

    patched = apply_patches(
        objects, request.patches, source=request.source, kustomize=request.tools.find("kustomize")
    )
    return [
        validate_object(obj, source=request.source, file="patched output", index=i)
        for i, obj in enumerate(patched)
    ]
