"""``fleetlet import fleet`` of Fleet's ``overlays/`` and kustomize ``targetCustomizations``
(issue #29, item 3): ``tests/assets/fleet-overlays`` (a long bundle path, raw YAML with
overlays chosen per cluster, a kustomize base with per-target dirs) is imported as a user runs
the command, the fleet it wrote is loaded and planned by the hub, and every cluster's bundles
are rendered by the agent's code with the real kustomize: each cluster gets what Fleet's
overlay rules (``internal/helmdeployer/render/patch`` in rancher/fleet) give it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from agent.api import to_dict
from agent.render.formats import render_bundle
from agent.render.plain import RenderRequest
from agent.render.tools import ToolSettings
from tests.fleetlab import REPO_ROOT

EXAMPLE = REPO_ROOT / "tests" / "assets" / "fleet-overlays"
COMMIT = "c0ffee" + "0" * 34
GUESTBOOK = "edge-stores-multi-cluster-examples-multi-cluste-ce5e2"
KUSTOMIZE = "edge-stores-multi-cluster-examples-multi-cluste-4062e"


def _import(out: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", "import", "fleet", str(EXAMPLE), "--out", str(out),
         "--gitrepo", str(EXAMPLE / "gitrepo.yaml"), "--clusters", str(EXAMPLE / "clusters.yaml"),
         "--commit", COMMIT, "-o", "json"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _tree(sources: list[dict[str, Any]], work: Path) -> Path:
    """The bundle's tree as the agent composes it: each source's directory of the checkout at
    its destination."""
    if len(sources) == 1 and "destination" not in sources[0]:
        return EXAMPLE / sources[0]["directory"]
    for source in sources:
        shutil.copytree(EXAMPLE / source["directory"], work / source.get("destination", ""),
                        dirs_exist_ok=True)  # fmt: skip
    return work


def _rendered(
    out: Path, kustomize: Path, work: Path
) -> dict[str, dict[str, dict[tuple[str, str], Any]]]:
    """cluster -> bundle -> (kind, name) -> object, as the agent renders the planned sets."""
    from hub.fleet.load import load_fleet
    from hub.fleet.render import plan_clusters

    fleet = load_fleet(out)
    sources = {s for b in fleet.bundles for s in b.all_sources}
    plans = plan_clusters(fleet, {s: s.ref for s in sources})
    got: dict[str, dict[str, dict[tuple[str, str], Any]]] = {}
    for cluster, plan in plans.items():
        for entry in plan.entries:
            spec = to_dict(entry.spec)
            assert all(source["commit"] == COMMIT for source in spec["sources"])
            options = spec.get("formatOptions") or {}
            objects = render_bundle(
                _tree(spec["sources"], work / f"{cluster}-{entry.name}"),
                format=spec.get("format", "plain"),
                request=RenderRequest(
                    source=entry.name,
                    namespace=options.get("targetNamespace"),
                    options=options,
                    patches=tuple(spec.get("patches") or ()),
                    tools=ToolSettings(kustomize=str(kustomize)),
                ),
            )
            got.setdefault(cluster, {})[entry.name] = {
                (o["kind"], o["metadata"]["name"]): o for o in objects
            }
    return got


def test_overlays_and_kustomize_dirs_convert_into_a_fleet_that_renders_what_fleet_deploys(
    tmp_path: Path, kustomize_binary: Path
) -> None:
    out = tmp_path / "fleet"
    report = _import(out)
    formats = {b["name"]: b["format"] for b in report["bundles"]}
    # The long path's name is Fleet's: cut at 53 characters with a hash of the whole.
    assert formats == {GUESTBOOK: "plain", KUSTOMIZE: "kustomize"}
    assert not [n for n in report["notExpressed"] if "overlays" in n["field"]]
    written = yaml.safe_load((out / "bundles" / f"{GUESTBOOK}.yaml").read_text())
    assert [sorted(o["clusters"]) for o in written["overrides"]] == [["dev-1"], ["test-1"],
                                                                     ["prod-1"]]  # fmt: skip
    assert all(o["patches"] for o in written["overrides"])

    got = _rendered(out, kustomize_binary, tmp_path / "trees")
    base = {c: got[c][GUESTBOOK] for c in ("dev-1", "test-1", "prod-1")}
    # Nothing under overlays/ is deployed as such, anywhere.
    for objects in base.values():
        assert all("overlays" not in str(o.get("metadata")) for o in objects.values())
    # dev (noreplication, quota): the empty file removes the follower Deployment; the
    # follower Service is patched strategically (its selector map merged); the custom
    # resource is merge-patched (null removes, the list is replaced, not merged by name);
    # a JSON patch annotates the frontend Service.
    dev = base["dev-1"]
    assert ("Deployment", "redis-follower") not in dev
    assert dev[("Service", "redis-follower")]["spec"]["selector"] == {"app": "redis",
                                                                      "role": "leader"}  # fmt: skip
    assert dev[("StoreQuota", "guestbook")]["spec"] == {"limits": [{"name": "carts", "max": 10}]}
    assert dev[("Service", "frontend")]["metadata"]["annotations"] == {
        "stores.example.com/quota": "small"
    }
    assert dev[("Deployment", "frontend")]["spec"]["replicas"] == 1
    # test (scale3) and prod (servicelb, scale3).
    assert base["test-1"][("Deployment", "frontend")]["spec"]["replicas"] == 3
    assert "type" not in base["test-1"][("Service", "frontend")]["spec"]
    assert base["test-1"][("Deployment", "redis-follower")]["spec"]["replicas"] == 2
    assert base["prod-1"][("Deployment", "frontend")]["spec"]["replicas"] == 3
    assert base["prod-1"][("Service", "frontend")]["spec"]["type"] == "LoadBalancer"
    assert base["prod-1"][("StoreQuota", "guestbook")]["spec"]["tier"] == "standard"
    # prod's edge overlay adds a file and swaps the follower Service for a headless one: its
    # directory is placed in the tree (one more source) and the base file's Service deleted.
    assert base["prod-1"][("ConfigMap", "store-config")]["data"] == {"region": "edge"}
    assert ("Service", "redis-follower") not in base["prod-1"]
    assert base["prod-1"][("Service", "redis-follower-headless")]["spec"]["clusterIP"] == "None"
    assert set(base["prod-1"]) - {("ConfigMap", "store-config"),
                                  ("Service", "redis-follower-headless")} == set(
        base["test-1"]) - {("Service", "redis-follower")}  # fmt: skip
    assert ("ConfigMap", "store-config") not in base["test-1"]
    prod_sources = written["overrides"][2]["sources"]
    assert [s.get("destination") for s in prod_sources] == [None, "fleet-overlays/edge"]
    assert prod_sources[1]["directory"].endswith("/overlays/edge")
    for objects in base.values():
        assert all(o["metadata"].get("namespace") in (None, "guestbook") for o in objects.values())

    kust = KUSTOMIZE
    assert set(got["dev-1"][kust]) == {("Deployment", "frontend-dev")}
    assert got["prod-1"][kust][("Deployment", "frontend")]["spec"]["replicas"] == 5


def _one_bundle(root: Path, overlay: dict[str, str], base: dict[str, str]) -> Path:
    bundle = root / "app"
    (bundle / "overlays" / "o").mkdir(parents=True)
    for name, text in base.items():
        (bundle / name).write_text(text)
    for name, text in overlay.items():
        (bundle / "overlays" / "o" / name).write_text(text)
    (bundle / "fleet.yaml").write_text(
        "targetCustomizations:\n- name: o\n  clusterName: c1\n  yaml: {overlays: [o]}\n"
    )
    return root


CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {a: b}\n"


def test_an_overlay_without_a_faithful_patch_leaves_the_bundle_out_and_says_why(
    tmp_path: Path,
) -> None:
    from hub.importer.fleet import ImportSettings, import_fleet

    cases = {
        "mixed": ({"extra.yaml": CM % "extra", "cm_patch.yaml": "data: {a: c}\n"},
                  "a patch beside files that add or swap"),
        "same": ({"cm.yaml": (CM % "web") + "---\n" + (CM % "more")},
                 "some of them the same objects"),
        "missing": ({"nothere_patch.yaml": "data: {a: c}\n"}, "no file nothere.yaml to patch"),
    }  # fmt: skip
    for case, (overlay, why) in cases.items():
        root = _one_bundle(tmp_path / case, overlay, {"cm.yaml": CM % "web"})
        result = import_fleet(
            root,
            ImportSettings(name="x", source_url="https://git.example.invalid/x.git",
                           clusters=[{"name": "c1", "labels": {}}]),
        )  # fmt: skip
        assert not result.bundles, case
        (note,) = [n for n in result.notes if n.field == "overlays/"]
        assert note.bundle == "x-app"
        assert note.message.startswith("not converted, not written: overlays/o/"), note.message
        assert why in note.message, (case, note.message)


def test_an_overlay_adding_or_swapping_files_becomes_a_placed_directory(tmp_path: Path) -> None:
    from hub.importer.check import render_problem
    from hub.importer.fleet import ImportSettings, import_fleet

    url = "https://git.example.invalid/x.git"
    root = _one_bundle(tmp_path, {"extra.yaml": CM % "extra", "cm.yaml": CM % "other"},
                       {"cm.yaml": CM % "web", "keep.yaml": CM % "keep"})  # fmt: skip
    result = import_fleet(
        root, ImportSettings(name="x", source_url=url, clusters=[{"name": "c1", "labels": {}}])
    )
    (bundle,) = result.bundles
    (override,) = bundle["overrides"]
    assert override["sources"][1] == {"kind": "git", "uri": url, "branch": "main",
                                      "directory": "app/overlays/o",
                                      "destination": "fleet-overlays/o"}  # fmt: skip
    # Fleet gives c1 keep.yaml, the overlay's cm.yaml (ConfigMap other) and extra.yaml.
    work = tmp_path / "tree"
    for source in override["sources"]:
        shutil.copytree(root / source["directory"], work / source.get("destination", ""),
                        dirs_exist_ok=True)  # fmt: skip
    objects = render_bundle(
        work,
        format="plain",
        request=RenderRequest(source="x-app", options={}, patches=tuple(override["patches"])),
    )
    assert sorted(o["metadata"]["name"] for o in objects) == ["extra", "keep", "other"]
    assert render_problem(bundle, root, url) is None


def test_a_bundle_level_overlay_adding_a_file_places_it_for_every_cluster(tmp_path: Path) -> None:
    from hub.importer.fleet import ImportSettings, import_fleet, write_fleet_repo

    url = "https://git.example.invalid/x.git"
    root = _one_bundle(tmp_path / "src", {"extra.yaml": CM % "extra"}, {"cm.yaml": CM % "web"})
    (root / "app" / "fleet.yaml").write_text("yaml: {overlays: [o]}\n")
    result = import_fleet(
        root, ImportSettings(name="x", source_url=url, clusters=[{"name": "c1", "labels": {}}])
    )
    (bundle,) = result.bundles
    assert [s.get("destination") for s in bundle["sources"]] == [None, "fleet-overlays/o"]
    assert "overrides" not in bundle and "patches" not in bundle
    write_fleet_repo(result, tmp_path / "out")  # loads as the hub loads it
    work = tmp_path / "tree"
    for source in bundle["sources"]:
        shutil.copytree(root / source["directory"], work / source.get("destination", ""),
                        dirs_exist_ok=True)  # fmt: skip
    objects = render_bundle(work, format="plain", request=RenderRequest(source="x-app"))
    assert sorted(o["metadata"]["name"] for o in objects) == ["extra", "web"]
