"""The cluster facts agents report (``cluster.json`` on ``fleetlet/status/<cluster>``, see
:mod:`agent.api.facts`), read on demand for the clusters ``hub diff --cluster`` previews.

One ref listing of the status repository and one shallow fetch of the wanted branches; the
documents are read from the object database. A cluster whose agent reported none (no status
branch, an older agent, an unreadable document) is simply absent: the preview then renders with
the tools' default capabilities, as an install, and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from agent.api.facts import FACTS_FILE, MAX_FACTS_BYTES, ReportedFacts, load_reported_facts
from agent.api.status import STATUS_BRANCH_PREFIX
from agent.errors import ValidationError
from hub.status.reported import status_files

_log = logging.getLogger(__name__)


def reported_facts(
    *, url: str, clusters: Iterable[str], credentials: tuple[str, str] | None = None
) -> dict[str, ReportedFacts]:
    """The facts each of ``clusters``' agents reported, for those that reported some.

    Raises GitTransportError when the status repository cannot be listed or fetched.
    """
    files = status_files(
        url=url,
        clusters=clusters,
        name=FACTS_FILE,
        max_bytes=MAX_FACTS_BYTES,
        credentials=credentials,
    )
    out: dict[str, ReportedFacts] = {}
    for cluster, data in files.items():
        origin = f"{STATUS_BRANCH_PREFIX}{cluster}:{FACTS_FILE}"
        try:
            facts = load_reported_facts(data, origin=origin)
        except ValidationError as exc:
            _log.warning("ignored: %s", exc)
            continue
        if facts.cluster == cluster:
            out[cluster] = facts
    return out


__all__ = ["reported_facts"]
