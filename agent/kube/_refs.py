"""Naming one object of a cluster: :class:`ObjectRef`, built from a manifest or anything
:class:`RefLike` (an API reference), and the plain-dict form objects take.

Part of :mod:`agent.kube`; used by its client and by every caller that names an object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.kube._errors import InvalidError

Object = dict[str, Any]
Objects = list[Object]
# --- object references -------------------------------------------------------------------------


class RefLike(Protocol):
    """Anything naming one object (e.g. :class:`agent.api.models.ObjectReference`)."""

    @property
    def api_version(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One object: apiVersion, kind, name and (namespaced kinds) namespace."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any] | RefLike) -> ObjectRef:
        """The reference of a manifest (a dict) or of any reference-like object.

        Raises InvalidError when a manifest lacks apiVersion, kind or metadata.name.
        """
        if not isinstance(obj, Mapping):
            return cls(obj.api_version, obj.kind, obj.name, obj.namespace or None)
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        api_version, kind, name = obj.get("apiVersion"), obj.get("kind"), meta.get("name")
        if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
            raise InvalidError(
                "an object needs apiVersion, kind and metadata.name",
                target=f"{kind or '?'} {name or '?'}",
            )
        namespace = meta.get("namespace")
        return cls(api_version, kind, name, namespace if isinstance(namespace, str) else None)

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {self.api_version} {where}"
