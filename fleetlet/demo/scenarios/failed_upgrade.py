"""``fleetlet demo --scenario failed-upgrade``: the canary store gets a broken upgrade of the
``shop`` group (and every store a good upgrade of ``payments-config``); the demo waits for the
canary's group to roll back while the others move on. Registered in
:mod:`fleetlet.demo.scenarios`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from fleetlet.demo.examples import CANARY, bundle_files
from fleetlet.demo.realenv import say

if TYPE_CHECKING:
    from fleetlet.demo.environment import Demo


def run(demo: Demo) -> None:
    """The canary's shop group gets a broken v2 and rolls back; every store gets a good
    payments-config v2."""
    files = bundle_files(demo.fleet)
    backend = yaml.safe_load(files["shop-backend"].read_text())
    source = dict(backend["sources"][0], digest=demo.digests[("shop-backend", "v2")])
    backend["overrides"] = [
        {"clusterSelector": {"matchLabels": {"tier": "canary"}}, "sources": [source]}
    ]
    files["shop-backend"].write_text(yaml.safe_dump(backend, sort_keys=False))
    payments = yaml.safe_load(files["payments-config"].read_text())
    payments["sources"][0]["digest"] = demo.digests[("payments-config", "v2")]
    files["payments-config"].write_text(yaml.safe_dump(payments, sort_keys=False))
    demo.commit("shop-backend v2 to the canary; payments-config v2 everywhere")
    before = {k: demo.installation(*k).get("appliedSerial") for k in demo.expected}
    say(
        f"scenario failed-upgrade: shop-backend v2 (its catalog-api image is broken) to the "
        f"canary {CANARY}, payments-config v2 to every store"
    )
    demo.publish()

    def settled() -> str | None:
        items = demo.installations()
        for (cluster, bundle), _ in demo.expected.items():
            item = items.get((cluster, bundle))
            if item is None:
                return f"{cluster}/{bundle} not reported"
            if cluster == CANARY and bundle in ("shop-backend", "shop-frontend"):
                if item["state"] != "RolledBack":
                    return f"{cluster}/{bundle} is {item['state']}, not RolledBack yet"
            elif bundle == "payments-config" and (
                item["state"] != "Ready" or item.get("appliedSerial") == before[(cluster, bundle)]
            ):
                return f"{cluster}/{bundle} not on the new serial yet"
        return None

    demo.wait_for(settled, "the canary's shop group rolled back and payments-config upgraded")
    detail = demo.installation(CANARY, "shop-backend")
    ready: dict[str, Any] = next(
        (c for c in detail.get("conditions", []) if c.get("type") == "Ready"), {}
    )
    print(
        demo.summary(
            f"Scenario failed-upgrade: the shop group on {CANARY} rolled back "
            f"({ready.get('message', '')[:300]}); payments-config moved on everywhere"
        ),
        flush=True,
    )
