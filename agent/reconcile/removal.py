"""Bundles that left the set: their objects go by their ``deletionPolicy``, and so does all
of their bookkeeping (stored revisions, runs, outputs, group records, the BundleDeployment).

What a bundle owns is everything the agent ever wrote for it and did not hand over: its
stored revision's objects, what a failed first install left, and the target of a move a
crash interrupted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from agent.api import BundleDeploymentSet, BundleDeploymentSpec
from agent.apply import Entry, Inventory, Key, plan_prune, prune
from agent.apply.hooks import POST_DELETE, PRE_DELETE, Hook, HookFailedError, run_hooks, split
from agent.apply.intent import GroupRecord, GroupRecords
from agent.apply.store import RevisionStore
from agent.kube import KubeApiError
from agent.reconcile.context import Identities
from agent.report.outputs import OutputsStage
from agent.report.runs import RunLog
from agent.report.view import BundleViews

log = logging.getLogger(__name__)


def remove_absent(
    deployment_set: BundleDeploymentSet,
    *,
    store: RevisionStore,
    records: GroupRecords,
    runs: RunLog,
    views: BundleViews,
    outputs: OutputsStage | None,
    identities: Identities,
) -> list[str]:
    """Remove every bundle the agent knows that the set no longer lists; returns their names.

    Raises the KubeClient's errors (the next pass tries again: nothing is forgotten before its
    objects are gone).
    """
    wanted = {e.name for e in deployment_set.bundle_deployments}
    present = set(store.bundles()) | set(views.bundles.names())
    gone = sorted(present - wanted)
    groups = set(deployment_set.groups)
    recorded: dict[str, GroupRecord] = {}
    if gone or _stale(records, groups):
        names = records.groups()
        recorded = dict(zip(names, records.load_all(names), strict=True))
    # A failed first install has no stored revision: its record still knows what it wrote.
    for record in recorded.values():
        for name in _bundles_of(record):
            if name not in wanted and name not in gone:
                gone.append(name)
    claims = _claims(store, wanted)
    for name in sorted(gone):
        owned = _owned(name, store, recorded)
        kept = store.latest(name)
        spec = kept.spec if kept is not None else None
        policy = spec.deletion_policy if spec else "Delete"
        hooks = split(name, kept.delete_hooks, install=False) if kept else None
        if hooks is not None:
            _run_delete_hooks(hooks.of(PRE_DELETE), identities, spec)
        if policy == "Delete" and len(owned):
            plan = plan_prune(
                {name: owned},
                {},
                keep_crds={name: spec.keep_crds if spec else True},
                claimed_elsewhere=claims,
            )
            outcomes = prune(identities(spec), plan)
            log.info(
                "bundle %s removed from the set: %d objects deleted",
                name,
                sum(1 for o in outcomes if o.done == "deleted"),
            )
        if hooks is not None:
            _run_delete_hooks(hooks.of(POST_DELETE), identities, spec)
        store.delete(name)
        runs.delete(name)
        if outputs is not None:
            outputs.forget(name)
        views.bundles.delete(name)
        views.forget(name)
    for group, record in recorded.items():
        _tidy(records, group, record, wanted, keep=group in groups)
    return sorted(gone)


def _run_delete_hooks(
    hooks: Sequence[Hook], identities: Identities, spec: BundleDeploymentSpec | None
) -> None:
    """A removed bundle's pre-delete (or post-delete) hooks, waited for; a failed one is
    logged and the removal goes on (the bundle is going away either way, as in Helm)."""
    if not hooks:
        return
    timeout = float(spec.health_checks.timeout_seconds) if spec else 300.0
    try:
        run_hooks(
            hooks,
            client_for=lambda _bundle: identities(spec),
            timeout_for=lambda _bundle: timeout,
        )
    except (HookFailedError, KubeApiError) as exc:
        log.warning(
            "bundle %s: a delete hook failed (removing it anyway): %s", hooks[0].bundle, exc
        )


def _stale(records: GroupRecords, groups: set[str]) -> bool:
    """Whether a group record outlived its group (its bundles were removed earlier)."""
    return any(g not in groups for g in records.groups())


def _bundles_of(record: GroupRecord) -> set[str]:
    names = set(record.leftovers)
    if record.intent is not None:
        names |= set(record.intent.bundles)
    return names


def _owned(name: str, store: RevisionStore, recorded: Mapping[str, GroupRecord]) -> Inventory:
    entries: list[Entry] = []
    kept = store.latest(name)
    if kept is not None:
        entries.extend(kept.inventory)
    for record in recorded.values():
        if name in record.leftovers:
            entries.extend(record.leftovers[name])
        if record.intent is not None and name in record.intent.bundles:
            entries.extend(record.intent.bundles[name].target_inventory)
    return Inventory.of(entries)


def _claims(store: RevisionStore, wanted: set[str]) -> dict[Key, str]:
    """Objects the bundles that stay own: never deleted, handed over."""
    claims: dict[Key, str] = {}
    for name, kept in store.latest_of(sorted(wanted)).items():
        for key in kept.inventory.entries if kept else ():
            claims.setdefault(key, name)
    return claims


def _tidy(
    records: GroupRecords, group: str, record: GroupRecord, wanted: set[str], *, keep: bool
) -> None:
    """Drop what a record says of removed bundles; a record of a group gone goes whole."""
    if not keep:
        records.delete(group)
        return
    leftovers = {n: inv for n, inv in record.leftovers.items() if n in wanted}
    if leftovers != dict(record.leftovers):
        records.save(group, replace(record, leftovers=leftovers))
