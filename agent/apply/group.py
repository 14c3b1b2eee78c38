"""Apply one lockstep group: a server-side dry run of every object, then the stages.

:func:`apply_group` first dry-runs every object of the group (each bundle as its own identity:
impersonating its ServiceAccount when it names one), so nothing is written when any object is
refused. Objects that cannot be dry-run before the group's own CRDs and Namespaces exist (a
custom resource of a CRD of the group, an object in a Namespace of the group) are dry-run right
after stages 1 and 2, before anything of the later stages is written. Then the stages are applied, the
objects of a stage concurrently (a bounded pool), all with one field manager.

The action per object comes from comparing, as Flux does, the live object with the dry run's
answer (ignoring status, resourceVersion, generation and other managers' bookkeeping): the same
means ``unchanged`` and the object is not applied at all; no live object means ``created``.
When the bundle's identity may not read the object, it is applied and the resourceVersions
before and after decide. The live objects are read before the dry run by one LIST per kind and
namespace when the group has many of them there (a GET each otherwise, or when the object
changed since the LIST: the dry run's resourceVersion must be the live object's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from agent.api.status import RunCounts
from agent.apply.guard import Guard
from agent.apply.inventory import Entry, Inventory
from agent.apply.plan import (
    STAGE_CRDS,
    STAGE_NAMES,
    STAGE_NAMESPACES,
    ApplyError,
    BundleInput,
    Plan,
    PlannedObject,
    Skipped,
    identity,
    plan_group,
)
from agent.backoff import attempts, delay
from agent.errors import TemporaryError
from agent.kube import (
    CONTENT_FIELD_MANAGER,
    ApiNotServedError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    KubeApiError,
    KubeClient,
    NotFoundError,
    ObjectRef,
)

FIELD_MANAGER = CONTENT_FIELD_MANAGER
DEFAULT_WORKERS = 8
DEFAULT_ESTABLISH_TIMEOUT = 60.0
_COMPARE_ATTEMPTS = 5
_COMPARE_BACKOFF = 0.05  # seconds before the 2nd attempt, doubling: 0.75 s in all

Object = dict[str, Any]
Action = Literal["created", "configured", "unchanged"]
Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class ObjectResult:
    """What applying one object did; ``uid`` and ``resource_version`` are the live object's."""

    bundle: str
    ref: ObjectRef
    action: Action
    uid: str
    resource_version: str


