"""``fleetlet explain CLUSTER [BUNDLE]``: why a cluster is not running the latest, from the
status repository and the rollout state in git (``--repo``, ``--cluster-repo``) and from the
hub API (``GET /api/v1/explain/{cluster}``), which answer the same.

A fleet of six clusters on a real git daemon, published with ``hub publish`` signed by the
mini Sigstore; the agents are simulated (:mod:`tests.rolloutsim`), and two of them report what
real agents report when a group waits for an approval and when it waits for a dependency.
Version 2 of ``web`` starts a rollout whose first wave is the two canaries."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from hub.api.tokens import add_token
from tests.realenv.hubserver import serving_hub
from tests.realenv.sigstore import MiniSigstore
from tests.rolloutsim import (
    Agent,
    SimulatedAgents,
    digest_of,
    fleetlet,
    inventory,
    ok,
    signing_args,
    sim_repos,
    web_bundle,
)
from tests.statusfleet import bundle_in
from tests.test_hub_fleet import write_fleet

STRATEGY = {
    "waves": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
        {"name": "rest"},
    ],
    "soakTime": "1h",
}
REQUEST = "web-7d2f1"


class ReportingAgents(SimulatedAgents):
    """Simulated agents; ``edits[cluster]`` changes what that cluster's agent reports."""

    edits: dict[str, Callable[[dict[str, Any]], None]]

    def document(self, cluster: str, agent: Agent, now: datetime) -> dict[str, Any]:
        document = super().document(cluster, agent, now)
        edit = getattr(self, "edits", {}).get(cluster)
        if edit is not None:
            edit(document)
        return document


def ready(document: dict[str, Any], bundle: str, status: str, reason: str, message: str) -> None:
    (condition,) = (c for c in document["bundles"][bundle]["conditions"] if c["type"] == "Ready")
    condition.update(status=status, reason=reason, message=message)


def awaiting_approval(document: dict[str, Any]) -> None:
    """What an agent reports while the group's BundleDeploymentRequest is pending."""
    ready(document, "web", "True", "AwaitingApproval", f"waiting for request {REQUEST}")
    document["requests"] = [
        {
            "name": REQUEST,
            "group": "web",
            "serial": document["lastAcceptedSerial"],
            "bundles": ["web"],
            "state": "Pending",
            "createdAt": "2026-11-27T04:00:00Z",
            "preview": {"source": "live", "changed": 1, "findings": 1},
        }
    ]


def waiting_for_base(document: dict[str, Any]) -> None:
    """What an agent reports when web's group depends on base, whose move failed."""
    # The agent's own words (agent/reconcile/group.py).
    ready(
        document, "web", "Unknown", "WaitingForDependency",
        "waiting for group(s) base to be healthy",
    )  # fmt: skip
    base = bundle_in("Degraded", document["cluster"], "base", serial=2)
    base["group"] = "base"
    document["bundles"]["base"] = base


