"""Whether a decision a group awaits may have come: what it waits on, compared by
resourceVersion.

While a group's move awaits a decision on its BundleDeploymentRequest, another pass decides
the same (wait) until the request changes (someone approved, denied, edited or deleted it) or
an ApprovalPolicy does (one that approves it by a rule, or no longer requires approval). The
worker that decided to wait says what it read (:class:`~agent.runner.protocol.Awaited`: the
request's resourceVersion as it acted on it, every policy's); a decision taken afterwards,
even while that worker still ran, gives the request a newer resourceVersion. So the
supervisor compares these with metadata-only LISTs each poll and starts a worker only when
something differs, instead of one every poll for as long as nobody decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.runner.protocol import Awaited
from agent.runner.reader import ClusterReader


def changed(reader: ClusterReader, awaited: Sequence[Awaited]) -> bool:
    """Whether anything of ``awaited`` differs now (one metadata-only LIST per entry).

    Raises ReaderError when a LIST fails: then whether it changed is unknown.
    """
    for entry in awaited:
        listed = reader.list_versions(entry.path)
        now = {name: found.resource_version for name, found in listed.items()}
        if entry.whole:
            if now != dict(entry.versions):
                return True
        elif any(now.get(name) != version for name, version in entry.versions.items()):
            return True
    return False


__all__ = ["changed"]