@dataclass(frozen=True, kw_only=True)
class ApplyResult:
    """The outcome of :func:`apply_group`: per object, in plan order, and the skipped ones."""

    objects: tuple[ObjectResult, ...]
    skipped: tuple[Skipped, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        """Objects per action (created, configured, unchanged) and skipped."""
        counts = {"created": 0, "configured": 0, "unchanged": 0, "skipped": len(self.skipped)}
        for result in self.objects:
            counts[result.action] += 1
        return counts

    def for_bundle(self, bundle: str) -> list[ObjectResult]:
        """The results of one bundle's objects."""
        return [r for r in self.objects if r.bundle == bundle]

    def counts_of(self, bundle: str) -> RunCounts:
        """One bundle's objects by what the apply did to them."""
        mine = self.for_bundle(bundle)
        return RunCounts(
            created=sum(1 for r in mine if r.action == "created"),
            configured=sum(1 for r in mine if r.action == "configured"),
            unchanged=sum(1 for r in mine if r.action == "unchanged"),
        )

    def inventory_of(self, bundle: str) -> Inventory:
        """One bundle's objects as applied (with their UIDs)."""
        return Inventory.of(Entry.of(r.ref, uid=r.uid) for r in self.for_bundle(bundle))


class CrdNotEstablishedError(TemporaryError):
    """A CustomResourceDefinition of the group did not become Established in time."""

    reason = "CRDNotEstablished"


@dataclass(kw_only=True)
class _Work:
    planned: PlannedObject
    force: bool
    client: KubeClient
    existed: bool | None = None
    version_before: str = ""
    unchanged: Object | None = None
    listed: Object | None = None
    """The live object as a LIST before the dry run saw it (None: not listed or absent)."""
    answer: Object | None = None
    """The dry run's answer: the object as the apply would leave it."""
    live: Object | None = None
    """The live object the answer was compared with (None: absent, or not readable)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _as_apply_error(exc: KubeApiError, planned: PlannedObject, *, dry_run: bool) -> ApplyError:
    when = "dry run refused" if dry_run else "apply refused"
    managers = exc.managers if isinstance(exc, ConflictError) else []
    message = exc.server_message
    if managers:
        message = (
            f"{message} (fields owned by field manager(s) {', '.join(managers)}; set "
            f"takeOwnership to take them over)"
        )
    elif isinstance(exc, InvalidError) and "needs metadata.namespace" in message:
        message += (
            " (give the object a namespace, or the bundle formatOptions.targetNamespace or "
            "createNamespace)"
        )
    elif isinstance(exc, NotFoundError) and planned.ref.namespace and "namespaces" in message:
        message += (
            f" (namespace {planned.ref.namespace} does not exist: create it in the bundle or "
            "set createNamespace)"
        )
    return ApplyError(
        f"{when}: {message}",
        bundle=planned.bundle,
        target=planned.target,
        reason=exc.reason,
        managers=managers,
        dry_run=dry_run,
    )


def _comparable(obj: Mapping[str, Any]) -> Object:
    """What an apply of ours can change: the object without status and server bookkeeping,
    with only our own field manager's field set."""
    meta = dict(_meta(obj))
    ours = [
        m.get("fieldsV1")
        for m in meta.pop("managedFields", None) or []
        if m.get("manager") == FIELD_MANAGER and m.get("operation") == "Apply"
    ]
    for key in ("resourceVersion", "generation"):
        meta.pop(key, None)
    rest = {k: v for k, v in obj.items() if k not in ("status", "metadata")}
    return {**rest, "metadata": meta, "ours": ours}


def _dry_run(work: _Work) -> None:
    """Dry-run the apply of one object; remember whether it exists, its resourceVersion, and
    (reading the live object, only when it exists) whether the apply would change it.

    Raises ApplyError, ApiUnavailableError.
    """
    planned = work.planned
    # A controller writing to the object between the dry run and the read (a new Deployment's
    # status, several times in its first second) makes them incomparable: try again a few
    # times, backing off so the controller settles, then count it as changed.
    for _attempt in attempts(_COMPARE_ATTEMPTS, initial=_COMPARE_BACKOFF, jitter=0.0):
        try:
            answer = work.client.apply(
                planned.manifest, field_manager=FIELD_MANAGER, force=work.force, dry_run=True
            )
        except KubeApiError as exc:
            raise _as_apply_error(exc, planned, dry_run=True) from exc
        version = str(_meta(answer).get("resourceVersion") or "")
        work.answer = answer
        work.existed = bool(version)
        work.version_before = version
        if not version:
            return  # a creation: nothing to compare
        listed, work.listed = work.listed, None
        if listed is not None and str(_meta(listed).get("resourceVersion")) == version:
            live: Object | None = listed
        else:
            try:
                live = work.client.get(planned.ref)
            except (ForbiddenError, NotFoundError):
                return  # the bundle's ServiceAccount may write but not read: the apply decides
        if live is None or str(_meta(live).get("resourceVersion")) != version:
            continue
        work.live = live
        if _comparable(live) == _comparable(answer):
            work.unchanged = live
        return


def _apply(work: _Work) -> ObjectResult:
    planned = work.planned
    if work.unchanged is not None:
        meta = _meta(work.unchanged)
        return ObjectResult(
            bundle=planned.bundle,
            ref=planned.ref,
            action="unchanged",
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
        )
    try:
        answer = work.client.apply(planned.manifest, field_manager=FIELD_MANAGER, force=work.force)
    except KubeApiError as exc:
        raise _as_apply_error(exc, planned, dry_run=False) from exc
    meta = _meta(answer)
    version = str(meta.get("resourceVersion") or "")
    action: Action
    if not work.existed:
        action = "created"
    elif version == work.version_before:
        action = "unchanged"
    else:
        action = "configured"
    return ObjectResult(
        bundle=planned.bundle,
        ref=planned.ref,
        action=action,
        uid=str(meta.get("uid") or ""),
        resource_version=version,
    )


def _run_all(
    pool: ThreadPoolExecutor, task: Callable[[_Work], Any], works: Sequence[_Work]
) -> list[Any]:
    """Run ``task`` on every work item concurrently; results in order. Raised after every
    started task has finished, so nothing runs on behind us: the first error that is not a
    refusal (the API server away), else every object refused, as one ApplyError."""
    futures = [pool.submit(task, w) for w in works]
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    refusals = [e for e in errors if isinstance(e, ApplyError)]
    for error in errors:
        if not isinstance(error, ApplyError):
            raise error
    if refusals:
        raise ApplyError.combine(refusals)
    return [f.result() for f in futures]


def _list_live(pool: ThreadPoolExecutor, works: Sequence[_Work]) -> None:
    """Set ``listed`` on the works :meth:`KubeClient.read_many` reads by a LIST (per identity,
    the LISTs concurrently); the others are read by a GET in their dry run."""
    by_client: dict[int, list[_Work]] = {}
    for work in works:
        by_client.setdefault(id(work.client), []).append(work)
    for same in by_client.values():
        found = same[0].client.read_many([w.planned.ref for w in same], each=pool.map)
        for work in same:
            work.listed = found.get(work.planned.ref)


def _wait_established(crds: Sequence[_Work], timeout: float) -> None:
    """Wait until every CRD has condition Established=True (read as the identity that applied
    it: the agent's own role need not read every CRD).

    Raises CrdNotEstablishedError, ForbiddenError, ApiUnavailableError.
    """
    deadline = time.monotonic() + timeout
    pending = list(crds)
    polls = 0
    while pending:
        still: list[_Work] = []
        for work in pending:
            live = work.client.get(work.planned.ref)
            conditions = ((live or {}).get("status") or {}).get("conditions") or []
            if not any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            ):
                still.append(work)
        pending = still
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(w.planned.ref.name for w in pending)
            raise CrdNotEstablishedError(
                f"CustomResourceDefinition(s) {names} not Established after {timeout:.0f}s"
            )
        polls += 1
        time.sleep(delay(polls, initial=0.05, maximum=1.0))


