"""``bundles/*.yaml``: one bundle per file, its targets, overrides, encrypted values and rollout
(its sources are read by :mod:`hub.fleet.load._sources`). Called by
:func:`hub.fleet.load.load_fleet`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from agent.errors import FieldProblem
from hub.fleet.helmsets import check_sets
from hub.fleet.load._problems import _NAME, _found, _load_yaml, _Problems
from hub.fleet.load._sources import _load_sources
from hub.fleet.model import APPROVALS, Bundle, Cluster, Override, Target
from hub.fleet.selectors import parse_selector
from hub.rollout.model import Strategy, parse_strategy

# Keys of a bundle file the hub consumes itself; every other key is passed to the
# BundleDeployment spec unchanged (the agent's API validates it).
_BUNDLE_OWN_KEYS = (
    "name",
    "sources",
    "targets",
    "overrides",
    "rollout",
    "encryptedValues",
    "verify",  # the signature policy of its image sources (hub.fleet.signing)
)
# What an override changes (it needs one at least), and every key it may have.
_OVERRIDE_FIELDS = (
    "sources",
    "values",
    "encryptedValues",
    "paused",
    "approval",
    "namespace",
    "path",
    "patches",
    "setString",
    "setJson",
    "setFile",
)
_OVERRIDE_KEYS = ("clusters", "clusterSelector", *_OVERRIDE_FIELDS)


def _load_bundle_file(
    path: Path, rel: str, clusters: Mapping[str, Cluster], problems: _Problems
) -> Bundle | None:
    raw = _load_yaml(path, rel, problems)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.add(rel, "", "a bundle mapping", raw)
        return None
    start = len(problems.items)
    root = path.parents[len(PurePosixPath(rel).parts) - 1]
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        problems.add(rel, "name", "a lowercase DNS label (bundle name)", name)
    sources = _load_sources(raw.get("sources"), rel, problems)
    encrypted = _encrypted_values(root, raw, "encryptedValues", rel, problems)
    targets_raw = raw.get("targets")
    targets: list[Target] = []
    if not isinstance(targets_raw, list) or not targets_raw:
        problems.add(
            rel,
            "targets",
            "a non-empty list of targets (clusters and/or clusterSelector)",
            targets_raw,
        )
    else:
        for i, t in enumerate(targets_raw):
            target = _load_target(
                t, f"targets[{i}]", ("clusters", "clusterSelector"), rel, clusters, problems
            )
            if target is not None:
                targets.append(target)
    overrides: list[Override] = []
    overrides_raw = raw.get("overrides", []) or []
    if not isinstance(overrides_raw, list):
        problems.add(rel, "overrides", "a list of overrides", overrides_raw)
        overrides_raw = []
    for i, o in enumerate(overrides_raw):
        ov = _load_override(o, i, rel, clusters, problems, root=root)
        if ov is not None:
            overrides.append(ov)
    spec = {k: v for k, v in raw.items() if k not in _BUNDLE_OWN_KEYS}
    if isinstance(spec.get("formatOptions"), dict):
        check_sets(spec["formatOptions"], "formatOptions", functools.partial(problems.add, rel))
    rollout: Strategy | str | None = None
    if "rollout" in raw:
        found: list[FieldProblem] = []
        rollout = parse_strategy(raw["rollout"], "rollout", found)
        problems.extend(rel, found)
    verify = raw.get("verify")
    if verify is not None and (not isinstance(verify, str) or not verify):
        problems.add(rel, "verify", "the name of a sourceSigning policy", verify)
    if len(problems.items) > start:
        return None
    return Bundle(
        name=str(name),
        file=rel,
        sources=tuple(sources),
        spec=spec,
        targets=tuple(targets),
        overrides=tuple(overrides),
        rollout=rollout,
        encrypted_values=encrypted,
        verify=verify,
    )


def _encrypted_values(
    root: Path, raw: Mapping[str, Any], key: str, rel: str, problems: _Problems
) -> Mapping[str, Any] | None:
    """The SOPS document ``raw[key]`` names (None when absent, or after a problem)."""
    from hub.fleet.secrets import load_encrypted_values

    if key not in raw:
        return None
    return load_encrypted_values(
        root,
        raw[key],
        add=lambda expected, found: problems.add(rel, key, expected, found),
    )


def _load_target(
    raw: Any,
    where: str,
    allowed: tuple[str, ...],
    rel: str,
    clusters: Mapping[str, Cluster],
    problems: _Problems,
) -> Target | None:
    if not isinstance(raw, dict):
        problems.add(rel, where, "a mapping with clusters and/or clusterSelector", raw)
        return None
    start = len(problems.items)
    if "clusters" not in raw and "clusterSelector" not in raw:
        problems.add(rel, where, "clusters and/or clusterSelector", _found("neither"))
    for key in sorted(set(raw) - set(allowed), key=str):
        problems.add(rel, f"{where}.{key}", "one of " + ", ".join(allowed), _found("unknown field"))
    names: frozenset[str] | None = None
    if "clusters" in raw:
        lst = raw["clusters"]
        if not isinstance(lst, list) or not lst:
            problems.add(rel, f"{where}.clusters", "a non-empty list of cluster names", lst)
        else:
            for j, n in enumerate(lst):
                if not isinstance(n, str) or n not in clusters:
                    problems.add(rel, f"{where}.clusters[{j}]", "the name of a defined cluster", n)
            names = frozenset(n for n in lst if isinstance(n, str))
    selector = None
    if "clusterSelector" in raw:
        sel_problems: list[FieldProblem] = []
        selector = parse_selector(raw["clusterSelector"], f"{where}.clusterSelector", sel_problems)
        problems.extend(rel, sel_problems)
    if len(problems.items) > start:
        return None
    return Target(names=names, selector=selector)


def _load_override(
    raw: Any,
    index: int,
    rel: str,
    clusters: Mapping[str, Cluster],
    problems: _Problems,
    *,
    root: Path,
) -> Override | None:
    where = f"overrides[{index}]"
    target = _load_target(raw, where, _OVERRIDE_KEYS, rel, clusters, problems)
    if target is None or not isinstance(raw, dict):
        return None
    start = len(problems.items)
    encrypted = _encrypted_values(root, raw, "encryptedValues", f"{rel}: {where}", problems)
    ok = len(problems.items) == start
    values = raw.get("values")
    if values is not None and not isinstance(values, dict):
        problems.add(rel, f"{where}.values", "a mapping (merged into the bundle's values)", values)
        ok = False
    paused = raw.get("paused")
    if paused is not None and not isinstance(paused, bool):
        problems.add(rel, f"{where}.paused", "true or false", paused)
        ok = False
    approval = raw.get("approval")
    if approval is not None and approval not in APPROVALS:
        problems.add(rel, f"{where}.approval", " | ".join(APPROVALS), approval)
        ok = False
    namespace = raw.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not _NAME.match(namespace)):
        problems.add(rel, f"{where}.namespace", "a namespace name (DNS label)", namespace)
        ok = False
    path = raw.get("path")
    if path is not None and (not isinstance(path, str) or not path):
        problems.add(rel, f"{where}.path", "a directory of the bundle's tree", path)
        ok = False
    patches = raw.get("patches")
    if patches is not None and not (
        isinstance(patches, list) and all(isinstance(x, dict) for x in patches)
    ):
        problems.add(rel, f"{where}.patches", "a list of patches ({patch, target})", patches)
        ok = False
    start = len(problems.items)
    sets = check_sets(raw, where, functools.partial(problems.add, rel))
    ok = ok and len(problems.items) == start
    sources = None
    if "sources" in raw:
        start = len(problems.items)
        sources = tuple(_load_sources(raw["sources"], rel, problems, f"{where}.sources"))
        ok = ok and len(problems.items) == start
    if not any(k in raw for k in _OVERRIDE_FIELDS):
        problems.add(rel, where, f"at least one of {', '.join(_OVERRIDE_FIELDS)}", _found("none"))
        ok = False
    if not ok:
        return None
    return Override(
        index=index,
        target=target,
        values=values,
        paused=paused,
        approval=approval,
        namespace=namespace,
        sources=sources,
        path=path,
        patches=tuple(patches) if patches is not None else None,
        encrypted_values=encrypted,
        sets=sets,
    )
