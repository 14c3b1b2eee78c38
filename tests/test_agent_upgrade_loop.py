"""The agent-upgrade loop of ``agent run`` is cheap when nothing happens (issue #30, measured).

Against a real API server, the supervisor with its upgrade half (:mod:`agent.upgrade.process`)
as ``agent run`` builds it: it takes the agent's Lease and reads its ConfigMap through the
supervisor's small door (:mod:`agent.runner.objects`), so the ``kubernetes`` package is never
imported; its checks send nothing until a renewal is due (then one PATCH of the Lease) or a new
set was accepted (then one GET of the ConfigMap); and when another agent holds the Lease it
stops acting, and acts again once that Lease expired and it took it back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.kube import KubeClient
from tests.fleetlab import REPO_ROOT, Lab, configmap, live, namespace_manifest
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

SCRIPT = """
import collections, json, sys, time
from fleetlet.cli import build_parser
from agent.assemble import build_supervisor
from agent.cli import settings_from_args
from agent.upgrade.lease import AgentLease
from agent.upgrade.process import Upgrades

args = build_parser(agent_only=True).parse_args(["agent", "run", *FLAGS])
settings = settings_from_args(args)
supervisor = build_supervisor(settings, log_level="error", log_format="text")
sent = collections.Counter()
supervisor.reader.on_request = lambda method: sent.update([method])
upgrades = Upgrades(settings=settings, supervisor=supervisor)
upgrades._take_lease(wait=10)  # as start() does, without its thread: the checks are ours
upgrades.acting.set()
out = {"door": type(upgrades.kube).__name__, "renew_every": upgrades.lease.renew_every}
supervisor.poll()  # the first tick (a worker): a set accepted, a new commit
upgrades._renew_due = time.monotonic() + upgrades.lease.renew_every  # however long that took
sent.clear()
upgrades._check()
out["after_new_set"] = dict(sent)
sent.clear()
for _ in range(50):
    upgrades._check()
out["fifty_idle_checks"] = dict(sent)
upgrades._renew_due = 0.0  # a renewal due
upgrades._check()
out["renewal"] = dict(sent)
sent.clear()

# Another agent takes the Lease (as after this one could not renew it in time).
other = AgentLease(upgrades.kube, settings.namespace, "elsewhere-1")
other.hand_to("elsewhere-1")
upgrades._renew_due = 0.0
upgrades._check()
out["acting_after_takeover"] = upgrades.acting.is_set()
sent.clear()
for _ in range(10):
    upgrades._check()  # not due: nothing
out["lost_idle"] = dict(sent)
# That agent stops renewing: its Lease expires, this one takes it back and acts again.
other.kube.patch(other._ref(), {"spec": {"renewTime": "2020-01-01T00:00:00.000000Z"}})
upgrades._renew_due = 0.0
upgrades._check()
out["acting_after_expiry"] = upgrades.acting.is_set()
out["modules"] = sorted({m.split(".")[0] for m in sys.modules})
out["reconcile"] = sorted(m for m in sys.modules if m.startswith("agent.reconcile"))
print(json.dumps(out))
"""


def test_the_upgrade_loop_renews_its_lease_through_the_small_door_and_reads_only_when_due(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    ns, name = lab.name("loop"), lab.name("cfg")
    files = {"01.yaml": namespace_manifest(ns), "02.yaml": configmap("c", ns, {"v": "1"})}
    lab.publish([{"name": name, "sources": [lab.source("cfg", lab.push("cfg", files, tag="1"))]}])
    flags = lab.agent_args("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("FLAGS", repr(flags))],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["door"] == "ObjectDoor"
    # Nor sigstore (the candidate's self-check runs in a child), oras (pulls are the upgrade's
    # own), nor the libraries of SOPS files (the supervisor opens none).
    heavy = {"kubernetes", "sigstore", "oras", "hub", "cryptography", "pyrage"} & set(
        out["modules"]
    )
    assert not heavy, f"the supervisor with its upgrade loop imported {heavy}"
    # The worker reconciles; the supervisor only reads its settings (agent.settings).
    assert out["reconcile"] == []
    # A new set accepted: the ConfigMap read once (the Lease was renewed when taken).
    assert out["after_new_set"] == {"GET": 1}
    # Fifty checks (over four minutes at production pace) send nothing: no renewal is due.
    assert out["fifty_idle_checks"] == {}
    assert out["renew_every"] == 10.0
    assert out["renewal"] == {"PATCH": 1}
    # Another holder: this agent stops acting, and asks again only when a renewal would be due.
    assert out["acting_after_takeover"] is False
    assert out["lost_idle"] == {}
    assert out["acting_after_expiry"] is True

    lease = live(
        KubeClient(kubeconfig=str(crds.kubeconfig)),
        "coordination.k8s.io/v1",
        "Lease",
        "fleetlet-agent",
        namespace,
    )
    assert lease is not None
    assert lease["spec"]["leaseDurationSeconds"] == 30
    assert lease["spec"]["holderIdentity"] not in ("", "elsewhere-1")
    assert live(KubeClient(kubeconfig=str(crds.kubeconfig)), "v1", "ConfigMap", "c", ns)
