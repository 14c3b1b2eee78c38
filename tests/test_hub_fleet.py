"""The fleet repo format: loading, every-error-at-once validation, targeting and overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.api.yamlio import KUBE_DUMPER
from agent.errors import FieldProblem
from hub.errors import FleetRepoError
from hub.fleet.durations import parse_duration
from hub.fleet.load import load_fleet
from hub.fleet.selectors import parse_selector

DIGEST_A = "sha256:" + "a" * 64
COMMIT_A = "1" * 40
SHA_A = "b" * 64


def write_fleet(
    root: Path,
    *,
    clusters: list[dict[str, Any]],
    bundles: list[dict[str, Any]],
    settings: dict[str, Any] | None = None,
) -> Path:
    """Write a fleet repo: fleet.yaml, clusters/inventory.yaml, bundles/<name>.yaml (quoting
    what Kubernetes' YAML rules, which the loader follows, would read as other than a string:
    ``y`` is a boolean there)."""

    def dump(data: Any, **kwargs: Any) -> str:
        return yaml.dump(data, Dumper=KUBE_DUMPER, **kwargs)

    root.mkdir(parents=True, exist_ok=True)
    (root / "clusters").mkdir(exist_ok=True)
    (root / "bundles").mkdir(exist_ok=True)
    (root / "fleet.yaml").write_text(
        dump(settings or {"apiVersion": "fleetlet.io/v1alpha1", "kind": "Fleet"})
    )
    (root / "clusters" / "inventory.yaml").write_text(dump({"clusters": clusters}))
    for old in (root / "bundles").glob("*.yaml"):
        old.unlink()
    for b in bundles:
        (root / "bundles" / f"{b['name']}.yaml").write_text(dump(b, sort_keys=False))
    return root


CLUSTERS = [
    {"name": "eu-edge-1", "labels": {"region": "eu", "tier": "edge"}},
    {"name": "eu-core", "labels": {"region": "eu", "tier": "core"}},
    {"name": "us-edge-1", "labels": {"region": "us", "tier": "edge", "gpu": "yes"}},
]


def image_bundle(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "sources": [{"kind": "image", "uri": "127.0.0.1:5000/b/" + name, "digest": DIGEST_A}],
        "format": "plain",
        "targets": [{"clusterSelector": {}}],
        **extra,
    }


def test_a_valid_fleet_loads_sorted(tmp_path: Path) -> None:
    root = write_fleet(
        tmp_path / "fleet",
        clusters=list(reversed(CLUSTERS)),
        bundles=[image_bundle("web"), image_bundle("api")],
    )
    fleet = load_fleet(root)
    assert [c.name for c in fleet.clusters] == ["eu-core", "eu-edge-1", "us-edge-1"]
    assert [b.name for b in fleet.bundles] == ["api", "web"]
    assert fleet.bundles[0].file == "bundles/api.yaml"
    assert fleet.bundles[0].spec == {"format": "plain"}


def test_one_cluster_per_file_is_accepted_too(tmp_path: Path) -> None:
    root = write_fleet(tmp_path / "fleet", clusters=[], bundles=[image_bundle("web")])
    (root / "clusters" / "inventory.yaml").unlink()
    (root / "clusters" / "solo.yaml").write_text("name: solo\nlabels: {tier: edge}\n")
    fleet = load_fleet(root)
    assert [(c.name, dict(c.labels), c.file) for c in fleet.clusters] == [
        ("solo", {"tier": "edge"}, "clusters/solo.yaml")
    ]


def test_every_problem_is_reported_at_once_with_file_and_field(tmp_path: Path) -> None:
    root = write_fleet(
        tmp_path / "fleet",
        settings={"publication": {"expiresAfter": "soon"}, "signing": {"issuer": 3}},
        clusters=[*CLUSTERS, {"name": "Bad_Name"}, {"name": "eu-core"}],
        bundles=[
            {
                "name": "web",
                "sources": [{"kind": "image", "uri": "127.0.0.1:5000/web", "digest": "latest"}],
                "targets": [
                    {
                        "clusterSelector": {
                            "matchExpressions": [{"key": "tier", "operator": "Equals"}]
                        }
                    }
                ],
            },
            {
                "name": "db",
                "sources": [{"kind": "git", "uri": "git://x/y", "branch": "main", "tag": "v1"}],
                "targets": [{"clusters": ["nowhere"]}],
                "overrides": [{"clusters": ["eu-core"], "paused": "yes"}],
            },
        ],
    )
    with pytest.raises(FleetRepoError) as caught:
        load_fleet(root)
    paths = [p.path for p in caught.value.problems]
    assert paths == [
        "fleet.yaml: publication.expiresAfter",
        "fleet.yaml: signing.issuer",
        "clusters/inventory.yaml: clusters[3].name",
        "clusters/inventory.yaml: name",
        "bundles/db.yaml: sources[0]",
        "bundles/db.yaml: targets[0].clusters[0]",
        "bundles/db.yaml: overrides[0].paused",
        "bundles/web.yaml: sources[0].digest",
        "bundles/web.yaml: targets[0].clusterSelector.matchExpressions[0].operator",
    ]
    message = str(caught.value)
    assert 'sources[0].digest: expected sha256:<64 lowercase hex>, got "latest"' in message
    assert "exactly one of commit, tag, branch" in message
    assert 'the name of a defined cluster, got "nowhere"' in message


def test_a_broken_yaml_file_is_named_with_its_line(tmp_path: Path) -> None:
    root = write_fleet(tmp_path / "fleet", clusters=CLUSTERS, bundles=[image_bundle("web")])
    (root / "bundles" / "broken.yaml").write_text("name: broken\nsources: [\n")
    with pytest.raises(FleetRepoError) as caught:
        load_fleet(root)
    assert caught.value.problems[0].path.startswith("bundles/broken.yaml: line ")


def test_missing_layout_is_reported(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FleetRepoError) as caught:
        load_fleet(tmp_path / "empty")
    assert [p.path for p in caught.value.problems] == ["fleet.yaml", "clusters/", "bundles/"]


LABELS = {"region": "eu", "tier": "edge"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({}, True),
        ({"matchLabels": {"region": "eu"}}, True),
        ({"matchLabels": {"region": "us"}}, False),
        ({"matchLabels": {"region": "eu", "tier": "core"}}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["edge", "x"]}]}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["edge"]}]}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["yes"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"region": "eu"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["core"]}],
            },
            False,
        ),
    ],
)
def test_label_selectors_follow_kubernetes(selector: dict[str, Any], expected: bool) -> None:
    problems: list[FieldProblem] = []
    parsed = parse_selector(selector, "sel", problems)
    assert problems == []
    assert parsed is not None
    assert parsed.matches(LABELS) is expected


@pytest.mark.parametrize(
    ("expr", "where"),
    [
        ({"key": "a", "operator": "In"}, "sel.matchExpressions[0].values"),
        ({"key": "a", "operator": "Exists", "values": ["x"]}, "sel.matchExpressions[0].values"),
        ({"key": "-bad", "operator": "Exists"}, "sel.matchExpressions[0].key"),
        ({"key": "a", "operator": "Gt", "values": ["1"]}, "sel.matchExpressions[0].operator"),
    ],
)
def test_invalid_selector_expressions_are_named(expr: dict[str, Any], where: str) -> None:
    problems: list[FieldProblem] = []
    assert parse_selector({"matchExpressions": [expr]}, "sel", problems) is None
    assert [p.path for p in problems] == [where]


def test_targets_by_name_and_selector(tmp_path: Path) -> None:
    root = write_fleet(
        tmp_path / "fleet",
        clusters=CLUSTERS,
        bundles=[
            image_bundle(
                "edge-only",
                targets=[
                    {"clusterSelector": {"matchLabels": {"tier": "edge"}}},
                    {"clusters": ["eu-core"]},
                ],
            ),
            image_bundle(
                "eu-edge",
                targets=[
                    {
                        "clusters": ["eu-edge-1", "us-edge-1"],
                        "clusterSelector": {"matchLabels": {"region": "eu"}},
                    }
                ],
            ),
        ],
    )
    fleet = load_fleet(root)
    edge_only, eu_edge = fleet.bundles
    hits = {c.name: any(t.matches(c) for t in edge_only.targets) for c in fleet.clusters}
    assert hits == {"eu-core": True, "eu-edge-1": True, "us-edge-1": True}
    hits = {c.name: any(t.matches(c) for t in eu_edge.targets) for c in fleet.clusters}
    assert hits == {"eu-core": False, "eu-edge-1": True, "us-edge-1": False}


def test_overrides_apply_selector_ones_first_then_named_ones(tmp_path: Path) -> None:
    root = write_fleet(
        tmp_path / "fleet",
        clusters=CLUSTERS,
        bundles=[
            image_bundle(
                "web",
                overrides=[
                    {"clusters": ["eu-edge-1"], "approval": "manual"},
                    {"clusterSelector": {"matchLabels": {"tier": "edge"}}, "paused": True},
                    {"clusterSelector": {"matchLabels": {"region": "eu"}}, "namespace": "eu"},
                ],
            )
        ],
    )
    fleet = load_fleet(root)
    web = fleet.bundles[0]
    eu_edge = fleet.cluster("eu-edge-1")
    us_edge = fleet.cluster("us-edge-1")
    assert eu_edge is not None and us_edge is not None
    assert [o.index for o in web.applied_overrides(eu_edge)] == [1, 2, 0]
    assert [o.index for o in web.applied_overrides(us_edge)] == [1]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 604800), ("36h", 129600), ("1h30m", 5400), ("90s", 90), ("0s", None), ("x", None)],
)
def test_durations(text: str, seconds: int | None) -> None:
    parsed = parse_duration(text)
    assert (parsed.total_seconds() if parsed else None) == seconds


def test_an_override_gives_some_clusters_other_sources(tmp_path: Path) -> None:
    """A canary rollout: the canary gets the new version first, the others keep theirs."""
    from hub.fleet.render import plan_clusters

    canary = {"kind": "image", "uri": "127.0.0.1:5000/b/web", "digest": "sha256:" + "c" * 64}
    root = write_fleet(
        tmp_path / "fleet",
        clusters=CLUSTERS,
        bundles=[image_bundle("web", overrides=[{"clusters": ["eu-edge-1"], "sources": [canary]}])],
    )
    fleet = load_fleet(root)
    assert {s.uri for s in fleet.bundles[0].all_sources} == {"127.0.0.1:5000/b/web"}
    assert len(fleet.bundles[0].all_sources) == 2
    pins = {s: s.ref for s in fleet.bundles[0].all_sources}
    plans = plan_clusters(fleet, pins)
    digests = {name: plan.entries[0].spec.sources[0].digest for name, plan in plans.items()}
    assert digests == {"eu-core": DIGEST_A, "eu-edge-1": canary["digest"], "us-edge-1": DIGEST_A}

    bad = write_fleet(
        tmp_path / "bad",
        clusters=CLUSTERS,
        bundles=[
            image_bundle(
                "web",
                overrides=[
                    {
                        "clusters": ["eu-core"],
                        "sources": [{"kind": "image", "uri": "x/y", "digest": "latest"}],
                    }
                ],
            )
        ],
    )
    with pytest.raises(FleetRepoError) as caught:
        load_fleet(bad)
    assert [p.path for p in caught.value.problems] == [
        "bundles/web.yaml: overrides[0].sources[0].digest"
    ]


def test_an_override_sets_the_path_and_appends_patches(tmp_path: Path) -> None:
    """Rancher Fleet's per-target kustomize.dir, and per-cluster patches after the bundle's."""
    from hub.fleet.render import plan_clusters

    own = {"patch": "spec: {replicas: 2}\n", "target": {"kind": "Deployment"}}
    edge = {"patch": "spec: {replicas: 1}\n", "target": {"kind": "Deployment"}}
    canary = {"patch": '[{"op": "add", "path": "/metadata/labels/canary", "value": "yes"}]',
              "target": {"kind": "Deployment", "name": "web"}}  # fmt: skip
    root = write_fleet(
        tmp_path / "fleet",
        clusters=CLUSTERS,
        bundles=[
            image_bundle(
                "web",
                format="kustomize",
                formatOptions={"path": "overlays/default"},
                patches=[own],
                overrides=[
                    {"clusters": ["eu-edge-1"], "path": "overlays/canary", "patches": [canary]},
                    {"clusterSelector": {"matchLabels": {"tier": "edge"}}, "patches": [edge]},
                ],
            )
        ],
    )
    fleet = load_fleet(root)
    plans = plan_clusters(fleet, {s: s.ref for s in fleet.bundles[0].all_sources})

    def spec(cluster: str) -> tuple[str | None, list[str]]:
        entry = plans[cluster].entries[0].spec
        return entry.format_options.path, [p.patch for p in entry.patches]

    # Selector overrides first, then the named one: patches in that order after the bundle's.
    assert spec("eu-edge-1") == ("overlays/canary", [own["patch"], edge["patch"], canary["patch"]])
    assert spec("us-edge-1") == ("overlays/default", [own["patch"], edge["patch"]])
    assert spec("eu-core") == ("overlays/default", [own["patch"]])


def test_bad_override_paths_and_patches_are_named(tmp_path: Path) -> None:
    from hub.fleet.render import plan_clusters

    bad = write_fleet(
        tmp_path / "bad",
        clusters=CLUSTERS,
        bundles=[
            image_bundle(
                "web",
                overrides=[
                    {"clusters": ["eu-core"], "path": 3},
                    {"clusters": ["eu-core"], "patches": "spec: {}"},
                ],
            )
        ],
    )
    with pytest.raises(FleetRepoError) as caught:
        load_fleet(bad)
    assert [p.path for p in caught.value.problems] == [
        "bundles/web.yaml: overrides[0].path",
        "bundles/web.yaml: overrides[1].patches",
    ]

    # A patch the API refuses (JSON 6902 without a target) is named where it lands.
    unchecked = write_fleet(
        tmp_path / "unchecked",
        clusters=CLUSTERS,
        bundles=[
            image_bundle(
                "web",
                overrides=[{"clusters": ["eu-core"], "path": "../up",
                            "patches": [{"patch": '[{"op": "remove", "path": "/x"}]'}]}],
            )
        ],
    )  # fmt: skip
    fleet = load_fleet(unchecked)
    with pytest.raises(FleetRepoError) as refused:
        plan_clusters(fleet, {s: s.ref for s in fleet.bundles[0].all_sources})
    assert sorted(p.path for p in refused.value.problems) == [
        "bundles/web.yaml: formatOptions.path",
        "bundles/web.yaml: patches[0].target",
    ]
