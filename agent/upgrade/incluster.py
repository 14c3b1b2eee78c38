"""The upgrade half of ``agent run`` in a pod: the candidate is a second Deployment.

An agent whose pod says ``FLEETLET_AGENT_DEPLOYMENT`` (``agent install`` sets it) upgrades as
:class:`InClusterUpgrades`: the same Lease, record, report and candidate self-check as a
process (:mod:`agent.upgrade.process`), but the candidate is a container image run by
Kubernetes. Read top to bottom, an attempt (:meth:`InClusterUpgrades._try`):

1. **pull** the release artifact by digest and read its release (:mod:`agent.upgrade.deployment`):
   the container image, by digest, and its CRDs and RBAC rules;
2. **declare** them: the CRDs updated (added to only), the agent's own ClusterRole and Role
   rules replaced (the old ones kept for a rollback); installed ``--self-upgrade=no-new-rules``,
   without ``escalate``, so a rule the agent does not hold is refused here
   (:mod:`agent.upgrade.rights`; ``off``: no attempt at all);
3. **start** the candidate: Deployment ``fleetlet-agent-candidate`` (made by ``agent install``
   with no replica) gets the agent's own pod spec, the new image, ``FLEETLET_AGENT_CANDIDATE``
   set, and one replica; the old agent goes on acting;
4. **self-check** in the candidate's pod (its code, :meth:`Upgrades._prove`): it says on the
   Lease that it checked itself, and who it is;
5. **hand over** the Lease; the candidate runs one sync and says it proved itself; its
   Deployment must then be Available (its readiness probe passes);
6. **promote**: the agent's own Deployment moves to the new image (``Recreate`` replaces this
   pod by one of the new image, which takes the Lease), and the candidate stopped (no replica).

A candidate that does not get there by ``FLEETLET_AGENT_UPGRADE_DEADLINE`` (a refused replica
or a stalled rollout ends the wait at once) is stopped, the rules put back, the Lease taken
back, and the attempt reported ``RolledBack`` as in process mode.

Installed ``--self-upgrade=off`` (:mod:`agent.upgrade.rights`) there is no attempt: the release
is pulled only to read the image it names; when that is the pod's own (an operator installed
it), the agent runs that release and says so, otherwise it reports ``UpgradeDisabled``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from agent.errors import FleetletError
from agent.upgrade.deployment import (
    CANDIDATE,
    ENV_DEPLOYMENT,
    NAME,
    AgentDeployment,
    Declared,
    Release,
    UpgradeStepError,
    read_release,
)
from agent.upgrade.desired import Desired, Record, agent_report
from agent.upgrade.lease import FAILED, IDENTITY, PROVEN, READY
from agent.upgrade.process import (
    ENV_CANDIDATE,
    ENV_IMAGE,
    ENV_VERSION,
    UpgradeFailed,
    Upgrades,
    _now,
)
from agent.upgrade.rights import SelfUpgrade, fit_rules

log = logging.getLogger(__name__)


def in_cluster() -> bool:
    """Whether this ``agent run`` is the one of ``agent install``'s Deployment."""
    return bool(os.environ.get(ENV_DEPLOYMENT))


