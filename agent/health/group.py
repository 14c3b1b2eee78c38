"""Health of a whole lockstep group: every bundle's objects and checks, each read as the
bundle's own identity, under one deadline."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agent.api.models import BundleDeploymentSpec, HealthCheck
from agent.health import HealthReport, ObjectHealth, Status, assess_live, wait_healthy

if TYPE_CHECKING:
    from agent.kube import KubeClient

DEFAULT_TIMEOUT = 300.0

Manifest = dict[str, Any]
ClientFor = Callable[[BundleDeploymentSpec | None], "KubeClient"]


def checks_of(spec: BundleDeploymentSpec) -> list[HealthCheck]:
    """The bundle's own checks, references completed with its target namespace."""
    namespace = spec.format_options.target_namespace if spec.format_options else None
    out = []
    for check in spec.health_checks.checks:
        target = check.object
        if target.namespace is None and namespace:
            target = replace(target, namespace=namespace)
        out.append(replace(check, object=target))
    return out


def group_health(
    client_for: ClientFor,
    objects: Mapping[str, Sequence[Manifest]],
    specs: Mapping[str, BundleDeploymentSpec | None],
    *,
    wait: bool,
    interval: float = 1.0,
) -> HealthReport:
    """Assess a group: every object of the bundles that use the built-in assessment and every
    bundle's own checks, each bundle read as its own identity (``client_for(spec)``).

    ``wait``: until all are Current, one is Failed, or the longest of the bundles' timeouts
    passed; else once. Raises ApiUnavailableError when the API server did not answer the
    last assessment (see :func:`agent.health.wait_healthy`).
    """
    # Objects are read as their bundle's identity, and judged by their bundle's APIService
    # rule: a group per (identity, rule), so one bundle's `apiServices: Endpoints` never
    # relaxes another's APIServices.
    by_identity: dict[tuple[str | None, bool], tuple[list[Manifest], list[HealthCheck], bool]] = {}
    timeout = 0.0
    for name, manifests in objects.items():
        spec = specs.get(name)
        account = spec.service_account_name if spec is not None else None
        wait_lb = spec is not None and spec.health_checks.wait_for_load_balancer
        endpoints = spec is not None and spec.health_checks.api_services == "Endpoints"
        assessed, checks, lb = by_identity.setdefault((account, endpoints), ([], [], False))
        if spec is None or spec.health_checks.builtin:
            assessed.extend(manifests)
        if spec is not None:
            checks.extend(checks_of(spec))
            timeout = max(timeout, float(spec.health_checks.timeout_seconds))
        by_identity[(account, endpoints)] = (assessed, checks, lb or wait_lb)
    deadline = time.monotonic() + (timeout or DEFAULT_TIMEOUT)
    results: list[ObjectHealth] = []
    timed_out = False
    for (account, endpoints), (assessed, checks, wait_lb) in by_identity.items():
        spec = next((s for s in specs.values() if s and s.service_account_name == account), None)
        client = client_for(spec) if account else client_for(None)
        if wait:
            # Identities one after another under one deadline: the objects become healthy
            # concurrently in the cluster, so this waits no longer than needed.
            report = wait_healthy(
                client,
                assessed,
                checks=checks,
                timeout=max(0.0, deadline - time.monotonic()),
                interval=interval,
                wait_for_load_balancer=wait_lb,
                api_service_endpoints=endpoints,
            )
            results.extend(report.results)
            timed_out = timed_out or report.timed_out
            if not report.healthy:
                break
        else:
            results.extend(
                assess_live(
                    client,
                    assessed,
                    checks=checks,
                    wait_for_load_balancer=wait_lb,
                    api_service_endpoints=endpoints,
                )
            )
    failed = tuple(r for r in results if r.status is Status.FAILED)
    return HealthReport(tuple(results), timed_out=timed_out, failed=failed)


__all__ = ["DEFAULT_TIMEOUT", "checks_of", "group_health"]
