"""The agent upgrading itself through the fleet (issue #30, second half).

The fast tests: ``fleet.yaml``'s ``agent:`` becomes one signed entry of every set, with the
group's rollout strategy; bad declarations and bundles taking the reserved name are refused
with one line naming the field; the agent takes the entry off the set it renders and keeps
what it asks for, and reports it in the words the hub's rollout verdicts read.

The slow one (long tier) runs ``fleetlet demo --scenario agent-upgrade`` as a user would: the
agents move from the checkout to image v1, v2 rolls out in two waves, and a broken image that
cannot start and one that fails its self-check are each halted after the canary, rolled back
there by the agent that still ran and reverted by the hub, with no bundle applied again.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.api import load_set, to_dict
from agent.upgrade import AGENT_ENTRY, AGENT_FORMAT
from agent.upgrade.artifact import MANIFEST, InvalidAgentImageError, pack
from agent.upgrade.deployment import CRD_NAMES, read_release
from agent.upgrade.desired import Desired, Record, agent_report, take_agent_entry
from hub.errors import FleetRepoError
from hub.fleet.agent import with_agent
from hub.fleet.load import load_fleet
from hub.fleet.render import plan_clusters
from hub.publish.compose import SetComposer
from hub.rollout.evaluate import Installation, Observation, judge
from hub.rollout.state import Member
from hub.status.document import installation_state
from tests.test_demo import CANARY, CLUSTERS, demo_command, left_running, ready_states, summary
from tests.test_hub_fleet import write_fleet

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "registry.example/fleetlet/agent@sha256:" + "a" * 64
NEWER = "sha256:" + "b" * 64
BUNDLE = {
    "name": "web",
    "sources": [{"kind": "image", "uri": "registry.example/web", "digest": "sha256:" + "c" * 64}],
    "targets": [{"clusterSelector": {}}],
}
CLUSTER_LIST = [
    {"name": "canary-1", "labels": {"tier": "canary"}},
    {"name": "store-1", "labels": {"tier": "production"}},
]
STRATEGY = {
    "waves": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
        {"name": "production"},
    ],
    "onFailure": "revert",
}


def fleet_with(tmp: Path, agent: object, bundles: list[dict[str, object]] | None = None) -> Path:
    settings = {"apiVersion": "fleetlet.io/v1alpha1", "kind": "Fleet", "agent": agent}
    return write_fleet(tmp, clusters=CLUSTER_LIST, bundles=bundles or [BUNDLE], settings=settings)


def test_the_agent_image_is_an_entry_of_every_set_with_its_rollout(tmp_path: Path) -> None:
    fleet = with_agent(load_fleet(fleet_with(tmp_path, {"image": IMAGE, "rollout": STRATEGY})))
    assert [w.name for w in fleet.rollouts[AGENT_ENTRY].waves] == ["canary", "production"]
    plans = plan_clusters(fleet, {s: s.ref for b in fleet.bundles for s in b.all_sources})
    now = datetime(2026, 11, 27, tzinfo=UTC)
    composer = SetComposer(
        issued_at=now,
        expires_at=now + timedelta(days=7),
        source_repo="https://fleet.example.invalid/f.git",
        source_commit="ab" * 20,
    )
    for name in ("canary-1", "store-1"):
        signed = load_set(composer.set_bytes(plans[name], 7), origin=name)
        entry = next(e for e in signed.bundle_deployments if e.name == AGENT_ENTRY)
        assert (entry.group, entry.spec.format) == (AGENT_ENTRY, AGENT_FORMAT)
        assert [(s.kind, s.uri, s.digest) for s in entry.spec.sources] == [
            ("image", "registry.example/fleetlet/agent", "sha256:" + "a" * 64)
        ]
        # The agent takes it off before anything renders: the bundles are what they were.
        rest, desired = take_agent_entry(signed, None)
        assert [e.name for e in rest.bundle_deployments] == ["web"]
        assert AGENT_ENTRY not in rest.groups
        assert desired == Desired(
            uri="registry.example/fleetlet/agent", digest="sha256:" + "a" * 64, serial=7, since=7
        )
        # A later set with the same image keeps when it was first asked for.
        later = take_agent_entry(signed, Desired(desired.uri, desired.digest, 5, 3))[1]
        assert later is not None and (later.serial, later.since) == (7, 3)


def test_a_fleet_without_agent_is_unchanged(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, clusters=CLUSTER_LIST, bundles=[BUNDLE])
    loaded = load_fleet(path)
    assert with_agent(loaded) is loaded


@pytest.mark.parametrize(
    ("agent", "bundles", "said"),
    [
        ("registry/agent:v1", None, "fleet.yaml: agent: expected a mapping"),
        ({"image": "registry/agent@sha256:12"}, None, "fleet.yaml: agent.image: expected"),
        ({"image": IMAGE, "version": 2}, None, "fleet.yaml: agent.version: expected one of"),
        ({"image": IMAGE, "rollout": {"waves": 3}}, None, "agent.rollout.waves"),
        (
            {"image": IMAGE},
            [{**BUNDLE, "name": AGENT_ENTRY}],
            f"bundles/{AGENT_ENTRY}.yaml: name/group: expected a name other than",
        ),
    ],
)
def test_bad_agent_declarations_are_refused_naming_the_field(
    tmp_path: Path, agent: object, bundles: list[dict[str, object]] | None, said: str
) -> None:
    with pytest.raises(FleetRepoError) as caught:
        with_agent(load_fleet(fleet_with(tmp_path, agent, bundles)))
    assert said in str(caught.value)


def test_the_agent_report_reads_as_the_rollout_verdicts_expect() -> None:
    """Running the wanted image: passed; a candidate rolled back: failed, with the serial."""
    now = datetime(2026, 11, 27, tzinfo=UTC)
    released = int(now.timestamp()) - 10
    member = Member(wave=0, previous="p", target="t", phase="released", serial=8, since=released)
    wanted = Desired(uri="registry.example/fleetlet/agent", digest=NEWER, serial=9, since=8)

    def verdict(record: Record) -> str:
        report = agent_report(wanted, record, now)
        assert report is not None
        item = to_dict(report)
        applied = (item.get("appliedRevision") or {}).get("serial", 0)
        run = (item.get("runs") or [{}])[0].get("serial", 0)
        seen = Observation(
            heartbeat=now,
            stale=False,
            accepted=9,
            installations={
                AGENT_ENTRY: Installation(installation_state(item, stale=False), applied, run)
            },
        )
        found = judge(member, seen, (AGENT_ENTRY,), now, timedelta(minutes=5))
        return f"{found.verdict}: {found.reason}"

    assert verdict(Record(running=NEWER)).startswith("passed")
    failed = Record(
        running="sha256:" + "a" * 64,
        attempt=NEWER,
        attempt_since=8,
        attempt_serial=9,
        state="Failed",
        reason="CannotStart",
        message="the candidate exited (code 1) before its self-check",
    )
    assert verdict(failed) == f"failed: {AGENT_ENTRY}: serial 9 failed and was RolledBack"
    # Reverted: the previous image is wanted again, and runs; the attempt stays as history.
    back = Desired(uri=wanted.uri, digest=failed.running, serial=10, since=10)
    report = agent_report(back, failed, now)
    assert report is not None and report.conditions[0].status == "True"
    assert "was rolled back (CannotStart: the candidate exited" in report.conditions[0].message
    assert [(r.result, r.serial) for r in report.runs] == [("RolledBack", 9)]
    assert installation_state(to_dict(report), stale=False, accepted=10) == "Ready"
    progressing = Record(running="sha256:" + "a" * 64, attempt=NEWER, attempt_since=8)
    assert verdict(progressing).startswith("pending")


RELEASE_IMAGE = "registry.example/fleetlet/agent@sha256:" + "d" * 64


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"image": "registry.example/fleetlet/agent:1.4"}, "image: expected the container image"),
        ({"image": None}, "image: expected the container image"),
        ({"crds": {"a": 1}}, "crds: expected a list of CustomResourceDefinitions"),
        (
            {"crds": [{"kind": "CustomResourceDefinition", "metadata": {"name": "x.example"}}]},
            "crds[x.example]: expected one of fleetlet's CRDs",
        ),
        ({"rbac": {"clusterRole": [{"resources": ["pods"]}]}}, "rbac.clusterRole: expected"),
        ({"rbac": ["rules"]}, "rbac: expected an object"),
    ],
)
def test_a_release_for_pods_is_read_and_bad_ones_are_refused_naming_the_key(
    tmp_path: Path, change: dict[str, object], said: str
) -> None:
    """``fleetlet-agent.json`` of a release (``pack(image=...)``): what an agent in a pod reads
    (the container image, fleetlet's CRDs, its role rules); anything else is one line naming
    the artifact and the key."""
    tree = pack(ROOT, tmp_path / "release", version="1.4.0", image=RELEASE_IMAGE)
    release = read_release(tree, "registry.example/release@sha256:" + "e" * 64)
    assert (release.version, release.image) == ("1.4.0", RELEASE_IMAGE)
    assert sorted(c["metadata"]["name"] for c in release.crds) == sorted(CRD_NAMES)
    assert release.cluster_rules and release.role_rules
    manifest = json.loads((tree / MANIFEST).read_text())
    (tree / MANIFEST).write_text(json.dumps({**manifest, **change}))
    with pytest.raises(InvalidAgentImageError) as caught:
        read_release(tree, "registry.example/release@sha256:" + "e" * 64)
    message = str(caught.value)
    assert said in message and len(message.splitlines()) == 1
    assert message.startswith("agent image registry.example/release@sha256:eeee")


@pytest.mark.slow
def test_the_demo_upgrades_its_agents_in_waves_and_reverts_broken_images(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    done = subprocess.run(
        demo_command(workdir, "--scenario", "agent-upgrade", "--exit-when-ready"),
        capture_output=True,
        text=True,
        timeout=2400,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    good = re.search(r"^rollout (fleetlet-agent-\S+): Completed", out, re.M)
    assert good is not None, out
    for broken, reason in (("broken-start", "CannotStart"), ("broken-check", "SelfCheckFailed")):
        said = re.search(rf"^\[demo\] {CANARY}'s agent after {broken}: (.*)$", done.stderr, re.M)
        assert said is not None, done.stderr[-4000:]
        assert "acts in this cluster; the last upgrade, to sha256:" in said.group(1)
        assert f"was rolled back ({reason}: " in said.group(1)
    assert len(re.findall(r"^rollout (fleetlet-agent-\S+): Reverted", out, re.M)) == 2, out
    assert f"  {CANARY}: {AGENT_ENTRY}: serial" in out
    rows = summary(out, "Scenario agent-upgrade:")
    assert {k: v[1] for k, v in rows.items() if k[1] != AGENT_ENTRY} == ready_states()
    for cluster in CLUSTERS:
        assert rows[(cluster, AGENT_ENTRY)][1] == "Ready", rows
        assert f"{cluster} 0.1.0+demo.2" in out
    assert left_running(workdir) == []
