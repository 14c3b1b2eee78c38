"""Format plugins: the example ``jsonnet`` distribution (``examples/fleetlet-jsonnet``, installed
by ``scripts/install.sh``) rendered and deployed end to end, and plugins that misbehave (raise,
hang, eat memory, crash, print, return nonsense) run in their bounded child process: each gives
one clear reason, and the agent, a real ``fleetlet agent run`` process, keeps running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

from agent.kube import KubeClient
from agent.render import confine, formats
from agent.render.confine import CONFINED_HINT, support
from agent.render.formats import render_bundle
from agent.render.plain import RenderRequest
from agent.render.plugins import (
    PluginError,
    PluginLoadError,
    PluginMemoryError,
    PluginTemporaryError,
    PluginTimeoutError,
    fleetlet_root,
    worker_path,
)
from agent.render.tools import ToolSettings
from tests.fleetlab import REPO_ROOT, Lab, conditions, live
from tests.hostile import renderers as hostile
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed

BAD_PLUGINS = """
import os, sys, threading
from agent.errors import TemporaryError
from agent.render.plugin_api import InvalidManifestError

def _cm(name):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}

class Raises:
    name = "raises"
    def render(self, tree, request):
        raise ValueError("the template is broken at line 3")

class Refuses:
    name = "refuses"
    def render(self, tree, request):
        raise InvalidManifestError("no main file", source=request.source, rule="NoMain")

class Flaky:
    name = "flaky"
    def render(self, tree, request):
        raise TemporaryError("the vault is sealed", delay=7)

class Hangs:
    name = "hangs"
    def render(self, tree, request):
        threading.Event().wait()

class Eats:
    name = "eats"
    def render(self, tree, request):
        kept = []
        while True:
            kept.append(bytearray(16 << 20))

class Crashes:
    name = "crashes"
    def render(self, tree, request):
        sys.stderr.write("about to die\\n")
        os._exit(9)

class Chatty:
    name = "chatty"
    def render(self, tree, request):
        print("debug: rendering", tree)  # must not be taken for the result
        return [_cm("chatty")]

class Nonsense:
    name = "nonsense"
    def render(self, tree, request):
        return {"not": "a list"}

class Future:
    name = "future"
    api_version = 2
    def render(self, tree, request):
        return []

class Snoop:
    # Tries what options["try"] says, the way a hostile bundle's plugin (or a plugin fooled
    # by its bundle) would.
    name = "snoop"
    def render(self, tree, request):
        import socket
        what, target = request.options["try"], request.options.get("target")
        if what == "read":
            data = open(target).read()
        elif what == "write":
            data = open(target, "w").write("x")
        elif what == "socket":
            data = socket.create_connection(("127.0.0.1", int(target)), timeout=5).recv(10)
        elif what == "udp":
            data = socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
        elif what == "tree":
            data = (tree / "main.txt").read_text()
        return [dict(_cm("snooped"), data={"got": str(data)})]

class Patcher:
    name = "patcher"
    applies_patches = True
    def render(self, tree, request):
        return [dict(_cm("patched-by-plugin"), data={"patches": str(len(request.patches))})]

raise_on_import = None
"""
NAMES = ["raises", "refuses", "flaky", "hangs", "eats", "crashes", "chatty", "nonsense",
         "future", "patcher", "snoop"]  # fmt: skip


@pytest.fixture
def bad_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Misbehaving plugins installed as pip would (a module, a dist-info with entry points),
    found through PYTHONPATH; the environment that finds them."""
    site = tmp_path / "site"
    info = site / "fleetlet_bad-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fleetlet-bad\nVersion: 1.0\n")
    entries = "".join(f"{n} = fleetlet_bad:{n.capitalize()}\n" for n in NAMES)
    (info / "entry_points.txt").write_text(
        "[fleetlet.formats]\n" + entries + "broken = fleetlet_missing:Nothing\n"
    )
    (site / "fleetlet_bad.py").write_text(textwrap.dedent(BAD_PLUGINS))
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    sys.path.insert(0, str(site))
    formats._plugins.cache_clear()
    yield {"PYTHONPATH": path}
    sys.path.remove(str(site))
    for name in [*NAMES, "broken"]:
        formats._LOADED.pop(name, None)
    formats._plugins.cache_clear()


