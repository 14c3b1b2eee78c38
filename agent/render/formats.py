"""The format registry: ``plain``, ``helm`` and ``kustomize`` built in, plugins through the
``fleetlet.formats`` entry points.

A format is an object with a ``name`` and ``render(tree, request) -> list[dict]`` returning
Kubernetes objects (see :class:`Format`). A plugin package declares, in its
``pyproject.toml``::

    [project.entry-points."fleetlet.formats"]
    myformat = "my_package.module:MyFormat"

The entry point may name a format object or a class/factory called without arguments.
:func:`render_objects` validates every object a format returns and applies the bundle's
``patches`` (unless the format says it applied them itself: ``applies_patches = True``, as the
kustomize format does in its one build); :func:`render_bundle` then finishes them (target namespace, ownership labels) the
same way for all formats, so no plugin can skip that. A built-in format of the API
(:data:`agent.api.BUILTIN_FORMATS`) that this build does not carry fails with
:class:`FormatNotAvailableError`; installing a plugin of that name makes it available without
any change here or in ``fleetlet render``.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol, runtime_checkable

from agent.api.models import BUILTIN_FORMATS
from agent.errors import FleetletError, NotImplementedYetError, PermanentError
from agent.render.helm import HelmFormat
from agent.render.kustomize import KustomizeFormat
from agent.render.manifests import InvalidManifestError, Manifest, validate_object
from agent.render.patches import apply_patches
from agent.render.plain import PlainFormat, RenderRequest, finish

ENTRY_POINT_GROUP = "fleetlet.formats"


@runtime_checkable
class Format(Protocol):
    """What a format provides."""

    name: str

    def render(self, tree: Path, request: RenderRequest) -> list[Manifest]: ...


class UnknownFormatError(PermanentError):
    """No built-in format or installed plugin has this name (or the plugin fails to load)."""

    reason = "UnknownFormat"


class FormatNotAvailableError(UnknownFormatError, NotImplementedYetError):
    """A format the API names (helm, registry+v1) that this build does not carry yet."""


class FormatFailedError(InvalidManifestError):
    """A format (typically a plugin) failed with an error of its own."""

    reason = "RenderFailed"


# The built-in formats, then each plugin once loaded.
_LOADED: dict[str, Format] = {
    "plain": PlainFormat(),
    "helm": HelmFormat(),
    "kustomize": KustomizeFormat(),
}


@functools.cache
def _plugins() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_formats() -> list[str]:
    """Names of the built-in formats and of the installed plugins."""
    return sorted({*_LOADED, *_plugins()})


def get_format(name: str) -> Format:
    """The format called ``name``.

    Raises UnknownFormatError if none is installed or the plugin does not load.
    """
    if name in _LOADED:
        return _LOADED[name]
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
    try:
        loaded = entry.load()  # type: ignore[attr-defined]
        # A class also "has" name and render: instantiate classes and factories.
        is_instance = isinstance(loaded, Format) and not isinstance(loaded, type)
        candidate = loaded if is_instance else loaded()
    except Exception as exc:  # a broken plugin must not take the agent down
        raise UnknownFormatError(f"format plugin {name!r} failed to load: {exc}") from exc
    if not isinstance(candidate, Format):
        raise UnknownFormatError(f"format plugin {name!r} has no render(tree, request)")
    _LOADED[name] = candidate
    return candidate


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
    if not request.patches or getattr(renderer, "applies_patches", False):
        return objects
    patched = apply_patches(
        objects, request.patches, source=request.source, kustomize=request.tools.find("kustomize")
    )
    return [
        validate_object(obj, source=request.source, file="patched output", index=i)
        for i, obj in enumerate(patched)
    ]
