"""Rollouts in ``hub serve``: what the API and the dashboard read and do, and the controller's
loop.

:class:`RolloutService` reads the state from git (again only when the ref moved), judges each
rollout with the hub's status view, and records the actions the admin API receives (the actor
is the name of the caller's token); after an action, or every ``interval``, the loop runs one
controller step (judge, advance, publish). The loop runs only when the hub can sign
(``--trust-config`` and ``--identity-token``, read again at each step since tokens expire);
without it the API still shows rollouts and records actions, and ``fleetlet hub rollout step``
(e.g. a CI job) carries them out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from agent.errors import FleetletError
from hub.fleet.model import Fleet
from hub.publish.git import BranchStore
from hub.publish.sendpack import ZERO
from hub.publish.shards import ShardedStore
from hub.publish.sign import PublicationSigner
from hub.rollout.controller import Controller
from hub.rollout.report import detail, summary
from hub.rollout.state import ROLLOUT_REF, Rollout, RolloutStore, State

log = logging.getLogger(__name__)


class RolloutService:
    """Rollouts for the API and the controller loop of ``hub serve``.

    ``controller`` steps (its stores are used by the loop only); ``reader`` is a store of shard
    0 of its own, for the API's reads and actions; ``fleet`` gives the fleet (settings and
    cluster names) at each step; ``signer`` makes a signer for a step (None: no loop).
    """

    def __init__(
        self,
        *,
        controller: Controller,
        reader: BranchStore,
        fleet: Callable[[], Fleet],
        signer: Callable[[], PublicationSigner | None] | None,
        interval: timedelta = timedelta(seconds=30),
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.controller = controller
        self.rollouts = RolloutStore(reader)
        self.fleet = fleet
        self.signer = signer
        self.interval = interval.total_seconds()
        self.report = report or log.info
        self._lock = threading.Lock()
        self._state: State | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollouts", daemon=True)
        self.last_error: str | None = None
        self.published: Callable[[tuple[str, ...]], None] | None = None
        """Called with the cluster branches a step pushed (the agents' channel lists them at
        once: ``hub serve --channel-tokens``)."""

    @property
    def stepping(self) -> bool:
        """Whether this hub runs the controller (it can sign)."""
        return self.signer is not None

    # --- reads ----------------------------------------------------------------------------

    def state(self) -> State:
        """The state now (read again only when the ref moved). Raises GitTransportError,
        RolloutStateError."""
        with self._lock:
            oid = self.rollouts.store.list_refs().get(ROLLOUT_REF, ZERO)
            if self._state is None or self._state.oid != oid:
                self._state = self.rollouts.read_at(oid)
            return self._state

    def list(self) -> dict[str, Any]:
        state = self.state()
        judged = self.controller.judge(state)
        items = [summary(r, judged.get(r.id)) for r in reversed(list(state.rollouts.values()))]
        return {"items": items, "controller": self._controller()}

    def detail(self, rollout_id: str, **page: Any) -> dict[str, Any] | None:
        state = self.state()
        rollout = state.rollouts.get(rollout_id)
        if rollout is None:
            return None
        judged = self.controller.judge(state)
        return {**detail(rollout, judged.get(rollout.id), **page), "controller": self._controller()}

    def _controller(self) -> dict[str, Any]:
        return {
            "running": self.stepping,
            "intervalSeconds": self.interval,
            "lastError": self.last_error,
        }

    # --- actions ----------------------------------------------------------------------------

    def act(self, rollout_id: str, action: str, *, actor: str, reason: str = "") -> Rollout:
        """Record ``action`` by ``actor``; the loop carries it out at once. Raises
        RolloutActionError, GitTransportError, RolloutStateError, RolloutStateMovedError."""
        with self._lock:
            recorder = Controller(
                sharded=ShardedStore.of(self.rollouts.store), clock=self.controller.clock
            )
            rollout = recorder.act(rollout_id, action, actor=actor, reason=reason)
            self._state = None
        self.poke()
        return rollout

    # --- the loop ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.stepping:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def poke(self) -> None:
        """Step soon (an action was recorded, the status moved)."""
        self._wake.set()

    def tick(self) -> None:
        """One controller step; a failure is reported and retried at the next tick."""
        assert self.signer is not None
        try:
            result = self.controller.step(self.fleet(), signer=self.signer(), refresh=False)
        except FleetletError as exc:
            self.last_error = str(exc)
            self.report(f"rollout step failed: {exc}")
            return
        self.last_error = None
        for rid, event in result.events:
            self.report(f"rollout {rid}: {event.action} by {event.by}: {event.message}")
        if result.publication is not None and result.publication.pushed:
            if self.published is not None:
                self.published(result.publication.pushed)
            self.report(
                f"rollouts: published {len(result.publication.pushed)} cluster branches "
                f"(publication {result.publication.publication})"
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.tick()


__all__ = ["RolloutService"]