def _render(tree: Path, name: str, **kw: object) -> list[dict[str, object]]:
    if (tree / "site").is_dir():  # the bad_plugins fixture's tmp_path: render a tree beside it
        tree = tree / "bundle"
        tree.mkdir(exist_ok=True)
    request = RenderRequest(
        source="b", tools=ToolSettings(plugin_timeout=3, plugin_max_memory=256 << 20), **kw
    )  # type: ignore[arg-type]
    return render_bundle(tree, format=name, request=request)


@pytest.mark.usefixtures("bad_plugins")
@pytest.mark.parametrize(
    ("name", "error", "rule", "message"),
    [
        ("raises", PluginError, "PluginFailed",
         "format plugin 'raises' (fleetlet-bad==1.0) failed: ValueError: the template is broken"),
        ("refuses", PluginError, "NoMain", "format plugin 'refuses' (fleetlet-bad==1.0): no main"),
        ("hangs", PluginTimeoutError, "PluginTimeout", "ran longer than 3 s and was stopped"),
        ("eats", PluginMemoryError, "PluginOutOfMemory",
         "needed more than 256 MiB of memory and was stopped"),
        ("crashes", PluginError, "PluginCrashed",
         f"crashed: {Path(sys.executable).name} failed (exit code 9): about to die"),
        ("nonsense", PluginError, "BadPluginOutput", "returned a dict, not a list"),
    ],
)  # fmt: skip
def test_a_misbehaving_plugin_gives_one_clear_refusal(
    tmp_path: Path, name: str, error: type[Exception], rule: str, message: str
) -> None:
    with pytest.raises(error) as refused:
        _render(tmp_path, name)
    assert refused.value.rule == rule  # type: ignore[attr-defined]
    assert message in str(refused.value)


@pytest.mark.usefixtures("bad_plugins")
def test_plugin_errors_that_are_not_render_failures(tmp_path: Path) -> None:
    with pytest.raises(PluginTemporaryError) as flaky:
        _render(tmp_path, "flaky")
    assert flaky.value.delay == 7 and "the vault is sealed" in str(flaky.value)
    with pytest.raises(PluginLoadError, match="failed to load: ModuleNotFoundError"):
        _render(tmp_path, "broken")
    with pytest.raises(PluginLoadError, match="written for plugin API version 2; this fleetlet"):
        _render(tmp_path, "future")


@pytest.mark.usefixtures("bad_plugins")
def test_prints_go_to_stderr_and_patches_are_left_to_a_plugin_that_applies_them(
    tmp_path: Path,
) -> None:
    assert [o["metadata"] for o in _render(tmp_path, "chatty")] == [{"name": "chatty"}]
    patch = {"patch": "metadata: {labels: {x: y}}", "target": {"kind": "ConfigMap"}}
    (patched,) = _render(tmp_path, "patcher", patches=(patch,))
    assert patched["data"] == {"patches": "1"}
    assert "labels" not in patched["metadata"]  # fleetlet did not apply it again


@pytest.mark.usefixtures("bad_plugins")
def test_nothing_in_the_bundle_tree_can_stand_in_for_fleetlet_or_the_plugin(
    tmp_path: Path,
) -> None:
    # Issue 28, 1: the worker ran as `python -m ...` in the tree, so these were imported first.
    tree = hostile.shadowing_tree(tmp_path / "bundle", plugin_module="fleetlet_bad")

    assert [o["metadata"] for o in _render(tree, "chatty")] == [{"name": "chatty"}]
    assert not list(tree.rglob("HIJACKED")), "a module of the tree ran"


