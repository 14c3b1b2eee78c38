"""The pure logic of progressive rollouts: the strategy as written in the fleet repo, wave
arithmetic, each cluster's verdict from what its agent reported, and how a rollout moves
(budget, soak, gates, concurrency, the operator's actions). No git, no cluster: fakes are the
inputs (status summaries, the clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.api import BundleDeploymentEntry, BundleDeploymentSpec, from_dict
from agent.errors import FieldProblem
from hub.errors import FleetRepoError
from hub.fleet.load import load_fleet
from hub.rollout.advance import RolloutActionError, act, advance
from hub.rollout.content import Rewriter, RolloutContentError, Variants, variant_of
from hub.rollout.evaluate import (
    ClusterVerdict,
    Evaluation,
    Installation,
    Observation,
    evaluate,
    judge,
)
from hub.rollout.model import NONE, Quantity, Strategy, parse_strategy, strategy_from_dict
from hub.rollout.plan import plan_waves, spread
from hub.rollout.state import Member, Rollout, State, epoch, members_of, stamp
from tests.test_hub_fleet import image_bundle, write_fleet

NOW = datetime(2026, 11, 22, 22, 0, tzinfo=UTC)


def strategy(**raw: Any) -> Strategy:
    problems: list[FieldProblem] = []
    found = parse_strategy({"waves": [{"name": "all"}], **raw}, "rollout", problems)
    assert isinstance(found, Strategy), problems
    return found


# --- the strategy in the fleet repo ------------------------------------------------------------


def test_a_strategy_reads_with_its_defaults_and_round_trips() -> None:
    problems: list[FieldProblem] = []
    found = parse_strategy(
        {
            "waves": [
                {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
                {"size": "25%", "pauseBefore": True},
                {"name": "rest"},
            ],
            "maxFailures": "10%",
            "soakTime": "10m",
            "onFailure": "revert",
        },
        "rollout",
        problems,
    )
    assert isinstance(found, Strategy) and not problems
    assert [w.name for w in found.waves] == ["canary", "wave-2", "rest"]
    assert found.waves[1].size == Quantity(25, True) and found.waves[1].pause_before
    assert found.max_unavailable == Quantity(100, True)
    assert found.progress_deadline == timedelta(minutes=30)
    assert found.soak == timedelta(minutes=10) and found.on_failure == "revert"
    assert strategy_from_dict(found.to_dict(), origin="x") == found
    assert parse_strategy("none", "rollout", problems) == NONE


def test_every_problem_of_a_strategy_is_reported_at_once(tmp_path: Path) -> None:
    bad = {
        "waves": [
            {"name": "canary", "size": 0, "colour": "red"},
            {"name": "canary", "clusterSelector": {"matchLabels": {"tier": 3}}},
            {"name": "remaining", "pauseBefore": "yes"},
        ],
        "maxUnavailable": "0%",
        "maxFailures": -1,
        "soakTime": "soon",
        "progressDeadline": "0s",
        "onFailure": "panic",
        "speed": "fast",
    }
    root = write_fleet(
        tmp_path / "fleet",
        clusters=[{"name": "a", "labels": {}}],
        bundles=[
            image_bundle("web", rollout=bad),
            image_bundle("api", group="web", rollout="none"),
        ],
        settings={"apiVersion": "fleetlet.io/v1alpha1", "kind": "Fleet", "rollout": "none"},
    )
    with pytest.raises(FleetRepoError) as caught:
        load_fleet(root)
    paths = {p.path for p in caught.value.problems}
    assert {
        "fleet.yaml: rollout",
        "bundles/web.yaml: rollout.speed",
        "bundles/web.yaml: rollout.waves[0].size",
        "bundles/web.yaml: rollout.waves[0].colour",
        "bundles/web.yaml: rollout.waves[1].name",
        "bundles/web.yaml: rollout.waves[1].clusterSelector.matchLabels.tier",
        "bundles/web.yaml: rollout.waves[2].name",
        "bundles/web.yaml: rollout.waves[2].pauseBefore",
        "bundles/web.yaml: rollout.maxUnavailable",
        "bundles/web.yaml: rollout.maxFailures",
        "bundles/web.yaml: rollout.soakTime",
        "bundles/web.yaml: rollout.progressDeadline",
        "bundles/web.yaml: rollout.onFailure",
    } <= paths, sorted(paths)


def test_a_group_takes_its_bundles_strategy_else_the_fleet_default(tmp_path: Path) -> None:
    own = {"waves": [{"name": "canary", "size": 1}], "maxFailures": 1}
    fleet_default = {"waves": [{"name": "first", "size": "50%"}]}
    root = write_fleet(
        tmp_path / "fleet",
        clusters=[{"name": "a", "labels": {}}],
        bundles=[
            image_bundle("web", group="shop", rollout=own),
            image_bundle("api", group="shop"),
            image_bundle("metrics"),
            image_bundle("dns", rollout="none"),
        ],
        settings={"apiVersion": "fleetlet.io/v1alpha1", "kind": "Fleet", "rollout": fleet_default},
    )
    fleet = load_fleet(root)
    assert set(fleet.rollouts) == {"shop", "metrics"}
    assert fleet.rollouts["shop"].max_failures == Quantity(1, False)
    assert fleet.rollouts["metrics"].waves[0].name == "first"
    # The field never reaches the BundleDeployment spec.
    assert all("rollout" not in b.spec for b in fleet.bundles)
    # Two bundles of one group with different strategies: refused, naming both files.
    write_fleet(
        root,
        clusters=[{"name": "a", "labels": {}}],
        bundles=[
            image_bundle("web", group="shop", rollout=own),
            image_bundle("api", group="shop", rollout={"waves": [{"name": "x"}]}),
        ],
    )
    with pytest.raises(FleetRepoError) as caught:
        load_fleet(root)
    assert [p.path for p in caught.value.problems] == ["bundles/web.yaml: rollout"]
    assert "bundles/api.yaml" in caught.value.problems[0].expected


# --- wave arithmetic ------------------------------------------------------------------------


def test_waves_take_selectors_counts_and_percentages_of_the_remaining() -> None:
    labels = {f"c{i:03d}": {"tier": "canary" if i < 3 else "prod"} for i in range(100)}
    chosen = strategy(
        waves=[
            {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
            {"name": "two", "size": 2},
            {"name": "tenth", "size": "10%"},
            {"name": "nobody", "clusterSelector": {"matchLabels": {"tier": "lab"}}},
            {"name": "half", "size": "50%", "pauseBefore": True},
        ]
    )
    found = plan_waves(chosen, labels)
    assert [(w.name, len(w.members)) for w in found] == [
        ("canary", 3),
        ("two", 2),
        ("tenth", 10),  # ceil(10% of 95)
        ("nobody", 0),
        ("half", 43),  # ceil(50% of 85)
        ("remaining", 42),
    ]
    assert set(found[0].members) == {"c000", "c001", "c002"}
    every = [n for w in found for n in w.members]
    assert sorted(every) == sorted(labels) and len(every) == len(set(every))
    # Spread, not alphabetical; the same on every hub.
    assert list(found[1].members) == spread([n for n in labels if n >= "c003"])[:2]
    assert plan_waves(chosen, dict(reversed(labels.items()))) == found


def test_a_small_fleet_still_gets_one_cluster_per_percentage_wave() -> None:
    found = plan_waves(strategy(waves=[{"name": "one", "size": "1%"}]), {"a": {}, "b": {}})
    assert [(w.name, len(w.members)) for w in found] == [("one", 1), ("remaining", 1)]


# --- verdicts ---------------------------------------------------------------------------------


def observed(
    state: str = "Ready", *, applied: int = 7, run: int = 7, accepted: int = 7, stale: bool = False
) -> Observation:
    return Observation(
        heartbeat=NOW,
        stale=stale,
        accepted=accepted,
        installations={"web": Installation(state, applied, run)},
    )


RELEASED = Member(
    wave=0, previous="sha256:old", target="sha256:new", phase="released", serial=7, since=epoch(NOW)
)


def verdict(seen: Observation | None, *, later: timedelta = timedelta(0)) -> ClusterVerdict:
    return judge(RELEASED, seen, ("web",), NOW + later, timedelta(minutes=30))


def test_ready_on_the_old_revision_is_not_ready_on_the_new_one() -> None:
    assert verdict(observed()).verdict == "passed"
    assert verdict(observed(applied=9, run=9, accepted=9)).verdict == "passed"
    # Accepted serial 7 but the group has not moved yet: still Ready on serial 6.
    old = verdict(observed(applied=6, run=6, accepted=7))
    assert old.verdict == "pending" and "applied serial 6" in old.reason
    assert verdict(observed(accepted=6, applied=6, run=6)).verdict == "pending"
    assert verdict(observed("Progressing", applied=6, run=7)).verdict == "pending"


def test_failures_count_only_when_they_are_about_the_new_revision() -> None:
    assert verdict(observed("RolledBack", applied=6, run=7)).verdict == "failed"
    assert verdict(observed("Degraded", applied=7, run=7)).verdict == "failed"
    assert verdict(observed("Denied", applied=6, run=6)).verdict == "failed"
    # A roll back of an older serial, reported before the agent took serial 7: not yet.
    assert verdict(observed("RolledBack", applied=5, run=6, accepted=6)).verdict == "pending"
    assert verdict(observed("Degraded", applied=6, run=6, accepted=6)).verdict == "pending"
    assert verdict(observed("Paused", applied=6, run=6)).verdict == "skipped"


def test_silence_counts_as_a_failure_after_the_progress_deadline() -> None:
    for seen in (None, observed(stale=True), observed("AwaitingApproval", applied=6, run=6)):
        assert verdict(seen).verdict == "pending"
        late = verdict(seen, later=timedelta(minutes=31))
        assert late.verdict == "failed" and "progress deadline" in late.reason
    assert verdict(observed(), later=timedelta(days=3)).verdict == "passed"


# --- how a rollout moves --------------------------------------------------------------------


def rollout(waves: list[tuple[str, bool, list[str]]], **raw: Any) -> Rollout:
    states, members = members_of(
        waves,
        {n: "sha256:old" for _, _, names in waves for n in names},
        {n: "sha256:new" for _, _, names in waves for n in names},
    )
    return Rollout(
        id="web-1",
        group="web",
        created_at=stamp(NOW),
        created_by="ci",
        source_repo="r",
        source_commit="c" * 40,
        strategy=strategy(**raw),
        status="Progressing",
        waves=states,
        members=members,
    )


def judged(r: Rollout, **verdicts: str) -> Evaluation:
    """Held members are held; released ones ``pending`` unless given."""
    out = Evaluation()
    for name, member in r.members.items():
        if member.phase == "held":
            out.verdicts[name] = ClusterVerdict("held")
        else:
            out.verdicts[name] = ClusterVerdict(verdicts.get(name, "pending"), "because")
    return out


def release_all(r: Rollout) -> None:
    for member in r.members.values():
        if member.phase == "releasing":
            member.phase = "released"


def test_a_wave_settles_soaks_and_the_next_waits_for_its_promotion() -> None:
    r = rollout([("canary", False, ["a"]), ("rest", True, ["b", "c"])], soakTime="10m")
    advance(r, judged(r), NOW)
    assert r.members["a"].phase == "releasing" and r.members["b"].phase == "held"
    release_all(r)
    advance(r, judged(r, a="passed"), NOW + timedelta(minutes=1))
    assert r.waves[0].settled_at == stamp(NOW + timedelta(minutes=1))
    advance(r, judged(r, a="passed"), NOW + timedelta(minutes=5))
    assert r.status == "Progressing"  # soaking
    advance(r, judged(r, a="passed"), NOW + timedelta(minutes=11))
    assert r.status == "WaitingForPromotion" and r.members["b"].phase == "held"
    with pytest.raises(RolloutActionError):
        act(r, "resume", actor="bob", now=NOW)
    event = act(r, "promote", actor="alice", now=NOW + timedelta(minutes=12), reason="ok")
    assert (event.by, event.action, event.wave) == ("alice", "promoted", "rest")
    events = advance(r, judged(r, a="passed"), NOW + timedelta(minutes=13))
    assert "promoted by alice" in events[-1].message
    assert r.members["b"].phase == r.members["c"].phase == "releasing"
    release_all(r)
    advance(r, judged(r, a="passed", b="passed", c="skipped"), NOW + timedelta(minutes=20))
    assert r.status == "Progressing"  # the last wave soaks too
    advance(r, judged(r, a="passed", b="passed", c="skipped"), NOW + timedelta(minutes=31))
    assert r.status == "Completed"
    with pytest.raises(RolloutActionError):
        act(r, "abort", actor="alice", now=NOW)


def test_a_regression_during_the_soak_starts_it_over() -> None:
    r = rollout([("one", False, ["a"]), ("two", False, ["b"])], soakTime="10m")
    advance(r, judged(r), NOW)
    release_all(r)
    advance(r, judged(r, a="passed"), NOW)
    advance(r, judged(r, a="pending"), NOW + timedelta(minutes=5))
    assert r.waves[0].settled_at is None
    advance(r, judged(r, a="passed"), NOW + timedelta(minutes=6))
    advance(r, judged(r, a="passed"), NOW + timedelta(minutes=12))
    assert r.members["b"].phase == "held"
    advance(r, judged(r, a="passed"), NOW + timedelta(minutes=16))
    assert r.members["b"].phase == "releasing"


def test_the_budget_halts_at_one_failure_more_than_allowed() -> None:
    names = [f"c{i}" for i in range(10)]
    r = rollout([("all", False, names)], maxFailures="20%")  # 2 of 10
    advance(r, judged(r), NOW)
    release_all(r)
    advance(r, judged(r, c0="failed", c1="failed"), NOW)
    assert r.status == "Progressing" and r.halt is None
    advance(r, judged(r, c0="failed", c1="failed", c2="failed"), NOW)
    assert r.status == "Halted" and r.halt is not None
    assert sorted(r.halt.failures) == ["c0", "c1", "c2"]
    assert "more than maxFailures 20% allows (2)" in r.halt.reason
    assert all(m.phase == "released" for m in r.members.values())  # halt: nothing moves
    # Resumed: those three are forgiven; one more failure fits the budget again.
    act(r, "resume", actor="alice", now=NOW)
    advance(r, judged(r, c0="failed", c1="failed", c2="failed", c3="failed"), NOW)
    assert r.status == "Progressing"
    advance(r, judged(r, **{n: "failed" for n in names[:6]}), NOW)
    assert r.status == "Halted"


def test_revert_and_abort_send_the_released_clusters_back() -> None:
    r = rollout([("one", False, ["a", "b"]), ("two", False, ["c"])], onFailure="revert")
    advance(r, judged(r), NOW)
    release_all(r)
    advance(r, judged(r, a="failed"), NOW)
    assert r.status == "Reverted"
    assert {n: m.phase for n, m in r.members.items()} == {
        "a": "reverting",
        "b": "reverting",
        "c": "held",
    }
    r = rollout([("one", False, ["a", "b"]), ("two", False, ["c"])])
    advance(r, judged(r), NOW)
    act(r, "pause", actor="bob", now=NOW)
    release_all(r)
    advance(r, judged(r, a="passed", b="passed"), NOW)
    assert r.members["c"].phase == "held"  # paused: no new cluster gets it
    act(r, "abort", actor="bob", now=NOW, reason="wrong version")
    assert r.status == "Aborted" and r.members["a"].phase == "reverting"
    assert r.events[-1].message.endswith("wrong version")


def test_max_unavailable_releases_a_wave_in_batches() -> None:
    names = [f"c{i}" for i in range(5)]
    r = rollout([("all", False, names)], maxUnavailable=2)
    advance(r, judged(r), NOW)
    moving = [n for n, m in r.members.items() if m.phase == "releasing"]
    assert len(moving) == 2
    release_all(r)
    advance(r, judged(r, **{moving[0]: "passed"}), NOW)
    assert sum(m.phase in ("releasing", "released") for m in r.members.values()) == 3
    # A failed cluster does not block the others (maxFailures counts it, not maxUnavailable).
    release_all(r)
    now_failed = {n: "failed" for n, m in r.members.items() if m.phase == "released"}
    r.strategy = strategy(maxUnavailable=2, maxFailures=5)
    advance(r, judged(r, **now_failed), NOW)
    assert sum(m.phase == "releasing" for m in r.members.values()) == 2


def test_the_state_document_round_trips() -> None:
    r = rollout([("one", False, ["a"]), ("two", True, ["b"])], maxFailures=1)
    advance(r, judged(r), NOW)
    act(r, "promote", actor="alice", now=NOW)
    again = Rollout.from_dict(r.to_dict(), origin="test")
    assert again.to_dict() == r.to_dict()
    assert again.members == r.members and again.strategy == r.strategy
    assert State(rollouts={r.id: r}).latest("web") is r


def test_evaluate_reads_every_member() -> None:
    r = rollout([("one", False, ["a", "b"])])
    advance(r, judged(r), NOW)
    for member in r.members.values():
        member.phase, member.serial, member.since = "released", 7, epoch(NOW)
    seen = {"a": observed(), "b": observed("RolledBack", applied=6, run=7)}
    found = evaluate(r, seen.get, lambda _v: ("web",), NOW)
    assert {n: v.verdict for n, v in found.verdicts.items()} == {"a": "passed", "b": "failed"}


def test_holding_a_group_back_never_makes_a_set_with_a_missing_dependency() -> None:
    def entry(name: str, **spec: Any) -> BundleDeploymentEntry:
        source = {"kind": "image", "uri": "r.example/x", "digest": "sha256:" + "a" * 64}
        return BundleDeploymentEntry(
            name=name, spec=from_dict(BundleDeploymentSpec, {"sources": [source], **spec})
        )

    db = (entry("db"),)
    app = entry("app", dependsOn=["db"])
    variants = Variants()
    variants.add(variant_of(db), db)
    rewriter = Rewriter(variants)
    # The new group db comes with app depending on it: held back, app would lack it.
    with pytest.raises(RolloutContentError, match="group 'app' depends on db"):
        rewriter.replace((app, *db), "db", "", cluster="edge-1")
    entries, groups = rewriter.replace((app,), "db", variant_of(db), cluster="edge-1")
    assert [e.name for e in entries] == ["app", "db"] and groups == ("db", "app")
