"""``fleetlet hub diff --cluster C``: the preview of what a publication would change, object by
object, in the shape of an approval request, rendered from the content the cluster's branch
pins and the content the fleet would pin (real registry, git server and mini Sigstore; no
cluster needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.kube import KubeClient
from tests.fleetlab import Lab
from tests.realenv.kube import Cluster
from tests.test_approval_flow import Shop

REPO_ROOT = Path(__file__).resolve().parent.parent


def hub_diff(lab: Lab, fleet: Path, tmp_path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", "hub", "diff", str(fleet), "--repo", lab.url,
         "--cache-dir", str(tmp_path / "diff-cache"), "-q", *more],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip


def test_hub_diff_previews_a_cluster_like_an_approval_request(
    lab: Lab, kube_cluster: Cluster, tmp_path: Path
) -> None:
    # Shop only pushes content and writes bundle documents here: no cluster is asked.
    shop = Shop(lab, KubeClient(kubeconfig=str(kube_cluster.kubeconfig)))
    shop.publish(1)
    fleet = lab.fleet_dir(shop.bundles(2, binding=True))

    done = hub_diff(lab, fleet, tmp_path, "--cluster", "edge-1", "-o", "json")
    assert done.returncode == 0, done.stderr
    (cluster,) = json.loads(done.stdout)["clusters"]
    assert cluster["cluster"] == "edge-1" and cluster["status"] == "changed"
    app = cluster["preview"]["groups"]["app"]
    assert app["source"] == "rendered"
    counts = [app.get(k, 0) for k in ("created", "changed", "deleted", "unchanged")]
    assert counts == [1, 2, 0, 0]  # (fields at their default are left out of the JSON)
    by = {(o["kind"], o["name"]): o for o in app["objects"]}
    assert by[("Deployment", "web")]["paths"] == ["spec.template.spec.containers[0].image"]
    assert by[("ConfigMap", "settings")]["paths"] == ["data.value"]
    assert by[("ClusterRoleBinding", shop.binding)]["action"] == "created"
    (finding,) = app["security"]["rbac"]
    assert finding["object"] == f"ClusterRoleBinding {shop.binding}"
    assert "cluster-wide" in finding["details"]
    assert "base" not in cluster["preview"]["groups"]  # nothing of it changes

    table = hub_diff(lab, fleet, tmp_path, "--cluster", "edge-1")
    assert table.returncode == 0, table.stderr
    assert "group app (as an approval request would preview it):" in table.stdout
    assert "Objects (rendered, not live): 1 created, 2 changed, 0 deleted" in table.stdout
    assert "+      - image: example/web:2.0" in table.stdout
    assert f"rbac       {shop.conf}: ClusterRoleBinding {shop.binding} (created)" in table.stdout

    # Without --cluster the fleet-wide diff stays as it was: no content is fetched.
    fleet_wide = hub_diff(lab, fleet, tmp_path, "-o", "json")
    assert fleet_wide.returncode == 0, fleet_wide.stderr
    assert all("preview" not in c for c in json.loads(fleet_wide.stdout)["clusters"])
