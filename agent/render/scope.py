"""Is a kind namespaced? Lookups for rendering: a mapping, API discovery, or the built-ins.

A :data:`ScopeLookup` is any callable ``(api_version, kind) -> bool | None``: True for a
namespaced kind, False for a cluster-scoped one, None when the kind is unknown. Production uses
:meth:`agent.kube.KubeClient.scope` (the API server's discovery); ``fleetlet render`` without a cluster uses
:func:`builtin_scope`, derived from the operations of the installed ``kubernetes`` client (which
is generated from the API server's OpenAPI), never from a list kept by hand. Either way, the
CustomResourceDefinitions inside the bundle itself are consulted first (:func:`with_bundle_crds`):
their kinds are not served yet when the bundle is rendered.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ScopeLookup = Callable[[str, str], bool | None]

_CREATE = re.compile(r"^    def create_(\w+?)\(\s*self\b", re.MULTILINE)
_CRD_API_VERSIONS = ("apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1")


def _group(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def mapping_scope(namespaced: Mapping[str, bool]) -> ScopeLookup:
    """A lookup from ``{"Kind": namespaced}`` or ``{"group/version/Kind": namespaced}`` keys."""

    def lookup(api_version: str, kind: str) -> bool | None:
        for key in (f"{api_version}/{kind}", f"{_group(api_version)}/{kind}", kind):
            if key in namespaced:
                return namespaced[key]
        return None

    return lookup


def _normal(kind: str) -> str:
    return kind.replace("_", "").lower()


@functools.cache
def _builtin_table() -> dict[str, bool]:
    # Read the generated API modules' source instead of importing them: importing
    # kubernetes.client (all its models) takes seconds, this takes milliseconds.
    spec = importlib.util.find_spec("kubernetes")
    if spec is None or spec.origin is None:
        return {}
    table: dict[str, bool] = {}
    for module in sorted((Path(spec.origin).parent / "client" / "api").glob("*_api.py")):
        for match in _CREATE.finditer(module.read_text(errors="replace")):
            rest = match.group(1)
            if rest.startswith("namespaced_"):
                table.setdefault(_normal(rest.removeprefix("namespaced_")), True)
            else:
                table.setdefault(_normal(rest), False)
    return table


def builtin_scope(api_version: str, kind: str) -> bool | None:
    """Scope of Kubernetes' built-in kinds, as generated into the ``kubernetes`` client."""
    return _builtin_table().get(_normal(kind))


def with_bundle_crds(objects: Iterable[Mapping[str, Any]], fallback: ScopeLookup) -> ScopeLookup:
    """A lookup answering first for the kinds that the bundle's own CRDs define."""
    own: dict[tuple[str, str], bool] = {}
    for obj in objects:
        if obj.get("kind") != "CustomResourceDefinition":
            continue
        if obj.get("apiVersion") not in _CRD_API_VERSIONS:
            continue
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            continue
        names = spec.get("names")
        group = spec.get("group")
        if not isinstance(names, dict) or not isinstance(group, str):
            continue
        kind = names.get("kind")
        if isinstance(kind, str):
            own[(group, kind)] = spec.get("scope", "Namespaced") == "Namespaced"

    def lookup(api_version: str, kind: str) -> bool | None:
        found = own.get((_group(api_version), kind))
        return found if found is not None else fallback(api_version, kind)

    return lookup
