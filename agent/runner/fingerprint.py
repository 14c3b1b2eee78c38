"""Whether anything the accepted set owns changed: a digest of resourceVersions.

Every write to an object (its spec, labels, annotations, its status: a Deployment whose pods
fail) gives it a new ``resourceVersion``; deleting it removes it from its LIST. So the digest
of the (uid, resourceVersion) of every object a worker's outbound pass looked at, taken just
before that pass started, says whether its conclusions still hold: if the digest taken now is
the same, nothing it checked (drift, health, the BundleDeployments' annotations) has changed
since, and no new pass is needed. If the pass wrote something itself (drift put back, a
status), the digest differs and one more pass runs, which finds nothing to do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from agent.runner.protocol import Watch, watch_list
from agent.runner.reader import ClusterReader


@dataclass(frozen=True)
class Fingerprint:
    """The digest of the watched objects' versions, for one watch list."""

    watches: str
    digest: str


def take(reader: ClusterReader, watches: Sequence[Watch]) -> Fingerprint:
    """The fingerprint of ``watches`` now (one metadata-only LIST per watch).

    Raises ReaderError when any LIST fails (refused, timed out): then what changed is unknown.
    """
    digest = hashlib.sha256()
    for watch in sorted(watches, key=lambda w: (w.path, w.user or "")):
        listed = reader.list_versions(watch.path, user=watch.user)
        names = sorted(watch.names) if watch.names is not None else sorted(listed)
        for name in names:
            found = listed.get(name)
            uid, version = (found.uid, found.resource_version) if found else ("-", "-")
            digest.update(f"{watch.user}|{watch.path}|{name}|{uid}|{version}\n".encode())
    return Fingerprint(watches=watch_list(watches), digest=digest.hexdigest())


__all__ = ["Fingerprint", "take"]
