"""Loading and validating a fleet repo (the format is documented in ``docs/fleet-repo.md``).

Layout::

    FLEET_DIR/fleet.yaml        settings (signing identity, expiry and refresh windows, repo)
    FLEET_DIR/clusters/*.yaml   clusters with labels: one cluster per file, or ``clusters: [...]``
    FLEET_DIR/bundles/*.yaml    one bundle per file: sources, format, targets, overrides, ...

:func:`load_fleet` reads everything into :mod:`hub.fleet.model`'s types and reports every
problem in one :class:`~hub.errors.FleetRepoError`, each naming the file, the field and what is
wrong.

The rooms, one per file kind: :mod:`~hub.fleet.load._settings` (fleet.yaml),
:mod:`~hub.fleet.load._clusters` (the inventory), :mod:`~hub.fleet.load._bundles` (bundle
files, their targets and overrides), :mod:`~hub.fleet.load._sources` (a bundle's sources), all
reporting into :mod:`~hub.fleet.load._problems`. Callers import from ``hub.fleet.load``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from pathlib import Path

from hub.errors import FleetRepoError
from hub.fleet.load._bundles import _load_bundle_file
from hub.fleet.load._clusters import _cluster_file
from hub.fleet.load._problems import _found, _Problems
from hub.fleet.load._settings import _load_settings
from hub.fleet.load._sources import version_range
from hub.fleet.model import Bundle, Cluster, Fleet, Settings
from hub.rollout.model import Strategy

_NAME_OF = operator.attrgetter("name")


def load_fleet(root: str | Path, *, cache_dir: Path | None = None) -> Fleet:
    """Load and validate the fleet repo in ``root``.

    ``cache_dir`` keeps the parsed cluster files by content hash (:mod:`hub.fleet.cache`):
    an unchanged inventory is not parsed again. Raises FleetRepoError listing every problem
    found (file, field, expected, found).
    """
    from hub.fleet.cache import ParsedFiles

    root = Path(root)
    problems = _Problems()
    if not root.is_dir():
        what = "a file" if root.exists() else "nothing there"
        problems.add(
            str(root), "", "a fleet repo directory (fleet.yaml, clusters/, bundles/)", _found(what)
        )
        raise FleetRepoError(problems.items)
    settings = _load_settings(root, problems)
    files: list[str] = ["fleet.yaml"]
    clusters: dict[str, Cluster] = {}
    parsed = ParsedFiles(cache_dir) if cache_dir is not None else None
    for path in _yaml_files(root / "clusters"):
        rel = path.relative_to(root).as_posix()
        files.append(rel)
        count = settings.shards.count if settings is not None else 1
        found = _cluster_file(path, rel, problems, parsed, count)
        before = len(clusters)
        merged = {**clusters, **dict(zip(map(_NAME_OF, found), found, strict=True))}
        if len(merged) == before + len(found):
            clusters = merged  # the common case: every name new (checked in one go)
            continue
        for c in found:
            if c.name in clusters:
                problems.add(
                    rel,
                    "name",
                    "a unique cluster name",
                    _found(f'"{c.name}" (also in {clusters[c.name].file})'),
                )
            else:
                clusters[c.name] = c
    if not (root / "clusters").is_dir():
        problems.add("clusters/", "", "a directory of cluster files", _found("missing"))
    bundles: dict[str, Bundle] = {}
    for path in _yaml_files(root / "bundles"):
        rel = path.relative_to(root).as_posix()
        files.append(rel)
        b = _load_bundle_file(path, rel, clusters, problems)
        if b is None:
            continue
        if b.name in bundles:
            problems.add(
                rel,
                "name",
                "a unique bundle name",
                _found(f'"{b.name}" (also in {bundles[b.name].file})'),
            )
        else:
            bundles[b.name] = b
    if not (root / "bundles").is_dir():
        problems.add("bundles/", "", "a directory of bundle files", _found("missing"))
    strategies = _group_strategies(bundles, settings, problems) if settings is not None else {}
    if problems.items:
        raise FleetRepoError(problems.items, origin=str(root))
    if parsed is not None:
        parsed.prune()
    assert settings is not None
    return Fleet(
        root=root,
        settings=settings,
        clusters=tuple(map(clusters.__getitem__, sorted(clusters))),
        bundles=tuple(bundles[n] for n in sorted(bundles)),
        files=tuple(sorted(files)),
        by_name=clusters,
        rollouts=strategies,
    )


def _group_strategies(
    bundles: Mapping[str, Bundle], settings: Settings, problems: _Problems
) -> dict[str, Strategy]:
    """Group -> rollout strategy: the one its bundles name (they must agree), else fleet.yaml's
    default, unless a bundle says ``rollout: none``."""
    said: dict[str, Bundle] = {}
    groups: set[str] = set()
    for name in sorted(bundles):
        b = bundles[name]
        groups.add(b.group)
        if b.rollout is None:
            continue
        first = said.get(b.group)
        if first is None:
            said[b.group] = b
        elif first.rollout != b.rollout:
            problems.add(
                b.file,
                "rollout",
                f"the rollout of {first.file} (group {b.group!r} moves as one)",
                _found("another one"),
            )
    out: dict[str, Strategy] = {}
    for group in sorted(groups):
        chosen = said[group].rollout if group in said else settings.rollout
        if isinstance(chosen, Strategy):
            out[group] = chosen
    return out


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


__all__ = ["load_fleet", "version_range"]
