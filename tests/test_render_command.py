"""``fleetlet render DIR``: format detection, every bad file at once, the files that are never
manifests, the options (``--path``, ``--values``, ``--set``, ...) and output formats, run as a
user runs them (``python -m fleetlet``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.render.detect import detect_format
from agent.render.values import parse_set

REPO_ROOT = Path(__file__).resolve().parent.parent
FLUX_EXAMPLE = REPO_ROOT / "tests" / "assets" / "flux2-kustomize-helm-example"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root


def _fleetlet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetlet", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
    )


def _cm(name: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n"


OLM_ANNOTATIONS = """
    annotations:
      operators.operatorframework.io.bundle.mediatype.v1: registry+v1
      operators.operatorframework.io.bundle.manifests.v1: manifests/
      operators.operatorframework.io.bundle.package.v1: example
"""


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"Chart.yaml": "apiVersion: v2\nname: x\nversion: 1.0.0\n"}, ("helm", "Chart.yaml")),
        ({"kustomization.yaml": "resources: []\n"}, ("kustomize", "kustomization.yaml")),
        ({"kustomization.yml": "resources: []\n"}, ("kustomize", "kustomization.yml")),
        ({"Kustomization": "resources: []\n"}, ("kustomize", "Kustomization")),
        (
            {"metadata/annotations.yaml": OLM_ANNOTATIONS, "manifests/csv.yaml": _cm("x")},
            ("registry+v1", "metadata/annotations.yaml"),
        ),
        # Annotations of another media type, or none: plain.
        ({"metadata/annotations.yaml": "annotations: {a: b}\n"}, ("plain", None)),
        ({"deploy.yaml": _cm("x"), "sub/Chart.yaml": "name: x\n"}, ("plain", None)),
        # One chart folder and nothing to apply beside it (an unpacked chart archive): helm.
        ({"README.md": "x", "sub/Chart.yaml": "name: x\n"}, ("helm", "sub/Chart.yaml")),
    ],
)
def test_the_format_is_detected_from_its_marker_files(
    tmp_path: Path, files: dict[str, str], expected: tuple[str, str | None]
) -> None:
    found = detect_format(_write(tmp_path, files))
    assert found.format == expected[0]
    assert (found.evidence is None) == (expected[1] is None)
    assert (found.evidence or "").startswith(expected[1] or "")


def test_render_says_which_format_it_chose_and_renders_with_it(
    kustomize_binary: Path,
) -> None:
    shown = _fleetlet("render", str(FLUX_EXAMPLE), "--path", "apps/staging", "--namespace", "x")

    assert shown.returncode == 0, shown.stderr
    assert f"{FLUX_EXAMPLE}/apps/staging: rendering as kustomize (kustomization.yaml)" in (
        shown.stderr
    )
    objects = list(yaml.safe_load_all(shown.stdout))
    expected = subprocess.run(
        [str(kustomize_binary), "build", "apps/staging"],
        cwd=FLUX_EXAMPLE,
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert objects == list(yaml.safe_load_all(expected.stdout))  # namespaced by the base


def test_a_plain_render_reports_every_bad_file_at_once(tmp_path: Path) -> None:
    tree = _write(
        tmp_path / "bundle",
        {
            "01_good.yaml": _cm("good"),
            "02_syntax.yaml": "kind: [unclosed\n",
            "03_noname.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
            "sub/04_nokind.yaml": "apiVersion: v1\nmetadata: {name: x}\n",
        },
    )

    shown = _fleetlet("render", str(tree))

    assert shown.returncode == 1
    lines = shown.stderr.splitlines()
    assert f"fleetlet: {tree}: rendering as plain (no format marker)" in lines
    assert f"fleetlet: {tree}: 3 files refused:" in lines
    listed = [line.strip().split(":")[0] for line in lines if line.startswith("  ")]
    assert listed == [
        "02_syntax.yaml",
        "03_noname.yaml (document 1)",
        "sub/04_nokind.yaml (document 1)",
    ]
    assert "[YamlSyntax]" in shown.stderr and "[MissingName]" in shown.stderr
    assert "[MissingKind]" in shown.stderr and shown.stdout == ""


def test_fleet_yaml_and_other_tool_files_are_never_manifests(tmp_path: Path) -> None:
    """A Rancher Fleet bundle directory: fleet.yaml and helm values beside the manifests."""
    tree = _write(
        tmp_path / "bundle",
        {
            "fleet.yaml": "defaultNamespace: web\nhelm:\n  releaseName: web\n",
            ".fleetignore": "*.md\n",
            "values.yaml": "replicas: 2\n",
            "values-prod.yaml": "replicas: 3\n",
            "deploy/configmap.yaml": _cm("web"),
            "deploy/kustomization.yaml": "resources: [configmap.yaml]\n",
            "chart/Chart.yaml": "apiVersion: v2\nname: c\nversion: 1.0.0\n",
        },
    )

    shown = _fleetlet("render", str(tree), "-o", "json")

    assert shown.returncode == 0, shown.stderr
    listed = json.loads(shown.stdout)
    assert listed["kind"] == "List"
    assert [(o["kind"], o["metadata"]["name"]) for o in listed["items"]] == [("ConfigMap", "web")]


def test_a_plain_render_of_another_format_says_so(tmp_path: Path) -> None:
    chart = _write(
        tmp_path / "chart",
        {
            "Chart.yaml": "apiVersion: v2\nname: web\nversion: 1.0.0\n",
            "templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
            "  name: {{ .Release.Name }}\n",
        },
    )

    shown = _fleetlet("render", str(chart), "--format", "plain")

    assert shown.returncode == 1
    assert (
        f"fleetlet: {chart}: looks like a helm bundle (Chart.yaml); rendering it as plain, "
        "as asked" in shown.stderr
    )
    assert "templates/cm.yaml" in shown.stderr

    from agent.render.formats import render_bundle
    from agent.render.manifests import InvalidManifestError
    from agent.render.plain import RenderRequest

    with pytest.raises(InvalidManifestError) as refused:
        render_bundle(chart, format="plain", request=RenderRequest())
    assert "looks like a helm bundle: Chart.yaml; render it with format helm" in str(refused.value)


@pytest.fixture
def echo_plugin(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A format plugin installed as pip would (a module plus dist-info with an entry point)
    that renders what it was given into a ConfigMap; the environment that finds it."""
    site = tmp_path / "site"
    info = site / "fleetlet_echo-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fleetlet-echo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fleetlet.formats]\necho = fleetlet_echo:Echo\n")
    (site / "fleetlet_echo.py").write_text(
        textwrap.dedent("""
        import json

        class Echo:
            name = "echo"

            def render(self, tree, request):
                given = {
                    "options": dict(request.options),
                    "kubeVersion": request.cluster.kube_version,
                    "files": sorted(p.name for p in tree.iterdir()),
                }
                return [{"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "echo"}, "data": {"given": json.dumps(given)}}]
        """)
    )
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    yield {"PYTHONPATH": path}


