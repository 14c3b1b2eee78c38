"""Progressive rollouts over a simulated fleet of 1,000 clusters.

Only the agents are simulated (:mod:`tests.rolloutsim`: each reads its branch and writes its
status document as an agent would); the hub's publish and controller, the git server, the
Sigstore signing and the status aggregation are the real ones. What an operator checks: the
waves have the sizes the strategy says; each step publishes to the clusters it releases and to
no other (the branches of held clusters never move); the rollout halts exactly when one failure
more than ``maxFailures`` is reported, and with ``onFailure: revert`` the clusters that took the
new revision get the previous one back, signed, while the others never see it, not even an
offline cluster when it comes back; a restarted hub (empty caches) resumes where the state in
git says; two hubs stepping at once never step twice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hub.fleet.load import load_fleet
from hub.fleet.shards import fleet_shards
from hub.publish.flow import prepare
from hub.publish.git import BranchStore
from hub.publish.ledger import HEAD_REF, HeadRecord
from hub.publish.shards import ShardedStore
from hub.publish.sign import PublicationSigner
from hub.rollout.controller import Controller, StepReport
from hub.rollout.state import ROLLOUT_REF, Rollout
from hub.status.aggregate import FleetStatus
from tests.realenv.gitserver import GitDaemon
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.rolloutsim import SimulatedAgents, digest_of, inventory, web_bundle
from tests.test_hub_fleet import write_fleet

CLUSTERS = 1000
V1, V2 = digest_of(1), digest_of(2)


@dataclass
class Hub:
    """A hub: its caches, its controller (a new one is a restarted hub)."""

    root: Path
    git: GitDaemon
    sigstore: MiniSigstore
    fleet_dir: Path
    clock: list[datetime]
    generation: int = 0
    controller: Controller = field(init=False)
    store: BranchStore = field(init=False)

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new hub process: new cache directories, nothing in memory."""
        self.generation += 1
        where = self.root / f"hub-{self.generation}"
        self.store = BranchStore(url=self.git.url_for("fleet.git"), cache_dir=where / "branches")
        status = FleetStatus(
            repo_url=self.git.url_for("status.git"),
            cache_dir=where / "status",
            stale_after=timedelta(days=30),  # heartbeats do not age with the test's clock
        )
        self.controller = Controller(
            sharded=ShardedStore.of(self.store), status=status, clock=lambda: self.clock[0]
        )

    def signer(self) -> PublicationSigner:
        return PublicationSigner.from_trust_config(
            trust_config=self.sigstore.trust_config_path, token=self.sigstore.mint_token()
        )

    def publish(self) -> StepReport:
        return self.controller.publish(prepare(self.fleet_dir), signer=self.signer(), actor="ci")

    def step(self) -> StepReport:
        return self.controller.step(load_fleet(self.fleet_dir), signer=self.signer())

    def rollout(self) -> Rollout:
        rollouts = [r for r in self.controller.read().active() if r.group == "web"]
        assert len(rollouts) == 1
        return rollouts[0]


def settings(sigstore: MiniSigstore) -> dict[str, Any]:
    return {
        "name": "sim",
        "repo": "https://fleet.example.invalid/sim.git",
        "signing": {"identity": DEFAULT_IDENTITY, "issuer": sigstore.issuer},
    }


STRATEGY = {
    "waves": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
        {"name": "early", "size": "10%"},
        {"name": "half", "size": "50%", "pauseBefore": True},
    ],
    "maxFailures": 5,
    "onFailure": "halt",
}


@pytest.fixture
def fleet(
    git_server_factory: Any, mini_sigstore: MiniSigstore, tmp_path: Path
) -> Iterator[tuple[Hub, SimulatedAgents]]:
    """1,000 clusters running web v1 (published without a strategy, reported Ready)."""
    git = git_server_factory("daemon")
    git.create_bare("fleet.git")
    status = git.create_bare("status.git")
    fleet_dir = write_fleet(
        tmp_path / "fleet",
        clusters=inventory(CLUSTERS),
        bundles=[web_bundle(V1)],
        settings=settings(mini_sigstore),
    )
    hub = Hub(
        root=tmp_path,
        git=git,
        sigstore=mini_sigstore,
        fleet_dir=fleet_dir,
        clock=[datetime.now(UTC).replace(microsecond=0)],
    )
    report = hub.publish()
    assert report.publication is not None and len(report.publication.pushed) == CLUSTERS
    agents = SimulatedAgents(
        cluster_repo=git.url_for("fleet.git"), status_repo=Path(status), workdir=tmp_path
    )
    agents.tick()
    yield hub, agents
    hub.store.close()


def upgrade(hub: Hub, strategy: dict[str, Any], digest: str = V2) -> None:
    write_fleet(
        hub.fleet_dir,
        clusters=inventory(CLUSTERS),
        bundles=[web_bundle(digest, rollout=strategy)],
        settings=settings(hub.sigstore),
    )


