"""Health of applied objects: kstatus-style assessment, the bundle's own checks, and waiting.

- :func:`assess` (:mod:`agent.health.kstatus`): the status of one object as it is.
- :func:`evaluate` (:mod:`agent.health.checks`): one ``healthChecks.checks`` entry.
- :func:`assess_live`: both, for objects read from the cluster through a KubeClient (many
  objects of one kind in one namespace by one LIST, the others by a GET each).
- :func:`wait_healthy`: poll until every object is Current, one Failed, or the timeout passed
  (the per-group health timeout of the lockstep engine).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.health.checks import evaluate
from agent.health.kstatus import NOT_FOUND, Assessment, Status, assess

if TYPE_CHECKING:
    from agent.api.models import HealthCheck  # the API's validation: not for `health --offline`
    from agent.kube import KubeClient, ObjectRef, RefLike

__all__ = [
    "Assessment",
    "HealthReport",
    "ObjectHealth",
    "Status",
    "assess",
    "assess_live",
    "evaluate",
    "wait_healthy",
]


@dataclass(frozen=True, slots=True)
class ObjectHealth:
    """The assessment of one object; ``check`` describes a bundle check (None: built-in)."""

    ref: ObjectRef
    assessment: Assessment
    check: str | None = None

    @property
    def status(self) -> Status:
        return self.assessment.status

    @property
    def name(self) -> str:
        """``Kind/namespace/name`` (``Kind/name`` when cluster-scoped)."""
        parts = [self.ref.kind, self.ref.namespace or "", self.ref.name]
        return "/".join(p for p in parts if p)

    def describe(self) -> str:
        """One line: which object, its status and why."""
        what = f"{self.name} [{self.check}]" if self.check else self.name
        return f"{what}: {self.assessment.status} ({self.assessment.message})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": self.ref.api_version,
            "kind": self.ref.kind,
            "namespace": self.ref.namespace or "",
            "name": self.ref.name,
            **self.assessment.to_dict(),
        }
        if self.check:
            out["check"] = self.check
        return out


@dataclass(frozen=True, slots=True)
class HealthReport:
    """The outcome of :func:`wait_healthy`: the last assessments and how waiting ended."""

    results: tuple[ObjectHealth, ...]
    timed_out: bool = False
    elapsed: float = 0.0
    failed: tuple[ObjectHealth, ...] = field(default=())

    @property
    def healthy(self) -> bool:
        return all(r.status is Status.CURRENT for r in self.results)

    @property
    def unhealthy(self) -> tuple[ObjectHealth, ...]:
        return tuple(r for r in self.results if r.status is not Status.CURRENT)

    def summary(self) -> str:
        """One line for a condition message: the first unhealthy object(s) and why."""
        if self.healthy:
            return f"{len(self.results)} objects healthy"
        bad = self.failed or self.unhealthy
        head = "; ".join(r.describe() for r in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        ending = "timed out" if self.timed_out else "failed"
        return f"health check {ending}: {head}{more}"


def _check_label(check: HealthCheck) -> str:
    if check.condition is not None:
        return f"condition {check.condition.type}={check.condition.status}"
    if check.expression is not None:
        return f"{check.expression.field_path}=={check.expression.equals!r}"
    return "check"


def assess_live(
    kube: KubeClient,
    objects: Iterable[Mapping[str, Any] | RefLike],
    *,
    checks: Sequence[HealthCheck] = (),
    default_namespace: str | None = None,
    builtin: bool = True,
    wait_for_load_balancer: bool = False,
    api_service_endpoints: bool = False,
) -> list[ObjectHealth]:
    """Read each object (and each check's object) once from the cluster and assess it.

    Many objects of one kind in one namespace are read by one LIST (falling
    back to a GET each when this user may not list them). A kind the server does not serve
    counts as NotFound; an object this user may not read, or a reference that cannot be
    completed, is Unknown (with why). ``default_namespace`` completes check references
    without a namespace. Raises ApiUnavailableError (and other KubeErrors of reads).
    """
    from agent.kube import ApiNotServedError, ForbiddenError, InvalidError, ObjectRef

    cache: dict[ObjectRef, Mapping[str, Any] | Assessment | None] = {}
    refs = [ObjectRef.of(obj) for obj in objects] if builtin else []
    cache.update(kube.read_many(refs))

    def live(ref: ObjectRef) -> Mapping[str, Any] | Assessment | None:
        if ref not in cache:
            try:
                cache[ref] = kube.get(ref)
            except ApiNotServedError as exc:
                cache[ref] = Assessment(Status.NOT_FOUND, "ApiNotServed", exc.server_message)
            except ForbiddenError as exc:
                cache[ref] = Assessment(Status.UNKNOWN, "Forbidden", exc.server_message)
            except InvalidError as exc:
                # E.g. a check naming a namespaced object, with no namespace to complete it.
                cache[ref] = Assessment(Status.UNKNOWN, "InvalidReference", exc.server_message)
        return cache[ref]

    results: list[ObjectHealth] = []
    if builtin:
        for ref in refs:
            found = live(ref)
            assessment = (
                found
                if isinstance(found, Assessment)
                else assess(
                    found,
                    wait_for_load_balancer=wait_for_load_balancer,
                    api_service_endpoints=api_service_endpoints,
                )
            )
            results.append(ObjectHealth(ref, assessment))
    for check in checks:
        target = check.object
        ref = ObjectRef(
            target.api_version,
            target.kind,
            target.name,
            target.namespace or default_namespace,
        )
        found = live(ref)
        if isinstance(found, Assessment):
            assessment = found
        else:
            assessment = evaluate(check, found) if found is not None else NOT_FOUND
        results.append(ObjectHealth(ref, assessment, check=_check_label(check)))
    return results


_FIRST_PAUSE = 0.1
"""Seconds before the second assessment of :func:`wait_healthy` (then doubling)."""


def wait_healthy(
    kube: KubeClient,
    objects: Sequence[Mapping[str, Any] | RefLike],
    *,
    timeout: float,
    checks: Sequence[HealthCheck] = (),
    default_namespace: str | None = None,
    builtin: bool = True,
    interval: float = 1.0,
    fail_fast: bool = True,
    on_progress: Callable[[Sequence[ObjectHealth]], None] | None = None,
    wait_for_load_balancer: bool = False,
    api_service_endpoints: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HealthReport:
    """Assess until every object is Current, or (``fail_fast``) one is Failed, or ``timeout``
    seconds passed. ``on_progress`` receives each round's assessments;
    ``wait_for_load_balancer`` and ``api_service_endpoints`` as in :func:`assess`.

    The pause between rounds starts at 0.1 s and doubles up to ``interval``: most objects are
    Current a fraction of a second after they are applied (``kubectl rollout status`` watches
    and sees it at once), and a first pause of a whole interval cost an update of 2,000 objects
    a second of waiting; a rollout that takes longer is still read at most once per
    ``interval``.

    A round that fails while the API server answers (a request lost, an aggregated API
    away) is retried until the deadline. Raises ApiUnavailableError at once when the API server
    itself does not answer (``kube.reachable()``): waiting out the deadline would say nothing
    of the objects' health, and a move must not be rolled back for it (the agent backs off and
    resumes the move); also when the last round before the deadline could not be assessed.
    """
    from agent.kube import ApiUnavailableError

    started = clock()
    deadline = started + timeout
    # Positions in the report: the objects (when assessed), then the checks. An object or a
    # check found Current is not read again: each round reads only what is still pending
    # (as `kubectl rollout status` follows each rollout until it is done), so a large group
    # of ConfigMaps and a few Deployments costs one LIST of each kind, then the Deployments'.
    offset = len(objects) if builtin else 0
    pending_objects = list(range(offset))
    pending_checks = list(range(len(checks)))
    latest: dict[int, ObjectHealth] = {}
    last: list[ObjectHealth] | None = None
    error: ApiUnavailableError | None = None
    pause = min(interval, _FIRST_PAUSE)
    while True:
        try:
            fresh = assess_live(
                kube,
                [objects[i] for i in pending_objects],
                checks=[checks[j] for j in pending_checks],
                default_namespace=default_namespace,
                builtin=builtin,
                wait_for_load_balancer=wait_for_load_balancer,
                api_service_endpoints=api_service_endpoints,
            )
        except ApiUnavailableError as exc:
            if not kube.reachable():
                raise
            error = exc
        else:
            error = None
            positions = [*pending_objects, *(offset + j for j in pending_checks)]
            latest.update(zip(positions, fresh, strict=True))
            last = [latest[i] for i in sorted(latest)]
            if on_progress is not None:
                on_progress(last)
            failed = tuple(r for r in last if r.status is Status.FAILED)
            if all(r.status is Status.CURRENT for r in last) or (fail_fast and failed):
                return HealthReport(tuple(last), elapsed=clock() - started, failed=failed)
            pending_objects = [i for i in pending_objects if latest[i].status is not Status.CURRENT]
            pending_checks = [
                j for j in pending_checks if latest[offset + j].status is not Status.CURRENT
            ]
        now = clock()
        if now >= deadline:
            if error is not None or last is None:
                assert error is not None
                raise error
            failed = tuple(r for r in last if r.status is Status.FAILED)
            return HealthReport(tuple(last), timed_out=True, elapsed=now - started, failed=failed)
        sleep(min(pause, max(0.0, deadline - now)))
        pause = min(interval, pause * 2)
