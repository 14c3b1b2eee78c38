"""The agent's own version, declared in ``fleet.yaml`` and carried in every set.

::

    agent:
      image: registry.example.com/fleetlet/agent@sha256:...   # or :tag, resolved to a digest
      rollout: {waves: [...], soakTime: 10m, onFailure: revert}   # optional, or "none"

:func:`with_agent` (called by :func:`hub.publish.flow.prepare` after the fleet is loaded) turns
it into one entry of every cluster's set, named and grouped :data:`AGENT_ENTRY`, of the
reserved format :data:`AGENT_FORMAT`, its image pinned by digest like any bundle's source, and
its ``rollout`` into the group's strategy. So the version is signed with the set (one
publication statement), resolved and pinned by the resolver, and moved in waves, soaked,
halted and reverted by the rollout controller (:mod:`hub.rollout`) like any group. The agent
takes the entry off the set it renders and applies right after verifying it
(:mod:`agent.upgrade.desired`): bundle content never touches the agent's own objects, and no
bundle may take the reserved name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from agent.errors import FieldProblem
from agent.upgrade import AGENT_ENTRY, AGENT_FORMAT
from hub.errors import FleetRepoError
from hub.fleet.model import Bundle, Fleet, SourceRef, Target
from hub.rollout.model import Strategy, parse_strategy

_KEYS = ("image", "rollout")


def with_agent(fleet: Fleet) -> Fleet:
    """``fleet`` with the agent entry of ``fleet.yaml``'s ``agent:`` (unchanged without it).

    Raises FleetRepoError naming ``fleet.yaml`` and the field: an invalid ``agent:``, or a bundle
    or group that takes the reserved name.
    """
    problems: list[FieldProblem] = []
    for bundle in fleet.bundles:
        if AGENT_ENTRY in (bundle.name, bundle.group):
            problems.append(
                FieldProblem(
                    path=f"{bundle.file}: name/group",
                    expected=f"a name other than {AGENT_ENTRY!r} (reserved for fleet.yaml's agent)",
                    found=AGENT_ENTRY,
                )
            )
    raw = _raw(fleet.root)
    if raw is None and not problems:
        return fleet
    made, strategy = _bundle(raw, problems) if raw is not None else (None, None)
    if problems or made is None:
        raise FleetRepoError(problems, origin=str(fleet.root))
    rollouts = dict(fleet.rollouts)
    if strategy is not None:
        rollouts[AGENT_ENTRY] = strategy
    return dataclasses.replace(fleet, bundles=(*fleet.bundles, made), rollouts=rollouts)


def _raw(root: Path) -> Any:
    try:
        settings = yaml.safe_load((root / "fleet.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None  # load_fleet said what is wrong with the file already
    return settings.get("agent") if isinstance(settings, dict) else None


def _bundle(raw: Any, problems: list[FieldProblem]) -> tuple[Bundle | None, Strategy | None]:
    def bad(path: str, expected: str, found: str) -> tuple[None, None]:
        problems.append(FieldProblem(path=f"fleet.yaml: {path}", expected=expected, found=found))
        return None, None

    if not isinstance(raw, dict):
        return bad("agent", "a mapping with image (and rollout)", type(raw).__name__)
    for key in sorted(set(raw) - set(_KEYS), key=str):
        return bad(f"agent.{key}", "one of " + ", ".join(_KEYS), "unknown field")
    image = raw.get("image")
    if not isinstance(image, str) or not image:
        return bad(
            "agent.image", "the agent's image, REGISTRY/REPO@sha256:<hex> or :TAG", repr(image)
        )
    uri, field, ref = _image_ref(image.removeprefix("oci://"))
    if not uri or not ref:
        return bad("agent.image", "REGISTRY/REPO@sha256:<64 hex> or REGISTRY/REPO:TAG", image)
    strategy: Strategy | None = None
    if "rollout" in raw:
        found = parse_strategy(raw["rollout"], "fleet.yaml: agent.rollout", problems)
        if found is None:
            return None, None
        strategy = found if isinstance(found, Strategy) else None
    bundle = Bundle(
        name=AGENT_ENTRY,
        file="fleet.yaml",
        sources=(SourceRef(kind="image", uri=uri, ref_field=field, ref=ref),),
        spec={"format": AGENT_FORMAT, "group": AGENT_ENTRY},
        targets=(Target(names=None, selector=None),),
        overrides=(),
        rollout=strategy,
    )
    return bundle, strategy


def _image_ref(image: str) -> tuple[str, str, str]:
    """(repository, "digest" or "tag", reference) of ``host/repo@sha256:...`` or ``:tag``."""
    if "@" in image:
        uri, _, digest = image.partition("@")
        ok = digest.startswith("sha256:") and len(digest) == 71
        return uri, "digest", digest if ok else ""
    head, _, last = image.rpartition("/")
    if ":" in last:
        name, _, tag = last.partition(":")
        return f"{head}/{name}" if head else name, "tag", tag
    return image, "tag", ""


__all__ = ["with_agent"]
