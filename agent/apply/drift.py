"""Drift detection without correction: which objects of a revision differ from the cluster.

Used for paused bundles, whose drift is reported but never corrected. It is the first half of
:func:`agent.apply.apply_group` (the server-side dry run of every object, compared with the live
object), with no write: an object that does not exist, or that an apply of ours would change,
has drifted.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from agent.apply.group import DEFAULT_WORKERS, _dry_run, _list_live, _Work
from agent.apply.guard import Guard
from agent.apply.plan import BundleInput, PlannedObject, identity, plan_group
from agent.kube import KubeClient, ObjectRef


def drifted_objects(
    kube: KubeClient,
    bundles: Sequence[BundleInput],
    *,
    agent_namespace: str,
    workers: int = DEFAULT_WORKERS,
    guard: Guard | None = None,
) -> list[ObjectRef]:
    """The objects of ``bundles`` that are missing or differ from what an apply would make
    them, in plan order. Nothing is written.

    Raises PlanError, ApplyError (an object the dry run refuses), ApiUnavailableError.
    """
    plan = plan_group(bundles, kube, guard=guard)
    accounts = {b.name: b.settings.service_account_name for b in bundles}
    settings = {b.name: b.settings for b in bundles}

    def force(planned: PlannedObject) -> bool:
        mine = settings[planned.bundle]
        return mine.take_ownership or identity(planned.ref) in mine.reclaim

    def client_of(bundle: str) -> KubeClient:
        account = accounts[bundle]
        return kube.impersonating(account, agent_namespace) if account else kube

    works = [_Work(planned=p, force=force(p), client=client_of(p.bundle)) for p in plan.objects]
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="drift") as pool:
        _list_live(pool, works)
        for done in [pool.submit(_dry_run, w) for w in works]:
            done.result()
    return [w.planned.ref for w in works if not w.existed or w.unchanged is None]
