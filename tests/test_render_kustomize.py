"""The ``kustomize`` format, post-render patches, waves and hooks, and the render cache, with
the real kustomize (and helm, for ``helmCharts``) binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.render.cache import RenderCache, tree_digest
from agent.render.confine import CONFINED_HINT, support
from agent.render.facts import ClusterFacts
from agent.render.formats import render_bundle
from agent.render.kustomize import KustomizeError, KustomizeFormat
from agent.render.manifests import InvalidManifestError
from agent.render.patches import PatchFailedError
from agent.render.plain import RenderRequest
from agent.render.tools import ToolSettings
from tests.hostile import renderers as hostile
from tests.realenv.tool_fixtures import ToolCounter

ASSETS = Path(__file__).parent / "assets"
FLUX_EXAMPLE = ASSETS / "flux2-kustomize-helm-example"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root


def _kustomize_build(kustomize: Path, tree: Path, path: str, *extra: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(kustomize), "build", path, *extra],
        cwd=tree,
        capture_output=True,
        check=True,
        timeout=120,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def _kustomize(tree: Path, path: str = "", **request: Any) -> list[dict[str, Any]]:
    options = {"path": path} if path else {}
    return render_bundle(
        tree,
        format="kustomize",
        request=RenderRequest(
            source="bundle", options=options, tools=ToolSettings.from_env(), **request
        ),
    )


def _ids(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (o["kind"], o["metadata"].get("name") or o["metadata"]["generateName"]) for o in objects
    ]


DEPLOYMENT = """
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: web
      annotations: {fleetlet.io/wave: "2"}
    spec:
      selector: {matchLabels: {app: web}}
      template:
        metadata: {labels: {app: web}}
        spec:
          containers:
            - {name: main, image: "example/web:1.0", env: [{name: MODE, value: base}]}
            - {name: sidecar, image: "example/proxy:1.0"}
"""
SERVICE = """
    apiVersion: v1
    kind: Service
    metadata:
      name: web
      labels: {tier: front}
      annotations: {argocd.argoproj.io/sync-wave: "3"}
    spec:
      selector: {app: web}
      ports: [{port: 80}]
"""
HOOK = """
    apiVersion: batch/v1
    kind: Job
    metadata:
      generateName: migrate-
      annotations:
        argocd.argoproj.io/hook: PreSync
        argocd.argoproj.io/sync-wave: "-1"
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: migrate, image: "example/migrate:1.0"}]
"""


# --- kustomize build ------------------------------------------------------------------------


def test_a_real_world_overlay_renders_as_kustomize_build_does(kustomize_binary: Path) -> None:
    """Flux's example: an overlay beside its base, a targeted strategic merge patch."""
    ours = _kustomize(FLUX_EXAMPLE, "apps/production")

    assert ours == _kustomize_build(kustomize_binary, FLUX_EXAMPLE, "apps/production")
    release = next(o for o in ours if o["kind"] == "HelmRelease")
    assert release["metadata"]["namespace"] == "podinfo"
    assert release["spec"]["values"]["httpRoute"]["hostnames"] == ["podinfo.production"]
    assert release["spec"]["chart"]["spec"]["version"] == ">=1.0.0"


def test_the_deprecated_bases_field_works_as_kustomize_allows(
    kustomize_binary: Path, tmp_path: Path
) -> None:
    tree = _write(
        tmp_path,
        {
            "base/deployment.yaml": DEPLOYMENT,
            "base/service.yaml": SERVICE,
            "base/kustomization.yaml": "resources: [deployment.yaml, service.yaml]\n",
            "overlay/kustomization.yaml": """
                namePrefix: eu-
                bases: [../base]
                commonLabels: {region: eu}
            """,
        },
    )

    ours = _kustomize(tree, "overlay")

    assert ours == _kustomize_build(kustomize_binary, tree, "overlay")
    assert _ids(ours) == [("Service", "eu-web"), ("Deployment", "eu-web")]
    assert all(o["metadata"]["labels"]["region"] == "eu" for o in ours)


