"""The answers about the fleet, as JSON-ready documents: shared by the hub API and the CLI.

:class:`StatusQueries` answers over a :class:`~hub.status.FleetStatus`; sealed outputs are
opened with the hub's private key only when asked as admin, shown as ``<sensitive>``
otherwise. No web framework here, so ``fleetlet installations --repo`` runs without the hub
extra.

The fleet matrix (clusters × bundles, one state per cell) is answered a page at a time, with
the filters applied over the whole fleet first; each cluster's cells are computed once per
status document (and staleness), so a page of 10,000 clusters costs a pass over cached dicts.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nacl.public import PrivateKey

from agent.report.seal import (
    OpenedOutput,
    OutputPlace,
    SealError,
    open_sealed,
    read_private_key,
)
from hub.fleet.selectors import LabelSelector, Requirement, label_key_ok, label_value_ok
from hub.status.aggregate import FleetStatus
from hub.status.document import STATES

SENSITIVE = "<sensitive>"
DEFAULT_PAGE = 100
"""Items per page of every list of the API when the request gives no ``limit``."""
MAX_PAGE = 500
"""The largest ``limit`` the API accepts (a larger one is a 400)."""
MAX_SELECTOR_LENGTH = 1024
"""Characters of a label selector (``label=`` of the matrix); a longer one is a 400."""
MAX_REQUIREMENTS = 20
"""Requirements of a label selector; more is a 400 (each costs a pass over the label sets)."""
MAX_NAME_FILTER = 253
"""Characters of the matrix's ``name`` filter (a cluster name is at most 253)."""
_FILTERS_KEPT = 32
_FLIPS_EVERY = timedelta(seconds=1)
"""The matrix's rows follow clusters going stale (or fresh) by the clock at most this late."""

Labels = Mapping[str, Mapping[str, str]]

Opener = Callable[[str, OutputPlace], OpenedOutput]
"""Opens a sealed value for its place; raises ValueError when it does not open there."""


def load_private_key(path: Path) -> PrivateKey:
    """The hub's X25519 private key (base64 of 32 raw bytes, one line).

    Raises HubKeyError (a PermanentError) naming the file.
    """
    return read_private_key(Path(path))


def sealed_opener(private_key: PrivateKey) -> Opener:
    """Open sealed values with ``private_key``, for their place; the function raises
    ValueError on a value that does not open there (sealed for another cluster, bundle, output
    or run, to another key, damaged, or of the older unbound format)."""

    def open_value(sealed: str, place: OutputPlace) -> OpenedOutput:
        try:
            return open_sealed(private_key, sealed, place=place)
        except SealError as exc:
            raise ValueError(str(exc)) from exc

    return open_value


def present_outputs(
    outputs: Mapping[str, Any],
    *,
    admin: bool,
    opener: Opener | None,
    cluster: str,
    bundle: str,
    run: str,
) -> list[dict[str, Any]]:
    """Outputs of run ``run`` of ``cluster``/``bundle`` as ``{name, value, sensitive}`` rows:
    sealed values opened for admins only, and only for the place they were sealed for. An
    opened row says who sealed it: ``sealedBy: agent`` (the cluster's own sealing key) or
    ``anyone`` (a key anybody holding the hub's public key could have used: not proof that the
    agent produced it)."""
    rows = []
    for name, item in sorted(outputs.items()):
        item = item if isinstance(item, dict) else {}
        if "value" in item:
            rows.append({"name": name, "value": item["value"], "sensitive": False})
        elif "sealed" in item:
            row: dict[str, Any] = {"name": name, "value": SENSITIVE, "sensitive": True}
            if admin:
                if opener is None:
                    row["value"] = "<sealed: the hub has no private key>"
                else:
                    place = OutputPlace(cluster=cluster, bundle=bundle, output=name, run=run)
                    try:
                        opened = opener(str(item["sealed"]), place)
                    except ValueError:
                        row["value"] = (
                            "<sealed: does not open here (sealed for another place or key, "
                            "or damaged)>"
                        )
                    else:
                        row["value"] = opened.value
                        row["sealedBy"] = "agent" if opened.from_agent else "anyone"
            rows.append(row)
        else:
            # Omitted by the agent (it has no hub key): there is no value anywhere outside.
            rows.append({"name": name, "value": None, "sensitive": True, "omitted": True})
    return rows