def test_every_option_reaches_the_format_as_formatoptions(
    tmp_path: Path, echo_plugin: dict[str, str]
) -> None:
    tree = _write(
        tmp_path / "bundle",
        {"chart/Chart.yaml": "name: web\n", "base.yaml": "image: {tag: '1.0'}\nreplicas: 1\n",
         "prod.yaml": "replicas: 3\nimage: {pullPolicy: Always}\n"},
    )  # fmt: skip

    shown = _fleetlet(
        "render", str(tree), "--format", "echo", "--path", "chart",
        "--values", str(tree / "base.yaml"), "--values", str(tree / "prod.yaml"),
        "--set", "image.tag=2.0,debug=true", "--set", "hosts[1]=b.example,ports={80,443}",
        "--namespace", "web", "--release-name", "shop", "--install-namespace", "ops",
        "--watch-namespace", "apps", "--kube-version", "v1.31.4",
        env=echo_plugin,
    )  # fmt: skip

    assert shown.returncode == 0, shown.stderr
    (echoed,) = list(yaml.safe_load_all(shown.stdout))
    assert echoed["metadata"]["namespace"] == "web"
    given = json.loads(echoed["data"]["given"])
    assert given == {
        "options": {
            "path": "chart",
            "targetNamespace": "web",
            "installNamespace": "ops",
            "watchNamespace": "apps",
            "releaseName": "shop",
            "values": {
                "image": {"tag": "2.0", "pullPolicy": "Always"},
                "replicas": 3,
                "debug": True,
                "hosts": [None, "b.example"],
                "ports": [80, 443],
            },
        },
        "kubeVersion": "v1.31.4",
        "files": ["base.yaml", "chart", "prod.yaml"],
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "a=b"], "--values/--set: the kustomize format takes no such option"),
        (["--release-name", "r"], "--release-name: the kustomize format takes no such option"),
        (["--watch-namespace", "w"], "--watch-namespace: the kustomize format takes no such"),
        (["--namespace", "Not_A_Label"], "invalid option: targetNamespace: expected a DNS-1123"),
        (["--path", "../elsewhere"], "invalid option: path: expected a path without '..'"),
        (["--values", "/nonexistent/values.yaml"], "--values /nonexistent/values.yaml:"),
        (["--set", "novalue"], "--set 'novalue': expected key=value"),
    ],
)
def test_options_a_format_does_not_take_are_refused(args: list[str], message: str) -> None:
    shown = _fleetlet("render", str(FLUX_EXAMPLE / "apps" / "base" / "podinfo"), *args)
    assert shown.returncode == 1
    assert message in shown.stderr, shown.stderr
    assert shown.stderr.count("\n") <= 2  # the note, the error


