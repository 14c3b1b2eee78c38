"""``fleetlet demo --scenario approval``: ``payments-config`` needs an approval and is upgraded;
the production stores' own ApprovalPolicy approves it automatically, the canary waits for a
person, and the demo shows the request's preview and approves it as that person
(docs/approvals.md). Registered in :mod:`fleetlet.demo.scenarios`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

from fleetlet.demo.examples import CANARY, REPO_ROOT, bundle_files
from fleetlet.demo.realenv import DemoError, say

if TYPE_CHECKING:
    from fleetlet.demo.environment import Demo

APPROVALS = REPO_ROOT / "deploy" / "agent" / "approvals"
AUTO_APPROVER = REPO_ROOT / "deploy" / "agent" / "auto-approver"
APPROVER = "alice"


# The production stores' own rule book: what touches no RBAC, CRD or webhook goes through.
APPROVAL_POLICY = {
    "apiVersion": "fleetlet.io/v1alpha1",
    "kind": "ApprovalPolicy",
    "metadata": {"name": "store-defaults"},
    "spec": {
        "rules": [
            {
                "name": "no-rbac-crds-webhooks",
                "description": "changes that grant nothing and extend no API",
                "expression": "preview.security.rbac.size() == 0 && "
                "preview.security.crds.size() == 0 && preview.security.webhooks.size() == 0",
            }
        ]
    },
}


def run(demo: Demo) -> None:
    """payments-config needs an approval and gets v2: the production stores' ApprovalPolicy
    approves it, the canary waits for alice, who previews and approves it."""
    for name, cluster in demo.clusters.items():
        demo.kubectl_run(cluster, "apply", "--server-side", "-k", str(APPROVALS))
        if name != CANARY:
            demo.kubectl_run(cluster, "apply", "--server-side", "-k", str(AUTO_APPROVER))
            demo.kubectl_stdin(cluster, yaml.safe_dump(APPROVAL_POLICY), "apply", "-f", "-")
    canary = demo.clusters[CANARY]
    alice = canary.mint_user(APPROVER)
    demo.kubectl_run(
        canary, "create", "clusterrolebinding", "alice-approves",
        "--clusterrole=fleetlet-approver", f"--user={APPROVER}",
    )  # fmt: skip
    say(
        f"scenario approval: ValidatingAdmissionPolicy fleetlet-approvals on every store; "
        f"ApprovalPolicy store-defaults on the production stores; {APPROVER} may approve "
        f"on {CANARY}"
    )
    files = bundle_files(demo.fleet)
    payments = yaml.safe_load(files["payments-config"].read_text())
    payments["sources"][0]["digest"] = demo.digests[("payments-config", "v2")]
    payments["approval"] = "manual"
    files["payments-config"].write_text(yaml.safe_dump(payments, sort_keys=False))
    demo.commit("payments-config v2, approval: manual")
    before = {c: demo.installation(c, "payments-config").get("appliedSerial")
              for c in demo.clusters}  # fmt: skip
    demo.publish()

    def asked() -> str | None:
        items = demo.installations()
        for cluster in demo.clusters:
            item = items.get((cluster, "payments-config")) or {}
            state = item.get("state", "not reported")
            if cluster == CANARY:
                if state != "AwaitingApproval":
                    return f"{cluster}/payments-config is {state}, not AwaitingApproval yet"
            elif state != "Ready" or item.get("appliedSerial") == before[cluster]:
                return f"{cluster}/payments-config not approved and upgraded yet"
        return None

    demo.wait_for(asked, "the production stores upgraded, the canary asking for approval")
    request = _pending_request(demo, CANARY, "payments-config")
    preview = demo.fleetlet("preview", request, "--kubeconfig", alice)
    print(f"\n$ fleetlet preview {request}\n{preview}", flush=True)
    approved = demo.fleetlet(
        "approve", request, "--kubeconfig", alice, "--reason", "new gateway endpoint, reviewed"
    )
    print(f"\n$ fleetlet approve {request} --reason ...\n{approved}", flush=True)

    def moved() -> str | None:
        item = demo.installations().get((CANARY, "payments-config"))
        if item is None or item["state"] != "Ready" or item.get("appliedSerial") == before[CANARY]:
            return f"{CANARY}/payments-config not upgraded yet"
        return None

    demo.wait_for(moved, f"{CANARY} to apply the approved request")
    print(
        demo.summary(
            f"Scenario approval: payments-config v2 approved by ApprovalPolicy "
            f"store-defaults on the production stores and by {APPROVER} on {CANARY}"
        ),
        flush=True,
    )


def _pending_request(demo: Demo, cluster: str, bundle: str) -> str:
    for request in demo.installation(cluster, bundle).get("requests", []):
        if request.get("state") == "Pending":
            return str(request["name"])
    raise DemoError(f"{cluster}/{bundle}: no pending request reported")