@pytest.mark.parametrize(
    ("kustomization", "where", "entry"),
    [
        (
            "resources: [github.com/kubernetes-sigs/kustomize//examples/multibases?ref=v5.0.0]",
            "resources[0]",
            "github.com/kubernetes-sigs/kustomize",
        ),
        (
            "resources: [https://raw.githubusercontent.com/org/repo/main/deploy.yaml]",
            "resources[0]",
            "https://raw.githubusercontent.com",
        ),
        ("bases: ['git@github.com:org/repo.git//deploy?ref=v1']", "bases[0]", "git@github.com"),
        ("components: ['https://example.com/component.tar.gz']", "components[0]", "example.com"),
        (
            "helmCharts: [{name: podinfo, repo: 'https://stefanprodan.github.io/podinfo', "
            "version: 6.7.0}]",
            "helmCharts[0]",
            "stefanprodan.github.io",
        ),
    ],
)
def test_remote_references_are_refused_before_kustomize_runs(
    counted_kustomize: ToolCounter, tmp_path: Path, kustomization: str, where: str, entry: str
) -> None:
    # Behind a local base, so the check follows references as kustomize would.
    tree = _write(
        tmp_path,
        {
            "app/kustomization.yaml": "resources: [../remote]\n",
            "remote/kustomization.yaml": kustomization + "\n",
        },
    )

    with pytest.raises(KustomizeError) as refused:
        _kustomize(tree, "app")

    error = refused.value
    assert error.rule == "RemoteReference"
    assert error.file == f"remote/kustomization.yaml: {where}"
    assert entry in str(error)
    assert "a render never fetches" in str(error) and "pinned source" in str(error)
    assert counted_kustomize.runs == 0


def test_references_that_leave_the_tree_are_refused(
    counted_kustomize: ToolCounter, tmp_path: Path
) -> None:
    outside = _write(tmp_path / "outside", {"kustomization.yaml": "resources: []\n"})
    tree = tmp_path / "tree"
    for entry in ("../outside", str(outside), "linked"):
        shutil.rmtree(tree, ignore_errors=True)
        _write(tree, {"kustomization.yaml": f"resources: ['{entry}']\n"})
        (tree / "linked").symlink_to(outside)

        with pytest.raises(KustomizeError) as refused:
            _kustomize(tree)

        assert refused.value.rule == "OutsideTree", entry
        assert "outside the bundle tree" in str(refused.value)
    assert counted_kustomize.runs == 0


def test_missing_kustomizations_and_files_are_named(tmp_path: Path) -> None:
    tree = _write(
        tmp_path,
        {
            "empty/deployment.yaml": DEPLOYMENT,
            "missing/kustomization.yaml": "resources: [deployment.yaml, nope.yaml]\n",
            "missing/deployment.yaml": DEPLOYMENT,
        },
    )
    with pytest.raises(KustomizeError) as none:
        _kustomize(tree, "empty")
    assert none.value.rule == "NoKustomization" and none.value.file == "empty"

    with pytest.raises(KustomizeError) as missing:
        _kustomize(tree, "missing")
    assert missing.value.rule == "MissingFile"
    assert missing.value.file == "missing/kustomization.yaml: resources[1]"

    with pytest.raises(InvalidManifestError) as no_path:
        _kustomize(tree, "overlays/nowhere")
    assert no_path.value.rule == "PathNotFound"


def test_a_chain_of_bases_is_bounded(counted_kustomize: ToolCounter, tmp_path: Path) -> None:
    for i in range(1_001):
        _write(tmp_path, {f"k{i}/kustomization.yaml": f"resources: [../k{i + 1}]\n"})
    _write(tmp_path, {"k1001/kustomization.yaml": "resources: []\n"})

    with pytest.raises(KustomizeError) as refused:
        _kustomize(tmp_path, "k0")

    assert refused.value.rule == "TooManyKustomizations"
    assert counted_kustomize.runs == 0


CHART = {
    "charts/greeter/Chart.yaml": "apiVersion: v2\nname: greeter\nversion: 0.1.0\n",
    "charts/greeter/values.yaml": "greeting: hello\n",
    "charts/greeter/templates/configmap.yaml": """
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: {{ .Release.Name }}-greeter
        data:
          greeting: {{ .Values.greeting | quote }}
          kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}
    """,
}


