"""Agents report the formats they can render; ``hub publish`` refuses to send a bundle to a
cluster whose agent said it cannot render its format (``--force`` overrides). Real agents push
their status to a real git server; the hub reads the status branches."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pygit2

from agent.api.status import STATUS_FILE, ClusterStatus, load_status
from agent.report.push import StatusPusher
from tests.fleetlab import REPO_ROOT, Lab
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed
from tests.test_hub_fleet import write_fleet

PLAIN = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"


def _status_of(lab: Lab, cluster: str) -> ClusterStatus:
    bare = pygit2.Repository(str(lab.git.root / lab.status_name))
    commit = bare.revparse_single(f"refs/heads/fleetlet/status/{cluster}").peel(pygit2.Commit)
    return load_status(bytes(commit.tree[STATUS_FILE].data), origin=cluster)


def _branches(lab: Lab) -> list[str]:
    bare = pygit2.Repository(str(lab.git.root / lab.repo_name))
    return sorted(r for r in bare.references if r.startswith("refs/heads/fleetlet/clusters/"))


def _publish(lab: Lab, fleet: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", "publish", str(fleet), "--repo", lab.url,
         "--status-repo", lab.status_url, "--no-sign", "--cache-dir", str(lab.tmp / "cli-cache"),
         *extra],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=dict(os.environ),
    )  # fmt: skip


def test_publish_refuses_a_format_an_agent_cannot_render_unless_forced(
    lab: Lab, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    lab.clusters.append({"name": "edge-3", "labels": {"tier": "production"}})
    digest = lab.push("plain", {"cm.yaml": PLAIN}, tag="1")
    lab.publish([{"name": lab.name("first"), "sources": [lab.source("plain", digest)]}])
    # edge-1: a real agent; its status document says what it can render.
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")
    agent.tick()
    reported = _status_of(lab, "edge-1")
    assert reported.schema_version == 2
    assert {"plain", "kustomize", "helm", "registry+v1", "jsonnet"} <= set(reported.formats)
    # edge-2: an agent without the jsonnet plugin; edge-3: an older agent (schema 1, no formats).
    now = datetime.now(UTC).replace(microsecond=0)
    for cluster, formats in (("edge-2", ("plain", "helm")), ("edge-3", ())):
        pusher = StatusPusher(
            repo_url=lab.status_url, cluster=cluster, credentials=None,
            workdir=tmp_path / cluster, formats=formats,
        )  # fmt: skip
        pusher.update(ClusterStatus(schema_version=1, cluster=cluster, agent_version="0.0.9",
                                    heartbeat=now, sequence=0))  # fmt: skip
        pusher.push()
    assert _status_of(lab, "edge-3").formats == ()

    web = lab.push("jsonnet", {"main.jsonnet": "[]\n"}, tag="1")
    fleet = write_fleet(
        lab.tmp / "fleet-formats",
        clusters=lab.clusters,
        bundles=[
            {"name": "dash", "sources": [lab.source("jsonnet", web)], "format": "jsonnet",
             "targets": [{"clusterSelector": {}}]},
            {"name": "cfg", "sources": [lab.source("plain", digest)],
             "targets": [{"clusterSelector": {}}]},
        ],
        settings={"name": "lab", "repo": "https://fleet.example.invalid/lab.git"},
    )  # fmt: skip
    before = _branches(lab)

    refused = _publish(lab, fleet)

    assert refused.returncode == 1, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "fleetlet: cluster edge-2 cannot render format 'jsonnet' (bundle dash); its agent "
        "reported: helm, plain. Nothing was published"
    )
    assert "edge-1" not in line and "edge-3" not in line  # can render it / did not report
    assert "--force" in line
    assert _branches(lab) == before  # nothing pushed

    forced = _publish(lab, fleet, "--force")

    assert forced.returncode == 0, forced.stderr
    assert _branches(lab) == [f"refs/heads/fleetlet/clusters/edge-{i}" for i in (1, 2, 3)]
