"""What a format may know of the cluster it renders for (helm's ``.Capabilities``).

The agent reads them from its own API server (:meth:`agent.kube.KubeClient.server_version`
and :meth:`~agent.kube.KubeClient.api_versions`); the hub and ``fleetlet render`` take them from
the command line or leave them unset, and a format then uses its tool's defaults. They are part
of what a render depends on, so :meth:`ClusterFacts.key` goes into the render cache's key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.errors import PermanentError

_KUBE_VERSION = re.compile(r"^v?(\d+)\.(\d+)(\.\d+)?([-+][0-9A-Za-z.+-]*)?$")


class InvalidClusterFactsError(PermanentError):
    """A cluster fact given by a user (``--kube-version``) is malformed."""

    reason = "InvalidClusterFacts"


@dataclass(frozen=True, kw_only=True)
class ClusterFacts:
    """The cluster's Kubernetes version and served APIs; ``None``/empty: unknown."""

    kube_version: str | None = None
    """The API server's version, e.g. ``v1.37.2`` (helm's ``.Capabilities.KubeVersion``)."""
    api_versions: tuple[str, ...] = ()
    """Served ``group/version`` and ``group/version/Kind`` strings, sorted
    (helm's ``.Capabilities.APIVersions``)."""

    def __post_init__(self) -> None:
        if self.kube_version is not None and not _KUBE_VERSION.match(self.kube_version):
            raise InvalidClusterFactsError(
                f"kube version {self.kube_version!r}: expected a version such as v1.37.2"
            )

    @classmethod
    def of(cls, *, kube_version: str | None, api_versions: Iterable[str] = ()) -> ClusterFacts:
        """Facts with the API versions deduplicated and sorted (a stable cache key).

        Raises InvalidClusterFactsError for a malformed version.
        """
        return cls(kube_version=kube_version, api_versions=tuple(sorted(set(api_versions))))

    def key(self) -> str:
        """A short digest of the facts, for cache keys."""
        import hashlib  # here: `fleetlet render` keys no cache (OpenSSL's library: 2 ms)

        doc = json.dumps([self.kube_version, list(self.api_versions)], separators=(",", ":"))
        return hashlib.sha256(doc.encode()).hexdigest()[:32]


__all__ = ["ClusterFacts", "InvalidClusterFactsError"]
