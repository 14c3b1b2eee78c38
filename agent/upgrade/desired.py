"""What the cluster wants the agent to run, what it runs, and how that is reported.

The inbound pipeline calls :func:`take_agent_entry` on every verified set: the entry
:data:`~agent.upgrade.AGENT_ENTRY` leaves the set (so no render, apply or prune ever sees it)
and what it pins is kept in the cluster as :class:`Desired`, in the ConfigMap
:data:`CONFIGMAP` of the agent's namespace. The acting agent keeps its :class:`Record` there
(which image runs, the one before, the last attempt and how it ended).

:func:`agent_report` turns both into the entry's report in the status document, in the words
the hub's rollout verdicts read (:mod:`hub.rollout.evaluate`): Ready on serial S once the
wanted image runs; Progressing while a candidate proves itself; RolledBack, with a run of the
serial that asked for it, when the candidate did not prove itself and the previous agent went on;
``UpgradeDisabled`` (Ready False, a failed run of that serial) when the agent was installed
without the rights to upgrade itself (:mod:`agent.upgrade.rights`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from agent.api import BundleDeploymentSet
from agent.api.models import Condition, Revision
from agent.api.reasons import Reason
from agent.api.status import BundleStatusReport, ClusterStatus, Run
from agent.kube import NotFoundError
from agent.upgrade import AGENT_ENTRY
from agent.upgrade.lease import ObjectClient
from agent.upgrade.rights import UpgradeDisabledError

CONFIGMAP = "fleetlet-agent-upgrade"
AttemptState = Literal["", "Progressing", "Failed", "Succeeded"]


@dataclass(frozen=True, slots=True)
class Desired:
    """The agent image the accepted set pins: repository, digest, the serial of that set and
    the first serial that asked for this digest (an attempt is made once per ``since``)."""

    uri: str
    digest: str
    serial: int
    since: int


@dataclass(frozen=True, slots=True)
class Record:
    """What the acting agent runs and tried last."""

    running: str = ""
    """Digest of the image the acting agent runs ("": started from elsewhere, e.g. a checkout)."""
    version: str = ""
    previous: str = ""
    attempt: str = ""
    attempt_since: int = 0
    attempt_serial: int = 0
    state: AttemptState = ""
    reason: str = ""
    message: str = ""
    at: str = ""


def take_agent_entry(
    deployment_set: BundleDeploymentSet, before: Desired | None
) -> tuple[BundleDeploymentSet, Desired | None]:
    """(the set without the agent entry, what that entry asks for; None: no entry)."""
    entry = next((e for e in deployment_set.bundle_deployments if e.name == AGENT_ENTRY), None)
    if entry is None:
        return deployment_set, None
    rest = tuple(e for e in deployment_set.bundle_deployments if e.name != AGENT_ENTRY)
    groups = tuple(g for g in deployment_set.groups if g != AGENT_ENTRY)
    source = entry.spec.sources[0]
    digest = str(source.digest or "")
    serial = deployment_set.serial
    since = before.since if before is not None and before.digest == digest else serial
    desired = Desired(uri=source.uri, digest=digest, serial=serial, since=since)
    return dataclasses.replace(deployment_set, bundle_deployments=rest, groups=groups), desired


class UpgradeStore:
    """The ConfigMap :data:`CONFIGMAP`: ``desired`` (written by whoever accepts a set) and
    ``record`` (written by the acting agent), each one JSON value. ``kube``: the worker's
    :class:`agent.kube.KubeClient` or the supervisor's :class:`agent.runner.objects.ObjectDoor`."""

    def __init__(self, kube: ObjectClient, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace

    def _ref(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP, "namespace": self.namespace},
        }

    def read(self) -> tuple[Desired | None, Record]:
        """Raises the KubeClient's errors."""
        live = self.kube.get(self._ref())
        data = (live or {}).get("data") or {}
        desired = _load(Desired, data.get("desired"))
        return desired, _load(Record, data.get("record")) or Record()

    def save_desired(self, desired: Desired | None) -> None:
        self._write("desired", None if desired is None else dataclasses.asdict(desired))

    def save_record(self, record: Record) -> None:
        self._write("record", dataclasses.asdict(record))

    def _write(self, key: str, value: dict[str, Any] | None) -> None:
        text = None if value is None else json.dumps(value, sort_keys=True)
        try:
            self.kube.patch(self._ref(), {"data": {key: text}})
        except NotFoundError:
            if text is None:
                return
            self.kube.create({**self._ref(), "data": {key: text}})


def _load(kind: Any, text: str | None) -> Any:
    if not text:
        return None
    try:
        raw = json.loads(text)
        names = {f.name for f in dataclasses.fields(kind)}
        return kind(**{k: v for k, v in raw.items() if k in names})
    except (ValueError, TypeError, AttributeError):
        return None  # written by someone else: treated as absent, written anew