def test_fleetlet_render_on_the_operators_machine_imports_nothing_from_the_tree(
    tmp_path: Path, bad_plugins: dict[str, str]
) -> None:
    tree = hostile.shadowing_tree(tmp_path / "bundle", plugin_module="fleetlet_bad")

    shown = subprocess.run(
        [sys.executable, "-m", "fleetlet", "render", str(tree), "--format", "chatty",
         "-o", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        env={**os.environ, **bad_plugins},
    )  # fmt: skip

    assert shown.returncode == 0, shown.stderr
    assert '"chatty"' in shown.stdout
    assert not list(tree.rglob("HIJACKED")), "a module of the tree ran"


@pytest.mark.usefixtures("bad_plugins")
@pytest.mark.skipif(not support().confined, reason="the kernel has no Landlock")
@pytest.mark.parametrize("attempt", ["read", "token", "write", "socket", "udp"])
def test_a_plugin_reaches_nothing_outside_its_tree(tmp_path: Path, attempt: str) -> None:
    tree = _write(tmp_path / "bundle", {"main.txt": "ours\n"})
    secret = _write(tmp_path / "agent-state", {"token": "the agent's token\n"}) / "token"
    with socket.create_server(("127.0.0.1", 0)) as server:
        target = {
            "read": str(secret),
            "token": "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "write": str(tmp_path / "planted"),
            "socket": str(server.getsockname()[1]),
            "udp": "",
        }[attempt]
        if attempt == "token" and not Path(target).exists():
            target = str(secret)  # not in a pod: the same refusal on a stand-in

        with pytest.raises(PluginError) as refused:
            how = "read" if attempt == "token" else attempt
            _render(tree, "snoop", options={"try": how, "target": target})

    message = str(refused.value)
    assert refused.value.rule == "PluginFailed"
    assert "PermissionError" in message and "Permission denied" in message
    assert CONFINED_HINT in message
    assert not (tmp_path / "planted").exists()
    # What it may do: read its own tree.
    (ok,) = _render(tree, "snoop", options={"try": "tree"})
    assert ok["data"] == {"got": "ours\n"}


def test_no_renderer_may_read_the_token_the_state_or_credentials(tmp_path: Path) -> None:
    # What every renderer's confinement names (the kernel enforces it where Landlock exists):
    # the bundle tree, scratch, programs and libraries, none of which holds a credential.
    tree, scratch = tmp_path / "tree", tmp_path / "scratch"
    python = confine.for_python(
        tree=tree, scratch=scratch, path=worker_path(tree)[1:], code=fleetlet_root()
    )
    helm = confine.for_tool(Path("/usr/local/bin/helm"), tree=tree)
    kustomize = confine.for_tool(
        Path("/usr/local/bin/kustomize"), tree=tree, scratch=scratch,
        also_execute=[Path("/usr/local/bin/helm")],
    )  # fmt: skip
    secrets = [
        Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        Path.home() / ".git-credentials",
        Path.home() / ".kube" / "config",
        tmp_path / "agent-cache" / "state.json",
        Path("/proc/1/environ"),
        Path("/etc/shadow"),
    ]
    for confinement in (python, helm, kustomize):
        assert confinement.readable(tree / "Chart.yaml")
        assert [s for s in secrets if confinement.readable(s)] == []
    assert python.readable(fleetlet_root() / "agent" / "errors.py")
    assert not python.readable(fleetlet_root() / ".git" / "config")


def _jsonnet_installed() -> None:
    try:
        distribution("fleetlet-jsonnet")
    except PackageNotFoundError:  # pragma: no cover - scripts/install.sh installs it
        pytest.fail("the example plugin is not installed: run scripts/install.sh")


JSONNET_TREE = {
    "lib/app.libsonnet": """
        {
          deployment(name, image, replicas):: {
            apiVersion: 'apps/v1', kind: 'Deployment',
            metadata: { name: name, labels: { app: name } },
            spec: {
              replicas: replicas,
              selector: { matchLabels: { app: name } },
              template: {
                metadata: { labels: { app: name } },
                spec: { containers: [{ name: 'main', image: image }] },
              },
            },
          },
        }
    """,
    "deploy/main.jsonnet": """
        local app = import 'app.libsonnet';
        local values = std.extVar('values');
        [
          app.deployment('web', 'example/web:' + values.tag, values.replicas),
          {
            apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'web-settings' },
            data: { namespace: std.extVar('namespace'), kube: std.extVar('kubeVersion') },
          },
        ]
    """,
}


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root


def test_the_jsonnet_plugin_renders_with_values_and_stays_in_its_tree(tmp_path: Path) -> None:
    _jsonnet_installed()
    tree = _write(tmp_path / "bundle", JSONNET_TREE)
    shown = subprocess.run(
        [sys.executable, "-m", "fleetlet", "render", str(tree), "--format", "jsonnet",
         "--path", "deploy", "--namespace", "shop", "--kube-version", "v1.37.2", "-o", "json"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    # No values given: the template's std.extVar('values').tag fails, said in jsonnet's words.
    assert shown.returncode == 1
    assert (
        "RUNTIME ERROR: field does not exist: replicas (at deploy/main.jsonnet:4:" in shown.stderr
    )
    assert shown.stderr.count("\n") == 1 and "(rule JsonnetError)" in shown.stderr

    objects = _render(
        tree, "jsonnet", namespace="shop", options={"path": "deploy", "values": {
            "tag": "1.4", "replicas": 2}},
    )  # fmt: skip
    assert [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in objects] == [
        ("Deployment", "web", "shop"),
        ("ConfigMap", "web-settings", "shop"),
    ]
    assert objects[0]["spec"]["template"]["spec"]["containers"][0]["image"] == "example/web:1.4"
    assert objects[1]["data"] == {"namespace": "shop", "kube": ""}

    # The render cache keys the plugin by its distribution, entry point and jsonnet's version.
    identity = formats.get_format("jsonnet").cache_identity(ToolSettings())  # type: ignore[attr-defined]
    assert identity.startswith("fleetlet-jsonnet==0.1.0 fleetlet_jsonnet:JsonnetFormat jsonnet v")

    (tree / "deploy" / "main.jsonnet").write_text("importstr '/etc/hostname'\n")
    with pytest.raises(PluginError) as escaped:
        _render(tree, "jsonnet", options={"path": "deploy"})
    assert escaped.value.rule == "ImportOutsideTree"


def test_a_jsonnet_bundle_is_published_and_synced_by_the_agent(
    lab: Lab, crds: Cluster, namespace: str, app_namespace: str, tmp_path: Path
) -> None:
    _jsonnet_installed()
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    tree = _write(tmp_path / "jsonnet-bundle", JSONNET_TREE)
    from tests.realenv.oci import OciClient, push_bundle

    digest = push_bundle(OciClient(host=lab.registry.host), "jsonnet/web", tree, tag="1").digest
    name = lab.name("web")
    lab.publish(
        [
            {
                "name": name,
                "sources": [lab.source("jsonnet/web", digest)],
                "format": "jsonnet",
                "formatOptions": {
                    "path": "deploy",
                    "targetNamespace": app_namespace,
                    "values": {"tag": "1.0", "replicas": 1},
                },
                "overrides": [{"clusters": ["edge-1"], "values": {"tag": "2.0"}}],
                "healthChecks": {"timeoutSeconds": 120},
            }
        ]
    )
    agent = lab.agent("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent")

    first = agent.tick()

    assert first.outbound is not None and first.outbound.moved == (name,), first
    assert conditions(kube, name)["Ready"]["status"] == "True"
    deployment = live(kube, "apps/v1", "Deployment", "web", app_namespace)
    assert deployment is not None
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "example/web:2.0"  # edge-1's override of the values
    settings = live(kube, "v1", "ConfigMap", "web-settings", app_namespace)
    assert settings is not None
    assert settings["data"]["kube"].startswith("v1.")  # the agent's cluster facts


def _wait(predicate: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_agent_survives_plugins_that_raise_hang_and_eat_memory(
    lab: Lab,
    crds: Cluster,
    namespace: str,
    app_namespace: str,
    tmp_path: Path,
    bad_plugins: dict[str, str],
) -> None:
    """A real ``fleetlet agent run``: in each publication a misbehaving plugin bundle fails
    its own group (Ready False RenderFailed, in the plugin's words) while the good bundle of
    the same publication moves on; then a good publication is applied by the same, still
    running, agent process."""
    kube = KubeClient(kubeconfig=str(crds.kubeconfig))
    digest = lab.push("any", {"cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"},
                      tag="1")  # fmt: skip
    good = lab.name("good")

    def good_bundle(value: str) -> dict[str, object]:
        manifest = (f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: good, namespace: "
                    f"{app_namespace}}}\ndata: {{value: '{value}'}}\n")  # fmt: skip
        return {"name": good, "sources": [lab.source("good", lab.push(
            "good", {"cm.yaml": manifest}, tag=value))]}  # fmt: skip

    lab.publish([good_bundle("one")])
    env = {
        **os.environ,
        **bad_plugins,
        "FLEETLET_PLUGIN_TIMEOUT": "5",
        "FLEETLET_PLUGIN_MAX_MEMORY": "256",
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "fleetlet", "agent", "run",
         *lab.agent_args("edge-1", crds, namespace=namespace, workdir=tmp_path / "agent"),
         "--interval", "1", "--jitter", "0.2"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "agent.log").open("w"),
    )  # fmt: skip
    try:

        def ready() -> dict[str, object]:
            if live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", good) is None:
                return {}
            return conditions(kube, good).get("Ready", {})

        def value() -> object:
            cm = live(kube, "v1", "ConfigMap", "good", app_namespace)
            return None if cm is None else cm["data"]["value"]

        _wait(lambda: ready().get("status") == "True" and value() == "one", "the good bundle")
        for kind, message in [
            ("raises", "failed: ValueError: the template is broken at line 3"),
            ("hangs", "ran longer than 5 s and was stopped"),
            ("eats", "needed more than 256 MiB of memory and was stopped"),
        ]:
            name = lab.name(kind)

            def refusal(name: str = name) -> dict[str, object]:
                if live(kube, "fleetlet.io/v1alpha1", "BundleDeployment", name) is None:
                    return {}
                return conditions(kube, name).get("Ready", {})

            bad = {"name": name, "sources": [lab.source("any", digest)], "format": kind}
            lab.publish([good_bundle(kind), bad])
            _wait(lambda: refusal().get("reason") == "RenderFailed", f"the {kind} plugin's refusal")
            assert refusal()["status"] == "False"
            assert f"format plugin '{kind}' (fleetlet-bad==1.0)" in str(refusal()["message"])
            assert message in str(refusal()["message"])
            # The good bundle of the same publication moved on.
            _wait(lambda k=kind: value() == k and ready().get("status") == "True", "good moved")
            assert agent.poll() is None, "the agent died"

        lab.publish([good_bundle("two")])
        _wait(lambda: value() == "two", "the next good publication, applied by the same agent")
        _wait(lambda: ready().get("status") == "True", "Ready again")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    log = (tmp_path / "agent.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_the_plugin_reference_documents_every_request_field_a_plugin_gets() -> None:
    """docs/plugins.md names every RenderRequest field the worker rebuilds for a plugin."""
    documented = (REPO_ROOT / "docs" / "plugins.md").read_text()
    passed = ("source", "namespace", "options", "patches", "cluster", "upgrade", "tools")
    for field in passed:
        assert f"`request.{field}`" in documented, field
    from agent.render.plugins import _request_data

    wire = _request_data(RenderRequest(patches=({"patch": "x"},), upgrade=True))
    assert wire["patches"] == [{"patch": "x"}] and wire["upgrade"] is True
