"""``fleetlet agent run`` while a group's move awaits an approval, against real parts.

- Waiting costs no worker processes: each poll the supervisor compares the resourceVersions
  of the request (and the ApprovalPolicies) the last worker read; poll after poll nothing
  changed and no worker starts. A decision changes the request: the next poll's check sees
  it and one worker moves the group.
- What runs keeps being corrected: an object of the group's running revision edited or
  deleted while the next revision awaits its approval is put back, the target is not
  applied and the request is left as it was (still pending, not rewritten).

Real API server (with deploy/'s ValidatingAdmissionPolicy enforcing who decides), registry,
git server and mini Sigstore; alice decides with ``fleetlet approve`` and her own kubeconfig.
"""

from __future__ import annotations

from pathlib import Path

from agent.kube import KubeClient, ObjectRef
from tests.fleetlab import Lab, live
from tests.realenv.kube import Cluster
from tests.test_approval_flow import Shop, approve, pending, requests
from tests.test_approval_flow import alice as alice  # the fixtures
from tests.test_approval_flow import kube as kube
from tests.test_approval_flow import users as users
from tests.test_approvals import User
from tests.test_approvals import approvals_enforced as approvals_enforced
from tests.test_crds import crds as crds
from tests.test_runner import Running, _wait, agent_run

WORKERS = "fleetlet_agent_worker_runs_total"
CHECKS = "fleetlet_agent_approval_checks_total"


def _workers(agent: Running) -> float:
    return sum(
        agent.metric(WORKERS, job=job, result=result)
        for job in ("tick", "drift")
        for result in ("ok", "failed")
    )


def test_a_group_awaiting_approval_starts_no_worker_until_the_decision_which_moves_it(
    lab: Lab, approvals_enforced: Cluster, kube: KubeClient, alice: User, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    shop = Shop(lab, kube)
    shop.publish(1)
    # No drift checks in this test's time: every worker counted is one a poll started.
    extra = ["--drift-interval", "3600", "--heartbeat", "2"]
    with agent_run(
        lab, approvals_enforced, namespace=namespace, workdir=tmp_path / "a", extra=extra
    ) as agent:
        _wait(lambda: any(r.state == "Pending" for r in requests(kube, namespace)), "a request")
        request = pending(kube, namespace)
        _wait(lambda: agent.metric(CHECKS, result="unchanged") >= 2, "two idle approval checks")
        workers = _workers(agent)
        ticks = agent.metric(WORKERS, job="tick", result="ok")
        checks = agent.metric(CHECKS, result="unchanged")
        polls = agent.metric("fleetlet_agent_polls_total", outcome="unchanged")
        # Poll after poll: one ls-refs and the check, no worker (it was one per poll before).
        _wait(lambda: agent.metric(CHECKS, result="unchanged") >= checks + 5,
              "five more approval checks")  # fmt: skip
        assert agent.metric("fleetlet_agent_polls_total", outcome="unchanged") >= polls + 5
        assert _workers(agent) == workers
        assert shop.running() == (None, None)
        assert shop.ready(shop.web)["reason"] == "AwaitingApproval"
        assert agent.metric(CHECKS, result="changed") == 0

        approve(alice, request.name, "--reason", "go")
        _wait(lambda: shop.on(1), "the group moved")
        # The first check after the decision saw it, and its one worker moved the group.
        _wait(lambda: agent.metric(WORKERS, job="tick", result="ok") > ticks, "its result")
        assert agent.metric(CHECKS, result="changed") == 1
        assert agent.metric(WORKERS, job="tick", result="ok") == ticks + 1
        assert shop.ready(shop.web)["status"] == "True"
        assert shop.ready(shop.conf)["status"] == "True"
        # Nothing awaited any more: no more checks.
        after = agent.metric(CHECKS, result="unchanged")
        moved_polls = agent.metric("fleetlet_agent_polls_total", outcome="unchanged")
        _wait(lambda: agent.metric("fleetlet_agent_polls_total", outcome="unchanged")
              >= moved_polls + 3, "three idle polls")  # fmt: skip
        assert agent.metric(CHECKS, result="unchanged") == after


def test_drift_on_the_running_revision_is_corrected_while_the_next_awaits_approval(
    lab: Lab, approvals_enforced: Cluster, kube: KubeClient, alice: User, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    shop = Shop(lab, kube)
    shop.publish(1)
    extra = ["--drift-interval", "1", "--heartbeat", "2"]
    with agent_run(
        lab, approvals_enforced, namespace=namespace, workdir=tmp_path / "a", extra=extra
    ) as agent:
        _wait(lambda: any(r.state == "Pending" for r in requests(kube, namespace)), "a request")
        approve(alice, pending(kube, namespace).name)
        _wait(lambda: shop.on(1), "serial 1 running")
        shop.publish(2)
        _wait(lambda: any(r.spec.serial == 2 for r in requests(kube, namespace)), "v2's request")
        v2 = pending(kube, namespace)
        _wait(lambda: shop.ready(shop.web)["reason"] == "AwaitingApproval", "awaiting approval")
        assert shop.on(1)

        # Someone edits serial 1's ConfigMap and deletes its Deployment.
        kube.patch(ObjectRef("v1", "ConfigMap", "settings", shop.ns), {"data": {"value": "x"}})
        kube.delete(ObjectRef("apps/v1", "Deployment", "web", shop.ns))
        _wait(lambda: shop.on(1), "serial 1 put back")
        assert agent.metric("fleetlet_agent_drift_checks_total", result="changed") >= 1
        _wait(lambda: agent.metric("fleetlet_agent_drift_corrections_total") >= 1,
              "the correction counted")  # fmt: skip

        # Not moved to the unapproved serial 2, the request untouched, still awaited.
        assert shop.running() == ("example/web:1.0", "v1")
        now = pending(kube, namespace)
        assert (now.name, now.resource_version) == (v2.name, v2.resource_version)
        for bundle in (shop.web, shop.conf):
            ready = shop.ready(bundle)
            assert (ready["status"], ready["reason"]) == ("False", "AwaitingApproval"), ready
            assert "still running serial 1" in ready["message"]
        bd = live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", shop.conf)
        assert bd is not None and bd["status"]["driftCount"] >= 1
        assert bd["status"]["appliedRevision"]["serial"] == 1

        # Settled: the waiting group's passes write nothing, so drift checks find nothing and
        # start no worker.
        drift = "fleetlet_agent_drift_checks_total"
        settled = agent.metric(drift, result="unchanged")
        _wait(lambda: agent.metric(drift, result="unchanged") >= settled + 2, "idle drift checks")
        workers = _workers(agent)
        settled = agent.metric(drift, result="unchanged")
        _wait(lambda: agent.metric(drift, result="unchanged") >= settled + 3, "three more")
        assert _workers(agent) == workers

        # And the decision still moves it.
        approve(alice, v2.name)
        _wait(lambda: shop.on(2), "serial 2 moved")
