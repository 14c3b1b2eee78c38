"""``fleetlet demo --scenario agent-upgrade``: the demo's agents upgrade themselves through
the fleet (docs/operations.md "Upgrading the agent"). Registered in
:mod:`fleetlet.demo.scenarios`.

The demo's agents run as processes, so their "image" is an agent artifact
(:mod:`agent.upgrade.artifact`: the agent's code and its version) pushed to the demo's
registry and pinned by digest in ``fleet.yaml``'s ``agent:``. Four are built from this checkout:

- ``v1`` and ``v2``: the agent as it is, versions ``<version>+demo.1`` and ``+demo.2``;
- ``broken-start``: an image built without one of its dependencies: it cannot start;
- ``broken-check``: an image whose verifier refuses every publication: it starts, and fails its
  self-check (it cannot verify the set the cluster runs).

Then: ``agent: {image: v1}`` without a rollout (every store's agent moves from the checkout to
v1 at once), ``v2`` with a rollout strategy (the canary store, then the production stores: two
waves, each store's new agent proving itself before the old one stops acting), and each broken
image with the same strategy: the canary's agent rolls it back, its status says RolledBack, and
the hub halts the rollout after the canary wave and publishes v2 back there. Through all of it
no bundle is applied again (their newest runs stay what they were) and every installation
stays Ready.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

import yaml

from agent import __version__
from agent.upgrade import AGENT_ENTRY
from agent.upgrade.artifact import pack
from fleetlet.demo.examples import CANARY, REPO_ROOT
from fleetlet.demo.realenv import DemoError, say

if TYPE_CHECKING:
    from fleetlet.demo.environment import Demo

REPOSITORY = "fleetlet/agent"
STRATEGY = {
    "waves": [
        {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
        {"name": "production"},
    ],
    "maxFailures": 0,
    "soakTime": "5s",
    "progressDeadline": "3m",
    "onFailure": "revert",
}
BROKEN_START = "import fleetlet_dependency_left_out_of_this_build  # noqa: F401\n"
BROKEN_CHECK = """

def verify_publication(**_kwargs: object) -> object:  # this build's verifier is broken
    raise ValueError("this build refuses every publication")
"""


def build_images(demo: Demo) -> dict[str, str]:
    """Name -> digest of the four agent images, pushed to the demo's registry."""
    env = demo.env
    client = env.oci.OciClient(host=demo.registry.host)
    root = demo.workdir / "agent-images"
    shutil.rmtree(root, ignore_errors=True)
    digests = {}
    for name in ("v1", "v2", "broken-start", "broken-check"):
        number = {"v1": 1, "v2": 2, "broken-start": 3, "broken-check": 4}[name]
        tree = pack(REPO_ROOT, root / name, version=f"{__version__}+demo.{number}")
        if name == "broken-start":
            init = tree / "agent" / "__init__.py"
            init.write_text(BROKEN_START + init.read_text())
        if name == "broken-check":
            with (tree / "agent" / "verify" / "publication.py").open("a") as handle:
                handle.write(BROKEN_CHECK)
        pushed = env.oci.push_bundle(client, REPOSITORY, tree, tag=name)
        digests[name] = pushed.digest
    return digests


