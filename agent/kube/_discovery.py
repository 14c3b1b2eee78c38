"""The dynamic client's discovery, with a miss that costs one or two requests, not twenty.

The ``kubernetes`` package's ``LazyDiscoverer`` answers a kind it has not cached (a CRD created
since the cache was written, or a kind not served at all: an optional ServiceMonitor) by
throwing its whole cache away: ``/version`` and ``/apis`` again, and then every group version's
resource list as soon as a core kind is looked up (a core ``v1`` kind is searched for in every
group that has a ``v1``). Its cache file is then written back empty, so the next worker starts
with that sweep too: 20-odd requests per miss, 0.1-0.2 s on a quiet machine, several times
per job.

:class:`TargetedDiscoverer` answers a miss for ``group/version`` by reading what can have
changed there only: the served groups (``/apis``, keeping the resource lists already read)
and that group version's resource list. A CRD created since is found, as before; a kind not
served is said not served, as before. Any other invalidation (a cache file of another library
version, unreadable) is the library's own.
"""

from __future__ import annotations

from typing import Any

from kubernetes.dynamic.discovery import LazyDiscoverer
from kubernetes.dynamic.exceptions import (
    NotFoundError,
    ResourceNotFoundError,
    ResourceNotUniqueError,
)
from kubernetes.dynamic.resource import ResourceList


def find(discoverer: Any, api_version: str, kind: str) -> Any:
    """The dynamic client's ``Resource`` for ``kind`` in ``api_version`` (what its
    ``resources.get(api_version=..., kind=...)`` answers), searched for under its prefix: a
    core kind (``v1``) under ``/api`` only, never in every group that has a ``v1``.

    Raises ResourceNotFoundError, ResourceNotUniqueError.
    """
    if "/" in api_version:
        group, version = api_version.split("/", 1)
        terms = {"prefix": "apis", "group": group, "api_version": version, "kind": kind}
    else:
        terms = {"prefix": "api", "api_version": api_version, "kind": kind}
    results = [r for r in discoverer.search(**terms) if r.group_version == api_version]
    if len(results) > 1:
        results = [r for r in results if not isinstance(r, ResourceList)]
    if len(results) == 1:
        return results[0]
    if not results:
        raise ResourceNotFoundError(f"No matches found for {kind} {api_version}")
    raise ResourceNotUniqueError(f"Multiple matches found for {kind} {api_version}: {results}")


class TargetedDiscoverer(LazyDiscoverer):  # type: ignore[misc]
    """See the module docstring."""

    _wanted: tuple[str, str, str] | None = None

    def search(
        self,
        prefix: Any = None,
        group: Any = None,
        api_version: Any = None,
        kind: Any = None,
        **kwargs: Any,
    ) -> Any:
        if prefix in ("api", "apis") and isinstance(api_version, str) and "/" not in api_version:
            self._wanted = (str(prefix), str(group or ""), api_version)
        try:
            return super().search(  # type: ignore[no-untyped-call]
                prefix=prefix, group=group, api_version=api_version, kind=kind, **kwargs
            )
        finally:
            self._wanted = None

    def invalidate_cache(self) -> None:
        wanted = self._wanted
        if wanted is None:
            super().invalidate_cache()  # type: ignore[no-untyped-call]
            return
        prefix, group, version = wanted
        try:
            cached: Any = self._cache["resources"]
            if prefix == "apis":
                # The groups served now; resource lists already read are kept (the library
                # resets the core group's: it is put back, it did not change).
                core = cached.get("api")
                self.parse_api_groups(request_resources=False, update=True)  # type: ignore[no-untyped-call]
                if core is not None:
                    cached["api"] = core
            served = cached.get(prefix, {}).get(group, {}).get(version)
            if served is not None:
                # This group version's kinds now (a CRD added to a group already known).
                served.resources = self.get_resources_for_api_version(  # type: ignore[no-untyped-call]
                    prefix, group, version, served.preferred
                )
            self._write_cache()  # type: ignore[no-untyped-call]
        except NotFoundError:
            super().invalidate_cache()  # type: ignore[no-untyped-call]  # gone meanwhile


__all__ = ["TargetedDiscoverer", "find"]