def _works(
    kube: KubeClient, bundles: Sequence[BundleInput], plan: Plan, agent_namespace: str
) -> list[_Work]:
    """One work item per planned object: each bundle acts as its own identity (impersonating
    its ServiceAccount when it names one) and forces only what it may take over."""
    settings = {b.name: b.settings for b in bundles}

    def client_of(bundle: str) -> KubeClient:
        account = settings[bundle].service_account_name
        return kube.impersonating(account, agent_namespace) if account else kube

    def force(planned: PlannedObject) -> bool:
        mine = settings[planned.bundle]
        return mine.take_ownership or identity(planned.ref) in mine.reclaim

    return [_Work(planned=p, force=force(p), client=client_of(p.bundle)) for p in plan.objects]


def apply_group(
    kube: KubeClient,
    bundles: Sequence[BundleInput],
    *,
    agent_namespace: str,
    workers: int = DEFAULT_WORKERS,
    establish_timeout: float = DEFAULT_ESTABLISH_TIMEOUT,
    on_progress: Progress | None = None,
    plan: Plan | None = None,
    between_waves: Callable[[ApplyResult], None] | None = None,
    guard: Guard | None = None,
) -> ApplyResult:
    """Dry-run, then apply, every object of a group (see the module docstring).

    ``kube`` is the agent's client; a bundle with ``serviceAccountName`` is dry-run and applied
    through ``kube.impersonating(name, agent_namespace)``. ``on_progress`` is called with a
    short message before each step. ``plan`` may be given when already computed. Objects
    after the Namespaces are applied wave by wave (:attr:`PlannedObject.wave`); between two
    waves ``between_waves`` is called with what was applied so far (a health wait: it raises
    to stop the apply).

    Raises PlanError (an object's API is not served and it is not optional), ApplyError (the
    first object refused, by the dry run or by the apply: bundle, object and server message;
    a conflict names the other field managers), CrdNotEstablishedError, ApiUnavailableError.
    """
    say = on_progress or (lambda _message: None)
    plan = plan if plan is not None else plan_group(bundles, kube, guard=guard)
    works = _works(kube, bundles, plan, agent_namespace)
    later: list[_Work] = []

    def first_dry_run(work: _Work) -> bool:
        try:
            _dry_run(work)
        except ApplyError as exc:
            cause = exc.__cause__
            if work.planned.deferred and isinstance(cause, NotFoundError | ApiNotServedError):
                return False  # its CRD or Namespace comes with this group: try after stage 2
            raise
        return True

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="apply") as pool:
        _list_live(pool, works)
        say(f"dry run of {len(works)} objects")
        done = _run_all(pool, first_dry_run, works)
        later = [w for w, ok in zip(works, done, strict=True) if not ok]
        results: list[ObjectResult] = []
        waves = sorted({w.planned.wave for w in works if w.planned.stage > STAGE_NAMESPACES})
        for stage, name in enumerate(STAGE_NAMES[: STAGE_NAMESPACES + 1]):
            stage_works = [w for w in works if w.planned.stage == stage]
            if not stage_works:
                continue
            say(f"applying {len(stage_works)} {name} ({stage + 1}/{len(STAGE_NAMES)})")
            results.extend(_run_all(pool, _apply, stage_works))
            if stage == STAGE_CRDS:
                say(f"waiting for {len(stage_works)} CustomResourceDefinitions to be Established")
                _wait_established(stage_works, establish_timeout)
                for client in {id(w.client): w.client for w in works}.values():
                    client.forget_discovery()
        if later:
            say(f"dry run of {len(later)} objects that needed the group's CRDs/Namespaces")
            _run_all(pool, _dry_run, later)
        for index, wave in enumerate(waves):
            if index:
                # The previous waves are applied: they must be healthy before this one starts.
                say(f"waiting for wave {waves[index - 1]} to be healthy")
                if between_waves is not None:
                    between_waves(ApplyResult(objects=tuple(results), skipped=plan.skipped))
            for stage in range(STAGE_NAMESPACES + 1, len(STAGE_NAMES)):
                stage_works = [
                    w for w in works if w.planned.stage == stage and w.planned.wave == wave
                ]
                if not stage_works:
                    continue
                shown = f" of wave {wave}" if len(waves) > 1 else ""
                say(
                    f"applying {len(stage_works)} {STAGE_NAMES[stage]}{shown} "
                    f"({stage + 1}/{len(STAGE_NAMES)})"
                )
                results.extend(_run_all(pool, _apply, stage_works))
    return ApplyResult(objects=tuple(results), skipped=plan.skipped)