def run(demo: Demo) -> None:
    """The scenario (see the module docstring). Raises DemoError."""
    images = build_images(demo)
    where = f"{demo.registry.host}/{REPOSITORY}"
    say(
        "scenario agent-upgrade: agent images pushed to the registry: "
        + ", ".join(f"{n} {d[:19]}" for n, d in images.items())
    )
    runs_before = _newest_runs(demo)

    def declare(name: str, rollout: dict[str, Any] | None) -> None:
        path = demo.fleet / "fleet.yaml"
        settings = yaml.safe_load(path.read_text())
        settings["agent"] = {"image": f"{where}@{images[name]}"}
        if rollout is not None:
            settings["agent"]["rollout"] = rollout
        path.write_text(yaml.safe_dump(settings, sort_keys=False))
        demo.commit(f"the agent: image {name}")
        demo.publish()

    def running(image: str, clusters: Any) -> Any:
        def pending() -> str | None:
            for cluster in clusters:
                item = demo.installation(cluster, AGENT_ENTRY)
                applied = (item.get("appliedRevision") or {}).get("sources") or []
                if item["state"] != "Ready" or applied != [images[image]]:
                    return f"{cluster}'s agent is {item['state']} ({_said(item)})"
            return None

        return pending

    say("scenario agent-upgrade: fleet.yaml declares agent v1 (no rollout): every store at once")
    declare("v1", None)
    demo.wait_for(running("v1", demo.clusters), "every store's agent on v1")

    say("scenario agent-upgrade: agent v2 with a rollout strategy: the canary, then the rest")
    declare("v2", STRATEGY)
    rollout_id = _current_rollout(demo)["id"]

    def completed() -> str | None:
        found = _rollout(demo, rollout_id)
        return None if found["status"] == "Completed" else f"rollout is {found['status']}"

    demo.wait_for(completed, "agent v2 on the canary, then on the production stores")
    demo.wait_for(running("v2", demo.clusters), "every store's agent on v2")
    print(f"\n$ fleetlet hub rollout status {rollout_id}", flush=True)
    print(demo.fleetlet("hub", "rollout", "status", rollout_id, *demo.hub_args()), flush=True)

    for broken in ("broken-start", "broken-check"):
        say(f"scenario agent-upgrade: agent image {broken} with the same strategy")
        declare(broken, STRATEGY)
        broken_id = _current_rollout(demo)["id"]

        def reverted(broken_id: str = broken_id) -> str | None:
            found = _rollout(demo, broken_id)
            if found["status"] != "Reverted":
                return f"rollout {broken_id} is {found['status']}"
            return None

        demo.wait_for(reverted, f"{CANARY} to roll {broken} back and the hub to revert it")
        demo.wait_for(running("v2", demo.clusters), f"every store's agent on v2 after {broken}")
        print(f"\n$ fleetlet hub rollout status {broken_id}", flush=True)
        print(demo.fleetlet("hub", "rollout", "status", broken_id, *demo.hub_args()), flush=True)
        say(f"{CANARY}'s agent after {broken}: {_said(demo.installation(CANARY, AGENT_ENTRY))}")
    if (after := _newest_runs(demo)) != runs_before:
        moved = sorted(k for k in after if after[k] != runs_before.get(k))
        raise DemoError(f"bundles applied again during the agent upgrades: {moved}")
    missing = demo.all_ready()
    if missing is not None:
        raise DemoError(f"an installation is disturbed after the agent upgrades: {missing}")
    versions = ", ".join(
        f"{c} {demo.api_get(f'/clusters/{c}').get('agentVersion')}" for c in sorted(demo.clusters)
    )
    print(
        demo.summary(
            f"Scenario agent-upgrade: agent v2 rolled out in two waves ({versions}); "
            f"broken-start and broken-check halted on {CANARY}, rolled back there by the agent "
            "that still ran and reverted by the hub; no bundle applied again"
        ),
        flush=True,
    )


def _rollout(demo: Demo, rollout_id: str) -> dict[str, Any]:
    found: dict[str, Any] = demo.api_get(f"/rollouts/{rollout_id}")
    return found


def _current_rollout(demo: Demo) -> dict[str, Any]:
    for item in demo.api_get("/rollouts")["items"]:
        if item["group"] == AGENT_ENTRY and item["status"] != "Superseded":
            found: dict[str, Any] = item
            return found
    raise DemoError(f"no rollout of group {AGENT_ENTRY} started")


def _said(item: dict[str, Any]) -> str:
    ready: dict[str, Any] = next(
        (c for c in item.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    return f"{ready.get('reason')}: {ready.get('message')}"


def _newest_runs(demo: Demo) -> dict[tuple[str, str], str | None]:
    """(cluster, bundle) -> the id of its newest run: a bundle applied again has a new one."""
    out = {}
    for cluster, bundle in demo.expected:
        runs = demo.installation(cluster, bundle).get("runs") or []
        out[(cluster, bundle)] = runs[0].get("id") if runs else None
    return out


__all__ = ["build_images", "run"]