def test_helm_charts_in_the_tree_inflate_with_the_pinned_helm(
    kustomize_binary: Path, helm_binary: Path, tmp_path: Path
) -> None:
    tree = _write(
        tmp_path,
        {
            **CHART,
            "kustomization.yaml": """
                helmCharts:
                  - name: greeter
                    releaseName: hi
                    valuesInline: {greeting: bonjour}
                namePrefix: eu-
            """,
        },
    )

    ours = _kustomize(tree, cluster=ClusterFacts(kube_version="v1.31.4"))

    assert ours == _kustomize_build(
        kustomize_binary,
        tree,
        ".",
        "--enable-helm",
        "--helm-command",
        str(helm_binary),
        "--helm-kube-version",
        "v1.31.4",
    )
    assert ours[0]["metadata"]["name"] == "eu-hi-greeter"
    assert ours[0]["data"] == {"greeting": "bonjour", "kubeVersion": "v1.31.4"}


def test_a_failing_build_says_what_kustomize_said(tmp_path: Path, kustomize_binary: Path) -> None:
    tree = _write(
        tmp_path,
        {
            "kustomization.yaml": "resources: [a.yaml, b.yaml]\n",
            "a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: same}\n",
            "b.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: same}\n",
        },
    )
    with pytest.raises(KustomizeError) as failed:
        _kustomize(tree)
    assert failed.value.rule == "KustomizeFailed"
    assert failed.value.reason == "RenderFailed"
    assert "may not add resource with an already registered id" in str(failed.value)


# --- patches --------------------------------------------------------------------------------

WIDGET = """
    apiVersion: example.com/v1
    kind: Widget
    metadata: {name: gadget, labels: {tier: front}}
    spec:
      sizes: [{name: s, value: 1}, {name: m, value: 2}]
"""


def test_patches_apply_after_any_format_as_flux_applies_them(
    kustomize_binary: Path, tmp_path: Path
) -> None:
    tree = _write(
        tmp_path,
        {"01_deployment.yaml": DEPLOYMENT, "02_service.yaml": SERVICE, "03_widget.yaml": WIDGET,
         "04_hook.yaml": HOOK},
    )  # fmt: skip
    patches = [
        # Strategic merge without target: the object it names; containers merge by name.
        {
            "patch": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"
            "spec:\n  template:\n    spec:\n      containers:\n"
            "        - {name: main, image: 'example/web:2.0'}\n"
        },
        # JSON 6902 by label selector: every object labelled tier=front (a kind of any group).
        {
            "patch": '[{"op": "add", "path": "/metadata/annotations", '
            '"value": {"patched": "by-label"}}]',
            "target": {"labelSelector": "tier=front", "kind": "Widget"},
        },
        # A custom resource has no merge keys for kustomize: its list is replaced.
        {
            "patch": "spec:\n  sizes: [{name: l, value: 3}]\n",
            "target": {"group": "example.com", "version": "v1", "kind": "Widget", "name": "gad.*"},
        },
        # A hook known by generateName is patched like any object and keeps generateName.
        {"patch": "spec:\n  backoffLimit: 0\n", "target": {"kind": "Job"}},
    ]

    plain = render_bundle(
        tree, format="plain", request=RenderRequest(namespace="shop", patches=patches)
    )

    assert _ids(plain) == [
        ("Deployment", "web"),
        ("Service", "web"),
        ("Widget", "gadget"),
        ("Job", "migrate-"),
    ]
    containers = plain[0]["spec"]["template"]["spec"]["containers"]
    assert containers == [
        {"name": "main", "image": "example/web:2.0", "env": [{"name": "MODE", "value": "base"}]},
        {"name": "sidecar", "image": "example/proxy:1.0"},
    ]
    assert plain[0]["metadata"]["namespace"] == "shop"  # the target namespace, after patches
    assert plain[2]["metadata"]["annotations"] == {"patched": "by-label"}
    assert plain[2]["spec"]["sizes"] == [{"name": "l", "value": 3}]
    assert plain[1]["metadata"].get("annotations") == {"argocd.argoproj.io/sync-wave": "3"}
    hook = plain[3]
    assert hook["spec"]["backoffLimit"] == 0
    assert "name" not in hook["metadata"] and hook["metadata"]["generateName"] == "migrate-"
    assert hook["metadata"]["annotations"] == {
        "argocd.argoproj.io/hook": "PreSync",
        "argocd.argoproj.io/sync-wave": "-1",
    }

    # The same patches after the kustomize format.
    _write(tree, {"kustomization.yaml": "resources: [01_deployment.yaml, 02_service.yaml]\n"})
    built = render_bundle(tree, format="kustomize", request=RenderRequest(patches=patches[:1]))
    assert built[1]["spec"]["template"]["spec"]["containers"][0]["image"] == "example/web:2.0"