@dataclass(frozen=True, kw_only=True)
class DryRunResult:
    """One object's server-side dry run, nothing written: the live object and the dry run's
    answer (the object as the apply would leave it), or why there is none."""

    bundle: str
    ref: ObjectRef
    manifest: Object
    existed: bool
    """The object exists (it may exist although ``live`` is None: not readable by the
    bundle's identity)."""
    unchanged: bool = False
    """The apply would change nothing (compared as :func:`apply_group` compares)."""
    live: Object | None = None
    answer: Object | None = None
    refused: ApplyError | None = None
    """The dry run refused it: the move would fail on it."""
    deferred: bool = False
    """Not dry-run: its CRD or Namespace comes with the group (it would be created)."""


def dry_run_group(
    kube: KubeClient,
    bundles: Sequence[BundleInput],
    *,
    agent_namespace: str,
    workers: int = DEFAULT_WORKERS,
    guard: Guard | None = None,
) -> tuple[list[DryRunResult], tuple[Skipped, ...]]:
    """The server-side dry run :func:`apply_group` starts with, of every object of a group,
    with what it found per object (refusals included, not raised); nothing is written. For
    the preview of an approval request. Returns the results in plan order and the skipped
    optional objects. ``guard``: as for :func:`apply_group` (objects bundle content may never
    touch are refused by the plan).

    Raises PlanError, ApplyError (objects that cannot be planned), ApiUnavailableError.
    """
    plan = plan_group(bundles, kube, guard=guard)
    works = _works(kube, bundles, plan, agent_namespace)

    def one(work: _Work) -> DryRunResult:
        planned = work.planned
        where: dict[str, Any] = {
            "bundle": planned.bundle,
            "ref": planned.ref,
            "manifest": planned.manifest,
        }
        try:
            _dry_run(work)
        except ApplyError as exc:
            if planned.deferred and isinstance(exc.__cause__, NotFoundError | ApiNotServedError):
                return DryRunResult(**where, existed=False, deferred=True)
            return DryRunResult(**where, existed=False, refused=exc)
        return DryRunResult(
            **where,
            existed=bool(work.existed),
            unchanged=work.unchanged is not None,
            live=work.live,
            answer=work.answer,
        )

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="dry-run") as pool:
        _list_live(pool, works)
        results = list(pool.map(one, works))
    return results, plan.skipped
