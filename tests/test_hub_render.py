"""``hub render``: deterministic per-cluster sets, targeting, overrides, groups, API checks."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api import load_set
from hub.errors import FleetRepoError
from hub.publish.flow import prepare, render
from tests.test_hub_fleet import CLUSTERS, DIGEST_A, image_bundle, write_fleet

EXAMPLES = Path(__file__).resolve().parent.parent / "fleet-examples"


def fleetlet(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fleetlet")
    cmd = [exe] if exe else [sys.executable, "-m", "fleetlet"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def test_render_of_the_examples_is_byte_identical_on_two_runs(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    for out in (first, second):
        done = fleetlet("hub", "render", str(EXAMPLES), "--out", str(out))
        assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in first.iterdir())
    assert names == ["store-eu-1.yaml", "store-eu-2.yaml", "store-us-1.yaml"]
    _same, mismatch, errors = filecmp.cmpfiles(first, second, names, shallow=False)
    assert (mismatch, errors) == ([], [])
    sets = {n: load_set((first / n).read_bytes(), origin=n) for n in names}
    every = [
        "metrics",
        "payments-config",
        "platform-crds",
        "platform-operator",
        "shop-backend",
        "shop-frontend",
    ]
    for name, deployment_set in sets.items():
        assert [e.name for e in deployment_set.bundle_deployments] == every, name
        # platform before shop, which depends on it; independent groups by name.
        assert deployment_set.groups == ("metrics", "payments-config", "platform", "shop")
        backend = deployment_set.entry("shop-backend")
        assert backend is not None and backend.spec.depends_on == ("platform",)
    paused = {n: [e.name for e in s.bundle_deployments if e.spec.paused] for n, s in sets.items()}
    assert paused == {"store-eu-1.yaml": [], "store-eu-2.yaml": [], "store-us-1.yaml": ["metrics"]}


def test_key_order_and_file_layout_do_not_change_the_sets(tmp_path: Path) -> None:
    bundles = [
        image_bundle("web", group="front", dependsOn=["base"]),
        image_bundle("base"),
    ]
    a = write_fleet(tmp_path / "a", clusters=CLUSTERS, bundles=bundles)
    b = write_fleet(
        tmp_path / "b",
        clusters=list(reversed(CLUSTERS)),
        bundles=[{k: v for k, v in reversed(list(x.items()))} for x in reversed(bundles)],
    )
    # One file per cluster in b, an inventory in a.
    (b / "clusters" / "inventory.yaml").unlink()
    for c in CLUSTERS:
        (b / "clusters" / f"{c['name']}.yaml").write_text(yaml.safe_dump(c))
    when = "2026-11-22T22:00:00Z"
    from agent.api import parse_time

    issued = parse_time(when)
    assert issued is not None
    render(prepare(a), tmp_path / "out-a", issued_at=issued)
    pb = prepare(b)
    render(pb, tmp_path / "out-b", issued_at=issued)
    for name in ("eu-core", "eu-edge-1", "us-edge-1"):
        data_a = (tmp_path / "out-a" / f"{name}.yaml").read_bytes()
        data_b = (tmp_path / "out-b" / f"{name}.yaml").read_bytes()
        # Same content; the source commit differs only because the files differ.
        sa, sb = load_set(data_a, origin="a"), load_set(data_b, origin="b")
        assert sa.bundle_deployments == sb.bundle_deployments
        assert sa.groups == sb.groups == ("base", "front")


def test_spec_problems_are_named_by_bundle_file_and_field(tmp_path: Path) -> None:
    root = write_fleet(
        tmp_path / "fleet",
        clusters=CLUSTERS,
        bundles=[
            image_bundle("web", approval="sometimes"),
            image_bundle("db", healthChecks={"timeoutSeconds": 0}),
            image_bundle("api", formatOptions={"values": {"a": 1}}),
        ],
    )
    with pytest.raises(FleetRepoError) as caught:
        prepare(root)
    paths = sorted(p.path for p in caught.value.problems)
    assert paths == [
        "bundles/api.yaml: formatOptions.values",
        "bundles/db.yaml: healthChecks.timeoutSeconds",
        "bundles/web.yaml: approval",
    ]


def test_a_missing_dependency_group_names_the_cluster(tmp_path: Path) -> None:
    root = write_fleet(
        tmp_path / "fleet",
        clusters=CLUSTERS,
        bundles=[
            image_bundle("web", dependsOn=["base"]),
            image_bundle("base", targets=[{"clusters": ["eu-core"]}]),
        ],
    )
    with pytest.raises(FleetRepoError) as caught:
        prepare(root)
    text = str(caught.value)
    assert "clusters/inventory.yaml: eu-edge-1: expected group 'base' too (web depend on it)" in (
        text
    )


def test_unknown_dependency_and_cycles_are_refused(tmp_path: Path) -> None:
    root = write_fleet(
        tmp_path / "fleet",
        clusters=CLUSTERS,
        bundles=[
            image_bundle("a", dependsOn=["b"]),
            image_bundle("b", dependsOn=["a"]),
            image_bundle("c", dependsOn=["nope"]),
        ],
    )
    with pytest.raises(FleetRepoError) as caught:
        prepare(root)
    text = str(caught.value)
    assert 'bundles/c.yaml: dependsOn[0]: expected the name of a group, got "nope"' in text
    assert "no dependency cycle between groups, got a -> b -> a" in text


def test_render_one_cluster_and_unknown_cluster(tmp_path: Path) -> None:
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=[image_bundle("web")])
    written = render(prepare(root, only=["eu-core"]), tmp_path / "out")
    assert [p.name for p in written] == ["eu-core.yaml"]
    with pytest.raises(FleetRepoError, match="--cluster: expected a cluster of the fleet"):
        prepare(root, only=["mars-1"])


def test_values_merge_and_null_removes(tmp_path: Path) -> None:
    helm: dict[str, Any] = {
        "format": "helm",
        "formatOptions": {"values": {"a": {"x": 1, "y": 2}, "list": [1, 2], "drop": True}},
        "overrides": [
            {"clusterSelector": {}, "values": {"a": {"y": 3}, "list": [9], "drop": None}},
        ],
    }
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=[image_bundle("h", **helm)])
    plans = prepare(root).plans
    spec = plans["eu-core"].entries[0].spec
    assert spec.format_options.values == {"a": {"x": 1, "y": 3}, "list": (9,)}
    assert spec.sources[0].digest == DIGEST_A


def test_a_committed_fleet_records_its_commit_and_commit_time(tmp_path: Path) -> None:
    from tests.test_hub_resolve import git

    root = write_fleet(tmp_path / "repo", clusters=CLUSTERS, bundles=[image_bundle("web")])
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "fleet")
    git(root, "remote", "add", "origin", "https://git.example.invalid/fleet.git")
    head = git(root, "rev-parse", "HEAD")
    stamp = int(git(root, "log", "-1", "--format=%ct"))
    prepared = prepare(root)
    assert (prepared.source.repo, prepared.source.commit) == (
        "https://git.example.invalid/fleet.git",
        head,
    )
    out = render(prepared, tmp_path / "out")
    s = load_set(out[0].read_bytes(), origin="x")
    assert int(s.issued_at.timestamp()) == stamp
    # An uncommitted edit: the commit becomes a digest of the files.
    (root / "bundles" / "web.yaml").write_text(
        (root / "bundles" / "web.yaml").read_text() + "paused: true\n"
    )
    edited = prepare(root)
    assert not edited.source.committed and edited.source.commit != head


def test_cluster_templating_in_values_is_substituted_per_cluster(tmp_path: Path) -> None:
    helm: dict[str, Any] = {
        "format": "helm",
        "formatOptions": {
            "values": {
                "ingress": {"host": "${cluster.name}.shop.example"},
                "region": "${cluster.labels.region}",
                "literal": "$${cluster.name} stays",
                "replicas": 2,
            }
        },
        "overrides": [
            {
                "clusterSelector": {"matchLabels": {"gpu": "yes"}},
                "values": {"gpu": "${cluster.labels.gpu}"},
            },
        ],
    }
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=[image_bundle("h", **helm)])
    plans = prepare(root).plans
    values = {name: plans[name].entries[0].spec.format_options.values for name in plans}
    assert values["eu-core"] == {
        "ingress": {"host": "eu-core.shop.example"},
        "region": "eu",
        "literal": "${cluster.name} stays",
        "replicas": 2,
    }
    assert values["us-edge-1"] is not None
    assert values["us-edge-1"]["ingress"] == {"host": "us-edge-1.shop.example"}
    assert (values["us-edge-1"]["region"], values["us-edge-1"]["gpu"]) == ("us", "yes")
    # What is published is final: the rendered set holds no reference any more.
    written = render(prepare(root), tmp_path / "out")
    for path in written:  # only the escaped literal is left
        text = path.read_text()
        assert text.count("${cluster.") == text.count("${cluster.name} stays") == 1


def test_a_label_a_cluster_lacks_is_named_with_the_cluster(tmp_path: Path) -> None:
    helm: dict[str, Any] = {
        "format": "helm",
        "formatOptions": {
            "values": {"gpu": {"kind": "${cluster.labels.gpu}"}, "x": "${cluster.nme}"}
        },
    }
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=[image_bundle("h", **helm)])
    with pytest.raises(FleetRepoError) as refused:
        prepare(root)
    problems = [str(p) for p in refused.value.problems]
    assert (
        "bundles/h.yaml: formatOptions.values.gpu.kind: expected a label of cluster eu-core "
        '(it has: region, tier), got "${cluster.labels.gpu}"'
    ) in problems
    assert (
        "bundles/h.yaml: formatOptions.values.x: expected ${cluster.name} or "
        '${cluster.labels.<key>}, got "${cluster.nme}"'
    ) in problems


def test_helm_sources_in_the_fleet_repo_need_a_chart_and_a_version_range(tmp_path: Path) -> None:
    good = {
        "kind": "helm",
        "uri": "https://charts.example/stable",
        "chart": "podinfo",
        "version": "^6.5",
    }
    bad = [
        {"kind": "helm", "uri": "https://charts.example/stable", "version": "^6.5"},
        {"kind": "helm", "uri": "oci://charts.example/stable", "chart": "podinfo", "version": "1"},
        {
            "kind": "helm",
            "uri": "https://charts.example/stable",
            "chart": "podinfo",
            "version": "one",
        },
        {"kind": "image", "uri": "127.0.0.1:5000/charts/podinfo", "version": "~6"},
    ]
    bundles = [image_bundle("ok", sources=[good], format="helm")] + [
        image_bundle(f"bad{i}", sources=[s], format="helm") for i, s in enumerate(bad)
    ]
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=bundles)
    with pytest.raises(FleetRepoError) as refused:
        prepare(root)
    problems = [str(p) for p in refused.value.problems]
    assert problems == [
        "bundles/bad0.yaml: sources[0].chart: expected the chart's name in the repository, "
        "got None",
        "bundles/bad1.yaml: sources[0].uri: expected an http:// or https:// URL, got "
        '"oci://charts.example/stable"',
        "bundles/bad2.yaml: sources[0].version: expected a version or a SemVer range such as "
        '1.2.3, ^1.2, ~1.2.3 or >=1.0 <2.0, got "one"',
    ]