def test_a_patch_that_cannot_apply_fails_with_a_reason(
    kustomize_binary: Path, tmp_path: Path
) -> None:
    tree = _write(tmp_path, {"deployment.yaml": DEPLOYMENT})
    missing = {"patch": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api}\n"}
    with pytest.raises(PatchFailedError) as refused:
        render_bundle(tree, format="plain", request=RenderRequest(patches=[missing]))
    assert refused.value.reason == "PatchFailed"
    assert "Deployment.v1.apps/api" in str(refused.value)
    assert "must name an object as rendered" in str(refused.value)

    bad_op = {
        "patch": '[{"op": "replace", "path": "/spec/nothing/here", "value": 1}]',
        "target": {"kind": "Deployment"},
    }
    with pytest.raises(PatchFailedError) as failed:
        render_bundle(tree, format="plain", request=RenderRequest(patches=[bad_op]))
    assert "/spec/nothing/here" in str(failed.value)


# --- waves and hooks ------------------------------------------------------------------------


def test_waves_and_hooks_are_kept_by_every_format(kustomize_binary: Path, tmp_path: Path) -> None:
    files = {"deployment.yaml": DEPLOYMENT, "service.yaml": SERVICE, "hook.yaml": HOOK}
    plain_tree = _write(tmp_path / "plain", files)
    kustomize_tree = _write(
        tmp_path / "kustomize",
        {
            **files,
            # kustomize refuses objects without a name: a generateName hook stays plain.
            "kustomization.yaml": "resources: [deployment.yaml, service.yaml]\n",
            "hook.yaml": HOOK.replace("generateName: migrate-", "name: migrate"),
        },
    )
    plain = render_bundle(plain_tree, format="plain", request=RenderRequest())
    built = render_bundle(kustomize_tree, format="kustomize", request=RenderRequest())

    for objects in (plain, built):
        annotations = {
            o["kind"]: o["metadata"].get("annotations") for o in objects if o["kind"] != "Job"
        }
        assert annotations == {
            "Deployment": {"fleetlet.io/wave": "2"},
            "Service": {"argocd.argoproj.io/sync-wave": "3"},
        }
    hook = next(o for o in plain if o["kind"] == "Job")
    assert hook["metadata"]["generateName"] == "migrate-"
    assert hook["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync"

    # generateName is for hooks only: an applied object needs a name.
    _write(plain_tree, {"hook.yaml": HOOK.replace("argocd.argoproj.io/hook: PreSync", "a: b")})
    with pytest.raises(InvalidManifestError) as refused:
        render_bundle(plain_tree, format="plain", request=RenderRequest())
    assert refused.value.rule == "MissingName"
    assert "allowed for hooks" in str(refused.value)


# --- the render cache -----------------------------------------------------------------------


def test_a_second_render_of_the_same_inputs_runs_no_tool(
    counted_kustomize: ToolCounter, tmp_path: Path
) -> None:
    tree = _write(
        tmp_path / "tree",
        {
            "base/deployment.yaml": DEPLOYMENT,
            "base/kustomization.yaml": "resources: [deployment.yaml]\n",
            "overlay/kustomization.yaml": "resources: [../base]\nnamePrefix: x-\n",
        },
    )
    patch = {"patch": "metadata: {labels: {patched: 'yes'}}\n", "target": {"kind": "Deployment"}}
    request = RenderRequest(
        tools=ToolSettings.from_env(), namespace="web", options={"path": "overlay"}, patches=[patch]
    )
    cache = RenderCache(directory=tmp_path / "renders")
    composed: list[int] = []

    def compose() -> Path:
        composed.append(1)
        return tree

    content = tree_digest(tree)
    first = cache.render(format="kustomize", content=content, request=request, tree=compose)
    assert counted_kustomize.runs == 1  # one build carries the patches
    first[0]["metadata"]["name"] = "changed by the caller"

    second = cache.render(format="kustomize", content=content, request=request, tree=compose)
    assert counted_kustomize.runs == 1 and len(composed) == 1
    assert second[0]["metadata"]["name"] == "x-web"
    assert second[0]["metadata"]["namespace"] == "web"
    assert second[0]["metadata"]["labels"] == {"patched": "yes"}

    # A restarted agent keeps the renders on disk: still no run.
    restarted = RenderCache(directory=tmp_path / "renders")
    assert restarted.render(format="kustomize", content=content, request=request, tree=compose) == (
        second
    )
    assert counted_kustomize.runs == 1 and restarted.hits == 1

    # Anything that shapes the output is in the key: other options, content, cluster facts.
    for changed, changed_content in [
        (RenderRequest(tools=ToolSettings.from_env(), namespace="web", options={"path": "base"}, patches=[patch]), content),
        (RenderRequest(tools=ToolSettings.from_env(), namespace="web", options={"path": "overlay"}), content),
        (RenderRequest(tools=ToolSettings.from_env(), namespace="web", options={"path": "overlay"}, patches=[patch],
                       cluster=ClusterFacts(kube_version="v1.30.0")), content),
        (request, "sources:other"),
    ]:  # fmt: skip
        runs = counted_kustomize.runs
        cache.render(format="kustomize", content=changed_content, request=changed, tree=compose)
        assert counted_kustomize.runs > runs
    _write(tree, {"base/deployment.yaml": DEPLOYMENT.replace("1.0", "1.1")})
    assert tree_digest(tree) != content


def test_the_cache_is_bounded_in_memory_and_on_disk(tmp_path: Path) -> None:
    def objects(i: int) -> list[dict[str, Any]]:
        noise = os.urandom(600).hex()  # does not compress: about 1.2 kB per entry
        return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}"},
                 "data": {"noise": noise}}]  # fmt: skip

    memory = RenderCache(max_bytes=3_000)  # room for a few
    for i in range(10):
        memory.put(f"key{i}", objects(i))
    kept = [i for i in range(10) if memory.get(f"key{i}") is not None]
    assert 1 <= len(kept) < 10 and kept == list(range(10 - len(kept), 10))  # the latest

    disk = RenderCache(max_bytes=0, directory=tmp_path, max_files=3)
    for i in range(10):
        disk.put(f"key{i}", objects(i))
    assert sorted(p.name for p in tmp_path.glob("*.json.z")) == [
        "key7.json.z",
        "key8.json.z",
        "key9.json.z",
    ]
    (tmp_path / "key9.json.z").write_bytes(b"damaged")
    assert disk.get("key9") is None and not (tmp_path / "key9.json.z").exists()
    found = disk.get("key8")
    assert found is not None and found[0]["metadata"]["name"] == "c8"


