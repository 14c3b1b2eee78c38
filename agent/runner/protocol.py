"""What the supervisor and a worker exchange: a job request and a job result, as JSON files.

The supervisor writes a :class:`JobRequest` and starts ``python -m agent.runner.worker
REQUEST``; the worker writes its :class:`JobResult` to ``request.result`` (atomically) before
it exits. No result means the worker died. Both are plain data: this module imports nothing
heavy, since the supervisor reads every result.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Job = Literal["tick", "drift"]
"""``tick``: poll, and on a new publication fetch, verify, render; then the outbound pass over
the accepted set (as ``agent sync --once``). ``drift``: the outbound pass alone."""
JOBS: tuple[Job, ...] = ("tick", "drift")

ErrorKind = Literal["temporary", "permanent", "configuration"]


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """One job for one worker."""

    job: Job
    settings: Mapping[str, Any]
    """:func:`agent.settings.settings_to_dict` of the agent's settings."""
    result: Path
    """Where the worker writes its :class:`JobResult`."""
    progress: Path
    """Where the worker writes its status document while it works (for the heartbeats)."""
    progress_interval: float
    parent_pid: int
    """The supervisor: the worker exits at once if its parent is another process."""
    previous_failure: str | None = None
    """How the previous worker failed (it died, or hung): said on every bundle first."""
    inbound_problem: tuple[str, str] | None = None
    """(reason, message) of the supervisor's last failed poll (the git server away): a drift
    worker, which does not poll, keeps saying it on every bundle."""
    known_commits: tuple[str, ...] = ()
    """Branch commits the cluster runs or refused already: a tick does not check their
    signature before it starts (see :mod:`agent.runner.worker`)."""
    log_level: str = "info"
    log_format: str = "text"

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "job": self.job,
                "settings": dict(self.settings),
                "result": str(self.result),
                "progress": str(self.progress),
                "progressInterval": self.progress_interval,
                "parentPid": self.parent_pid,
                "previousFailure": self.previous_failure,
                "inboundProblem": list(self.inbound_problem) if self.inbound_problem else None,
                "knownCommits": list(self.known_commits),
                "logLevel": self.log_level,
                "logFormat": self.log_format,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> JobRequest:
        """Raises ValueError (not JSON, or not a request)."""
        try:
            doc = json.loads(data)
            job = doc["job"]
            if job not in JOBS:
                raise ValueError(f"unknown job {job!r}")
            return cls(
                job=job,
                settings=doc["settings"],
                result=Path(doc["result"]),
                progress=Path(doc["progress"]),
                progress_interval=float(doc["progressInterval"]),
                parent_pid=int(doc["parentPid"]),
                previous_failure=doc.get("previousFailure"),
                inbound_problem=_pair(doc.get("inboundProblem")),
                known_commits=tuple(str(c) for c in doc.get("knownCommits") or ()),
                log_level=str(doc.get("logLevel") or "info"),
                log_format=str(doc.get("logFormat") or "text"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a job request: {exc}") from exc


def _pair(value: Any) -> tuple[str, str] | None:
    if value is None:
        return None
    reason, message = value
    return str(reason), str(message)


@dataclass(frozen=True, kw_only=True)
class JobError:
    """The error a job ended with: ``kind`` says what the supervisor does (back off on
    temporary; wait for the branch to move on permanent; stop at start on configuration)."""

    kind: ErrorKind
    reason: str
    message: str
    delay: float | None = None


@dataclass(frozen=True, kw_only=True)
class Watch:
    """One collection whose objects' resourceVersions tell whether anything the accepted set
    owns changed: a LIST ``path`` (with its query), read as ``user`` (impersonated; None: the
    agent), of which the objects named ``names`` count (None: every object listed)."""

    path: str
    user: str | None = None
    names: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "user": self.user,
            "names": list(self.names) if self.names is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Watch:
        names = data.get("names")
        return cls(
            path=str(data["path"]),
            user=data.get("user"),
            names=tuple(str(n) for n in names) if names is not None else None,
        )


@dataclass(frozen=True, kw_only=True)
class Awaited:
    """Objects a group awaiting a decision waits on, as the worker that decided to wait read
    them: the LIST ``path`` (with its query) and the resourceVersion of each object named in
    ``versions``; with ``whole``, the collection's members count too (one added or removed is
    a change). While all of it is as it was, another pass would decide the same."""

    path: str
    versions: Mapping[str, str]
    whole: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "versions": dict(self.versions), "whole": self.whole}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Awaited:
        return cls(
            path=str(data["path"]),
            versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()},
            whole=bool(data.get("whole")),
        )