def agent_report(
    desired: Desired | None, record: Record, now: datetime | None = None
) -> BundleStatusReport | None:
    """The agent entry's report (None without a desired image)."""
    if desired is None:
        return None
    # The record's time, not the clock's: the same state makes the same document (no push).
    at = _parse_time(record.at) or now or datetime.now(UTC).replace(microsecond=0)

    def condition(kind: str, status: str, reason: str, message: str) -> Condition:
        return Condition(
            type=kind,
            status=status,  # type: ignore[arg-type]
            reason=reason,
            message=message[:4096],
            last_transition_time=at,
        )

    short = desired.digest[7:19]
    if record.running == desired.digest:
        said = f"agent {record.version or short} ({desired.digest}) acts in this cluster"
        history: tuple[Run, ...] = ()
        if record.reason == UpgradeDisabledError.reason and record.attempt != desired.digest:
            said += f"; the release declared before, {record.attempt}, was not tried"
        elif record.state == "Failed" and record.attempt != desired.digest:
            # History, as a bundle's rolled back run is once a newer set is running.
            said += (
                f"; the last upgrade, to {record.attempt}, was rolled back "
                f"({record.reason}: {record.message})"
            )
            history = (_rolled_back(record, at),)
        return BundleStatusReport(
            name=AGENT_ENTRY,
            group=AGENT_ENTRY,
            conditions=(condition("Ready", "True", Reason.HEALTHY, said),),
            applied_revision=Revision(serial=desired.serial, sources=(desired.digest,)),
            last_healthy_revision=Revision(serial=desired.serial, sources=(desired.digest,)),
            runs=history,
        )
    applied = (
        Revision(serial=max(desired.since - 1, 1), sources=(record.running,))
        if record.running
        else None
    )
    mine = record.attempt == desired.digest and record.attempt_since == desired.since
    if mine and record.state == "Failed" and record.reason == UpgradeDisabledError.reason:
        # Not tried (agent install --self-upgrade=off): a failure of this cluster for the
        # hub's rollout, in one line; nothing was rolled back.
        return BundleStatusReport(
            name=AGENT_ENTRY,
            group=AGENT_ENTRY,
            conditions=(
                condition("Ready", "False", record.reason, record.message),
                condition("Degraded", "True", record.reason, record.message),
            ),
            applied_revision=applied,
            runs=(dataclasses.replace(_rolled_back(record, at), result="Failed"),),
        )
    if mine and record.state == "Failed":
        run = _rolled_back(record, at)
        message = (
            f"agent {desired.digest} did not prove itself ({record.reason}: {record.message}); "
            f"the previous agent {record.running or 'as started'} goes on acting"
        )
        return BundleStatusReport(
            name=AGENT_ENTRY,
            group=AGENT_ENTRY,
            conditions=(
                condition("Ready", "False", "RolledBack", message),
                condition("Degraded", "True", record.reason or "UpgradeFailed", message),
            ),
            applied_revision=applied,
            runs=(run,),
        )
    run = Run(
        id=f"agent-{short}-{desired.since}",
        operation="upgrade",
        serial=desired.serial,
        source_digests=(desired.digest,),
        started_at=at,
        result="Running",
    )
    what = (
        record.message or "a candidate agent proves itself"
        if mine
        else "the upgrade starts at the next check"
    )
    return BundleStatusReport(
        name=AGENT_ENTRY,
        group=AGENT_ENTRY,
        conditions=(
            condition("Ready", "False", "Upgrading", f"to agent {desired.digest}: {what}"),
            condition("Progressing", "True", "Upgrading", what),
        ),
        applied_revision=applied,
        runs=(run,),
    )


def _rolled_back(record: Record, at: datetime) -> Run:
    return Run(
        id=f"agent-{record.attempt[7:19]}-{record.attempt_since}",
        operation="upgrade",
        serial=record.attempt_serial,
        source_digests=(record.attempt,),
        started_at=at,
        finished_at=at,
        result="RolledBack",
    )


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def with_agent_report(
    document: ClusterStatus, report: BundleStatusReport | None, version: str = ""
) -> ClusterStatus:
    """``document`` with the agent entry's report in place of any it had (by name order), and
    ``version`` (the running image's, when known) as the agent's version."""
    bundles = [b for b in document.bundles if b.name != AGENT_ENTRY]
    if report is not None:
        bundles.append(report)
        bundles.sort(key=lambda b: b.name)
    return dataclasses.replace(
        document, bundles=tuple(bundles), agent_version=version or document.agent_version
    )


__all__ = [
    "CONFIGMAP",
    "Desired",
    "Record",
    "UpgradeStore",
    "agent_report",
    "take_agent_entry",
    "with_agent_report",
]
