"""``fleetlet hub recipients``: the age recipients of the fleet's clusters, in the form
``sops --age`` and ``age -r`` take, so an operator encrypts a secret for exactly the clusters
that should read it.

Each agent makes its cluster's age key pair and reports the public half in ``cluster.json``
beside its status (:mod:`agent.api.facts`, read here with :func:`hub.facts.reported_facts`);
the hub holds no private key. The clusters are the fleet's inventory, filtered by a label
selector in Kubernetes' string form (``region=eu,tier!=edge``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.api.facts import ReportedFacts
from agent.errors import PermanentError


class RecipientsMissingError(PermanentError):
    """A selected cluster's agent has reported no age key yet."""

    reason = "RecipientsMissing"


class SelectorError(PermanentError):
    """``--selector`` is not a label selector."""

    reason = "InvalidSelector"


@dataclass(frozen=True)
class ClusterRecipient:
    """A cluster and its current age recipient (None: its agent reported none yet); ``older``:
    keys it still holds from before a rotation (files encrypted to them still open)."""

    cluster: str
    recipient: str | None
    older: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "recipient": self.recipient, "older": list(self.older)}


def recipients(
    fleet_dir: str | Path,
    *,
    selector: str | None,
    facts_of: Callable[[Any, list[str]], Mapping[str, ReportedFacts]],
) -> list[ClusterRecipient]:
    """The selected clusters of the fleet in ``fleet_dir`` with their reported recipients,
    by name. ``facts_of(fleet, clusters)`` reads the facts the agents reported.

    Raises FleetRepoError (the fleet does not load) and SelectorError.
    """
    from hub.fleet.load import load_fleet
    from hub.status.queries import QueryError, parse_label_filter

    try:
        wanted = parse_label_filter(selector or "")
    except QueryError as exc:
        raise SelectorError(f"--selector: {exc.message}") from None
    fleet = load_fleet(fleet_dir)
    names = sorted(c.name for c in fleet.clusters if wanted.matches(c.labels))
    reported = facts_of(fleet, names)
    out = []
    for name in names:
        keys = reported[name].age_recipients if name in reported else ()
        out.append(
            ClusterRecipient(cluster=name, recipient=keys[0] if keys else None, older=keys[1:])
        )
    return out


def print_recipients(found: list[ClusterRecipient], output: str | None) -> None:
    """The recipients: a comma-separated list (``sops --age``), ``table`` or ``json``/``yaml``.

    Raises RecipientsMissingError after printing when a cluster has no recipient (so a script
    never encrypts for fewer clusters than it selected without noticing).
    """
    from agent.output import render

    missing = [r.cluster for r in found if r.recipient is None]
    if output in ("json", "yaml"):
        print(render({"clusters": [r.to_dict() for r in found]}, output, table=str))
    elif output == "table":
        print(f"{'CLUSTER':<32} RECIPIENT")
        for r in found:
            print(f"{r.cluster:<32} {r.recipient or '(none reported yet)'}")
    else:
        print(",".join(r.recipient for r in found if r.recipient))
    if not found:
        print("warning: no cluster matches the selector", file=sys.stderr)
    if missing:
        raise RecipientsMissingError(
            f"no age recipient reported yet by {', '.join(missing)} (their agents report "
            "one with their status once they run; encrypt for them after that)"
        )


__all__ = ["ClusterRecipient", "RecipientsMissingError", "print_recipients", "recipients"]
