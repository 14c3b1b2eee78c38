"""The run history of each bundle, kept in the cluster (bounded).

Every attempt to move a bundle (install, upgrade, rollback, drift correction, uninstall) is a
:class:`~agent.api.status.Run`. A bundle's runs, newest first, live in one ConfigMap of the
agent's namespace, ``fleetlet-runs-<bundle>`` (labelled ``fleetlet.io/runs-of``), so a
restarted agent keeps its history and a cluster admin can read it. Outputs in runs are
already in their outside-the-cluster form (sensitive values sealed or omitted), so nothing
secret is kept here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from agent.api.reasons import RUNNING, RunResult
from agent.api.status import OutputValue, Run, RunCounts, RunOperation
from agent.api.validation import from_dict, to_dict
from agent.errors import PermanentError, ValidationError
from agent.kube import STATE_FIELD_MANAGER, KubeClient, ObjectRef

NAME_PREFIX = "fleetlet-runs-"
RUNS_LABEL = "fleetlet.io/runs-of"
DEFAULT_HISTORY = 20
_KEY = "runs.json"


class RunLogError(PermanentError):
    """A bundle's run history in the cluster cannot be read; the message names it."""

    reason = "RunHistoryCorrupt"


class RunLog:
    """Runs per bundle in ConfigMaps of ``namespace``; at most ``history`` kept per bundle."""

    def __init__(self, kube: KubeClient, *, namespace: str, history: int = DEFAULT_HISTORY) -> None:
        if history < 1:
            raise ValueError("history must be positive")
        self.kube = kube
        self.namespace = namespace
        self.history = history

    def _ref(self, bundle: str) -> ObjectRef:
        return ObjectRef("v1", "ConfigMap", NAME_PREFIX + bundle, self.namespace)

    def runs(self, bundle: str) -> list[Run]:
        """The bundle's runs, newest first (empty when none).

        Raises RunLogError, ApiUnavailableError, KubeApiError.
        """
        live = self.kube.get(self._ref(bundle))
        if live is None:
            return []
        raw = (live.get("data") or {}).get(_KEY) or "[]"
        where = f"ConfigMap {self.namespace}/{NAME_PREFIX}{bundle}"
        try:
            items = json.loads(raw)
            if not isinstance(items, list):
                raise TypeError("not a list")
            return [from_dict(Run, item, origin=where) for item in items]
        except (ValueError, TypeError, ValidationError) as exc:
            raise RunLogError(f"{where}: unreadable run history ({exc})") from exc

    def record(self, bundle: str, run: Run) -> list[Run]:
        """Add ``run`` as the newest, or replace the run with the same id where it is (a run
        that finishes); older runs beyond the bound are dropped. Returns the history.

        Raises RunLogError, ApiUnavailableError, KubeApiError.
        """
        return self._record(bundle, run, self.runs(bundle))

    def _record(self, bundle: str, run: Run, runs: list[Run]) -> list[Run]:
        """:meth:`record` onto ``runs``, the history just read."""
        if any(r.id == run.id for r in runs):
            runs = [run if r.id == run.id else r for r in runs]
        else:
            runs = [run, *runs]
        runs = runs[: self.history]
        self._write(bundle, runs)
        return runs

    def start(
        self,
        bundle: str,
        *,
        operation: RunOperation,
        serial: int,
        sources: Sequence[str],
        at: datetime,
        message: str,
        history: list[Run] | None = None,
    ) -> list[Run]:
        """Record a new ``Running`` run as the newest; returns the history (the new run
        first). ``history``: the bundle's runs as known (read when not given).

        Raises RunLogError, ApiUnavailableError, KubeApiError.
        """
        run = Run(
            id=self.next_id(bundle, history),
            operation=operation,
            serial=serial,
            source_digests=tuple(sources)[:16],
            started_at=at,
            result=RUNNING,
            message=message,
        )
        return self.record(bundle, run)

    def finish(
        self,
        bundle: str,
        run_id: str,
        *,
        result: RunResult,
        message: str,
        at: datetime,
        serial: int,
        counts: RunCounts | None = None,
        outputs: Sequence[OutputValue] = (),
        failed_object: str | None = None,
    ) -> list[Run]:
        """End run ``run_id`` with ``result`` (a run missing from the history, e.g. trimmed,
        is recorded anew as an upgrade started now); returns the history.

        Raises RunLogError, ApiUnavailableError, KubeApiError.
        """
        history = self.runs(bundle)
        started = next((r for r in history if r.id == run_id), None)
        run = Run(
            id=run_id,
            operation=started.operation if started else "upgrade",
            serial=serial,
            source_digests=started.source_digests if started else (),
            started_at=started.started_at if started else at,
            finished_at=at,
            result=result,
            message=message,
            failed_object=failed_object,
            counts=counts or RunCounts(),
            outputs=tuple(outputs),
        )
        return self._record(bundle, run, history)  # read just above: not read again

    def next_id(self, bundle: str, runs: list[Run] | None = None) -> str:
        """A new run id for ``bundle``: ``<bundle>.<n>``, n one more than any kept.

        Raises what :meth:`runs` raises when ``runs`` is not given.
        """
        known = self.runs(bundle) if runs is None else runs
        numbers = [0]
        for r in known:
            head, _, tail = r.id.rpartition(".")
            if head == bundle and tail.isdigit():
                numbers.append(int(tail))
        return f"{bundle}.{max(numbers) + 1}"

    def delete(self, bundle: str) -> None:
        """Forget a bundle's runs. Raises ApiUnavailableError, KubeApiError."""
        self.kube.delete(self._ref(bundle))

    def _write(self, bundle: str, runs: list[Run]) -> None:
        items: list[Any] = [to_dict(r) for r in runs]
        text = json.dumps(items, sort_keys=True, separators=(",", ":"))
        # A ConfigMap holds at most 1 MiB: drop the oldest runs until it fits.
        while len(text) > 900 * 1024 and len(items) > 1:
            items = items[:-1]
            text = json.dumps(items, sort_keys=True, separators=(",", ":"))
        self.kube.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": NAME_PREFIX + bundle,
                    "namespace": self.namespace,
                    "labels": {RUNS_LABEL: bundle, "app.kubernetes.io/name": "fleetlet"},
                },
                "data": {_KEY: text},
            },
            field_manager=STATE_FIELD_MANAGER,
            force=True,
        )
