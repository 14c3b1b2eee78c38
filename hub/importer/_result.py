"""What the Fleet importer is given (:class:`ImportSettings`) and gives back (:class:`ImportResult`
with its :class:`Note` list), and its one error. Used by every module of
:mod:`hub.importer.fleet`, which re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.errors import PermanentError


class FleetImportError(PermanentError):
    """The directory cannot be imported (not readable, a fleet.yaml that does not parse, no
    source URL); the message names the file and what was wrong."""


@dataclass(frozen=True, slots=True)
class Note:
    """Something of the Fleet repo that fleetlet does not express (or expresses differently)."""

    bundle: str
    field: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"bundle": self.bundle, "field": self.field, "message": self.message}


@dataclass(frozen=True, kw_only=True)
class ImportSettings:
    """Where the content is and what the GitRepo says (see the module doc)."""

    name: str
    source_url: str | None = None
    branch: str | None = None
    commit: str | None = None
    gitrepo: Mapping[str, Any] | None = None
    clusters: Sequence[Mapping[str, Any]] | None = None


@dataclass
class ImportResult:
    """The fleetlet bundles and clusters, and the notes."""

    name: str
    bundles: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