def pushed(report: StepReport) -> set[str]:
    return set(report.publication.pushed) if report.publication else set()


def released(rollout: Rollout, wave: str) -> set[str]:
    index = [w.name for w in rollout.waves].index(wave)
    return set(rollout.in_wave(index))


def test_waves_arithmetic_halting_at_the_budget_and_a_restarted_hub(
    fleet: tuple[Hub, SimulatedAgents],
) -> None:
    hub, agents = fleet
    before = agents.branches()
    upgrade(hub, STRATEGY)
    report = hub.publish()
    rollout = hub.rollout()
    sizes = {w.name: len(rollout.in_wave(i)) for i, w in enumerate(rollout.waves)}
    # 10 canaries; 10% of the 990 left, rounded up; 50% of the 891 left; the rest.
    assert sizes == {"canary": 10, "early": 99, "half": 446, "remaining": 445}
    canaries = released(rollout, "canary")
    assert {c for c in canaries if c < "store-010"} == canaries
    # The publish that started the rollout gave the new revision to the canaries only.
    assert pushed(report) == canaries
    assert [e.action for _, e in report.events] == ["created", "wave-started"]
    assert rollout.created_by == "ci" and rollout.status == "Progressing"

    # The canaries report v2 Ready: the next wave goes out, to its clusters only.
    agents.tick()
    report = hub.step()
    early = released(hub.rollout(), "early")
    assert pushed(report) == early
    branches = agents.branches()
    for cluster, (serial, version) in branches.items():
        moved = cluster in canaries | early
        assert version == (V2 if moved else V1), cluster
        assert (serial == before[cluster][0]) != moved, cluster

    # Five of the early wave fail: within maxFailures 5. The wave settles with them, and the
    # next wave waits for a promotion: nothing is published.
    broken = sorted(early)[:5]
    agents.tick(broken=broken, bad=V2)
    report = hub.step()
    rollout = hub.rollout()
    assert rollout.status == "WaitingForPromotion", rollout.events[-3:]
    assert pushed(report) == set()
    assert sorted(n for n, m in rollout.members.items() if m.phase == "released") == sorted(
        canaries | early
    )

    # A new hub (empty caches) takes over: the state in git says where the rollout is.
    hub.restart()
    promoted = hub.controller.act(rollout.id, "promote", actor="alice", reason="early looks good")
    assert promoted.waves[2].promoted_by == "alice"
    report = hub.step()
    half = released(hub.rollout(), "half")
    assert pushed(report) == half
    # The publication's record names the step and who promoted.
    head = hub.store.fetch_ref(HEAD_REF, hub.store.list_refs()[HEAD_REF]) or ""
    record = HeadRecord.from_bytes(hub.store.read_blob(head, "publication.json") or b"")
    assert record.note is not None
    assert any(
        e["action"] == "wave-started" and "promoted by alice" in e["message"]
        for e in record.note["rollouts"]
    )

    # One more failure (the sixth) halts the rollout: the last wave never gets the revision.
    agents.tick(broken=[*broken, sorted(half)[0]], bad=V2)
    report = hub.step()
    rollout = hub.rollout()
    assert rollout.status == "Halted"
    assert rollout.halt is not None and sorted(rollout.halt.failures) == sorted(
        [*broken, sorted(half)[0]]
    )
    assert "RolledBack" in next(iter(rollout.halt.failures.values()))
    assert pushed(report) == set()
    hub.clock[0] += timedelta(hours=2)
    assert pushed(hub.step()) == set()  # halted: time alone moves nothing
    remaining = released(rollout, "remaining")
    for cluster, (serial, version) in agents.branches().items():
        if cluster in remaining:
            assert (serial, version) == (before[cluster][0], V1), cluster

    # Resumed: the six failures are forgiven, the last wave goes out, and it completes.
    hub.controller.act(rollout.id, "resume", actor="alice")
    report = hub.step()
    assert pushed(report) == remaining
    agents.tick(broken=[*broken, sorted(half)[0]], bad=V2)
    hub.step()
    rollout = hub.rollout()
    assert rollout.status == "Completed", rollout.events[-3:]
    actions = [(e.action, e.by) for e in rollout.events]
    assert ("promoted", "alice") in actions and ("resumed", "alice") in actions
    assert ("halted", "controller") in actions