def test_kustomize_runs_with_a_time_and_memory_bound(kustomize_binary: Path) -> None:
    request = RenderRequest(options={"path": "apps/production"})
    starved = KustomizeFormat(kustomize=kustomize_binary, max_memory=32 * 1024 * 1024)
    with pytest.raises(KustomizeError) as refused:
        starved.render(FLUX_EXAMPLE, request)
    assert refused.value.rule == "KustomizeFailed"
    assert "kustomize needed more than 32 MiB of memory" in str(refused.value)

    hurried = KustomizeFormat(kustomize=kustomize_binary, timeout=0.001)
    with pytest.raises(KustomizeError) as stopped:
        hurried.render(FLUX_EXAMPLE, request)
    assert stopped.value.rule == "KustomizeFailed" and "kustomize" in str(stopped.value)


HCIG = "apiVersion: builtin\nkind: HelmChartInflationGenerator\nmetadata: {name: g}\n"


@pytest.mark.parametrize(
    ("files", "rule", "where", "words"),
    [
        pytest.param(  # a harmless helmCharts entry enabled helm for this one too
            {"kustomization.yaml": "helmCharts: [{name: greeter}]\ngenerators: [gen.yaml]\n",
             "gen.yaml": HCIG + "name: evil\nrepo: https://charts.example.com\n"},
            "RemoteReference", "gen.yaml: HelmChartInflationGenerator", "would be pulled",
            id="generator-file-repo",
        ),
        pytest.param(
            {"kustomization.yaml": "generators: [gen.yaml]\n",
             "gen.yaml": HCIG + "name: greeter\nconfigHome: helm-home\n"},
            "UnsafeHelm", "gen.yaml: HelmChartInflationGenerator configHome", "plugins",
            id="generator-file-confighome",
        ),
        pytest.param(
            {"kustomization.yaml": "generators:\n- |\n"
             + "".join(f"  {line}\n" for line in (HCIG + "name: greeter\nconfigHome: h\n")
                       .splitlines())},
            "UnsafeHelm", "kustomization.yaml: generators[0]: HelmChartInflationGenerator configHome",
            "configHome 'h'",
            id="inline-generator-confighome",
        ),
        pytest.param(
            {"kustomization.yaml": "generators: [gens]\n",
             "gens/kustomization.yaml": "resources: [hcig.yaml]\n",
             "gens/hcig.yaml": HCIG + "name: greeter\nchartHome: ..\nconfigHome: /tmp/h\n"},
            "UnsafeHelm", "gens/hcig.yaml: HelmChartInflationGenerator configHome", "configHome",
            id="generator-kustomization",
        ),
        pytest.param(
            {"kustomization.yaml": "transformers: [t.yaml]\n",
             "t.yaml": HCIG + "name: greeter\n"},
            "UnsafeHelm", "t.yaml", "listed under transformers", id="as-transformer",
        ),
        pytest.param(
            {"kustomization.yaml":
             "helmChartInflationGenerator:\n- {chartName: other, chartRepoUrl: 'https://x.io'}\n"},
            "RemoteReference", "kustomization.yaml: helmChartInflationGenerator[0]", "x.io",
            id="legacy-repo",
        ),
        pytest.param(
            {"kustomization.yaml":
             "helmChartInflationGenerator:\n- {chartName: greeter, helmHome: helm-home}\n"},
            "UnsafeHelm", "kustomization.yaml: helmChartInflationGenerator configHome",
            "helm-home", id="legacy-helmhome",
        ),
        pytest.param(
            {"kustomization.yaml":
             "helmGlobals: {configHome: helm-home}\nhelmCharts: [{name: greeter}]\n"},
            "UnsafeHelm", "kustomization.yaml: helmCharts configHome", "helm-home",
            id="globals-confighome",
        ),
        pytest.param(
            {"kustomization.yaml": "generators: [gen.yaml]\n",
             "gen.yaml": HCIG + "name: greeter\nchartHome: ../../../elsewhere\n"},
            "OutsideTree", "gen.yaml: HelmChartInflationGenerator", "outside the bundle tree",
            id="generator-charthome-outside",
        ),
    ],
)  # fmt: skip
def test_every_way_to_make_kustomize_run_helm_is_checked(
    counted_kustomize: ToolCounter,
    tmp_path: Path,
    files: dict[str, str],
    rule: str,
    where: str,
    words: str,
) -> None:
    # Issue 28, 2: only helmCharts was read; a generator could pull (network) or load helm
    # plugins from the tree (a getter plugin runs /bin/sh).
    tree = _write(tmp_path / "bundle", {**CHART, **files})
    (tree / "helm-home/plugins/getter").mkdir(parents=True)

    with pytest.raises(KustomizeError) as refused:
        _kustomize(tree)

    assert refused.value.rule == rule
    assert refused.value.file == where
    assert words in str(refused.value)
    assert counted_kustomize.runs == 0


