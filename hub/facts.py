"""The cluster facts agents report (``cluster.json`` on ``fleetlet/status/<cluster>``, see
:mod:`agent.api.facts`), read on demand for the clusters ``hub diff --cluster`` previews.

One ref listing of the status repository and one shallow fetch of the wanted branches; the
documents are read from the object database. A cluster whose agent reported none (no status
branch, an older agent, an unreadable document) is simply absent: the preview then renders with
the tools' default capabilities, as an install, and says so.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from typing import Any

import pygit2

from agent.api.facts import FACTS_FILE, MAX_FACTS_BYTES, ReportedFacts, load_reported_facts
from agent.api.status import STATUS_BRANCH_PREFIX
from agent.errors import ValidationError
from hub.errors import GitTransportError

_log = logging.getLogger(__name__)
_STATUS_REF = "refs/heads/" + STATUS_BRANCH_PREFIX
_TRACK = "refs/fleetlet/facts/"


class _Callbacks(pygit2.RemoteCallbacks):  # type: ignore[misc]
    def __init__(self, credentials: tuple[str, str] | None) -> None:
        super().__init__()
        self._creds = credentials

    def credentials(self, url: str, username_from_url: str | None, allowed_types: Any) -> Any:
        if self._creds is None:
            raise pygit2.Passthrough
        return pygit2.UserPass(*self._creds)


def reported_facts(
    *, url: str, clusters: Iterable[str], credentials: tuple[str, str] | None = None
) -> dict[str, ReportedFacts]:
    """The facts each of ``clusters``' agents reported, for those that reported some.

    Raises GitTransportError when the status repository cannot be listed or fetched.
    """
    wanted = set(clusters)
    with tempfile.TemporaryDirectory(prefix="fleetlet-facts-") as tmp:
        repo = pygit2.init_repository(tmp, bare=True)
        remote = repo.remotes.create_anonymous(url)
        try:
            heads = remote.list_heads(callbacks=_Callbacks(credentials))
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(f"cannot list the status branches of {url}: {exc}") from exc
        tips = {
            name: h.oid
            for h in heads
            if (name := str(h.name).removeprefix(_STATUS_REF)) in wanted
            and str(h.name).startswith(_STATUS_REF)
            and getattr(h, "oid", None) is not None
        }
        if not tips:
            return {}
        specs = [f"+{_STATUS_REF}{c}:{_TRACK}{c}" for c in sorted(tips)]
        try:
            remote.fetch(specs, callbacks=_Callbacks(credentials), depth=1)
        except (pygit2.GitError, OSError) as exc:
            raise GitTransportError(
                f"git fetch of status branches from {url} failed: {exc}"
            ) from exc
        out: dict[str, ReportedFacts] = {}
        for cluster, tip in tips.items():
            found = _facts_at(repo, tip, cluster)
            if found is not None:
                out[cluster] = found
        return out


def _facts_at(repo: pygit2.Repository, tip: pygit2.Oid, cluster: str) -> ReportedFacts | None:
    """``cluster.json`` at ``tip`` when it is there, readable and this cluster's."""
    origin = f"{STATUS_BRANCH_PREFIX}{cluster}:{FACTS_FILE}"
    try:
        tree = repo[tip].peel(pygit2.Commit).tree
        blob = repo[tree[FACTS_FILE].id].peel(pygit2.Blob)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    if blob.size > MAX_FACTS_BYTES:
        _log.warning("%s: larger than %d bytes, ignored", origin, MAX_FACTS_BYTES)
        return None
    try:
        facts = load_reported_facts(bytes(blob.data), origin=origin)
    except ValidationError as exc:
        _log.warning("ignored: %s", exc)
        return None
    return facts if facts.cluster == cluster else None


__all__ = ["reported_facts"]
