"""The worker process: one job of the agent, then exit (``python -m agent.runner.worker REQUEST``).

A ``tick`` starts in two steps, for memory: first, with nothing but the branch watcher and
sigstore loaded, it polls the branch and, when the tip is a commit the cluster neither runs
nor refused, checks the publication's signature; then it replaces itself (``exec``, same
process, fresh memory) with the step that does the job, given that signature as a
:class:`~agent.verify.VouchedSignature`: sigstore (about 45 MB) is then not in memory while
the content is fetched and rendered (helm runs beside it) and the group applied. That step
verifies everything else of the publication as always, and its signature too, with sigstore,
if its bytes are not exactly the ones vouched for. A first step that cannot check anything
(git server away) vouches for nothing; a trust configuration that cannot be loaded ends the
job with a configuration error.

Then it builds the whole agent from the request's settings (as ``fleetlet agent sync --once``
does; its own failpoint comes from ``FLEETLET_FAILPOINT``), says on every bundle how the
previous worker failed if it did, runs the job (:meth:`agent.loop.Agent.tick` or
:meth:`~agent.loop.Agent.correct_drift`), and writes its :class:`~agent.runner.protocol.JobResult`:
the error if any, the commit the cluster runs and any refused one, whether work is pending and
when a failed target is retried, what a group awaiting a decision waits on, the status
document, what to watch for drift, and the metric calls it made. The supervisor pushes the status and records the metrics; the worker pushes
nothing itself. While it works, it writes its status document to ``request.progress`` every
``request.progress_interval`` seconds, so the supervisor's heartbeats show the move's progress.

A worker dies with its supervisor (``PR_SET_PDEATHSIG``): an orphan must never go on moving a
group while a restarted supervisor starts another worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agent.runner.protocol import (
    Awaited,
    ErrorKind,
    JobError,
    JobRequest,
    JobResult,
    Watch,
    write_atomically,
)

log = logging.getLogger("agent.runner.worker")

_PR_SET_PDEATHSIG = 1
EXIT_BAD_REQUEST = 2
EXIT_ORPHAN = 3


def die_with_parent(parent: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; False when the parent is
    already gone (or is not ``parent``): then this worker must not start."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # ``--standby REQUEST``: started before there is a job (``agent run --warm-worker``).
    standby = bool(args) and args[0] == "--standby"
    if standby:
        args = args[1:]
        if not die_with_parent(os.getppid()) or not _stand_by():
            return EXIT_ORPHAN
    # ``REQUEST --then VOUCHED``: a tick's second step (VOUCHED is ``-`` when it has none).
    second = len(args) == 3 and args[1] == "--then"
    vouched_text = args[2] if second and args[2] != "-" else None
    if second:
        args = args[:1]
    if len(args) != 1:
        print("usage: python -m agent.runner.worker REQUEST", file=sys.stderr)
        return EXIT_BAD_REQUEST
    try:
        request = JobRequest.from_json(Path(args[0]).read_bytes())
    except (OSError, ValueError) as exc:
        print(f"fleetlet worker: {args[0]}: {exc}", file=sys.stderr)
        return EXIT_BAD_REQUEST
    if not die_with_parent(request.parent_pid):
        return EXIT_ORPHAN
    from agent.report import trace

    trace.mark("worker:second-step" if second else "worker:started")
    if request.job == "tick" and not second and not standby:
        checked = check_signature(request)
        trace.mark("worker:signature-checked")
        if isinstance(checked, JobResult):
            write_atomically(request.result, checked.to_json())
            return 0
        # The rest of the job in a fresh image: what was loaded to check the signature goes.
        sys.stdout.flush()
        sys.stderr.flush()
        then = checked.to_json() if checked is not None else "-"
        os.execv(
            sys.executable,
            [sys.executable, "-m", "agent.runner.worker", args[0], "--then", then],
        )
    vouched = None
    if vouched_text is not None:
        from agent.verify import VouchedSignature

        vouched = VouchedSignature.from_json(vouched_text)
    result = run(request, vouched=vouched)
    write_atomically(request.result, result.to_json())
    trace.mark("worker:result-written")
    return 0


# What a job loads (the modules ``build_agent`` and a tick import when they run).
_WARM = (
    "agent.assemble", "agent.loop", "agent.inbound", "agent.kube", "agent.reconcile",
    "agent.reconcile.group", "agent.apply", "agent.health", "agent.render", "agent.verify",
    "agent.verify._sigstore", "agent.report.logs", "agent.report.push", "agent.runner.relay",
    "agent.source.oci", "agent.secrets.keys", "sigstore.models", "sigstore.verify",
    # The cluster client (agent.kube imports it lazily, at the job's first request: 0.15-0.25
    # s of the move), and what the job's result and the agent entry import.
    "kubernetes", "kubernetes.config.kube_config", "kubernetes.dynamic", "agent.kube._discovery",
    "agent.fanout", "agent.cli", "agent.upgrade.desired", "agent.render.confine",
    "cryptography.hazmat.backends.openssl", "_strptime",
)  # fmt: skip


def _stand_by() -> bool:
    """Import what a job needs, then wait for the launcher's line: True to go on, False when
    stdin closed without one (the supervisor went away)."""
    import importlib

    from agent.report import trace

    for module in _WARM:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    trace.mark("worker:standby")
    return bool(sys.stdin.buffer.readline())


def check_signature(request: JobRequest) -> Any:
    """The first step of a tick: the signature of the branch's new tip, checked. Returns a
    :class:`~agent.verify.VouchedSignature`, None (nothing new, or nothing could be
    checked: the next step does it all), or a JobResult (the trust configuration cannot be
    loaded: the job ends)."""
    from agent.assemble import branch_watcher, git_credentials, trust_policy
    from agent.errors import ConfigurationError, FleetletError
    from agent.report import trace
    from agent.settings import settings_from_dict
    from agent.verify import (
        BUNDLE_FILE,
        STATEMENT_FILE,
        VouchedSignature,
        verify_statement_signature,
    )

    settings = settings_from_dict(request.settings)
    try:
        watcher = branch_watcher(settings, git_credentials())
        commit = watcher.poll()
        if commit is None or commit in request.known_commits:
            return None
        files = watcher.fetch(commit)
        trace.mark("worker:first-fetched")
        statement, bundle = files[STATEMENT_FILE], files[BUNDLE_FILE]
        trust = trust_policy(settings)
        trace.mark("worker:trust-loaded")
        signer = verify_statement_signature(
            statement=statement, bundle_json=bundle, trust=trust, bundle_name=BUNDLE_FILE
        )
        return VouchedSignature.of(
            statement=statement, bundle_json=bundle, signer=signer, policy=trust.digest()
        )
    except ConfigurationError as exc:
        return JobResult(
            job=request.job,
            summary=f"{settings.repo.cluster}: the agent cannot start: {exc}",
            error=JobError(kind="configuration", reason=exc.reason, message=str(exc)),
        )
    except (FleetletError, KeyError, ValueError):
        # Refused, unreadable, or the server away: the next step meets it again, and says so.
        return None


def run(request: JobRequest, *, vouched: Any = None) -> JobResult:
    """Build the agent, run the job, say what it did. Never raises for the job's errors (they
    are in the result); an unexpected exception is one too."""
    from agent.assemble import build_agent, make_failpoint
    from agent.errors import ConfigurationError, FleetletError, TemporaryError
    from agent.report.logs import setup_logging
    from agent.runner.relay import RecordingMetrics
    from agent.settings import settings_from_dict

    settings = settings_from_dict(
        request.settings, failpoint=make_failpoint(os.environ.get("FLEETLET_FAILPOINT"))
    )
    cluster = settings.repo.cluster
    setup_logging(level=request.log_level, format=request.log_format, cluster=cluster)
    from agent import __version__

    metrics = RecordingMetrics(cluster=cluster, version=__version__)
    try:
        # The supervisor pushes the status document: the worker never does.
        agent = build_agent(
            replace(settings, status=False),
            metrics=metrics,
            # sigstore is loaded only for bytes no earlier step of this job vouched for.
            lazy_trust=True,
            vouched=vouched,
        )
    except FleetletError as exc:
        kind: ErrorKind = (
            "configuration"
            if isinstance(exc, ConfigurationError)
            else ("temporary" if isinstance(exc, TemporaryError) else "permanent")
        )
        return JobResult(
            job=request.job,
            summary=f"{cluster}: the agent cannot start: {exc}",
            error=JobError(kind=kind, reason=exc.reason, message=str(exc), delay=_delay(exc)),
            metrics=tuple(metrics.calls),
        )
    from agent.report import trace

    trace.mark("worker:agent-built")
    if request.previous_failure:
        _report_failure(agent, request.previous_failure)
    if request.inbound_problem is not None and request.job == "drift":
        agent.note_inbound_problem(*request.inbound_problem)
    progress = _Progress(agent, request.progress, request.progress_interval)
    progress.start()
    error: FleetletError | None = None
    job = agent.tick if request.job == "tick" else agent.correct_drift
    try:
        try:
            outcome = metrics.instrument(agent, job)()
        except FleetletError as exc:
            error = exc
            outcome = agent.last
        except Exception as exc:
            log.exception("the %s job failed unexpectedly", request.job)
            error = TemporaryError(f"unexpected error: {type(exc).__name__}: {exc}")
            outcome = agent.last
    finally:
        progress.stop()
    return _result(request, agent, outcome, error, metrics.calls)


def _delay(exc: Exception) -> float | None:
    delay = getattr(exc, "delay", None)
    return float(delay) if isinstance(delay, int | float) else None


def _result(
    request: JobRequest, agent: Any, outcome: Any, error: Any, calls: list[Any]
) -> JobResult:
    from agent.api.facts import dump_reported_facts
    from agent.api.status import dump_status
    from agent.cli import summary
    from agent.errors import ConfigurationError, FleetletError, PermanentError

    cluster = agent.cluster
    job_error = None
    if error is not None:
        kind: ErrorKind = (
            "configuration"
            if isinstance(error, ConfigurationError)
            else "permanent"
            if isinstance(error, PermanentError)
            else "temporary"
        )
        job_error = JobError(
            kind=kind, reason=error.reason, message=str(error), delay=_delay(error)
        )
    commit = refused = None
    status = facts = None
    watch = None
    wake_at = None
    waits: tuple[Awaited, ...] | None = None
    try:
        state = agent.state.load()
        commit, refused = state.commit, state.refused_commit
        document = agent.status_document(state)
        status = dump_status(document)
        reported = agent.reported_facts(document)
        facts = dump_reported_facts(reported) if reported is not None else None
        watch = watches(agent)
        wake_at = _wake_at(agent)
        waits = awaited(agent)
    except FleetletError as exc:
        # The API server went away at the end: the supervisor knows less, and checks again.
        log.warning("%s: cannot read what the job left: %s", cluster, exc)
    out = outcome.outbound if outcome is not None else None
    return JobResult(
        job=request.job,
        summary=summary(cluster, outcome) if outcome is not None else f"{cluster}: {error}",
        error=job_error,
        commit=commit,
        refused_commit=refused,
        # A wait the supervisor cannot check itself: every poll runs a worker, as before.
        pending=agent.retry_pending or (bool(agent.awaiting) and waits is None),
        awaiting=waits or (),
        wake_at=wake_at,
        failed=bool(out is not None and out.failed),
        status=status,
        facts=facts,
        watch=watch,
        metrics=tuple(calls),
    )


def watches(agent: Any) -> tuple[Watch, ...] | None:
    """What to watch for drift: the BundleDeployments, and per bundle of the accepted set the
    collections of its stored revision's objects and of its health checks' objects, read as
    the bundle's identity. An object whose API is not served (an optional one, skipped)
    cannot be watched: the CustomResourceDefinitions are instead (read as the same identity),
    so a CRD that appears starts a worker, which applies the object. None when the
    collections cannot be located (the API server away)."""
    from agent.apply.store import RevisionStore
    from agent.health.group import checks_of
    from agent.kube import ApiNotServedError, KubeError, ObjectRef
    from agent.report.bundles import GROUP_VERSION, KIND, MANAGED_LABEL

    kube = agent.reconciler.kube
    store: RevisionStore = agent.reconciler.store
    owner = agent.reconciler.views.bundles.owner
    selector = quote(f"{MANAGED_LABEL}={owner}", safe="=")
    found: list[Watch] = [
        Watch(path=f"{kube.collection_path(GROUP_VERSION, KIND)}?labelSelector={selector}")
    ]
    accepted = agent.accepted
    if accepted is None:
        return tuple(found)
    names: dict[tuple[str | None, str], set[str]] = {}
    unserved: set[str | None] = set()
    namespace = agent.reconciler.settings.agent_namespace
    try:
        stored_of = store.latest_of([e.name for e in accepted.bundle_deployments])
        for entry in accepted.bundle_deployments:
            stored = stored_of[entry.name]
            account = entry.spec.service_account_name
            user = f"system:serviceaccount:{namespace}:{account}" if account else None
            refs = [ObjectRef.of(o) for o in (stored.manifests if stored else ())]
            refs += [ObjectRef.of(c.object) for c in checks_of(entry.spec)]
            for ref in refs:
                try:
                    path = kube.collection_path(ref.api_version, ref.kind, ref.namespace)
                except ApiNotServedError:
                    unserved.add(user)
                    continue
                names.setdefault((user, path), set()).add(ref.name)
        if unserved:
            crds = kube.collection_path("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            found += [Watch(path=crds, user=user) for user in sorted(unserved, key=str)]
    except KubeError as exc:
        log.info("drift checks need a worker each time: %s", exc)
        return None
    found += [
        Watch(path=path, user=user, names=tuple(sorted(members)))
        for (user, path), members in sorted(
            names.items(), key=lambda kv: (kv[0][1], kv[0][0] or "")
        )
    ]
    return tuple(found)


def awaited(agent: Any) -> tuple[Awaited, ...] | None:
    """What the groups whose move awaits a decision wait on, as LISTs the supervisor compares
    (:mod:`agent.runner.decisions`): their requests among this agent's (by resourceVersion,
    as the pass read them when it decided to wait) and every ApprovalPolicy (one may approve,
    or stop requiring approval). None when the collections cannot be located (the API server
    away, the ApprovalPolicy API not served): then each poll runs a worker while it waits."""
    from agent.approve import policy, request
    from agent.kube import KubeError

    waiting = agent.awaiting
    if not waiting:
        return ()
    kube = agent.reconciler.kube
    owner = agent.reconciler.approvals.requests.owner
    try:
        requests = kube.collection_path(request.GROUP_VERSION, request.KIND)
        policies = kube.collection_path(policy.GROUP_VERSION, policy.KIND)
    except KubeError as exc:
        log.info("a decision awaited: each poll starts a worker (%s)", exc)
        return None
    selector = quote(f"{request.MANAGED_LABEL}={owner}", safe="=")
    found = [
        Awaited(
            path=f"{requests}?labelSelector={selector}",
            versions={w.request: w.request_version for w in waiting},
        )
    ]
    # Each group read the policies itself: each view of them counts (one, unless they moved).
    seen: list[dict[str, str]] = []
    for wait in waiting:
        if dict(wait.policies) not in seen:
            seen.append(dict(wait.policies))
    found += [Awaited(path=policies, versions=versions, whole=True) for versions in seen]
    return tuple(found)


def _wake_at(agent: Any) -> float | None:
    """The earliest time a worker has something to do without the branch moving: a failed
    target of the accepted set retried by itself, or the running publication expiring (then
    every bundle says ``Expired``; once it has expired, that was said)."""
    from agent.api import parse_time

    accepted = agent.accepted
    if accepted is None:
        return None
    times: list[datetime] = []
    expires = accepted.expires_at + agent.pipeline.clock_skew
    if agent.clock() <= expires:
        times.append(expires + timedelta(seconds=1))  # past it, by the agent's clock too
    for record in agent.reconciler.records.load_all(accepted.groups):  # one LIST
        failure = record.failure
        when = parse_time(failure.retry_at) if failure is not None and failure.retry_at else None
        if when is not None:
            times.append(when)
    return min(times).timestamp() if times else None


def _report_failure(agent: Any, message: str) -> None:
    """Say on every bundle of the accepted set that the previous worker failed (before this
    one does anything that could fail the same way)."""
    from agent.errors import FleetletError

    try:
        accepted = agent.state.load_set()
        if accepted is None:
            return
        views = agent.reconciler.views
        for entry in accepted.bundle_deployments:
            view = views.view(entry.name, entry.group)
            view.mark_worker_failed(message)
            views.write(view)
            views.bundles.record(entry.name, "WorkerFailed", message, warning=True)
    except FleetletError as exc:
        log.warning("cannot report the previous worker's failure: %s", exc)


class _Progress:
    """Writes the agent's status document every ``interval`` seconds while the job runs."""

    def __init__(self, agent: Any, path: Path, interval: float) -> None:
        self._agent = agent
        self._path = path
        self._interval = max(interval, 0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        from agent.api.status import dump_status

        while not self._stop.wait(self._interval):
            try:
                write_atomically(self._path, dump_status(self._agent.status_document()))
            except Exception:  # the views move under us, the API server blinks: next time
                log.debug("progress not written", exc_info=True)


def _exit(code: int) -> None:
    """End the process now: the result is on disk (written atomically) and the logs flushed;
    the interpreter's own shutdown (module teardown, the kubernetes client's pools) would add
    0.3-1.5 s to every job before the supervisor can push the status."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
