"""Rollouts through the commands and the API, as an operator drives them.

A fleet of 30 clusters on a real git daemon, signed with the mini Sigstore; the agents are
simulated (:mod:`tests.rolloutsim`). First from CI, without a hub: ``fleetlet hub publish``
starts the rollout, ``fleetlet hub rollout step`` moves it, ``promote`` is recorded in git with
``--actor``. Then ``fleetlet hub serve`` with signing runs the controller: the API shows each
wave with its clusters by verdict, actions need an admin token and are recorded with the
token's name, and the hub carries them out by itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import requests
from openapi_spec_validator import validate as validate_spec

from hub.api.tokens import add_token
from tests.realenv.hubserver import serving_hub
from tests.realenv.sigstore import MiniSigstore
from tests.realenv.sigstore.mini import DEFAULT_IDENTITY
from tests.rolloutsim import (
    SimulatedAgents,
    digest_of,
    fleetlet,
    inventory,
    ok,
    signing_args,
    sim_repos,
    until,
    web_bundle,
)
from tests.test_hub_fleet import write_fleet

STRATEGY = {
    "waves": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
        {"name": "rest", "pauseBefore": True},
    ],
    "maxFailures": 1,
}


def test_a_rollout_from_ci_then_from_the_hub(
    git_server_factory: Any, mini_sigstore: MiniSigstore, tmp_path: Path
) -> None:
    git = git_server_factory("daemon")
    settings, status_path = sim_repos(git, mini_sigstore.issuer)
    repo, status_repo = settings["shards"]["repo"], settings["shards"]["statusRepo"]
    clusters = inventory(30, canaries=3)
    fleet = write_fleet(
        tmp_path / "fleet", clusters=clusters, bundles=[web_bundle(digest_of(1))], settings=settings
    )
    signing = signing_args(mini_sigstore, tmp_path)
    publish_cache = ["--cache-dir", str(tmp_path / "ci-publish")]
    cache = ["--cache-dir", str(tmp_path / "ci-rollouts")]
    assert ok("hub", "publish", str(fleet), *signing, *publish_cache)["rollouts"] == []
    agents = SimulatedAgents(cluster_repo=repo, status_repo=status_path, workdir=tmp_path)
    agents.tick()

    # CI: the publish of v2 starts the rollout and gives v2 to the three canaries.
    write_fleet(
        fleet,
        clusters=clusters,
        bundles=[web_bundle(digest_of(2), rollout=STRATEGY)],
        settings=settings,
    )
    published = ok("hub", "publish", str(fleet), *signing, *publish_cache)
    assert [e["action"] for e in published["rollouts"]] == ["created", "wave-started"]
    assert published["rollouts"][0]["by"] == DEFAULT_IDENTITY  # the signer's identity
    rid = published["rollouts"][0]["rollout"]
    assert len(published["pushed"]) == 3
    listed = ok("hub", "rollout", "list", "--fleet", str(fleet), *cache)
    assert [(i["id"], i["status"], i["currentWave"]) for i in listed["items"]] == [
        (rid, "Progressing", "canary")
    ]

    # The canaries report v2 Ready; a step from CI: the next wave waits for a promotion.
    agents.tick()
    stepped = ok("hub", "rollout", "step", str(fleet), *signing, *cache)
    assert stepped["pushed"] == 0 and stepped["rollouts"][0]["status"] == "WaitingForPromotion"
    shown = ok("hub", "rollout", "status", rid, "--fleet", str(fleet), *cache)
    assert [(w["name"], w["counts"]["passed"], w["counts"]["held"]) for w in shown["waves"]] == [
        ("canary", 3, 0),
        ("rest", 0, 27),
    ]
    table = fleetlet("hub", "rollout", "status", rid, "--fleet", str(fleet), *cache)
    assert "WaitingForPromotion" in table.stdout and "pauseBefore" in table.stdout

    # Without a hub, an operator's pause goes to git with who they say they are.
    paused = ok("hub", "rollout", "pause", rid, "--fleet", str(fleet), "--actor", "bob", *cache)
    assert paused["event"]["by"] == "bob" and paused["rollout"]["status"] == "Paused"
    again = fleetlet("hub", "rollout", "pause", rid, "--fleet", str(fleet), *cache)
    assert again.returncode == 1 and "is Paused: cannot pause it" in again.stderr

    # The hub takes over, with signing: it runs the controller.
    tokens = tmp_path / "tokens.yaml"
    admin = add_token(tokens, name="alice", role="admin")
    reader = add_token(tokens, name="viewer", role="read")
    extra = [
        "--tokens", str(tokens),
        "--fleet", str(fleet),
        *signing,
        "--rollout-interval", "1s",
    ]  # fmt: skip
    workdir = tmp_path / "hub"
    workdir.mkdir()
    with serving_hub(status_repo, workdir, extra, stale_after="1h") as url:

        def get(path: str, who: str | None = admin, **params: Any) -> requests.Response:
            headers = {"Authorization": f"Bearer {who}"} if who else {}
            return requests.get(f"{url}/api/v1{path}", headers=headers, params=params, timeout=30)

        def post(path: str, who: str | None = admin, body: Any = None) -> requests.Response:
            headers = {"Authorization": f"Bearer {who}"} if who else {}
            return requests.post(f"{url}/api/v1{path}", headers=headers, json=body, timeout=60)

        document = get("/openapi.json").json()
        validate_spec(document)
        listing = get("/rollouts", who=reader)
        assert listing.status_code == 200
        jsonschema.validate(
            listing.json(),
            {
                **document["paths"]["/api/v1/rollouts"]["get"]["responses"]["200"]["content"][
                    "application/json"
                ]["schema"],
                "components": document["components"],
            },
        )
        assert listing.json()["controller"]["running"] is True
        assert listing.json()["items"][0]["status"] == "Paused"
        assert get(f"/rollouts/{rid}", who=None).status_code == 401
        assert get("/rollouts/nope").status_code == 404

        # Actions: admin tokens only, unknown ones refused, each recorded with the token's name.
        assert post(f"/rollouts/{rid}/resume", who=reader).status_code == 403
        assert post(f"/rollouts/{rid}/resume", who=None).status_code == 401
        assert post(f"/rollouts/{rid}/launch").status_code == 404
        assert post(f"/rollouts/{rid}/promote").status_code == 409  # paused: resume first
        resumed = post(f"/rollouts/{rid}/resume", body={"reason": "canaries fine"})
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["event"]["by"] == "alice"
        promoted = post(f"/rollouts/{rid}/promote", body={"reason": "go"})
        assert promoted.status_code == 200, promoted.text

        # The hub starts the promoted wave by itself, signed, and records who promoted it.
        def started() -> Any:
            found = get(f"/rollouts/{rid}", wave="rest", verdict="pending").json()
            return found if found["members"]["total"] == 27 else None

        detail = until(started, "the rest wave released")
        assert detail["waves"][1]["promotedBy"] == "alice"
        assert {m["phase"] for m in detail["members"]["items"]} == {"released"}
        assert "has not accepted serial" in detail["members"]["items"][0]["reason"]
        agents.tick()
        until(lambda: get(f"/rollouts/{rid}").json()["status"] == "Completed", "completed")
        done = get(f"/rollouts/{rid}").json()
        assert done["counts"]["passed"] == 30
        actions = [(e["action"], e["by"]) for e in done["events"]]
        assert ("paused", "bob") in actions and ("resumed", "alice") in actions
        assert ("promoted", "alice") in actions and ("completed", "controller") in actions
        assert post(f"/rollouts/{rid}/abort").status_code == 409  # nothing left to abort
        # The command line through the hub shows the same.
        env_listed = fleetlet(
            "hub",
            "rollout",
            "list",
            "--hub",
            url,
            "--token-file",
            str(_write(tmp_path / "t", reader)),
            "-o",
            "json",
        )
        assert env_listed.returncode == 0, env_listed.stderr
        assert json.loads(env_listed.stdout)["items"][0]["status"] == "Completed"
    for cluster, (_, version) in agents.branches().items():
        assert version == digest_of(2), cluster


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
