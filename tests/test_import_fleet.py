"""``fleetlet import fleet``: a Rancher Fleet GitRepo layout (``tests/assets/fleet-style``,
written for these tests in Fleet's documented layout) converted into a fleetlet fleet repo, then
rendered per cluster by the hub and the agent's formats, and compared with what Fleet deploys
on each cluster.

How the expectation is established: Fleet's controller cannot run here, so the test computes
what Fleet deploys from the rules of Fleet's ``fleet.yaml`` reference, written out below
independently of the importer: the GitRepo's targets pick the clusters; the **first**
``targetCustomization`` whose selector matches a cluster applies (``doNotDeploy`` drops the
bundle there); the namespace is the customization's, else ``namespace``, else
``defaultNamespace``, else ``default``, and ``namespace`` forces every namespaced object into it;
a kustomize bundle is ``kustomize build`` of the chosen ``kustomize.dir``; a helm bundle is
``helm template`` of the chart with the chart's values, then ``valuesFiles``, then the bundle's
``values`` deep-merged with the customization's (Fleet's ``${ .ClusterName }`` and
``${ .ClusterLabels.x }`` substituted); plain manifests are every YAML file but ``fleet.yaml``
and what ``.fleetignore`` lists. The real helm and kustomize binaries run for both sides.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api import to_dict
from agent.api.canonical import load_set
from agent.render.formats import render_bundle
from agent.render.plain import RenderRequest
from agent.render.tools import ToolSettings
from agent.render.values import merge
from tests.fleetlab import REPO_ROOT
from tests.realenv.gitserver import GitDaemon
from tests.test_hub_resolve import git

EXAMPLE = REPO_ROOT / "tests" / "assets" / "fleet-style"
RENDERED_DIRS = ("guestbook", "shop", "kustomize", "extras")
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def _fleetlet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=dict(os.environ),
    )  # fmt: skip


def _clusters() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((EXAMPLE / "clusters.yaml").read_text())
    return [{"name": d["metadata"]["name"], "labels": d["metadata"]["labels"]} for d in docs]


# --- Fleet's rules (the oracle) -------------------------------------------------------------


def _selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        value = labels.get(e["key"])
        if e["operator"] == "In" and value not in e["values"]:
            return False
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
    return True


def _customization_matches(c: dict[str, Any], cluster: dict[str, Any]) -> bool:
    if "clusterName" in c:
        return bool(c["clusterName"] == cluster["name"])
    return "clusterSelector" in c and _selector_matches(c["clusterSelector"], cluster["labels"])


def _fleet_templates(value: Any, cluster: dict[str, Any]) -> Any:
    if isinstance(value, str):
        text = value.replace("${ .ClusterName }", cluster["name"])
        for key, label in cluster["labels"].items():
            text = text.replace(f"${{ .ClusterLabels.{key} }}", label)
        return text
    if isinstance(value, dict):
        return {k: _fleet_templates(v, cluster) for k, v in value.items()}
    return value


def _run(argv: list[str], cwd: Path) -> list[dict[str, Any]]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, check=True, timeout=120)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def fleet_deploys(
    directory: str, cluster: dict[str, Any], helm: Path, kustomize: Path, tmp: Path
) -> list[dict[str, Any]] | None:
    """What Fleet deploys of the bundle in ``directory`` on ``cluster`` (None: nothing)."""
    root = EXAMPLE / directory
    fy = yaml.safe_load((root / "fleet.yaml").read_text()) or {}
    gitrepo = yaml.safe_load((EXAMPLE / "gitrepo.yaml").read_text())
    targets = gitrepo["spec"]["targets"]
    if not any(
        "clusterSelector" in t and _selector_matches(t["clusterSelector"], cluster["labels"])
        for t in targets
    ):
        return None
    first = next(
        (c for c in fy.get("targetCustomizations") or [] if _customization_matches(c, cluster)),
        {},
    )
    if first.get("doNotDeploy"):
        return None
    namespace = (
        first.get("namespace") or fy.get("namespace") or fy.get("defaultNamespace") or "default"
    )
    helm_options = fy.get("helm") or {}
    if fy.get("kustomize") or (root / "kustomization.yaml").exists():
        chosen = (first.get("kustomize") or {}).get("dir") or fy["kustomize"].get("dir", ".")
        objects = _run([str(kustomize), "build", chosen], root)
    elif (root / "Chart.yaml").exists():
        values = merge(helm_options.get("values") or {}, (first.get("helm") or {}).get("values")
                       or {})  # fmt: skip
        values_file = tmp / f"{directory}-{cluster['name']}-values.json"
        values_file.write_text(json.dumps(_fleet_templates(values, cluster)))
        files = [*helm_options.get("valuesFiles", []),
                 *(first.get("helm") or {}).get("valuesFiles", [])]  # fmt: skip
        argv = [str(helm), "template", helm_options.get("releaseName") or directory, ".",
                "--namespace", namespace]  # fmt: skip
        for f in files:
            argv += ["-f", f]
        objects = _run([*argv, "-f", str(values_file)], root)
    else:
        ignore = []
        if (root / ".fleetignore").exists():
            ignore = (root / ".fleetignore").read_text().split()
        objects = []
        for path in sorted(root.rglob("*.yaml")):
            name = path.relative_to(root).as_posix()
            if name != "fleet.yaml" and not any(fnmatch.fnmatch(name, p) for p in ignore):
                objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] not in _CLUSTER_SCOPED and (
            fy.get("namespace") or not meta.get("namespace")
        ):
            meta["namespace"] = namespace
    return objects


# --- the test -------------------------------------------------------------------------------


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


@pytest.fixture
def stores_repo(git_daemon: GitDaemon, tmp_path: Path) -> tuple[str, str]:
    """The example pushed to a git server (branch main): its URL and commit."""
    work = tmp_path / "stores"
    shutil.copytree(EXAMPLE, work)
    name = f"stores-{os.urandom(3).hex()}.git"
    git_daemon.create_bare(name)
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "stores")
    git(work, "push", "-q", git_daemon.url_for(name), "main")
    return git_daemon.url_for(name), git(work, "rev-parse", "HEAD")


def test_a_fleet_repo_renders_per_cluster_what_fleet_deploys(
    stores_repo: tuple[str, str], tmp_path: Path, helm_binary: Path, kustomize_binary: Path
) -> None:
    url, commit = stores_repo
    out = tmp_path / "fleet"
    imported = _fleetlet(
        "import", "fleet", str(EXAMPLE), "--out", str(out),
        "--gitrepo", str(EXAMPLE / "gitrepo.yaml"), "--clusters", str(EXAMPLE / "clusters.yaml"),
        "--source-url", url, "--commit", commit, "-o", "json",
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    report = json.loads(imported.stdout)
    not_expressed = {(n["bundle"], n["field"]) for n in report["notExpressed"]}
    assert {
        ("stores-extras", "rolloutStrategy"),
        ("stores-extras", "diff"),
        ("stores-extras", "dependsOn[0]"),
        ("stores-extras", ".fleetignore"),
        ("stores-shop", "targets[1].clusterGroup"),
        ("stores-shop", "namespace"),
        ("stores-shop", "targetCustomizations[2].helm.valuesFiles"),
    } <= not_expressed
    bundles = {b["name"]: b for b in report["bundles"]}
    assert {n: b["format"] for n, b in bundles.items()} == {
        "stores-external": "helm",
        "stores-extras": "plain",
        "stores-guestbook": "plain",
        "stores-kustomize": "kustomize",
        "stores-shop": "helm",
    }
    shop = yaml.safe_load((out / "bundles" / "stores-shop.yaml").read_text())
    assert shop["dependsOn"] == ["stores-guestbook"] and shop["takeOwnership"] is True
    guestbook = yaml.safe_load((out / "bundles" / "stores-guestbook.yaml").read_text())
    assert guestbook["deletionPolicy"] == "Orphan"  # keepResources
    external = yaml.safe_load((out / "bundles" / "stores-external.yaml").read_text())
    assert external["sources"] == [{"kind": "helm", "uri": "https://stefanprodan.github.io/podinfo",
                                    "chart": "podinfo", "version": "6.5.4"}]  # fmt: skip
    # The external chart needs the network to be resolved: the rest is rendered here.
    (out / "bundles" / "stores-external.yaml").unlink()

    sets = tmp_path / "sets"
    rendered = _fleetlet("hub", "render", str(out), "--out", str(sets), "-q")
    assert rendered.returncode == 0, rendered.stderr

    tools = ToolSettings(helm=str(helm_binary), kustomize=str(kustomize_binary))
    names = {f"stores-{d}": d for d in RENDERED_DIRS}
    shop_web: dict[str, dict[str, Any]] = {}
    for cluster in _clusters():
        deployment_set = load_set((sets / f"{cluster['name']}.yaml").read_bytes(), origin="set")
        got: dict[str, list[dict[str, Any]]] = {}
        for entry in deployment_set.bundle_deployments:
            spec = to_dict(entry.spec)
            (source,) = spec["sources"]
            options = spec.get("formatOptions") or {}
            got[entry.name] = render_bundle(
                EXAMPLE / source["directory"],
                format=spec.get("format", "plain"),
                request=RenderRequest(
                    source=entry.name,
                    namespace=options.get("targetNamespace"),
                    options=options,
                    patches=tuple(spec.get("patches") or ()),
                    tools=tools,
                ),
            )
            assert source["commit"] == commit
        for name, directory in names.items():
            expected = fleet_deploys(directory, cluster, helm_binary, kustomize_binary, tmp_path)
            if expected is None:
                assert name not in got, (cluster["name"], name)
                continue
            assert name in got, (cluster["name"], name)
            assert sorted(got[name], key=_key) == sorted(expected, key=_key), (
                cluster["name"],
                name,
            )
        shop_web[cluster["name"]] = next(o for o in got["stores-shop"] if o["kind"] == "Deployment")
    # What the comparison covered, spelled out: only the FIRST matching customization applies.
    assert shop_web["prod-eu"]["spec"]["replicas"] == 5
    assert shop_web["prod-eu"]["metadata"]["labels"]["tier"] == "standard"
    assert shop_web["prod-us"]["spec"]["replicas"] == 3
    assert shop_web["prod-us"]["metadata"]["labels"]["tier"] == "production"
    assert shop_web["dev-1"]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "example/shop:1.2.1"  # values-fleet.yaml
    )
    # Paused where Fleet's first matching customization pauses (test-1: region us, not prod).
    kustomize_bundle = yaml.safe_load((out / "bundles" / "stores-kustomize.yaml").read_text())
    assert kustomize_bundle["overrides"][1] == {"clusters": ["test-1"], "paused": True}


def test_without_the_inventory_the_first_match_rule_is_listed_as_not_expressed(
    tmp_path: Path,
) -> None:
    done = _fleetlet("import", "fleet", str(EXAMPLE / "shop"), "--out", str(tmp_path / "f"),
                     "--name", "shop", "--source-url", "https://git.example.invalid/s.git",
                     "-o", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = json.loads(done.stdout)["notExpressed"]
    assert any(
        n["field"] == "targetCustomizations" and "only the first matching" in n["message"]
        for n in notes
    )
    bundle = yaml.safe_load((tmp_path / "f" / "bundles" / "shop.yaml").read_text())
    assert bundle["sources"][0] == {"kind": "git", "uri": "https://git.example.invalid/s.git",
                                    "branch": "main"}  # fmt: skip
    assert bundle["overrides"][0]["clusterSelector"] == {"matchLabels": {"env": "prod",
                                                                          "region": "eu"}}  # fmt: skip
    # A second import into the same place is refused rather than mixed.
    again = _fleetlet("import", "fleet", str(EXAMPLE / "shop"), "--out", str(tmp_path / "f"),
                      "--source-url", "https://git.example.invalid/s.git")  # fmt: skip
    assert again.returncode == 1
    assert "already holds a fleet repo" in again.stderr


# Fleet's own expectations for its bundle names (rancher/fleet internal/names/name_test.go,
# Apache-2.0): the importer names bundles exactly as Fleet does.
_STR53 = "12345678901234567890123456789012345678901234567890123"
FLEET_NAMES = [
    (_STR53, _STR53),
    (_STR53 + "a", "12345678901234567890123456789012345678901234567-fdba4"),
    ("long-name-test-shortpath-with@char", "long-name-test-shortpath-with-char-031bab5e"),
    ("long-name-test-0.App_ ", "long-name-test-0-app-5bf6b3fb"),
    ("long-name-test--App_-_12.factor", "long-name-test-app-12-factor-0efbac37"),
    ("bundle.name.example.com", "bundle-name-example-com-645ef821"),
    (_STR53[0:46] + "-1234567", "1234567890123456789012345678901234567890123456-d0bce"),
]


@pytest.mark.parametrize(("given", "expected"), FLEET_NAMES)
def test_bundle_names_are_fleets_own(given: str, expected: str) -> None:
    from hub.importer.fleet import fleet_name

    assert fleet_name(given, ".") == expected


def test_long_names_unquoted_labels_and_broken_bundles_import_into_a_fleet_that_loads(
    tmp_path: Path,
) -> None:
    from hub.fleet.load import load_fleet
    from hub.importer.fleet import ImportSettings, import_fleet, load_clusters, write_fleet_repo

    root = tmp_path / "repo"
    long = "gitrepo/fleet-examples/ui-plugins/elemental/some-very-long-directory-name"
    configmap = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {a: b}\n"
    for suffix in ("a", "b"):
        (root / f"{long}-{suffix}").mkdir(parents=True)
        (root / f"{long}-{suffix}" / "fleet.yaml").write_text("defaultNamespace: apps\n")
        (root / f"{long}-{suffix}" / "cm.yaml").write_text(configmap % suffix)
    (root / "versioned").mkdir()
    (root / "versioned" / "cm.yaml").write_text(configmap % "versioned")
    (root / "versioned" / "fleet.yaml").write_text(
        "targetCustomizations:\n- name: k128\n  clusterSelector:\n    matchLabels:\n"
        "      version: 1.28\n  defaultNamespace: k128\n"
    )
    (root / "broken").mkdir()
    (root / "broken" / "fleet.yaml").write_text("defaultNamespace: apps\n")
    (root / "broken" / "kustomization.yaml").write_text("resources:\n- missing.yaml\n")
    clusters = tmp_path / "clusters.yaml"
    clusters.write_text("clusters:\n- name: edge-1\n  labels:\n    version: 1.28\n")

    result = import_fleet(
        root,
        ImportSettings(
            name="fleet-examples",
            source_url="https://git.example.com/fleet-examples.git",
            clusters=load_clusters(clusters),
        ),
    )
    names = sorted(b["name"] for b in result.bundles)
    # Two long paths, two names (Fleet's hash of the whole path): nothing overwritten.
    assert names == [
        "fleet-examples-gitrepo-fleet-examples-ui-plugin-47d58",
        "fleet-examples-gitrepo-fleet-examples-ui-plugin-8e176",
        "fleet-examples-versioned",
    ]
    (broken,) = [
        n for n in result.notes if n.bundle == "fleet-examples-broken" and n.field == "bundle"
    ]
    assert broken.message.startswith("not converted, not written: does not render")

    out = tmp_path / "fleet"
    write_fleet_repo(result, out)  # loads what it wrote
    fleet = load_fleet(out)
    assert sorted(b.name for b in fleet.bundles) == names
    inventory = yaml.safe_load((out / "clusters" / "inventory.yaml").read_text())
    assert inventory["clusters"][0]["labels"] == {"version": "1.28"}
    versioned = yaml.safe_load((out / "bundles" / "fleet-examples-versioned.yaml").read_text())
    assert versioned["overrides"][0]["clusters"] == ["edge-1"]


def test_overlays_kustomize_customizations_and_go_getter_charts(tmp_path: Path) -> None:
    from hub.importer.fleet import ImportSettings, import_fleet, write_fleet_repo

    root = tmp_path / "repo"
    configmap = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata: {a: b}\n"
    # Fleet overlays: a file replacing the bundle's per customization.
    (root / "overlaid" / "overlays" / "prod").mkdir(parents=True)
    (root / "overlaid" / "cm.yaml").write_text(configmap % "web")
    (root / "overlaid" / "overlays" / "prod" / "cm.yaml").write_text(configmap % "web")
    (root / "overlaid" / "fleet.yaml").write_text(
        "targetCustomizations:\n- name: prod\n  clusterSelector: {matchLabels: {env: prod}}\n"
        "  yaml:\n    overlays: [prod]\n"
    )
    # kustomize dirs named only by customizations (no kustomization at the root).
    for env in ("prod", "dev"):
        (root / "kust" / "overlays" / env).mkdir(parents=True)
        (root / "kust" / "overlays" / env / "cm.yaml").write_text(configmap % env)
        (root / "kust" / "overlays" / env / "kustomization.yaml").write_text(
            "resources:\n- cm.yaml\n"
        )
    (root / "kust" / "fleet.yaml").write_text(
        "targetCustomizations:\n"
        "- name: prod\n  clusterSelector: {matchLabels: {env: prod}}\n"
        "  kustomize: {dir: overlays/prod}\n"
        "- name: dev\n  clusterSelector: {matchLabels: {env: dev}}\n"
        "  kustomize: {dir: overlays/dev}\n"
    )
    # A chart given as a go-getter address.
    (root / "getter").mkdir()
    (root / "getter" / "fleet.yaml").write_text(
        "helm:\n  chart: git::https://github.com/rancher/fleet-examples//single-cluster/helm"
        "?ref=v0.9.0\n"
    )
    clusters = [{"name": "p", "labels": {"env": "prod"}}, {"name": "d", "labels": {"env": "dev"}}]
    result = import_fleet(
        root,
        ImportSettings(name="x", source_url="https://git.example.com/x.git", clusters=clusters),
    )
    bundles = {b["name"]: b for b in result.bundles}
    # Fleet's overlay replaces cm.yaml by the same object: converted, with nothing to patch
    # (tests/test_import_overlays.py covers what overlays change).
    assert bundles["x-overlaid"]["format"] == "plain"
    assert "patches" not in bundles["x-overlaid"].get("overrides", [{}])[0]
    kust = bundles["x-kust"]
    assert kust["format"] == "kustomize"
    assert kust["formatOptions"]["path"] == "overlays/prod"
    assert {"clusters": ["d"], "path": "overlays/dev"} in kust["overrides"]
    assert bundles["x-getter"]["sources"] == [
        {
            "kind": "git",
            "uri": "https://github.com/rancher/fleet-examples",
            "tag": "v0.9.0",
            "directory": "single-cluster/helm",
        }
    ]
    write_fleet_repo(result, tmp_path / "fleet")  # loads what it wrote


@pytest.mark.parametrize("how", ["absolute", "dotdot", "link"])
def test_a_values_file_outside_the_imported_repo_is_refused_not_inlined(
    tmp_path: Path, how: str
) -> None:
    """Issue 28 item 7: a ``valuesFiles`` entry naming a file of the operator's machine (an
    absolute path, ``..``, or a link out of the tree) is refused with the file named; nothing is
    written, so the kubeconfig never reaches the generated bundle's values."""
    secret = tmp_path / "home" / "kubeconfig.yaml"
    secret.parent.mkdir()
    secret.write_text("token: operator-secret-token\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    named = {"absolute": str(secret), "dotdot": "../home/kubeconfig.yaml", "link": "v.yaml"}[how]
    if how == "link":
        (repo / "v.yaml").symlink_to(secret)
    (repo / "fleet.yaml").write_text(yaml.safe_dump({
        "helm": {"chart": "./chart"},
        "targetCustomizations": [{"name": "prod", "clusterSelector": {"matchLabels": {"a": "b"}},
                                  "helm": {"valuesFiles": [named]}}],
    }))  # fmt: skip
    out = tmp_path / "out"
    done = _fleetlet("import", "fleet", str(repo), "--out", str(out), "--name", "r",
                     "--source-url", "https://git.example.invalid/r.git")  # fmt: skip
    assert done.returncode == 1
    assert "targetCustomizations[0].helm.valuesFiles" in done.stderr
    assert named in done.stderr and "outside the imported repository" in done.stderr
    assert not out.exists() or "operator-secret-token" not in "".join(
        p.read_text() for p in out.rglob("*.yaml")
    )