def test_a_failed_canary_is_reverted_and_no_other_cluster_ever_gets_the_version(
    fleet: tuple[Hub, SimulatedAgents],
) -> None:
    hub, agents = fleet
    before = agents.branches()
    upgrade(hub, {**STRATEGY, "maxFailures": 0, "onFailure": "revert", "progressDeadline": "30m"})
    hub.publish()
    canaries = sorted(released(hub.rollout(), "canary"))
    offline = canaries[0]

    # Nine canaries report v2 Ready; one is offline: pending until the deadline.
    agents.tick(offline=[offline])
    assert pushed(hub.step()) == set()
    assert hub.rollout().status == "Progressing"
    hub.clock[0] += timedelta(minutes=31)
    report = hub.step()
    rollout = hub.rollout()
    assert rollout.status == "Reverted"
    assert rollout.halt is not None and list(rollout.halt.failures) == [offline]
    assert "progress deadline" in rollout.halt.failures[offline]
    # The revert is one signed publication to the canaries, and only to them.
    assert pushed(report) == set(canaries)
    assert all(m.phase == "reverted" for n, m in rollout.members.items() if n in canaries)
    for cluster, (serial, version) in agents.branches().items():
        assert version == V1, cluster
        if cluster not in canaries:
            assert serial == before[cluster][0], cluster

    # The offline canary comes back: its branch holds v1 again, it never runs v2.
    agents.tick()
    assert agents.agents[offline].version == V1
    assert agents.agents[offline].accepted > before[offline][0]
    # Publishing the same fleet again does not start it over: the reverted rollout holds.
    report = hub.publish()
    assert pushed(report) == set()
    assert hub.rollout().status == "Reverted"
    # A fixed revision supersedes it and starts again with the canaries.
    upgrade(hub, {**STRATEGY, "maxFailures": 0, "onFailure": "revert"}, digest=digest_of(3))
    report = hub.publish()
    assert pushed(report) == set(canaries)
    assert hub.rollout().status == "Progressing"


def test_two_hubs_stepping_at_once_start_the_next_wave_once(
    fleet: tuple[Hub, SimulatedAgents], tmp_path: Path
) -> None:
    hub, agents = fleet
    upgrade(hub, STRATEGY)
    hub.publish()
    agents.tick()
    other = Hub(
        root=tmp_path / "other",
        git=hub.git,
        sigstore=hub.sigstore,
        fleet_dir=hub.fleet_dir,
        clock=hub.clock,
    )
    reports: list[StepReport] = []
    threads = [threading.Thread(target=lambda h=h: reports.append(h.step())) for h in (hub, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rollout = hub.rollout()
    started = [e for e in rollout.events if e.action == "wave-started"]
    assert [e.wave for e in started] == ["canary", "early"]
    early = released(rollout, "early")
    assert sorted(len(pushed(r)) for r in reports) == [0, len(early)]
    assert all(rollout.members[n].phase == "released" for n in early)
    state_log = hub.store.list_refs()[ROLLOUT_REF]
    assert state_log == other.store.list_refs()[ROLLOUT_REF]


def test_a_sharded_fleet_rolls_out_and_reverts_across_its_shards(
    git_server_factory: Any, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    """30 clusters in 3 repositories: the canaries (in several shards) get the new revision in
    one publication, the state lives in shard 0, and an abort reverts them in each shard."""
    git = git_server_factory("daemon")
    for shard in range(3):
        git.create_bare(f"fleet-{shard}.git")
    template = git.url_for("fleet-{shard}.git")
    clusters = inventory(30, canaries=6)
    sharded_settings = {**settings(mini_sigstore), "shards": {"count": 3, "repo": template}}
    fleet_dir = write_fleet(
        tmp_path / "fleet", clusters=clusters, bundles=[web_bundle(V1)], settings=sharded_settings
    )
    store = ShardedStore(
        urls={i: template.replace("{shard}", str(i)) for i in range(3)}, cache_dir=tmp_path / "hub"
    )
    controller = Controller(sharded=store)

    def signer() -> PublicationSigner:
        return PublicationSigner.from_trust_config(
            trust_config=mini_sigstore.trust_config_path, token=mini_sigstore.mint_token()
        )

    controller.publish(prepare(fleet_dir), signer=signer())
    write_fleet(
        fleet_dir,
        clusters=clusters,
        bundles=[web_bundle(V2, rollout=STRATEGY)],
        settings=sharded_settings,
    )
    report = controller.publish(prepare(fleet_dir), signer=signer(), actor="ci")
    canaries = {c["name"] for c in clusters if c["labels"]["tier"] == "canary"}
    assert pushed(report) == canaries
    assert report.publication is not None and len(report.publication.shards_pushed) > 1
    homes = fleet_shards(load_fleet(fleet_dir))
    assert len({homes.shard_of(c) for c in canaries}) > 1
    assert ROLLOUT_REF in store.stores[0].list_refs()
    assert all(ROLLOUT_REF not in store.stores[s].list_refs() for s in (1, 2))

    rollout = controller.read().active()[0]
    controller.act(rollout.id, "abort", actor="alice", reason="wrong build")
    report = controller.step(load_fleet(fleet_dir), signer=signer())
    assert pushed(report) == canaries
    after = controller.read().active()[0]
    assert after.status == "Aborted"
    assert {n for n, m in after.members.items() if m.phase == "reverted"} == canaries
    for shard, branches in store.each(lambda _s, st: st.fetch()).items():
        for cluster in branches:
            data = store.stores[shard].read_file(cluster, "set.yaml")
            assert data is not None and V2.removeprefix("sha256:") not in data.decode(), cluster
    store.close()