def test_explain_names_an_approval_a_dependency_and_a_wave_not_reached(
    git_server_factory: Any, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    git = git_server_factory("daemon")
    settings, status_path = sim_repos(git, mini_sigstore.issuer)
    repo, status_repo = settings["shards"]["repo"], settings["shards"]["statusRepo"]
    clusters = inventory(6, canaries=2)
    fleet = write_fleet(
        tmp_path / "fleet", clusters=clusters, bundles=[web_bundle(digest_of(1))], settings=settings
    )
    signing = signing_args(mini_sigstore, tmp_path)
    publish = ["hub", "publish", str(fleet), *signing, "--cache-dir", str(tmp_path / "ci")]
    ok(*publish)
    agents = ReportingAgents(cluster_repo=repo, status_repo=status_path, workdir=tmp_path)
    agents.tick()
    write_fleet(
        fleet,
        clusters=clusters,
        bundles=[web_bundle(digest_of(2), rollout=STRATEGY)],
        settings=settings,
    )
    (created, _started) = ok(*publish)["rollouts"]
    rid = created["rollout"]
    agents.edits = {"store-0": awaiting_approval, "store-1": waiting_for_base}
    agents.tick()

    source = ["--repo", status_repo, "--cluster-repo", repo, "--stale-after", "1h"]
    source += ["--cache-dir", str(tmp_path / "explain-cache")]

    # A canary whose agent waits for an approver.
    approval = ok("explain", "store-0", *source)
    assert approval["blocked"] is True
    reason = approval["reason"]
    assert (reason["check"], reason["bundle"]) == ("approval", "web")
    assert reason["summary"] == f"group web waits for approval: request {REQUEST}"
    assert f"fleetlet approve {REQUEST}" in reason["unblock"]
    released = next(f for f in approval["findings"] if f["check"] == "rollout")
    assert released["blocking"] is False and "released the new revision" in released["summary"]
    branch = next(f for f in approval["findings"] if f["check"] == "publication")
    assert branch["summary"] == f"its branch in {repo} carries serial 2, which the agent accepted"
    assert approval["publishedSerial"] == 2

    # A canary whose group waits for base, whose own move failed.
    dependency = ok("explain", "store-1", "web", *source)["reason"]
    assert dependency["check"] == "dependency"
    assert dependency["summary"] == (
        "group web waits for group(s) base to be healthy (bundle base is Degraded)"
    )
    (why,) = dependency["details"]
    assert why.startswith("group base: bundle base is Degraded: HealthCheckFailed")
    assert "Deployment base/base not Available" in why
    assert dependency["unblock"] == "fleetlet explain store-1 base"

    # A cluster of the second wave, which the rollout has not reached.
    wave = ok("explain", "store-3", *source)["reason"]
    assert wave["check"] == "rollout"
    assert wave["summary"] == (
        f"rollout {rid} of group web: wave rest (2 of 2) not reached yet (the rollout is at "
        "wave canary)"
    )
    table = fleetlet("explain", "store-3", *source)
    assert table.returncode == 0, table.stderr
    first, *rest = table.stdout.splitlines()
    assert first == wave["summary"]
    assert (
        f"  to unblock: wait for wave canary to settle and soak, or fleetlet hub rollout promote {rid}"
        in rest
    )

    # Without the rollout state, the same cluster reads as up to date, and says what it missed.
    blind = fleetlet("explain", "store-3", *source[:2], "--stale-after", "1h")
    assert blind.returncode == 0, blind.stderr
    assert blind.stdout.startswith("nothing blocks: all 1 bundles are Ready")
    assert "(rollouts not read: give --cluster-repo" in blind.stdout

    # An agent that reports for a cluster no publication names.
    agents.agents["store-9"] = Agent()
    agents.write(datetime.now(UTC), ["store-9"])
    orphan = ok("explain", "store-9", *source)["reason"]
    assert (orphan["check"], orphan["summary"]) == (
        "publication",
        "cluster store-9 is in no publication: no branch fleetlet/clusters/store-9",
    )

    unknown = fleetlet("explain", "nowhere", *source)
    assert unknown.returncode == 1
    assert unknown.stderr.strip().startswith("fleetlet: ")
    assert "unknown cluster 'nowhere'" in unknown.stderr and len(unknown.stderr.splitlines()) == 1
    no_bundle = fleetlet("explain", "store-0", "nothing", *source)
    assert no_bundle.returncode == 1 and "reports no bundle 'nothing'" in no_bundle.stderr

    # The hub answers the same (GET /api/v1/explain/{cluster}, and fleetlet explain --hub).
    tokens = tmp_path / "tokens.yaml"
    reader = add_token(tokens, name="viewer", role="read")
    token_file = tmp_path / "token"
    token_file.write_text(reader)
    workdir = tmp_path / "hub"
    workdir.mkdir()
    extra = ["--tokens", str(tokens), "--fleet", str(fleet)]
    with serving_hub(status_repo, workdir, extra, stale_after="1h") as url:
        headers = {"Authorization": f"Bearer {reader}"}
        for cluster, expected in (("store-0", approval["reason"]), ("store-3", wave)):
            answer = requests.get(f"{url}/api/v1/explain/{cluster}", headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["reason"] == expected
        one = requests.get(
            f"{url}/api/v1/explain/store-1", params={"bundle": "web"}, headers=headers, timeout=30
        ).json()
        assert one["reason"] == dependency
        missing = requests.get(f"{url}/api/v1/explain/nowhere", headers=headers, timeout=30)
        assert missing.status_code == 404
        via_hub = fleetlet(
            "explain", "store-1", "web", "--hub", url, "--token-file", str(token_file)
        )
        assert via_hub.returncode == 0, via_hub.stderr
        assert via_hub.stdout.splitlines()[0] == dependency["summary"]
