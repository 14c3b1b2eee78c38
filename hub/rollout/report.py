"""Rollouts as the API, the CLI and the dashboard show them (JSON documents).

:func:`summary` is a rollout in one object: its status, each wave with its clusters counted by
verdict, the failures against the budget, why it halted. :func:`detail` adds the events and a
page of its member clusters (filtered by wave and verdict), each with its phase, the serial
its branch carries and the reason for its verdict. Without status reports (``evaluation``
None) clusters are counted by phase only.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hub.rollout.evaluate import VERDICTS, Evaluation
from hub.rollout.state import PHASES, Rollout

MAX_MEMBERS_PAGE = 1000


def summary(rollout: Rollout, evaluation: Evaluation | None) -> dict[str, Any]:
    """One rollout, counted (no per-cluster list)."""
    current = rollout.current_wave()
    waves = []
    for index, wave in enumerate(rollout.waves):
        names = rollout.in_wave(index)
        waves.append(
            {
                **wave.to_dict(),
                "clusters": len(names),
                "counts": _counts(rollout, evaluation, names),
            }
        )
    failures = evaluation.failures(rollout.forgiven) if evaluation is not None else None
    return {
        "id": rollout.id,
        "group": rollout.group,
        "status": rollout.status,
        "createdAt": rollout.created_at,
        "createdBy": rollout.created_by,
        "updatedAt": rollout.updated_at or rollout.created_at,
        "source": {"repo": rollout.source_repo, "commit": rollout.source_commit},
        "strategy": rollout.strategy.to_dict(),
        "clusters": len(rollout.members),
        "counts": _counts(rollout, evaluation, list(rollout.members)),
        "currentWave": rollout.waves[current].name if current >= 0 else None,
        "waves": waves,
        "failures": {
            "count": len(failures) if failures is not None else None,
            "budget": rollout.strategy.budget(len(rollout.members)),
            "forgiven": len(rollout.forgiven),
        },
        "halt": rollout.halt.to_dict() if rollout.halt is not None else None,
        "lastEvent": rollout.events[-1].to_dict() if rollout.events else None,
    }


def detail(
    rollout: Rollout,
    evaluation: Evaluation | None,
    *,
    wave: str | None = None,
    verdict: str | None = None,
    offset: int = 0,
    limit: int = 100,
) -> dict[str, Any]:
    """:func:`summary`, the events, and a page of members (``wave``, ``verdict`` filter)."""
    names = [w.name for w in rollout.waves]
    chosen = []
    for name in sorted(rollout.members):
        member = rollout.members[name]
        if wave is not None and names[member.wave] != wave:
            continue
        found = evaluation.verdicts.get(name) if evaluation is not None else None
        shown = found.verdict if found is not None else member.phase
        if verdict is not None and shown != verdict:
            continue
        chosen.append(
            {
                "cluster": name,
                "wave": names[member.wave],
                "phase": member.phase,
                "serial": member.serial or None,
                "verdict": found.verdict if found is not None else None,
                "reason": found.reason if found is not None else "",
            }
        )
    limit = max(1, min(limit, MAX_MEMBERS_PAGE))
    return {
        **summary(rollout, evaluation),
        "events": [e.to_dict() for e in rollout.events],
        "members": {
            "total": len(chosen),
            "offset": offset,
            "limit": limit,
            "items": chosen[offset : offset + limit],
        },
    }


def _counts(rollout: Rollout, evaluation: Evaluation | None, names: list[str]) -> dict[str, int]:
    if evaluation is None:
        found = Counter(rollout.members[n].phase for n in names)
        return {k: found.get(k, 0) for k in PHASES}
    verdicts = Counter(evaluation.verdicts[n].verdict for n in names if n in evaluation.verdicts)
    return {k: verdicts.get(k, 0) for k in VERDICTS}


__all__ = ["MAX_MEMBERS_PAGE", "detail", "summary"]
