"""Whether each cluster's agent can render the formats of the bundles it is about to receive.

Agents write the formats they can render (built in and installed plugins) into ``formats`` of
their status document (schema version 2). Before ``hub publish`` signs anything,
:func:`check_formats` reads the status branches of the clusters being published (one ref
listing, one fetch of the branches that exist, documents read from the object database) and
refuses, naming every cluster, bundle and format, when a bundle's format is not among what
that cluster's agent reported. A cluster whose agent has not reported formats (no status yet,
an agent writing schema version 1, an unreadable document) is not checked: the check is about
knowing better, never about guessing. ``force`` skips it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.api.status import MAX_LOAD_BYTES, STATUS_FILE
from hub.errors import PublishError
from hub.fleet.render import ClusterPlan


@dataclass(frozen=True, slots=True)
class FormatGap:
    """A bundle whose format the cluster's agent said it cannot render."""

    cluster: str
    bundle: str
    format: str
    reported: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"cluster {self.cluster} cannot render format {self.format!r} (bundle "
            f"{self.bundle}); its agent reported: {', '.join(self.reported)}"
        )


class FormatsUnavailableError(PublishError):
    """Bundles would go to clusters whose agents cannot render their format; ``gaps`` lists
    each."""

    reason = "FormatUnavailable"

    def __init__(self, gaps: Iterable[FormatGap]) -> None:
        self.gaps = tuple(gaps)
        listed = "; ".join(str(g) for g in self.gaps)
        super().__init__(
            f"{listed}. Nothing was published: install the format on those agents, or publish "
            "anyway with --force"
        )


def reported_formats(
    *, url: str, clusters: Iterable[str], credentials: tuple[str, str] | None = None
) -> dict[str, frozenset[str]]:
    """The formats each of ``clusters``' agents reported, for those that reported some.

    Raises GitTransportError when the status repository cannot be listed or fetched.
    """
    from hub.status.reported import status_files

    documents = status_files(
        url=url,
        clusters=clusters,
        name=STATUS_FILE,
        max_bytes=MAX_LOAD_BYTES,
        credentials=credentials,
    )
    out: dict[str, frozenset[str]] = {}
    for cluster, data in documents.items():
        found = _formats_of(data, cluster)
        if found is not None:
            out[cluster] = found
    return out


def _formats_of(data: bytes, cluster: str) -> frozenset[str] | None:
    """``formats`` of a status document; None when it says nothing usable."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    formats = doc.get("formats") if isinstance(doc, dict) else None
    if doc.get("cluster") != cluster or not isinstance(formats, list) or not formats:
        return None
    if not all(isinstance(f, str) for f in formats):
        return None
    return frozenset(formats)


def format_gaps(
    plans: Mapping[str, ClusterPlan], reported: Mapping[str, frozenset[str]]
) -> list[FormatGap]:
    """Every (cluster, bundle) whose format the cluster's agent did not report."""
    gaps: list[FormatGap] = []
    for cluster in sorted(plans):
        known = reported.get(cluster)
        if known is None:
            continue
        for entry in plans[cluster].entries:
            if entry.spec.format not in known:
                gaps.append(FormatGap(cluster, entry.name, entry.spec.format, tuple(sorted(known))))
    return gaps


def check_formats(
    plans: Mapping[str, ClusterPlan],
    *,
    status_url: str,
    credentials: tuple[str, str] | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[FormatGap]:
    """Refuse to publish bundles to clusters whose agents cannot render their format.

    With ``force`` nothing is read and nothing refused. Returns the gaps found (none, unless
    forced). Raises FormatsUnavailableError, GitTransportError.
    """
    if force:
        return []
    say = progress or (lambda _message: None)
    say(f"reading the formats agents reported from {status_url}")
    reported = reported_formats(url=status_url, clusters=plans, credentials=credentials)
    gaps = format_gaps(plans, reported)
    if gaps:
        raise FormatsUnavailableError(gaps)
    say(f"formats checked for {len(reported)} clusters whose agents reported theirs")
    return gaps


__all__ = [
    "FormatGap",
    "FormatsUnavailableError",
    "check_formats",
    "format_gaps",
    "reported_formats",
]