class InClusterUpgrades(Upgrades):
    """:class:`Upgrades` whose candidate is a Deployment (see the module docstring)."""

    def __init__(
        self, *, settings: Any, supervisor: Any, rights: SelfUpgrade = SelfUpgrade.ON
    ) -> None:
        super().__init__(settings=settings, supervisor=supervisor, rights=rights)
        self.deployment = AgentDeployment(
            self.kube, str(settings.namespace), os.environ.get(ENV_DEPLOYMENT) or NAME
        )
        self._declared: Declared | None = None
        self.container = self.image
        """The digest of this pod's container image, as ``agent install`` wrote it (an agent
        installed ``off`` is never promoted, so it stays that)."""

    def start(self) -> None:
        if self.attempt_id is None and self.rights is not SelfUpgrade.OFF:
            # A candidate left running by an attempt this agent's predecessor did not finish
            # (its pod replaced mid-way), or by a hand-over: stopped before this one takes the
            # Lease; an unfinished attempt starts over.
            try:
                if self.deployment.stop_candidate():
                    log.warning("stopped the candidate left by an agent upgrade")
            except FleetletError as exc:
                log.warning("the candidate Deployment could not be checked: %s", exc)
        super().start()

    def _try(self, desired: Desired, start: Record) -> None:
        pulled = self._pull(desired)
        release = read_release(pulled.root, f"{desired.uri}@{desired.digest}")
        # With --self-upgrade=no-new-rules the agent asks for no escalate (agent.upgrade.rights).
        release = dataclasses.replace(
            release,
            cluster_rules=fit_rules(release.cluster_rules, self.rights),
            role_rules=fit_rules(release.role_rules, self.rights),
        )
        try:
            self.run_attempt(desired, start, release)
        except FleetletError:
            raise
        except Exception as exc:  # an answer of an unexpected shape: rolled back all the same
            raise UpgradeFailed("UpgradeError", f"{type(exc).__name__}: {exc}") from exc

    def _refuse(self, desired: Desired, record: Record) -> None:
        """Installed ``--self-upgrade=off``: refused, unless this pod already runs the release's
        image (an operator's ``agent install --image``): then it runs that release. The release
        is pulled to be read, nothing more (a pull that fails: refused)."""
        if not self.container:  # started from elsewhere: it cannot run the release's image
            super()._refuse(desired, record)
            return
        try:
            release = read_release(self._pull(desired).root, f"{desired.uri}@{desired.digest}")
        except Exception as exc:  # read to compare only: refused all the same
            log.warning("agent release %s not read (%s): refused", desired.digest, exc)
        else:
            if release.image.rpartition("@")[2] == self.container:
                # As a promoted agent knows itself: by the release's digest and version.
                self.image, self.version = desired.digest, release.version
                self._save(Record(running=self.image, version=self.version, at=_now()))
                self._show(agent_report(desired, self._record))
                return
        super()._refuse(desired, record)

    def run_attempt(self, desired: Desired, start: Record, release: Release) -> None:
        """Steps 2 to 6 of the module docstring. Raises UpgradeFailed, the door's errors (the
        caller rolls back)."""
        attempt = f"{desired.digest}/{desired.since}"
        env = {ENV_IMAGE: desired.digest, ENV_VERSION: release.version}
        deadline = time.monotonic() + self.deadline
        try:
            self._progress(desired, start, f"declaring the CRDs and RBAC of {release.version}")
            self._declared = self.deployment.declare(release)
            self.deployment.start_candidate(release, {**env, ENV_CANDIDATE: attempt})
            self._progress(desired, start, f"candidate {release.version} checks itself")
            identity = self._await_word(READY, attempt, deadline, "its self-check")
            if not identity:
                raise UpgradeFailed(
                    "NoIdentity", f"the candidate did not say who it is ({IDENTITY} on the Lease)"
                )
            self.acting.clear()
            with self._job:  # the running job ends first; no job starts after
                self.lease.hand_to(identity)
            self.handed_over = True
            self._progress(desired, start, f"candidate {release.version} holds the Lease")
            self._await_word(PROVEN, attempt, deadline, "one successful sync")
            self._await_available(deadline)
            self.deployment.promote(release, env)
        except UpgradeStepError as exc:
            raise UpgradeFailed(exc.reason, str(exc)) from exc
        self._declared = None
        log.info("agent %s proved itself; the agent's Deployment runs it now", release.version)
        self._report = None  # the new agent reports

    def _await_word(self, key: str, attempt: str, deadline: float, what: str) -> str:
        """Wait for the candidate's word ``key`` on the Lease; returns who it is. Raises
        UpgradeFailed (its failure said, its Deployment stuck, the deadline, a stop)."""
        while True:
            view = self.lease.read()
            said = view.annotations if view is not None else {}
            if said.get(key) == attempt:
                return said.get(IDENTITY, "")
            failed = said.get(FAILED, "")
            if failed.startswith(attempt + " "):
                reason, _, message = failed[len(attempt) + 1 :].partition(": ")
                raise UpgradeFailed(reason or "SelfCheckFailed", message or failed)
            self._check_candidate(deadline, what)
            time.sleep(0.5)

    def _await_available(self, deadline: float) -> None:
        while not self.deployment.candidate().available:
            self._check_candidate(deadline, "Available")
            time.sleep(0.5)

    def _check_candidate(self, deadline: float, what: str) -> None:
        state = self.deployment.candidate()
        if state.problem:
            raise UpgradeFailed("CannotStart", f"the candidate Deployment: {state.problem}")
        if time.monotonic() > deadline:
            where = (
                "Available" if state.available else f"not Available: {state.said or 'no status'}"
            )
            raise UpgradeFailed(
                "DeadlineExceeded",
                f"the candidate did not pass {what} within {self.deadline:.0f}s "
                f"(Deployment {CANDIDATE} {where})",
            )
        if self.stopped.is_set():
            raise UpgradeFailed("Stopped", "agent run is stopping")

    def _roll_back(self, desired: Desired, start: Record, reason: str, message: str) -> None:
        """The candidate stopped and the rules put back, then as a process rolls back."""
        try:
            self.deployment.stop_candidate()
            if self._declared is not None:
                self.deployment.revert(self._declared)
                self._declared = None
        except FleetletError as exc:
            # The next check of this agent tries no more; an operator's `agent install` puts
            # the rules back. Said, not hidden.
            log.error("agent upgrade rollback: the candidate or the rules not restored: %s", exc)
            message = f"{message}; rollback incomplete: {exc}"
        super()._roll_back(desired, start, reason, message)

    def _watch_successor(self) -> None:
        """The agent's Deployment runs the new image: this pod is being replaced."""


__all__ = ["InClusterUpgrades", "in_cluster"]
