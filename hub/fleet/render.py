"""Turning a loaded fleet and its pins into one BundleDeploymentSet per cluster.

Deterministic by construction: clusters, bundles and groups are taken in sorted order, overrides
in their documented order, and the sets are serialised by the agent's canonical encoder, so the
same fleet commit with the same pins gives the same bytes.

Override order (for one bundle on one cluster): the bundle's own fields, then every override
selected by ``clusterSelector`` only, in file order, then every override naming the cluster in
``clusters``, in file order. ``values`` are deep-merged (mappings merge key by key, anything else
is replaced, ``null`` removes a key); ``patches`` are appended; ``paused``, ``approval``,
``namespace`` and ``path`` are replaced. Then ``${cluster.name}`` and
``${cluster.labels.<key>}`` in the merged values are substituted (:mod:`hub.fleet.templating`),
so each set holds its cluster's final values.

A source resolved from a version range (a Helm repository chart, an OCI chart tag range) is
written with its exact version; the dependencies the hub pinned for a chart (from a Helm
repository, an OCI registry, an http archive or a git directory) follow it as extra sources
placed under the chart's ``charts/``.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from agent.api import (
    BundleDeploymentEntry,
    BundleDeploymentSet,
    BundleDeploymentSpec,
    CommitSignature,
    SetSource,
    from_dict,
)
from agent.api.depgraph import find_cycle
from agent.errors import FieldProblem, ValidationError
from hub.errors import FleetRepoError
from hub.fleet.helmsets import apply_sets
from hub.fleet.model import (
    Bundle,
    ChartPin,
    Cluster,
    Fleet,
    Override,
    Pin,
    SignedPins,
    SourceRef,
)
from hub.fleet.templating import references, substitute

# Where an override's fields land in a BundleDeployment spec (agent.api field names).
VALUES_PATH = ("formatOptions", "values")
NAMESPACE_PATH = ("formatOptions", "targetNamespace")
PATH_PATH = ("formatOptions", "path")
ENCRYPTED_VALUES_PATH = ("formatOptions", "encryptedValues")


@dataclass(frozen=True, slots=True)
class Header:
    """The per-set fields that are not content: serial, validity period, fleet source."""

    serial: int
    issued_at: datetime
    expires_at: datetime
    source_repo: str
    source_commit: str
    source_signed_by: CommitSignature | None = None


def group_of(bundle: Bundle) -> str:
    group = bundle.spec.get("group")
    return group if isinstance(group, str) and group else bundle.name


def depends_of(bundle: Bundle) -> list[str]:
    deps = bundle.spec.get("dependsOn") or []
    return [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else []


def check_graph(fleet: Fleet) -> None:
    """Every dependsOn names a group that exists, and groups do not depend on themselves in a
    cycle. Raises FleetRepoError listing every problem."""
    groups: dict[str, list[Bundle]] = {}
    for b in fleet.bundles:
        groups.setdefault(group_of(b), []).append(b)
    problems: list[FieldProblem] = []
    edges: dict[str, set[str]] = {g: set() for g in groups}
    for b in fleet.bundles:
        g = group_of(b)
        for i, dep in enumerate(depends_of(b)):
            where = f"{b.file}: dependsOn[{i}]"
            if dep not in groups:
                problems.append(
                    FieldProblem(path=where, expected="the name of a group", found=f'"{dep}"')
                )
            elif dep == g:
                problems.append(
                    FieldProblem(
                        path=where, expected="another group than the bundle's own", found=f'"{dep}"'
                    )
                )
            else:
                edges[g].add(dep)
    cycle = find_cycle(edges)
    if cycle:
        first = groups[cycle[0]][0]
        problems.append(
            FieldProblem(
                path=f"{first.file}: dependsOn",
                expected="no dependency cycle between groups",
                found=" -> ".join(cycle),
            )
        )
    if problems:
        raise FleetRepoError(problems, origin=str(fleet.root))


def order_groups(members: Mapping[str, list[str]]) -> list[str]:
    """Topological order of groups (dependencies first), ties broken by name.

    ``members`` maps each group to the groups it depends on (all present; acyclic).
    """
    indegree = {g: 0 for g in members}
    dependents: dict[str, list[str]] = {g: [] for g in members}
    for g, deps in members.items():
        for d in set(deps):
            indegree[g] += 1
            dependents[d].append(g)
    ready = [g for g, n in indegree.items() if n == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        g = heapq.heappop(ready)
        out.append(g)
        for nxt in dependents[g]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(ready, nxt)
    return out


def merge_values(base: Any, override: Any) -> Any:
    """Deep merge: mappings merge key by key, ``None`` removes a key, the rest is replaced."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return copy.deepcopy(override)
    out = dict(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif k in out:
            out[k] = merge_values(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _set_path(spec: dict[str, Any], path: tuple[str, ...], value: Any, *, merge: bool) -> None:
    node = spec
    for key in path[:-1]:
        child = node.get(key)
        child = dict(child) if isinstance(child, dict) else {}
        node[key] = child
        node = child
    node[path[-1]] = merge_values(node.get(path[-1]) or {}, value) if merge else value


def source_dict(src: SourceRef, pin: Pin) -> dict[str, Any]:
    """The set's form of one resolved source (without the dependencies of a chart)."""
    return source_dicts(src, pin)[0]


def source_dicts(src: SourceRef, pin: Pin) -> list[dict[str, Any]]:
    """The set's sources for one resolved source: itself, then any chart dependencies the hub
    pinned for it (placed under its chart's ``charts/``)."""
    extra = dict(src.extra)
    if not isinstance(pin, ChartPin):
        field = {"image": "digest", "git": "commit", "http": "sha256"}[src.kind]
        return [{"kind": src.kind, "uri": src.uri, field: pin, **extra}]
    if src.kind == "git":  # a chart directory whose dependencies the hub pinned
        out: dict[str, Any] = {"kind": "git", "uri": src.uri, "commit": pin.pin}
    elif src.kind == "http":  # a chart archive whose dependencies the hub pinned
        out = {"kind": "http", "uri": src.uri, "sha256": pin.pin}
    elif src.kind == "helm":
        out = {
            "kind": "helm",
            "uri": src.uri,
            "chart": src.chart,
            "version": pin.version,
            "archiveUrl": pin.archive_url,
            "sha256": pin.pin,
        }
    elif pin.tag is not None:  # from a tag range: the tag is informational, the digest pins
        out = {"kind": "image", "uri": f"{src.uri}:{pin.tag}", "digest": pin.pin}
    else:  # an OCI chart by tag or digest whose dependencies the hub pinned
        out = {"kind": "image", "uri": src.uri, "digest": pin.pin}
    out.update(extra)
    sources = [out]
    base = str(extra.get("destination") or "").strip("/")
    for dep in pin.dependencies:
        destination = f"{base}/{dep.destination}" if base else dep.destination
        if dep.kind == "helm":
            placed: dict[str, Any] = {
                "kind": "helm",
                "uri": dep.uri,
                "chart": dep.chart,
                "version": dep.version,
                "archiveUrl": dep.archive_url,
                "sha256": dep.pin,
            }
        else:
            placed = {"kind": "image", "uri": f"{dep.uri}:{dep.tag}", "digest": dep.pin}
        placed["destination"] = destination
        if dep.uri == src.uri and "auth" in extra:  # same repository, same credentials
            placed["auth"] = extra["auth"]
        sources.append(placed)
    return sources


def _sources(refs: Iterable[SourceRef], pins: Mapping[SourceRef, Pin]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    proofs = pins.proofs if isinstance(pins, SignedPins) else {}
    for s in refs:
        dicts = source_dicts(s, pins[s])
        if s in proofs:  # its signature, verified by the hub (not its chart's dependencies)
            dicts[0]["signature"] = dict(proofs[s])
        out.extend(dicts)
    return out


def bundle_spec(
    bundle: Bundle,
    pins: Mapping[SourceRef, Pin],
    overrides: Iterable[Override],
    *,
    cluster: Cluster | None = None,
    problems: list[FieldProblem] | None = None,
) -> dict[str, Any]:
    """The BundleDeployment spec (as a dict) of ``bundle`` with ``overrides`` applied in order,
    and, given ``cluster``, its ``${cluster...}`` references substituted (problems appended to
    ``problems``)."""
    spec: dict[str, Any] = copy.deepcopy(dict(bundle.spec))
    spec["sources"] = _sources(bundle.sources, pins)
    encrypted = bundle.encrypted_values
    for o in overrides:
        if o.sources is not None:
            spec["sources"] = _sources(o.sources, pins)
        if o.encrypted_values is not None:
            encrypted = o.encrypted_values
        if o.values is not None:
            _set_path(spec, VALUES_PATH, o.values, merge=True)
        if o.paused is not None:
            spec["paused"] = o.paused
        if o.approval is not None:
            spec["approval"] = o.approval
        if o.namespace is not None:
            _set_path(spec, NAMESPACE_PATH, o.namespace, merge=False)
        if o.path is not None:
            _set_path(spec, PATH_PATH, o.path, merge=False)
        apply_sets(spec, o.sets)
        own = spec.get("patches")
        if o.patches is not None and (own is None or isinstance(own, list)):
            # (a bundle's own patches that are not a list are reported by the validation)
            spec["patches"] = [*(own or []), *copy.deepcopy(o.patches)]
    if encrypted is not None:
        # Whole, as sops wrote it (its MAC covers every value); never templated.
        _set_path(spec, ENCRYPTED_VALUES_PATH, copy.deepcopy(dict(encrypted)), merge=False)
    values = (spec.get("formatOptions") or {}).get("values")
    if cluster is not None and values and references(values):
        spec["formatOptions"]["values"] = substitute(
            values,
            cluster=cluster.name,
            labels=cluster.labels,
            where=f"{bundle.file}: formatOptions.values",
            problems=problems if problems is not None else [],
        )
    return spec


class ClusterPlan(NamedTuple):
    """What one cluster receives: its entries (shared between clusters) and the group order.
    A tuple: one is made per cluster of the fleet on every run."""

    cluster: Cluster
    entries: tuple[BundleDeploymentEntry, ...]
    groups: tuple[str, ...]


class Plans(dict[str, ClusterPlan]):
    """Cluster name -> its plan, and ``shapes``: the names of the clusters of each shape (one
    evaluation of the fleet's rules; its clusters' plans share their entries and groups
    objects), for the diff to compare a shape at once (:mod:`hub.publish.compare`)."""

    shapes: dict[tuple[int, int], list[str]]


def plan_clusters(
    fleet: Fleet,
    pins: Mapping[SourceRef, Pin],
    *,
    only: Iterable[str] | None = None,
) -> Plans:
    """Target every bundle, apply overrides, order groups: cluster name -> ClusterPlan.

    Each distinct (bundle, applied overrides) spec is built and validated by the agent's API
    once, and its entry object shared by every cluster that receives it. Clusters with the same
    labels (and the same memberships in name lists) share one computation, so a fleet of
    10,000 clusters with a few label combinations costs a few evaluations.

    Raises FleetRepoError listing every problem: a spec the API refuses (named by bundle file
    and field), a cluster receiving a bundle without the group it depends on.
    """
    check_graph(fleet)
    wanted = set(only) if only is not None else None
    clusters = [c for c in fleet.clusters if wanted is None or c.name in wanted]
    group_deps: dict[str, set[str]] = {}
    for b in fleet.bundles:
        group_deps.setdefault(group_of(b), set()).update(depends_of(b))
    # Name lists that can make two clusters with the same labels differ: each cluster named
    # in one gets the list of the lists naming it in its shape.
    name_lists = sorted(
        {
            t.names
            for b in fleet.bundles
            for t in (*b.targets, *(o.target for o in b.overrides))
            if t.names is not None
        },
        key=sorted,
    )
    named: dict[str, list[int]] = {}
    for index, names in enumerate(name_lists):
        for name in names:
            named.setdefault(name, []).append(index)
    memberships = {name: tuple(found) for name, found in named.items()}
    entries: dict[tuple[Any, ...], BundleDeploymentEntry | None] = {}
    # What each bundle's values refer to (${cluster.name}, ${cluster.labels.x}): a bundle that
    # names its cluster is built per cluster, one that reads labels per label set.
    refs = {b.name: _template_refs(b) for b in fleet.bundles}
    by_name = any("name" in r for r in refs.values())
    problems: list[FieldProblem] = []
    plans = Plans()
    shapes: dict[tuple[int, int], list[str]] = {}
    # Clusters loaded from the parsed-file cache share one labels mapping per label set: the
    # shape is first looked up by that mapping's id (the clusters keep it alive), then by
    # the labels themselves.
    by_labels: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    seen: dict[tuple[int, tuple[int, ...]], tuple[Any, ...]] = {}
    for cluster in clusters:
        name = cluster.name
        member = memberships.get(name, ())
        shape = None if by_name else seen.get((id(cluster.labels), member))
        if shape is None:
            shape_key = (
                tuple(sorted(cluster.labels.items())),
                member,
                name if by_name else None,
            )
            shape = by_labels.get(shape_key)
            if shape is None:
                chosen, groups, missing = _shape(
                    fleet, cluster, pins, entries, group_deps, problems, refs
                )
                shape = by_labels[shape_key] = (
                    chosen,
                    groups,
                    missing,
                    all(e is not None for e in chosen),
                    shapes.setdefault((id(chosen), id(groups)), []),
                )
            if not by_name:
                seen[(id(cluster.labels), member)] = shape
        chosen, groups, missing, complete, members = shape
        if missing:
            problems.append(
                FieldProblem(
                    path=f"{cluster.file}: {name}",
                    expected=missing,
                    found="groups " + ", ".join(groups),
                )
            )
        elif complete:
            plans[name] = ClusterPlan(cluster, chosen, groups)
            members.append(name)
    if problems:
        # The same spec problem in several override combinations is reported once.
        unique = list({str(p): p for p in problems}.values())
        raise FleetRepoError(unique, origin=str(fleet.root))
    plans.shapes = {key: names for key, names in shapes.items() if names}
    return plans


def _template_refs(bundle: Bundle) -> frozenset[str]:
    values = (bundle.spec.get("formatOptions") or {}).get("values")
    found = set(references(values))
    for o in bundle.overrides:
        found |= references(o.values)
    return frozenset(found)


def _shape(
    fleet: Fleet,
    cluster: Cluster,
    pins: Mapping[SourceRef, Pin],
    entries: dict[tuple[Any, ...], BundleDeploymentEntry | None],
    group_deps: Mapping[str, set[str]],
    problems: list[FieldProblem],
    refs: Mapping[str, frozenset[str]],
) -> tuple[tuple[BundleDeploymentEntry, ...], tuple[str, ...], str]:
    """(entries, group order, missing-dependency text) of one cluster."""
    chosen: list[BundleDeploymentEntry] = []
    present: dict[str, list[str]] = {}
    broken = False
    for b in fleet.bundles:
        if not any(t.matches(cluster) for t in b.targets):
            continue
        applied = b.applied_overrides(cluster)
        uses = refs.get(b.name, frozenset())
        key = (
            b.name,
            tuple(o.index for o in applied),
            cluster.name if "name" in uses else None,
            tuple(sorted(cluster.labels.items())) if "labels" in uses else None,
        )
        if key not in entries:
            entries[key] = _entry(b, pins, applied, problems, cluster if uses else None)
        entry = entries[key]
        if entry is None:
            broken = True
            continue
        chosen.append(entry)
        present.setdefault(group_of(b), []).append(b.name)
    deps: dict[str, list[str]] = {}
    missing: list[str] = []
    for g, names in sorted(present.items()):
        deps[g] = sorted(group_deps.get(g, set()))
        missing += [
            f"group {d!r} too ({', '.join(names)} depend on it)"
            for d in deps[g]
            if d not in present
        ]
    if broken:
        return (), (), ""
    if missing:
        return tuple(chosen), tuple(sorted(present)), "; ".join(missing)
    return tuple(chosen), tuple(order_groups(deps)), ""


def _entry(
    bundle: Bundle,
    pins: Mapping[SourceRef, Pin],
    applied: tuple[Override, ...],
    problems: list[FieldProblem],
    cluster: Cluster | None,
) -> BundleDeploymentEntry | None:
    unresolved: list[FieldProblem] = []
    spec = bundle_spec(bundle, pins, applied, cluster=cluster, problems=unresolved)
    if unresolved:
        problems.extend(unresolved)
        return None
    try:
        return BundleDeploymentEntry(name=bundle.name, spec=from_dict(BundleDeploymentSpec, spec))
    except ValidationError as exc:
        for p in exc.problems:
            path = p.path
            problems.append(
                FieldProblem(path=f"{bundle.file}: {path}", expected=p.expected, found=p.found)
            )
        return None


def build_set(plan: ClusterPlan, header: Header) -> BundleDeploymentSet:
    """The typed set of one cluster (cheap: entries are already validated).

    Raises ValidationError if the header is invalid (e.g. expiry before issue).
    """
    return BundleDeploymentSet(
        cluster=plan.cluster.name,
        serial=header.serial,
        issued_at=header.issued_at,
        expires_at=header.expires_at,
        source=SetSource(
            repo=header.source_repo,
            commit=header.source_commit,
            signed_by=header.source_signed_by,
        ),
        bundle_deployments=plan.entries,
        groups=plan.groups,
    )