class QueryError(Exception):
    """A query the view cannot answer: ``status`` is the HTTP status (400, 404; 503 with
    ``retry_after`` seconds, when known)."""

    def __init__(self, status: int, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


# One requirement of a label selector in its string form: ``key=value``, ``key==value``,
# ``key!=value``, ``key``, ``!key``, ``key in (a,b)``, ``key notin (a,b)``.
_REQUIREMENT = re.compile(
    r"^\s*(?:!\s*(?P<absent>[^\s=!(),]+)"
    r"|(?P<key>[^\s=!(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s=!(),]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
)


def parse_label_filter(text: str) -> LabelSelector:
    """A label selector in Kubernetes' string form, e.g. ``region=eu,tier!=edge,gpu``.

    Requirements are separated by commas (outside parentheses) and must all hold; at most
    :data:`MAX_SELECTOR_LENGTH` characters and :data:`MAX_REQUIREMENTS` requirements. Raises
    QueryError (400) naming the requirement that does not parse, or the limit passed.
    """
    if len(text) > MAX_SELECTOR_LENGTH:
        raise QueryError(
            400,
            f"label filter: {len(text)} characters, at most {MAX_SELECTOR_LENGTH} are accepted",
        )
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    parts = [p.strip() for p in parts if p.strip()]
    if len(parts) > MAX_REQUIREMENTS:
        raise QueryError(
            400,
            f"label filter: {len(parts)} requirements, at most {MAX_REQUIREMENTS} are accepted",
        )
    requirements = [_requirement(part) for part in parts]
    return LabelSelector(tuple(requirements))


def _requirement(text: str) -> Requirement:
    """One requirement of :func:`parse_label_filter`. Raises QueryError (400)."""
    match = _REQUIREMENT.match(text)
    key = (match["absent"] or match["key"]) if match else None
    if match is None or not label_key_ok(key):
        raise QueryError(
            400,
            f"label filter: {text!r} is not a requirement "
            "(key=value, key!=value, key, !key, key in (a,b), key notin (a,b))",
        )
    assert key is not None
    if match["absent"]:
        return Requirement(key, "DoesNotExist", frozenset())
    if match["op"]:
        operator, values = ("NotIn" if match["op"] == "!=" else "In"), [match["value"]]
    elif match["set"]:
        operator = "In" if match["set"] == "in" else "NotIn"
        values = [v.strip() for v in match["values"].split(",")]
    else:
        return Requirement(key, "Exists", frozenset())
    for value in values:
        if not label_value_ok(value):
            raise QueryError(400, f"label filter: {text!r}: {value!r} is not a label value")
    return Requirement(key, operator, frozenset(values))


@dataclass(frozen=True, slots=True)
class _Row:
    """A cluster in the matrix, as of its status tip and staleness (its key in the cache)."""

    tip: str
    summary: dict[str, Any]
    heartbeat: datetime | None
    stale: bool
    cells: dict[str, str]  # bundle -> state
    counts: Counter[str]  # state -> cells
    tally: tuple[int, ...]  # counts in the order of STATES, to add up rows fast


@dataclass(frozen=True, slots=True)
class _Fleet:
    """Every cluster's row, sorted by name, with what the unfiltered matrix shows."""

    rows: dict[str, _Row]
    ordered: list[_Row]
    bundles: list[str]
    counts: Counter[str]
    stale: int
    errors: int
    by_state: dict[str, list[_Row]]  # the rows with a cell in each state, in order

    @classmethod
    def of(cls, rows: dict[str, _Row]) -> _Fleet:
        ordered = [rows[name] for name in sorted(rows)]
        counts: Counter[str] = Counter()
        by_state: dict[str, list[_Row]] = {s: [] for s in STATES}
        for row in ordered:
            counts.update(row.counts)
            for state in row.counts:
                by_state[state].append(row)
        return cls(
            rows=rows,
            ordered=ordered,
            bundles=sorted({b for row in ordered for b in row.cells}),
            counts=counts,
            stale=sum(1 for row in ordered if row.stale),
            errors=sum(1 for row in ordered if row.summary["error"]),
            by_state=by_state,
        )


class StatusQueries:
    """The answers of the API, as JSON-ready dicts; shared by the API and the CLI's ``--repo``.

    Each method raises QueryError (404 for an unknown cluster, bundle or run; 400 for a bad
    filter). ``admin`` decides whether sealed outputs are opened. ``labels`` are the clusters'
    labels by cluster name (from the fleet repo: status documents carry none); a cluster not
    in it has no labels.
    """

    def __init__(
        self, status: FleetStatus, *, opener: Opener | None = None, labels: Labels | None = None
    ) -> None:
        self.status = status
        self.opener = opener
        # Clusters with the same labels share one dict: a label filter is evaluated once per
        # label set (a few hundred), not once per cluster (100,000).
        shared: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        self.labels: dict[str, dict[str, str]] = {
            name: shared.setdefault(tuple(sorted(items.items())), dict(items))
            for name, items in (labels or {}).items()
        }
        self._label_values = _label_values(self.labels)
        self._rows = _Fleet.of({})
        self._fleet_lock = threading.Lock()
        # The rows and counts of recent filters, for the rows they were computed over: the
        # dashboard asks the same filter page after page.
        self._filtered: tuple[_Fleet, OrderedDict[Any, tuple[list[_Row], Counter[str]]]] = (
            self._rows,
            OrderedDict(),
        )
        self._version = -1
        self._next_flip = datetime.min.replace(tzinfo=UTC)

    def _labelled(self, summary: dict[str, Any]) -> dict[str, Any]:
        return {**summary, "labels": self.labels.get(summary["name"], {})}

    def clusters(self, *, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        """Every cluster, or a page of them (``total`` then says how many there are)."""
        if limit is None and not offset:
            return {"items": [self._labelled(c) for c in self.status.clusters()]}
        _check_page(offset, limit)
        names = self.status.names()
        items = [self.status.cluster(n) for n in names[offset : offset + (limit or MAX_PAGE)]]
        return {
            "items": [self._labelled(c) for c in items if c is not None],
            "total": len(names),
            "offset": offset,
            "limit": limit,
        }

    def cluster(self, name: str) -> dict[str, Any]:
        found = self.status.cluster(name)
        if found is None:
            raise QueryError(404, f"unknown cluster {name!r}")
        return self._labelled(found)

    def installations(
        self,
        *,
        cluster: str | None = None,
        bundle: str | None = None,
        state: str | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Installations, filtered; all of them, or a page (``total`` then counts them all:
        at 100,000 clusters ask for pages, each costs the documents of its clusters only)."""
        if state is not None and state not in STATES:
            raise QueryError(400, f"state must be one of {', '.join(STATES)}, got {state!r}")
        if limit is None and not offset:
            items = self.status.installations(cluster=cluster, bundle=bundle, state=state)
            return {"items": items}
        _check_page(offset, limit)
        page = limit or MAX_PAGE
        items = self.status.installations(
            cluster=cluster, bundle=bundle, state=state, offset=offset, limit=page
        )
        if cluster is None and bundle is None:
            # The matrix's counts of the whole fleet are these totals (cached per view).
            counts = self._fleet().counts
            total = counts[state] if state is not None else sum(counts.values())
        else:
            total = self.status.count_installations(cluster=cluster, bundle=bundle, state=state)
        return {"items": items, "total": total, "offset": offset, "limit": page}

    def _missing(self, cluster: str, bundle: str) -> QueryError:
        if self.status.cluster(cluster) is None:
            return QueryError(404, f"unknown cluster {cluster!r}")
        return QueryError(404, f"cluster {cluster!r} has no installation of bundle {bundle!r}")

    def installation(self, cluster: str, bundle: str, *, admin: bool) -> dict[str, Any]:
        detail = self.status.installation(cluster, bundle)
        if detail is None:
            raise self._missing(cluster, bundle)
        detail["runs"] = [
            self._run_view(r, admin=admin, cluster=cluster, bundle=bundle) for r in detail["runs"]
        ]
        return detail

    def runs(self, cluster: str, bundle: str, *, admin: bool) -> dict[str, Any]:
        found = self.status.runs(cluster, bundle)
        if found is None:
            raise self._missing(cluster, bundle)
        items = [self._run_view(r, admin=admin, cluster=cluster, bundle=bundle) for r in found]
        return {"installation": f"{cluster}/{bundle}", "items": items}

    def outputs(self, cluster: str, bundle: str, run_id: str, *, admin: bool) -> dict[str, Any]:
        if self.status.runs(cluster, bundle) is None:
            raise self._missing(cluster, bundle)
        run = self.status.run(cluster, bundle, run_id)
        if run is None:
            what = "no succeeded run" if run_id == "latest" else f"no run {run_id!r}"
            raise QueryError(404, f"installation {cluster}/{bundle} has {what}")
        rows = present_outputs(
            run.get("outputs") or {},
            admin=admin,
            opener=self.opener,
            cluster=cluster,
            bundle=bundle,
            run=str(run["id"]),
        )
        return {
            "installation": f"{cluster}/{bundle}",
            "run": run["id"],
            "result": run.get("result"),
            "items": rows,
        }

    # --- the fleet matrix ----------------------------------------------------------------

    def warm(self) -> None:
        """Compute the cells of every cluster whose document moved (after a refresh), so the
        next matrix request does not pay for it."""
        self._fleet()

    def _fleet(self) -> _Fleet:
        """Every cluster's row, recomputed only where the status tip moved or staleness
        flipped since the last call. Between two refreshes that moved something, and until
        the next cluster goes stale, the rows are reused as they are: a request at 100,000
        clusters then costs its page, not a pass over the fleet."""
        now = datetime.now(UTC)
        version = self.status.version
        if version == self._version and now < self._next_flip:
            return self._rows
        # Tips first: a document read after them is at least as new, and a tip that moved
        # meanwhile only makes the next call compute that cluster again.
        tips = self.status.tips()
        stale_after = self.status.stale_after
        with self._fleet_lock:
            known = self._rows.rows
            rows: dict[str, _Row] = {}
            changed = len(tips) != len(known)
            for name, tip in tips.items():
                row = known.get(name)
                if row is not None and row.tip == tip:
                    beat = row.heartbeat
                    if (beat is None or now - beat > stale_after) == row.stale:
                        rows[name] = row
                        continue
                fresh = self._row(name, tip)
                changed = True
                if fresh is not None:  # None: gone since the listing
                    rows[name] = fresh
            if changed:
                self._rows = _Fleet.of(rows)
            # The next moment a row's staleness flips: when the freshest-ending row goes stale;
            # not sooner than a second from now: when thousands of clusters go stale one after
            # the other (a hub cut off from its agents), each request would pass over the
            # fleet again (at 10,000 clusters the matrix fell to 16 answers per second).
            self._next_flip = max(
                now + _FLIPS_EVERY,
                min(
                    (
                        r.heartbeat + stale_after
                        for r in self._rows.ordered
                        if not r.stale and r.heartbeat
                    ),
                    default=datetime.max.replace(tzinfo=UTC),
                ),
            )
            self._version = version
            return self._rows

    def _row(self, name: str, tip: str) -> _Row | None:
        summary = self.status.cluster(name)
        if summary is None:
            return None
        cells = self.status.cells(name)
        if cells is None:
            return None
        beat = summary["heartbeat"]
        return _Row(
            tip=tip,
            summary=summary,
            heartbeat=datetime.fromisoformat(beat.replace("Z", "+00:00")) if beat else None,
            stale=bool(summary["stale"]),
            cells=cells,
            counts=(counts := Counter(cells.values())),
            tally=tuple(counts[s] for s in STATES),
        )

    def matrix(
        self,
        *,
        label: str | None = None,
        bundle: str | None = None,
        state: str | None = None,
        name: str | None = None,
        offset: int = 0,
        limit: int = DEFAULT_PAGE,
    ) -> dict[str, Any]:
        """One page of the fleet matrix: clusters (rows, by name) × bundles (columns).

        Filters, all optional and combined: ``label`` a label selector (``region=eu,gpu``);
        ``bundle`` one column, rows limited to clusters that have it; ``state`` rows with a
        cell in that state (a stale cluster without installations counts as Stale); ``name``
        a substring of the cluster name. ``states`` counts the shown cells of every matching
        row; ``fleet`` describes the whole fleet, unfiltered. Raises QueryError (400) for an
        unknown state, a bad selector or a page out of bounds.
        """
        if state is not None and state not in STATES:
            raise QueryError(400, f"state must be one of {', '.join(STATES)}, got {state!r}")
        if offset < 0 or not 1 <= limit <= MAX_PAGE:
            raise QueryError(400, f"offset must be >= 0 and limit between 1 and {MAX_PAGE}")
        if name is not None and len(name) > MAX_NAME_FILTER:
            raise QueryError(400, f"name filter: at most {MAX_NAME_FILTER} characters")
        selector = parse_label_filter(label) if label else None
        needle = name.lower() if name else None
        fleet = self._fleet()
        columns = [bundle] if bundle is not None else fleet.bundles
        if selector is None and needle is None and bundle is None and state is None:
            matching, counts = fleet.ordered, fleet.counts
        else:
            matching, counts = self._filter(fleet, selector, needle, bundle, state)
        items = []
        for row in matching[offset : offset + limit]:
            # A fresh summary for the rows shown: the heartbeat's age is now, not cached.
            summary = self.status.cluster(row.summary["name"]) or row.summary
            cells = {b: row.cells[b] for b in columns if b in row.cells}
            items.append({**self._labelled(summary), "cells": cells})
        return {
            "bundles": columns,
            "allBundles": fleet.bundles,
            "labels": self._label_values,
            "fleet": {
                "clusters": len(fleet.ordered),
                "stale": fleet.stale,
                "errors": fleet.errors,
            },
            "total": len(matching),
            "offset": offset,
            "limit": limit,
            "states": {s: counts[s] for s in STATES},
            "items": items,
        }

    def _filter(
        self,
        fleet: _Fleet,
        selector: LabelSelector | None,
        needle: str | None,
        bundle: str | None,
        state: str | None,
    ) -> tuple[list[_Row], Counter[str]]:
        """The rows of ``fleet`` the filters keep, and their shown cells' counts; the last
        :data:`_FILTERS_KEPT` filters' answers are kept until the rows change."""
        key = (selector, needle, bundle, state)
        with self._fleet_lock:
            rows, kept = self._filtered
            if rows is not fleet:
                kept = OrderedDict()
                self._filtered = (fleet, kept)
            found = kept.get(key)
            if found is not None:
                kept.move_to_end(key)
                return found
        found = self._filter_rows(fleet, selector, needle, bundle, state)
        with self._fleet_lock:
            if self._filtered[0] is fleet:
                kept[key] = found
                while len(kept) > _FILTERS_KEPT:
                    kept.popitem(last=False)
        return found

    def _filter_rows(
        self,
        fleet: _Fleet,
        selector: LabelSelector | None,
        needle: str | None,
        bundle: str | None,
        state: str | None,
    ) -> tuple[list[_Row], Counter[str]]:
        matching: list[_Row] = []
        counts: Counter[str] = Counter()
        matched: dict[int, bool] = {}  # label sets are shared: one evaluation each
        candidates = fleet.ordered
        if state is not None and state != "Stale" and bundle is None:
            candidates = fleet.by_state.get(state, [])
        no_labels: dict[str, str] = {}
        for row in candidates:
            cluster = row.summary["name"]
            if needle is not None and needle not in cluster.lower():
                continue
            if selector is not None:
                labels = self.labels.get(cluster, no_labels)
                hit = matched.get(id(labels))
                if hit is None:
                    hit = matched[id(labels)] = selector.matches(labels)
                if not hit:
                    continue
            if bundle is not None:
                if bundle not in row.cells:
                    continue
                shown = Counter([row.cells[bundle]])
                if state is not None and not shown[state]:
                    continue
                matching.append(row)
                counts.update(shown)
                continue
            quiet = state == "Stale" and row.stale and not row.cells
            if state is not None and not row.counts[state] and not quiet:
                continue
            matching.append(row)
        if bundle is None:
            # Column sums in C: one Counter update per row would cost more than the filter.
            sums = [sum(column) for column in zip(*(r.tally for r in matching), strict=False)]
            counts = Counter(dict(zip(STATES, sums, strict=False)))
        return matching, counts

    def _run_view(
        self, run: Mapping[str, Any], *, admin: bool, cluster: str, bundle: str
    ) -> dict[str, Any]:
        shown = dict(run)
        shown["outputs"] = present_outputs(
            run.get("outputs") or {},
            admin=admin,
            opener=self.opener,
            cluster=cluster,
            bundle=bundle,
            run=str(run.get("id")),
        )
        return shown


def _check_page(offset: int, limit: int | None) -> None:
    """Raises QueryError (400) for a page out of bounds."""
    if offset < 0 or (limit is not None and not 1 <= limit <= MAX_PAGE):
        raise QueryError(400, f"offset must be >= 0 and limit between 1 and {MAX_PAGE}")


def _label_values(labels: Labels) -> dict[str, list[str]]:
    """Every label key with its values, sorted: the suggestions of the dashboard's filter."""
    found: dict[str, set[str]] = {}
    for items in labels.values():
        for key, value in items.items():
            found.setdefault(key, set()).add(value)
    return {key: sorted(found[key]) for key in sorted(found)}