def test_set_follows_helms_syntax() -> None:
    assert parse_set(["a.b=1,c=true,d=null,e=007", "f={x,2}", "g[1].h=i", r"j\.k=l\,m"]) == {
        "a": {"b": 1},
        "c": True,
        "d": None,
        "e": "007",
        "f": ["x", 2],
        "g": [None, {"h": "i"}],
        "j.k": "l,m",
    }


def test_a_chart_archive_alone_or_a_tree_of_kustomize_overlays_says_what_to_pass(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "pulled"
    archive.mkdir()
    (archive / "podinfo-6.14.1.tgz").write_bytes(b"not read")
    done = _fleetlet("render", str(archive))
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1:] == [
        f"fleetlet: {archive} holds the chart archive podinfo-6.14.1.tgz and no manifests: "
        f"unpack it (tar -xzf {archive / 'podinfo-6.14.1.tgz'} -C {archive}) and render "
        f"{archive} again"
    ]
    tree = _write(
        tmp_path / "tree",
        {
            "base/kustomization.yaml": "resources: [cm.yaml]\n",
            "base/cm.yaml": _cm("web"),
            "overlays/prod/kustomization.yaml": "resources: [../../base]\npatches:\n- path: p.yaml\n",
            "overlays/prod/p.yaml": _cm("web") + "data: {size: large}\n",
        },
    )
    done = _fleetlet("render", str(tree))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1:] == [
        f"fleetlet: {tree} has no kustomization at its root but has some below it (base, "
        "overlays/prod): pass --path overlays/prod (or --format plain to read every file as "
        "manifests)"
    ]
    done = _fleetlet("render", str(tree), "--path", "overlays/prod")
    assert done.returncode == 0, done.stderr
    assert "size: large" in done.stdout


def test_a_duplicate_names_the_file_of_each_copy(tmp_path: Path) -> None:
    plain = _write(tmp_path / "plain", {"one.yaml": _cm("x"), "a/two.yaml": _cm("x")})
    done = _fleetlet("render", str(plain))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"fleetlet: {plain}: one.yaml: ConfigMap x appears twice: in a/two.yaml and in one.yaml "
        "(rule DuplicateObject)"
    )
    chart = _write(
        tmp_path / "chart",
        {
            "Chart.yaml": "apiVersion: v2\nname: c\nversion: 0.1.0\n",
            "templates/a.yaml": _cm("x"),
            "templates/b.yaml": "# the same object again\n" + _cm("x"),
        },
    )
    done = _fleetlet("render", str(chart))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"fleetlet: {chart}: c/templates/b.yaml: ConfigMap x appears twice: in "
        "c/templates/a.yaml and in c/templates/b.yaml (rule DuplicateObject)"
    )
