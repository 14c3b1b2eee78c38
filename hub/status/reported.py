"""Files agents put on their status branches, read on demand for a few clusters.

``hub publish`` checks the formats each cluster's agent reported (``status.json``), ``hub diff``
renders with the cluster facts it reported (``cluster.json``): both want one file from the
branches of the clusters at hand, not the whole fleet's status. One ref listing of the status
repository, one shallow fetch of the wanted branches into a throw-away repository, each file
read from the object database.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable

import pygit2

from agent.api.status import STATUS_BRANCH_PREFIX
from hub.errors import GitTransportError
from hub.publish.git import Callbacks

_log = logging.getLogger(__name__)
_STATUS_REF = "refs/heads/" + STATUS_BRANCH_PREFIX
_TRACK = "refs/fleetlet/reported/"
# Up to this many branches get a refspec each; beyond, one wildcard (libgit2 matches every
# refspec against every advertised ref).
_EXPLICIT_REFSPECS = 64


def status_files(
    *,
    url: str,
    clusters: Iterable[str],
    name: str,
    max_bytes: int,
    credentials: tuple[str, str] | None = None,
) -> dict[str, bytes]:
    """File ``name`` from the tip of each of ``clusters``' status branches, for those whose
    branch has it (a file larger than ``max_bytes`` is left out, with a warning).

    Raises GitTransportError when the status repository cannot be listed or fetched.
    """
    wanted = set(clusters)
    with tempfile.TemporaryDirectory(prefix="fleetlet-reported-") as tmp:
        repo = pygit2.init_repository(tmp, bare=True)
        remote = repo.remotes.create_anonymous(url)
        try:
            heads = remote.list_heads(callbacks=Callbacks(credentials))
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(f"cannot list the status branches of {url}: {exc}") from exc
        tips = {
            cluster: head.oid
            for head in heads
            if str(head.name).startswith(_STATUS_REF)
            and (cluster := str(head.name)[len(_STATUS_REF) :]) in wanted
            and getattr(head, "oid", None) is not None
        }
        if not tips:
            return {}
        if len(tips) <= _EXPLICIT_REFSPECS:
            specs = [f"+{_STATUS_REF}{c}:{_TRACK}{c}" for c in sorted(tips)]
        else:
            specs = [f"+{_STATUS_REF}*:{_TRACK}*"]
        try:
            remote.fetch(specs, callbacks=Callbacks(credentials), depth=1)
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(
                f"git fetch of status branches from {url} failed: {exc}"
            ) from exc
        found: dict[str, bytes] = {}
        for cluster, tip in tips.items():
            try:
                tree = repo[tip].peel(pygit2.Commit).tree
                blob = repo[tree[name].id].peel(pygit2.Blob)
            except (KeyError, ValueError, pygit2.GitError):
                continue
            if blob.size > max_bytes:
                _log.warning(
                    "%s%s:%s: larger than %d bytes, ignored",
                    STATUS_BRANCH_PREFIX,
                    cluster,
                    name,
                    max_bytes,
                )
                continue
            found[cluster] = bytes(blob.data)
        return found


__all__ = ["status_files"]
