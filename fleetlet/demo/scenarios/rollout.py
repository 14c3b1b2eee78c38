"""``fleetlet demo --scenario rollout``: ``payments-config`` and the ``shop`` group get rollout
strategies (the canary store first): payments-config v2 reaches the canary, is promoted to the
production stores and completes; a broken shop-backend v2 reaches the canary only, and the hub
halts its rollout and publishes the previous version back there (docs/rollouts.md).
Registered in :mod:`fleetlet.demo.scenarios`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from fleetlet.demo.examples import CANARY, OPERATOR, bundle_files
from fleetlet.demo.realenv import DemoError, say

if TYPE_CHECKING:
    from fleetlet.demo.environment import Demo


def run(demo: Demo) -> None:
    """payments-config v2 goes canary first, is promoted to the production stores and
    completes; a broken shop-backend v2 reaches the canary only and is reverted there."""
    strategy = {
        "waves": [
            {"name": "canary", "clusterSelector": {"matchLabels": {"tier": "canary"}}},
            {"name": "production", "pauseBefore": True},
        ],
        "maxFailures": 0,
        "soakTime": "5s",
        "progressDeadline": "5m",
        "onFailure": "revert",
    }
    files = bundle_files(demo.fleet)
    payments = yaml.safe_load(files["payments-config"].read_text())
    payments["sources"][0]["digest"] = demo.digests[("payments-config", "v2")]
    payments["rollout"] = strategy
    files["payments-config"].write_text(yaml.safe_dump(payments, sort_keys=False))
    demo.commit("payments-config v2, rolled out canary first")
    before = {c: demo.installation(c, "payments-config").get("appliedSerial")
              for c in demo.clusters}  # fmt: skip
    say(
        "scenario rollout: payments-config v2 with a rollout strategy (the canary store, "
        "then the production stores once promoted); the hub runs the rollout controller"
    )
    demo.publish()
    payments_id = _rollout_of(demo, "payments-config")["id"]

    def gated() -> str | None:
        found = _rollout(demo, payments_id)
        if found["status"] != "WaitingForPromotion":
            return f"rollout {payments_id} is {found['status']}"
        return None

    demo.wait_for(gated, f"{CANARY} Ready on payments-config v2 and the next wave gated")
    for cluster in demo.clusters:
        if (
            cluster != CANARY
            and demo.installation(cluster, "payments-config").get("appliedSerial")
            != before[cluster]
        ):
            raise DemoError(f"{cluster} got payments-config v2 before its wave")
    print(f"\n$ fleetlet hub rollout status {payments_id}", flush=True)
    print(demo.fleetlet("hub", "rollout", "status", payments_id, *demo.hub_args()), flush=True)
    promoted = demo.fleetlet(
        "hub", "rollout", "promote", payments_id, "--reason", "the canary is fine",
        *demo.hub_args(),
    )  # fmt: skip
    print(f"\n$ fleetlet hub rollout promote {payments_id} --reason ...\n{promoted}", flush=True)

    def completed() -> str | None:
        found = _rollout(demo, payments_id)
        return None if found["status"] == "Completed" else f"rollout is {found['status']}"

    demo.wait_for(completed, "payments-config v2 on every store")

    # A broken shop-backend v2 (its catalog-api image never gets ready), same strategy.
    files = bundle_files(demo.fleet)
    backend = yaml.safe_load(files["shop-backend"].read_text())
    backend["sources"][0]["digest"] = demo.digests[("shop-backend", "v2")]
    backend["rollout"] = strategy
    files["shop-backend"].write_text(yaml.safe_dump(backend, sort_keys=False))
    demo.commit("shop-backend v2, rolled out canary first")
    say("scenario rollout: shop-backend v2 (broken) with the same strategy")
    demo.publish()
    shop_id = _rollout_of(demo, "shop")["id"]

    def reverted() -> str | None:
        found = _rollout(demo, shop_id)
        if found["status"] != "Reverted":
            return f"rollout {shop_id} is {found['status']}"
        counts = found["counts"]
        if counts.get("reverted", 0) < 1:
            return "the previous version not yet back on the canary's branch"
        return None

    demo.wait_for(reverted, f"{CANARY} to fail shop-backend v2 and the hub to revert it")

    def back() -> str | None:
        for bundle in ("shop-backend", "shop-frontend"):
            item = demo.installation(CANARY, bundle)
            if item["state"] != "Ready":
                return f"{CANARY}/{bundle} is {item['state']}"
        return None

    demo.wait_for(back, f"{CANARY} to accept the previous shop version and report it Ready")
    print(f"\n$ fleetlet hub rollout status {shop_id}", flush=True)
    print(demo.fleetlet("hub", "rollout", "status", shop_id, *demo.hub_args()), flush=True)
    print(
        demo.summary(
            f"Scenario rollout: payments-config v2 promoted by {OPERATOR} and completed; "
            f"shop-backend v2 halted on {CANARY} and reverted, never sent to the other stores"
        ),
        flush=True,
    )


def _rollout(demo: Demo, rollout_id: str) -> dict[str, Any]:
    found: dict[str, Any] = demo.api_get(f"/rollouts/{rollout_id}")
    return found


def _rollout_of(demo: Demo, group: str) -> dict[str, Any]:
    for item in demo.api_get("/rollouts")["items"]:
        if item["group"] == group and item["status"] != "Superseded":
            found: dict[str, Any] = item
            return found
    raise DemoError(f"no rollout of group {group} started")
