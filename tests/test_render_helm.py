"""The ``helm`` format with the real pinned helm: what a chart renders to, for a cluster.

Charts: ``tests/assets/charts/greeter`` (fleetlet's own: values, capabilities, CRDs, hooks) and
``tests/assets/charts/podinfo`` (a public chart, unchanged, with its LICENSE).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.render._process import ToolFailedError, ToolMemoryError
from agent.render.confine import CONFINED_HINT, support
from agent.render.facts import ClusterFacts
from agent.render.formats import available_formats, render_bundle
from agent.render.helm import HelmChartError, HelmFormat
from agent.render.manifests import InvalidManifestError
from agent.render.plain import BUNDLE_LABEL, Ownership, RenderRequest
from agent.render.tools import ToolSettings
from tests.hostile import renderers as hostile
from tests.realenv.helm import ASSETS, copy_chart, helm_binary

Obj = dict[str, Any]


def request(**kwargs: Any) -> RenderRequest:
    options = kwargs.pop("options", {})
    return RenderRequest(source=kwargs.pop("source", "greeter"), options=options, **kwargs)


def by_kind(objects: list[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def helm_template(chart: Path, *args: str) -> list[Obj]:
    """What `helm template` itself prints, parsed (the baseline)."""
    done = subprocess.run(
        [str(helm_binary()), "template", *args, str(chart)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(chart.parent), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(autouse=True, scope="module")
def _pinned_helm() -> None:
    """The pinned helm in the cache, where the format finds it (built on a fresh machine)."""
    helm_binary()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    copy_chart("greeter", root)
    return root


def test_helm_is_a_built_in_format() -> None:
    assert "helm" in available_formats()


def test_values_files_in_order_then_inline_values_like_helm_template(tree: Path) -> None:
    options = {
        "valuesFiles": ["greeter/values-loud.yaml"],
        "values": {"audience": "fleet", "replicas": 3},
    }
    objects = render_bundle(tree, format="helm", request=request(options=options, namespace="shop"))
    settings = by_kind(objects)["ConfigMap"][0]
    # The values file changed both; the inline values win over it for audience.
    assert settings["data"]["message"] == "HELLO, fleet!"
    assert by_kind(objects)["Deployment"][0]["spec"]["replicas"] == 3

    # The same objects as `helm template` with the same values (namespaces aside: fleetlet
    # gives namespaced objects the target namespace, as the apply would).
    (tree / "inline.yaml").write_text(yaml.safe_dump(options["values"]))
    baseline = helm_template(
        tree / "greeter",
        "greeter",
        "--namespace",
        "shop",
        "--include-crds",
        "--values",
        str(tree / "greeter/values-loud.yaml"),
        "--values",
        str(tree / "inline.yaml"),
    )
    for obj in objects:
        obj["metadata"].pop("namespace", None)
    assert objects == baseline


def test_release_name_is_the_bundle_and_objects_are_owned(tree: Path) -> None:
    owned = Ownership(bundle="shop-web", group="shop", revision="7")
    objects = render_bundle(tree, format="helm", request=request(ownership=owned, namespace="shop"))
    settings = by_kind(objects)["ConfigMap"][0]
    assert settings["metadata"]["name"] == "shop-web-settings"
    assert settings["data"]["release"] == "shop-web"
    assert settings["data"]["namespace"] == "shop"
    assert settings["metadata"]["namespace"] == "shop"
    assert settings["metadata"]["labels"][BUNDLE_LABEL] == "shop-web"
    # The chart's own CR gets the namespace too: its CRD is in the chart's crds/.
    assert by_kind(objects)["Widget"][0]["metadata"]["namespace"] == "shop"
    renamed = render_bundle(
        tree,
        format="helm",
        request=request(ownership=owned, options={"releaseName": "front"}),
    )
    assert by_kind(renamed)["ConfigMap"][0]["metadata"]["name"] == "front-settings"
    with pytest.raises(HelmChartError) as bad:
        render_bundle(tree, format="helm", request=request(options={"releaseName": "No_Good"}))
    assert bad.value.rule == "BadReleaseName"


def test_capabilities_and_upgrade_come_from_the_cluster_facts(tree: Path) -> None:
    facts = ClusterFacts.of(
        kube_version="v1.30.4",
        api_versions=["v1", "apps/v1", "monitoring.coreos.com/v1/ServiceMonitor"],
    )
    upgrade = render_bundle(tree, format="helm", request=request(cluster=facts, upgrade=True))
    data = by_kind(upgrade)["ConfigMap"][0]["data"]
    assert data["kubeVersion"] == "v1.30.4"
    assert data["serviceMonitors"] == "true"
    assert (data["install"], data["upgrade"]) == ("false", "true")
    install = render_bundle(tree, format="helm", request=request())
    data = by_kind(install)["ConfigMap"][0]["data"]
    assert data["serviceMonitors"] == "false"
    assert (data["install"], data["upgrade"]) == ("true", "false")


def test_the_charts_kube_version_constraint_is_checked_against_the_cluster(tree: Path) -> None:
    with pytest.raises(ToolFailedError) as old:
        render_bundle(
            tree, format="helm", request=request(cluster=ClusterFacts(kube_version="v1.20.0"))
        )
    assert "kubeVersion" in str(old.value) and "1.20.0" in str(old.value)


def test_crds_come_first_and_hooks_stay_with_their_annotations(tree: Path) -> None:
    objects = render_bundle(tree, format="helm", request=request(namespace="shop"))
    assert objects[0]["kind"] == "CustomResourceDefinition"
    kinds = by_kind(objects)
    job = kinds["Job"][0]
    assert "name" not in job["metadata"]
    assert job["metadata"]["generateName"] == "greeter-migrate-"
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["metadata"]["annotations"]["helm.sh/hook-weight"] == "-5"
    assert (
        job["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        == "before-hook-creation,hook-succeeded"
    )
    test_pod = kinds["Pod"][0]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_generate_name_only_for_hook_objects(tmp_path: Path) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"generateName": "seed-"},
        "spec": {},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    with pytest.raises(InvalidManifestError) as refused:
        render_bundle(tmp_path, format="plain", request=request())
    assert refused.value.rule == "MissingName"
    job["metadata"]["annotations"] = {"argocd.argoproj.io/hook": "PreSync"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job) + "---\n" + yaml.safe_dump(job))
    objects = render_bundle(tmp_path, format="plain", request=request(namespace="jobs"))
    # Two runs of the same hook are not duplicates: each is created anew.
    assert [o["metadata"]["generateName"] for o in objects] == ["seed-", "seed-"]
    assert {o["metadata"]["namespace"] for o in objects} == {"jobs"}


def test_a_dependency_that_is_not_vendored_is_refused_before_helm_runs(tree: Path) -> None:
    chart_yaml = tree / "greeter" / "Chart.yaml"
    chart_yaml.write_text(
        chart_yaml.read_text()
        + "dependencies:\n  - name: redis\n    version: ^18.0.0\n"
        + "    repository: https://charts.example.invalid\n"
    )
    # A helm that does not exist: the refusal comes before any process is started.
    nowhere = ToolSettings(helm=str(tree / "no-helm-here"))
    with pytest.raises(HelmChartError) as missing:
        render_bundle(tree, format="helm", request=request(tools=nowhere))
    assert missing.value.rule == "MissingDependency"
    assert "redis (^18.0.0 from https://charts.example.invalid)" in str(missing.value)
    assert "Rendering never downloads" in str(missing.value)


def test_a_vendored_dependency_renders_with_its_parent(tree: Path, tmp_path: Path) -> None:
    parent = tmp_path / "tree2" / "shop"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: shop\nversion: 0.1.0\n"
        "dependencies:\n  - name: greeter\n    version: 1.0.0\n"
        "    repository: https://charts.example.invalid\n"
    )
    (parent / "values.yaml").write_text(
        "greeter:\n  greeting: bonjour\n  hooks: {enabled: false}\n"
    )
    (parent / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shop\ndata: {a: b}\n"
    )
    copy_chart("greeter", parent / "charts")
    objects = render_bundle(parent.parent, format="helm", request=request(source="shop"))
    names = {(o["kind"], o["metadata"].get("name")) for o in objects}
    assert ("ConfigMap", "shop") in names and ("ConfigMap", "shop-settings") in names
    settings = next(o for o in objects if o["metadata"].get("name") == "shop-settings")
    assert settings["data"]["message"] == "bonjour, world!"


def test_chart_location_errors_say_what_to_set(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(HelmChartError) as none:
        render_bundle(tmp_path / "empty", format="helm", request=request())
    assert none.value.rule == "NoChart" and "formatOptions.path" in str(none.value)
    two = tmp_path / "two"
    copy_chart("greeter", two)
    copy_chart("podinfo", two)
    with pytest.raises(HelmChartError) as several:
        render_bundle(two, format="helm", request=request())
    assert several.value.rule == "SeveralCharts" and "greeter, podinfo" in str(several.value)
    chosen = render_bundle(two, format="helm", request=request(options={"path": "podinfo"}))
    assert any(o["kind"] == "Deployment" for o in chosen)


def test_values_files_must_be_files_inside_the_tree(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.yaml").write_text("greeting: pwned\n")
    (tree / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    with pytest.raises(HelmChartError) as escapes:
        render_bundle(tree, format="helm", request=request(options={"valuesFiles": ["link.yaml"]}))
    assert escapes.value.rule == "ValuesFileEscapes"
    with pytest.raises(HelmChartError) as missing:
        render_bundle(tree, format="helm", request=request(options={"valuesFiles": ["nope.yaml"]}))
    assert missing.value.rule == "ValuesFileMissing" and "nope.yaml" in str(missing.value)


def test_helm_runs_bounded(tree: Path) -> None:
    with pytest.raises(ToolMemoryError):
        HelmFormat(max_memory=48 << 20).render(tree, request())


def test_public_chart_podinfo_renders_as_helm_template_does(tmp_path: Path) -> None:
    copy_chart("podinfo", tmp_path)
    assert (tmp_path / "podinfo" / "LICENSE").is_file()
    # values-prod.yaml turns the HPA on; the inline values turn it off again.
    options = {
        "valuesFiles": ["podinfo/values-prod.yaml"],
        "values": {"replicaCount": 3, "hpa": {"enabled": False}},
    }
    facts = ClusterFacts.of(kube_version="v1.37.2", api_versions=["v1", "apps/v1"])
    objects = render_bundle(
        tmp_path,
        format="helm",
        request=request(
            source="podinfo",
            options=options,
            cluster=facts,
            ownership=Ownership(bundle="podinfo", group="podinfo", revision="1"),
        ),
    )
    (tmp_path / "inline.yaml").write_text(yaml.safe_dump(options["values"]))
    baseline = helm_template(
        tmp_path / "podinfo",
        "podinfo",
        "--include-crds",
        "--kube-version",
        "v1.37.2",
        "--api-versions",
        "v1,apps/v1",
        "--values",
        str(tmp_path / "podinfo/values-prod.yaml"),
        "--values",
        str(tmp_path / "inline.yaml"),
    )
    assert len(objects) == len(baseline)
    for ours, theirs in zip(objects, baseline, strict=True):
        assert ours["kind"] == theirs["kind"]
        hook = (ours["metadata"].get("annotations") or {}).get("helm.sh/hook")
        if hook:  # podinfo names its test pods with randAlphaNum: only the shape can match
            assert ours["metadata"]["name"][:-5] == theirs["metadata"]["name"][:-5]
            continue
        assert ours["metadata"]["name"] == theirs["metadata"]["name"]
        assert ours.get("spec") == theirs.get("spec")
    deployment = next(
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "podinfo"
    )
    assert deployment["spec"]["replicas"] == 3
    assert any(o["metadata"].get("name") == "podinfo-redis" for o in objects)  # values-prod
    # The chart's test hooks are in the output, marked as such.
    tests = [
        o
        for o in objects
        if (o["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test-success"
    ]
    assert tests, "podinfo's test hooks should be rendered"
    assert "Apache License" in ASSETS.joinpath("podinfo", "LICENSE").read_text()


def test_fleetlet_render_uses_the_helm_named_by_fleetlet_helm(tree: Path, tmp_path: Path) -> None:
    import os
    import sys

    def fleetlet_render(helm: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleetlet", "render", str(tree), "--format", "helm"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "FLEETLET_HELM": helm, "PATH": str(tmp_path / "empty")},
        )

    done = fleetlet_render(str(helm_binary()))
    assert done.returncode == 0, done.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout) if d]
    assert kinds[0] == "CustomResourceDefinition" and "Deployment" in kinds
    missing = fleetlet_render(str(tmp_path / "no-helm"))
    assert missing.returncode != 0
    assert missing.stderr.count("\n") == 1, missing.stderr  # one line
    assert f"FLEETLET_HELM={tmp_path / 'no-helm'}: not an executable file" in missing.stderr


@pytest.fixture
def filedep(tmp_path: Path) -> Path:
    """A bundle tree with chart `app` whose dependency `common` is `file://../lib/common`."""
    root = tmp_path / "filedep"
    shutil.copytree(ASSETS / "filedep", root)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_file_dependency_renders_as_after_helm_dependency_build(
    filedep: Path, tmp_path: Path
) -> None:
    """No vendoring needed: the chart the file:// path names is placed as `helm dependency
    build` places it, in a scratch copy; the bundle tree stays as it was."""
    before = snapshot(filedep)
    objects = render_bundle(filedep, format="helm", request=request(source="app"))
    assert snapshot(filedep) == before  # nothing written into the (signed, cached) tree

    built = tmp_path / "built"
    shutil.copytree(filedep, built)
    subprocess.run(
        [str(helm_binary()), "dependency", "build", str(built / "app")],
        capture_output=True, timeout=120, check=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    expected = helm_template(built / "app", "app", "--namespace", "default", "--include-crds")
    assert [(o["metadata"]["name"], o.get("data")) for o in objects] == [
        (o["metadata"]["name"], o.get("data")) for o in expected
    ]
    data = {o["metadata"]["name"]: o["data"] for o in objects}
    assert data == {"app-common": {"colour": "blue"}, "app-app": {"chart": "app"}}


@pytest.mark.parametrize(
    ("repository", "rule", "said"),
    [
        ("file://../../../outside", "LocalDependencyEscapes", "outside the bundle tree"),
        ("file:///etc", "LocalDependencyEscapes", "outside the bundle tree"),
        ("file://../lib", "LocalDependencyMissing", "no Chart.yaml in lib"),
        ("@stable", "RepositoryAlias", "use the repository's full URL"),
        ("alias:stable", "RepositoryAlias", "use the repository's full URL"),
    ],
)
def test_a_file_dependency_must_be_a_chart_inside_the_tree_and_aliases_are_refused(
    filedep: Path, repository: str, rule: str, said: str
) -> None:
    chart_yaml = filedep / "app" / "Chart.yaml"
    chart_yaml.write_text(
        chart_yaml.read_text().replace("file://../lib/common", json.dumps(repository))
    )
    (filedep.parent / "outside").mkdir(exist_ok=True)
    with pytest.raises(HelmChartError) as refused:
        render_bundle(filedep, format="helm", request=request(source="app"))
    assert refused.value.rule == rule
    message = str(refused.value)
    assert f"chart app: dependency common: repository {repository!r}" in message or (
        f"chart app: dependency common at {repository!r}" in message
    )
    assert said in message and "app/Chart.yaml" in message


def test_a_file_dependency_version_must_satisfy_the_constraint(filedep: Path) -> None:
    chart_yaml = filedep / "app" / "Chart.yaml"
    chart_yaml.write_text(chart_yaml.read_text().replace("~1.2.0", "^2.0.0"))
    with pytest.raises(HelmChartError) as refused:
        render_bundle(filedep, format="helm", request=request(source="app"))
    assert refused.value.rule == "LocalDependencyMismatch"
    assert "its version '1.2.3' does not satisfy '^2.0.0'" in str(refused.value)


def test_fleetlet_render_places_a_file_dependency(filedep: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fleetlet", "render", str(filedep), "--format", "helm",
         "--release-name", "demo", "-o", "json"],
        capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names = {o["metadata"]["name"] for o in json.loads(done.stdout)["items"]}
    assert names == {"demo-app", "demo-common"}


def test_a_file_dependency_link_cannot_climb_out_of_the_scratch_copy(tmp_path: Path) -> None:
    # Issue 28, 3: the overlay copy kept links, so `../../../../../<name>` (the tree's own
    # file where it lay) read <name> beside the scratch directory: any file of the agent's.
    name = f"fleetlet-leak-{uuid.uuid4().hex}"
    tree = hostile.overlay_escape_tree(tmp_path / "bundle", escape_name=name)
    beside_scratch = Path(tempfile.gettempdir()) / name
    beside_scratch.write_text("SECRET of the agent\n")
    try:
        objects = render_bundle(
            tree, format="helm", request=request(source="app", options={"path": "app"})
        )
    finally:
        beside_scratch.unlink()

    (leak,) = [o for o in objects if o["metadata"]["name"] == "leak"]
    assert leak["data"] == {"leak": "the tree's own file\n"}


def test_a_file_dependency_link_leaving_the_tree_is_refused(tmp_path: Path) -> None:
    tree = hostile.overlay_escape_tree(tmp_path / "bundle", escape_name="inside")
    link = tree / "lib/x/y/common/files/leak"
    link.unlink()
    link.symlink_to(tmp_path / "outside.txt")
    (tmp_path / "outside.txt").write_text("SECRET\n")

    with pytest.raises(HelmChartError) as refused:
        render_bundle(tree, format="helm", request=request(source="app", options={"path": "app"}))

    assert refused.value.rule == "LinkEscapes"
    assert refused.value.file == "lib/x/y/common/files/leak"
    assert "leads outside the bundle tree" in str(refused.value)


@pytest.mark.skipif(not support().confined, reason="the kernel has no Landlock")
def test_helm_reads_nothing_outside_its_tree(tmp_path: Path) -> None:
    # A local tree (`fleetlet render`, or content no unpacker checked) whose .Files.Get
    # follows a link to a file of the machine: helm itself is refused the read.
    secret = tmp_path / "agent-state" / "token"
    secret.parent.mkdir()
    secret.write_text("the agent's token\n")
    tree = hostile.escaping_link_chart(tmp_path / "bundle", outside=secret)

    with pytest.raises(ToolFailedError) as refused:
        render_bundle(tree, format="helm", request=request(source="leaky"))

    message = str(refused.value)
    assert "permission denied" in message.lower() and "files/leak" in message
    assert CONFINED_HINT in message
    assert "the agent's token" not in message
