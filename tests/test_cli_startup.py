"""``fleetlet render`` loads only what a render uses (issue #29: the command line starts fast).

Each render runs as a user runs it, in its own interpreter with the real helm or kustomize, and
reports the modules it ended with; what it must not have loaded is named with why (each costs
start-up time that ``bench/render_cli.py`` measures; no wall-clock bound here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART = REPO_ROOT / "tests" / "assets" / "charts" / "podinfo"
FLUX_EXAMPLE = REPO_ROOT / "tests" / "assets" / "flux2-kustomize-helm-example"

# Runs the command as the console script does, then lists what it imported.
_PROBE = """
import contextlib, io, json, sys
from fleetlet.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "output": out.getvalue(), "modules": sorted(sys.modules)}))
"""

# Never needed by a render without a cluster, with why.
NOT_LOADED = {
    "agent.api.models._set": "the published set's types (only FormatOptions checks options)",
    "agent.api.models._status": "the status types",
    "agent.api.models._spec": "the BundleDeployment's types",
    "agent.api.signatures": "Sigstore verification",
    "hashlib": "no digest is taken (OpenSSL's library)",
    "logging": "a render that is confined logs nothing",
    "decimal": "only an integral float in a document needs it",
    "platform": "the architecture comes from os.uname",
    "hub": "the hub's code",
    "kubernetes": "the Kubernetes client",
    "cryptography": "no signature is checked",
}


def _render(*args: str) -> tuple[dict[str, object], set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "render", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return result, set(result["modules"])


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([str(CHART), "--release-name", "podinfo"], id="helm chart"),
        pytest.param([str(FLUX_EXAMPLE), "--path", "apps/production"], id="kustomize --path"),
    ],
)
def test_a_render_loads_only_what_it_uses(args: list[str]) -> None:
    result, modules = _render(*args)
    assert result["code"] == 0
    assert str(result["output"]).startswith("---\napiVersion: ")
    from agent.render.confine import support

    unused = dict(NOT_LOADED)
    if not support().confined:
        del unused["logging"]  # the render warns that it runs unconfined here
    loaded = {
        name: why
        for name, why in unused.items()
        if name in modules or any(m.startswith(name + ".") for m in modules)
    }
    assert loaded == {}, f"a render loaded modules it does not use: {loaded}"
    # The C YAML parser reads helm's and kustomize's output.
    assert "yaml._yaml" in modules


# --- the head start: helm or kustomize started while the rest loads ----------------------------

CHART_FILES = {
    "Chart.yaml": "apiVersion: v2\nname: settings\nversion: 1.0.0\n",
    "templates/cm.yaml": (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  release: {{ .Release.Name | quote }}\n  namespace: {{ .Release.Namespace }}\n"
    ),
}


def _chart(root: Path) -> Path:
    for name, text in CHART_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("which", "path", "release"),
    [
        pytest.param("chart", None, None, id="chart, release name from Chart.yaml"),
        pytest.param("chart", None, "shop", id="chart, --release-name"),
        pytest.param("flux", "apps/production", None, id="kustomize --path"),
    ],
)
def test_the_render_takes_over_its_head_start_and_prints_the_same(
    which: str, path: str | None, release: str | None, tmp_path: Path
) -> None:
    from agent.render._launch import discard_early
    from agent.render.command import RenderOptions, run_render
    from agent.render.headstart import head_start
    from agent.render.tools import ToolSettings

    bundle = str(_chart(tmp_path) if which == "chart" else FLUX_EXAMPLE)
    tools = ToolSettings.from_env()
    options = RenderOptions(path=path, release_name=release)
    without = run_render(bundle_dir=bundle, options=options, tools=tools)
    early = head_start(bundle_dir=bundle, format=None, path=path, namespace=None,
                       release_name=release, kube_version=None, environ=os.environ)  # fmt: skip
    try:
        with_head_start = run_render(bundle_dir=bundle, options=options, tools=tools)
    finally:
        discard_early()
    assert early is not None and early.adopted
    assert with_head_start == without
    if which == "chart":
        assert f"release: {release or 'settings'}" in without


def test_a_head_start_the_render_does_not_ask_for_is_killed_unread(tmp_path: Path) -> None:
    from agent.render._launch import discard_early
    from agent.render.command import RenderOptions, run_render
    from agent.render.headstart import head_start
    from agent.render.tools import ToolSettings

    bundle = str(_chart(tmp_path))
    tools = ToolSettings.from_env()
    # Started for another namespace than the render's: another helm process.
    early = head_start(bundle_dir=bundle, format=None, path=None, namespace="elsewhere",
                       release_name=None, kube_version=None, environ=os.environ)  # fmt: skip
    try:
        text = run_render(bundle_dir=bundle, options=RenderOptions(), tools=tools)
    finally:
        discard_early()
    assert early is not None and not early.adopted
    assert early.proc.returncode is not None  # killed and reaped
    assert "namespace: default" in text and "elsewhere" not in text


def test_no_head_start_for_a_path_outside_the_tree_or_another_format(tmp_path: Path) -> None:
    from agent.render.headstart import head_start

    _chart(tmp_path / "bundle")
    _chart(tmp_path / "outside")
    common = {"namespace": None, "release_name": None, "kube_version": None, "environ": os.environ}
    bundle = str(tmp_path / "bundle")
    assert head_start(bundle_dir=bundle, format=None, path="../outside", **common) is None
    assert head_start(bundle_dir=bundle, format="plain", path=None, **common) is None
    assert head_start(bundle_dir=str(tmp_path / "none"), format=None, path=None, **common) is None


def test_a_hostile_tree_is_refused_as_without_a_head_start_and_its_process_killed(
    tmp_path: Path,
) -> None:
    """The head start runs kustomize before the render's checks: a remote reference behind a
    local base is still refused by those checks, word for word as without a head start, and
    the early process is killed, its output never read."""
    from agent.render._launch import discard_early
    from agent.render.command import RenderOptions, run_render
    from agent.render.headstart import head_start
    from agent.render.kustomize import KustomizeError
    from agent.render.tools import ToolSettings

    (tmp_path / "app").mkdir()
    (tmp_path / "remote").mkdir()
    (tmp_path / "app" / "kustomization.yaml").write_text("resources: [../remote]\n")
    (tmp_path / "remote" / "kustomization.yaml").write_text(
        "resources:\n- https://github.com/kubernetes-sigs/kustomize//examples/multibases?ref=v3.3.1\n"
    )
    bundle = str(tmp_path)
    tools = ToolSettings.from_env()
    options = RenderOptions(path="app")
    with pytest.raises(KustomizeError) as without:
        run_render(bundle_dir=bundle, options=options, tools=tools)
    early = head_start(bundle_dir=bundle, format=None, path="app", namespace=None,
                       release_name=None, kube_version=None, environ=os.environ)  # fmt: skip
    try:
        with pytest.raises(KustomizeError) as refused:
            run_render(bundle_dir=bundle, options=options, tools=tools)
    finally:
        discard_early()
    assert refused.value.rule == "RemoteReference"
    assert str(refused.value) == str(without.value)
    assert early is not None and not early.adopted
    assert early.proc.returncode is not None  # killed and reaped


# --- the head start comes first: before argparse, PyYAML and the render code load -----------

# Records what was loaded when the head start's process was started, then renders as the
# console script does.
_SPAWN_PROBE = """
import sys
at_start = sorted(sys.modules)  # what the interpreter's site loaded (this machine's hooks)
import json
import agent.render._launch as launch
seen = []
started = launch.Launch.start
def start(self):
    seen.append({"argv": self.args, "modules": sorted(sys.modules)})
    return started(self)