def test_a_helm_chart_inflation_generator_in_the_tree_renders_with_the_pinned_helm(
    kustomize_binary: Path, helm_binary: Path, tmp_path: Path
) -> None:
    tree = _write(
        tmp_path,
        {
            **CHART,
            "kustomization.yaml": "generators: [gen.yaml]\n",
            "gen.yaml": HCIG + "name: greeter\nreleaseName: gen\n",
        },
    )

    ours = _kustomize(tree)

    assert ours == _kustomize_build(
        kustomize_binary, tree, ".", "--enable-helm", "--helm-command", str(helm_binary)
    )
    assert ours[0]["metadata"]["name"] == "gen-greeter"


@pytest.mark.parametrize(
    ("kustomization", "local", "where"),
    [
        ("resources: ['https://example.com/x.yaml']", "https:/example.com/x.yaml", "resources[0]"),
        ("resources: [github.com/org/repo]", "github.com/org/repo/kustomization.yaml",
         "resources[0]"),
        ("resources: ['GitHub.com/org/repo']", "GitHub.com/org/repo/kustomization.yaml",
         "resources[0]"),
        ("resources: ['git@host:org/repo']", "git@host:org/repo/kustomization.yaml",
         "resources[0]"),
        ("patches: [{path: 'http://example.com/p.yaml'}]", "http:/example.com/p.yaml",
         "patches[0].path"),
        ("helmCharts: [{name: greeter, valuesFile: 'https://example.com/v.yaml'}]",
         "https:/example.com/v.yaml", "helmCharts[0].valuesFile"),
        ("configMapGenerator: [{name: c, files: ['https://example.com/f']}]",
         "https:/example.com/f", "configMapGenerator[0].files[0]"),
    ],
)  # fmt: skip
def test_a_remote_reference_is_refused_even_when_a_same_named_path_exists(
    counted_kustomize: ToolCounter, tmp_path: Path, kustomization: str, local: str, where: str
) -> None:
    # Issue 28, 5: kustomize tries a URL or a git repository before a local path.
    tree = _write(tmp_path, {**CHART, "kustomization.yaml": kustomization + "\n"})
    _write(tree, {local: "resources: []\n"})

    with pytest.raises(KustomizeError) as refused:
        _kustomize(tree)

    assert refused.value.rule == "RemoteReference"
    assert refused.value.file == f"kustomization.yaml: {where}"
    assert "a render never fetches" in str(refused.value)
    assert counted_kustomize.runs == 0