@dataclass(frozen=True, kw_only=True)
class JobResult:
    """What a job did and left, as the supervisor needs it."""

    job: Job
    summary: str
    """One line for the log (what moved, rolled back, failed)."""
    error: JobError | None = None
    commit: str | None = None
    """The branch commit whose publication the cluster runs (accepted last)."""
    refused_commit: str | None = None
    """A commit refused for good: polls are idle until the branch moves past it."""
    pending: bool = False
    """The outbound half has work without a new set (a temporary failure to retry)."""
    awaiting: tuple[Awaited, ...] = ()
    """What groups awaiting a decision wait on: a worker runs once any of it changed."""
    wake_at: float | None = None
    """Unix time at which a failed target is retried by itself (None: no such retry)."""
    failed: bool = False
    """A group failed (rolled back or not) or is still failing."""
    status: bytes | None = None
    """The status document (:func:`agent.api.status.dump_status`), for the status branch."""
    facts: bytes | None = None
    """The cluster facts (:func:`agent.api.facts.dump_reported_facts`) of the job's renders,
    for the status branch's ``cluster.json`` (None: the job rendered nothing)."""
    watch: tuple[Watch, ...] | None = None
    """What to watch for drift (None: the job could not tell; drift checks start workers)."""
    metrics: tuple[tuple[str, tuple[Any, ...], Mapping[str, Any]], ...] = field(default=())
    """Calls of :class:`agent.report.metrics.Metrics` recording methods, to replay."""

    def to_json(self) -> bytes:
        error = self.error
        return json.dumps(
            {
                "job": self.job,
                "summary": self.summary,
                "error": None
                if error is None
                else {
                    "kind": error.kind,
                    "reason": error.reason,
                    "message": error.message,
                    "delay": error.delay,
                },
                "commit": self.commit,
                "refusedCommit": self.refused_commit,
                "pending": self.pending,
                "awaiting": [a.to_dict() for a in self.awaiting],
                "wakeAt": self.wake_at,
                "failed": self.failed,
                "status": self.status.decode() if self.status is not None else None,
                "facts": self.facts.decode() if self.facts is not None else None,
                "watch": [w.to_dict() for w in self.watch] if self.watch is not None else None,
                "metrics": [[name, list(args), dict(kw)] for name, args, kw in self.metrics],
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> JobResult:
        """Raises ValueError (not JSON, or not a result)."""
        try:
            doc = json.loads(data)
            job = doc["job"]
            if job not in JOBS:
                raise ValueError(f"unknown job {job!r}")
            raw_error = doc.get("error")
            error = (
                JobError(
                    kind=raw_error["kind"],
                    reason=str(raw_error["reason"]),
                    message=str(raw_error["message"]),
                    delay=raw_error.get("delay"),
                )
                if raw_error
                else None
            )
            watch = doc.get("watch")
            status = doc.get("status")
            facts = doc.get("facts")
            return cls(
                job=job,
                summary=str(doc.get("summary") or ""),
                error=error,
                commit=doc.get("commit"),
                refused_commit=doc.get("refusedCommit"),
                pending=bool(doc.get("pending")),
                awaiting=tuple(Awaited.from_dict(a) for a in doc.get("awaiting") or ()),
                wake_at=doc.get("wakeAt"),
                failed=bool(doc.get("failed")),
                status=status.encode() if isinstance(status, str) else None,
                facts=facts.encode() if isinstance(facts, str) else None,
                watch=tuple(Watch.from_dict(w) for w in watch) if watch is not None else None,
                metrics=tuple(
                    (str(name), tuple(args), dict(kw))
                    for name, args, kw in doc.get("metrics") or []
                ),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a job result: {exc}") from exc


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new, whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def watch_list(watches: Sequence[Watch]) -> str:
    """A stable key of a watch list (fingerprints of different lists never compare equal)."""
    return json.dumps([w.to_dict() for w in watches], sort_keys=True)


__all__ = [
    "JOBS",
    "Awaited",
    "ErrorKind",
    "Job",
    "JobError",
    "JobRequest",
    "JobResult",
    "Watch",
    "watch_list",
    "write_atomically",
]
