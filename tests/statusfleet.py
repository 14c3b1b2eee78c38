"""Synthetic fleets for the dashboard: installations in every state, named clusters with labels.

Built on the status-document helpers of ``tests/test_hub_status.py`` (``make_run``,
``make_bundle``, ``make_status``, the documents agents push). Used by the dashboard's browser
tests (small fleets, pushed like agents push) and by ``bench/dashboard.py`` (a realistic fleet
for ``docs/dashboard.png``, and 10,000 clusters written as one pack, as ``bench/hub_status.py``
writes them).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import rfc8785
import yaml

from hub.publish.pack import PackWriter
from tests.test_hub_status import make_bundle, make_run, make_status

AUTHOR = "fleetlet agent <agent@fleetlet.invalid>"
STATUS_PREFIX = "refs/heads/fleetlet/status/"
# The shop of the README: two platform bundles, the shop itself, its metrics; then more.
BUNDLES = (
    "platform-crds",
    "platform-operator",
    "shop-frontend",
    "shop-backend",
    "metrics",
    "logging",
    "ingress",
    "cert-manager",
    "backup",
    "policy",
    "dns",
    "vpn",
    "payments",
    "search",
    "inventory",
    "loyalty",
    "pos-gateway",
    "kiosk",
    "recommendations",
    "gpu-drivers",
)
REGIONS = ("eu", "us", "ap")
INSTALLATION_STATES = ("Ready", "Progressing", "Degraded", "RolledBack", "Paused")


def bundle_in(
    state: str,
    cluster: str,
    bundle: str,
    *,
    outputs: Mapping[str, Any] | None = None,
    serial: int = 3,
    history: bool = True,
) -> dict[str, Any]:
    """A bundle report that the hub sees in ``state`` (any state but Stale, which is the
    cluster's heartbeat). ``outputs`` go on the newest succeeded run; without ``history`` a
    Ready bundle has its newest run only (smaller documents for 10,000 clusters)."""
    ok = make_run(cluster, bundle, serial - 1, 1, outputs=outputs)
    if state == "Ready":
        newest = make_run(cluster, bundle, serial, 1, outputs=outputs)
        return make_bundle([newest, ok] if history else [newest])
    if state == "Degraded":
        failed = make_run(cluster, bundle, serial, 1, result="Failed", operation="upgrade")
        failed["message"] = f"Deployment {bundle}/{bundle} not Available: 0/3 replicas ready"
        failed["failedObject"] = f"apps/v1 Deployment {bundle}/{bundle}"
        return make_bundle([failed, ok], ready=False)
    if state == "RolledBack":
        rolled = make_run(cluster, bundle, serial, 1, result="RolledBack", operation="upgrade")
        rolled["message"] = (
            f"group health check failed (Deployment {bundle}/{bundle} not Available); "
            f"back to serial {serial - 1}"
        )
        rolled["failedObject"] = f"apps/v1 Deployment {bundle}/{bundle}"
        return make_bundle([rolled, ok])
    if state == "Progressing":
        running = make_run(cluster, bundle, serial, 1, result="Running", operation="upgrade")
        running.update(finishedAt=None, failedObject=None, message="applying 14 objects")
        report = make_bundle([running, ok])
        report["conditions"].append(_condition("Progressing", "True", "Applying"))
        return report
    if state == "Paused":
        report = make_bundle([ok])
        report["conditions"].append(_condition("Paused", "True", "PausedByFleet"))
        return report
    if state in ("AwaitingApproval", "Denied"):
        # The group's move waits for (or was refused) an approval: it runs what it ran.
        report = make_bundle([ok])
        report["conditions"] = [
            _condition("Ready", "False", state),
            _condition("Progressing", "True" if state == "AwaitingApproval" else "False", state),
        ]
        return report
    raise ValueError(f"no bundle report for state {state!r}")


def _condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": "2026-11-22T23:01:00Z",
        "observedGeneration": 3,
    }


def cluster_document(
    cluster: str,
    states: Mapping[str, str],
    *,
    stale: bool = False,
    now: datetime | None = None,
    sequence: int = 1,
    outputs: Mapping[str, Mapping[str, Any]] | None = None,
    history: bool = True,
) -> dict[str, Any]:
    """A cluster's status document with one bundle per ``states`` item (bundle -> state);
    ``stale``: the heartbeat is two hours old. ``outputs`` by bundle."""
    now = now or datetime.now(UTC)
    bundles = {
        bundle: bundle_in(
            state, cluster, bundle, outputs=(outputs or {}).get(bundle), history=history
        )
        for bundle, state in states.items()
    }
    beat = now - timedelta(hours=2) if stale else now
    document = make_status(cluster, sequence=sequence, heartbeat=beat, bundles=bundles)
    document["lastAcceptedSerial"] = 3
    return document


@dataclass(frozen=True, slots=True)
class SyntheticCluster:
    name: str
    labels: dict[str, str]
    states: dict[str, str] = field(default_factory=dict)  # bundle -> installation state
    stale: bool = False


def synthetic_fleet(clusters: int, bundles: int = 5, *, seed: int = 7) -> list[SyntheticCluster]:
    """``clusters`` stores (``store-eu-001``...) across regions, with labels ``region``, ``tier``
    and ``channel``; the first ``bundles`` of :data:`BUNDLES`. Mostly Ready; canary clusters
    move first (more Progressing, RolledBack); about 3% of the clusters are stale. The same
    arguments give the same fleet."""
    rng = random.Random(seed)
    width = max(3, len(str(clusters // len(REGIONS) + 1)))
    names = BUNDLES[:bundles]
    fleet = []
    for i in range(clusters):
        region = REGIONS[i % len(REGIONS)]
        name = f"store-{region}-{i // len(REGIONS) + 1:0{width}d}"
        canary = i % 10 == 3
        labels = {
            "region": region,
            "tier": "flagship" if i % 7 == 0 else "store",
            "channel": "canary" if canary else "stable",
        }
        weights = [70, 12, 8, 7, 3] if canary else [93, 2, 2, 1, 2]
        states = {}
        for index, bundle in enumerate(names):
            # The platform and the shop everywhere; other bundles on most clusters.
            if index >= 5 and rng.random() < 0.2:
                continue
            states[bundle] = rng.choices(INSTALLATION_STATES, weights)[0]
        fleet.append(SyntheticCluster(name, labels, states, stale=rng.random() < 0.03))
    return fleet


def write_fleet_dir(path: Path, labels: Mapping[str, Mapping[str, str]]) -> Path:
    """A fleet repo (``fleet.yaml``, ``clusters/``, an empty ``bundles/``) declaring the
    clusters with their labels: what ``hub serve --fleet`` reads."""
    (path / "clusters").mkdir(parents=True, exist_ok=True)
    (path / "bundles").mkdir(exist_ok=True)
    (path / "fleet.yaml").write_text("apiVersion: fleetlet.io/v1alpha1\nkind: Fleet\nname: shop\n")
    entries = [{"name": name, "labels": dict(labels[name])} for name in sorted(labels)]
    (path / "clusters" / "clusters.yaml").write_text(yaml.safe_dump({"clusters": entries}))
    return path


def write_status_repo(repo_path: Path, documents: Mapping[str, Mapping[str, Any]]) -> None:
    """Every cluster's document on its status branch of the bare repository ``repo_path``,
    written as one pack plus ``packed-refs`` (10,000 branches without 10,000 pushes)."""
    pack = PackWriter()
    tips = {}
    stamp = int(datetime.now(UTC).timestamp())
    for cluster, document in documents.items():
        tree = pack.tree({"status.json": pack.blob(rfc8785.dumps(dict(document)))})
        tips[cluster] = pack.commit(
            tree=tree, parents=[], author=AUTHOR, timestamp=stamp, message="status\n"
        )
    pack.write(repo_path)
    lines = ["# pack-refs with: peeled fully-peeled sorted"]
    lines += [f"{tips[c]} {STATUS_PREFIX}{c}" for c in sorted(tips)]
    (repo_path / "packed-refs").write_text("\n".join(lines) + "\n")