def test_a_remote_path_in_a_generator_or_transformer_file_is_refused(
    counted_kustomize: ToolCounter, tmp_path: Path
) -> None:
    tree = _write(
        tmp_path,
        {
            "kustomization.yaml": "resources: [cm.yaml]\ntransformers: [patch.yaml]\n",
            "cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
            "patch.yaml": """
                apiVersion: builtin
                kind: PatchTransformer
                metadata: {name: p}
                path: https://example.com/patch.yaml
            """,
        },
    )
    with pytest.raises(KustomizeError) as refused:
        _kustomize(tree)

    assert refused.value.rule == "RemoteReference"
    assert refused.value.file == "patch.yaml: path"
    assert counted_kustomize.runs == 0


@pytest.mark.skipif(not support().confined, reason="the kernel has no Landlock")
def test_kustomize_and_its_helm_read_nothing_outside_the_tree(tmp_path: Path) -> None:
    # A chart in the tree passes the checks; its .Files.Get follows a link to a file of the
    # machine. kustomize's helm is confined as kustomize is: the read is refused.
    secret = tmp_path / "agent-state" / "token"
    secret.parent.mkdir()
    secret.write_text("the agent's token\n")
    tree = _write(tmp_path / "bundle", {"kustomization.yaml": "helmCharts: [{name: leaky}]\n"})
    hostile.escaping_link_chart(tree / "charts" / "leaky", outside=secret)

    with pytest.raises(KustomizeError) as refused:
        _kustomize(tree)

    message = str(refused.value)
    assert "permission denied" in message.lower() and "files/leak" in message
    assert CONFINED_HINT in message
    assert "the agent's token" not in message


def test_a_local_path_that_only_looks_like_a_host_renders(
    kustomize_binary: Path, tmp_path: Path
) -> None:
    # kustomize reads these from the tree (it fetches only URLs, git and github.com/... forms).
    tree = _write(
        tmp_path,
        {
            "kustomization.yaml": "resources: [config.d/cm.yaml, v1.2/cm.yaml]\n",
            "config.d/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
            "v1.2/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n",
        },
    )
    assert _ids(_kustomize(tree)) == [("ConfigMap", "a"), ("ConfigMap", "b")]