launch.Launch.start = start
from fleetlet.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"code": code, "spawned": seen, "at_start": at_start}), file=sys.stderr)
"""

# Loaded after the renderer started (each costs a few ms of start-up that helm's run now hides).
LOADED_LATER = {
    "argparse": "the command line's parser (the head start reads the few options it follows)",
    "yaml": "PyYAML: no YAML is read to start the renderer",
    "dataclasses": "with inspect, ast and dis",
    "pathlib": "paths are text until the render runs",
    "typing": "annotations only",
    "agent.render.confine": "the confinement's public face (dataclasses)",
    "agent.render.tools": "the tool settings (dataclasses)",
    "agent.render._process": "run_tool, which takes the head start over",
}


@pytest.mark.parametrize(
    ("args", "tool"),
    [
        pytest.param([str(CHART), "--release-name", "podinfo"], "helm", id="helm chart"),
        pytest.param(
            [str(FLUX_EXAMPLE), "--path=apps/production"], "kustomize", id="kustomize --path="
        ),
    ],
)
def test_the_renderer_starts_before_the_parser_and_the_render_code_load(
    args: list[str], tool: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SPAWN_PROBE, "render", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stderr.splitlines()[-1])
    assert report["code"] == 0
    assert done.stdout.startswith("---\napiVersion: ")
    from agent.render.confine import support

    if not support().confined:
        assert report["spawned"][0]["argv"] == []  # no head start where nothing confines
        return
    # One process: the head start's, taken over by the render (no second start).
    assert len(report["spawned"]) == 1, report["spawned"]
    first = report["spawned"][0]
    assert Path(first["argv"][0]).name == tool
    modules = set(first["modules"]) - set(report["at_start"])
    early = {
        name: why
        for name, why in LOADED_LATER.items()
        if name in modules or any(m.startswith(name + ".") for m in modules)
    }
    assert early == {}, f"loaded before the renderer started: {early}"


@pytest.mark.parametrize(
    ("args", "started"),
    [
        pytest.param(["CHART"], True, id="a chart"),
        pytest.param(["CHART", "--release-name", "shop", "-o", "json"], True, id="options"),
        pytest.param(["CHART", "--namespace=apps"], True, id="--option=value"),
        pytest.param(["CHART", "--values", "v.yaml"], False, id="values: not followed"),
        pytest.param(["CHART", "--set", "a=b"], False, id="--set: not followed"),
        pytest.param(["CHART", "--help"], False, id="--help"),
        pytest.param(["CHART", "--release", "shop"], False, id="an abbreviation"),
        pytest.param(["CHART", "--release-name"], False, id="a missing value"),
        pytest.param(["CHART", "CHART"], False, id="two directories"),
        pytest.param([], False, id="no directory"),
    ],
)
def test_the_head_start_follows_only_command_lines_it_reads_exactly(
    args: list[str], started: bool, tmp_path: Path
) -> None:
    from agent.render._launch import discard_early
    from agent.render.headstart import start_for_command_line

    bundle = str(_chart(tmp_path))
    try:
        early = start_for_command_line([bundle if a == "CHART" else a for a in args], os.environ)
        from agent.render.confine import support

        assert (early is not None) == (started and support().confined)
    finally:
        discard_early()


@pytest.mark.parametrize(
    ("chart", "name"),
    [
        pytest.param(b"apiVersion: v2\nname: podinfo\nversion: 1\n", "podinfo", id="plain"),
        pytest.param(b"name: 'web-1.2'\n", "web-1.2", id="quoted"),
        pytest.param(b"name: Web\n", None, id="not a release name"),
        pytest.param(b"name: web # the app\n", None, id="a comment: left to the render"),
        pytest.param(b"name: web\r\nversion: 1\r\n", "web", id="CRLF"),
        pytest.param(b"description: x\n  name: web\n", None, id="not at the top"),
    ],
)
def test_the_head_start_reads_the_release_name_only_from_a_plain_line(
    chart: bytes, name: str | None
) -> None:
    from agent.render.headstart import _chart_name

    assert _chart_name(chart) == name


def test_the_console_script_renders_exits_and_cleans_up_like_main(tmp_path: Path) -> None:
    """``python -m fleetlet render`` (the console script's ``run``: no garbage collector, no
    interpreter teardown) prints what ``main`` prints, removes the head start's scratch
    directory, and exits non-zero with the one-line error for a bad directory."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-m", "fleetlet", "render", str(FLUX_EXAMPLE), "--path",
            "apps/production"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result, _ = _render(str(FLUX_EXAMPLE), "--path", "apps/production")
    assert done.stdout == result["output"]
    assert list(tmp_path.iterdir()) == []  # the kustomize scratch directories are gone
    missing = subprocess.run(
        [sys.executable, "-m", "fleetlet", "render", str(tmp_path / "nowhere")],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=env,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "nowhere: no such directory" in missing.stderr


def test_render_help_starts_no_renderer_and_loads_none_of_its_code() -> None:
    probe = """
import sys
at_start = set(sys.modules)
import contextlib, io, json
from fleetlet.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(["render", "--help"])
    except SystemExit:
        pass
print(json.dumps({"help": out.getvalue(), "modules": sorted(set(sys.modules) - at_start)}))
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert "usage: fleetlet render" in report["help"]
    loaded = set(report["modules"])
    # The head start's modules, and what they load to start a confined process.
    assert not loaded & {"agent.render.headstart", "agent.render._launch",
                         "agent.render._sandbox", "ctypes"}  # fmt: skip
