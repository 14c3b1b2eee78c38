"""``fleetlet --help`` and the read-only commands load only what they use (issue #29: the command
line starts fast).

Each command runs as a user runs it, in its own interpreter, and reports the modules it ended
with; what it must not have loaded is named with why (each costs start-up time that
``bench/render_cli.py`` measures; no wall-clock bound here). The help a lean process prints is
the help of the whole command tree built once everything is loaded: building the parser without
the server's code changes no flag, default or word.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
COLUMNS = "100"  # the same wrapping in the child and here

# Runs the command as the console script does (``--help`` exits through SystemExit), then lists
# what it imported beyond what the interpreter's site loaded (this machine's start-up hooks).
_PROBE = """
import sys
at_start = set(sys.modules)
import contextlib, io, json
from fleetlet.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
modules = sorted(set(sys.modules) - at_start)
print(json.dumps({"code": code, "output": out.getvalue(), "modules": modules}))
"""

# Never needed to print a command's help, with why.
NOT_LOADED_BY_HELP = {
    "asyncio": "the agents' notification channel (hub.channel) and the web server: hub serve's",
    "urllib.request": "asking a hub over HTTP (http.client, email, ssl): when such a command runs",
    "http.client": "see urllib.request",
    "email": "see urllib.request",
    "ssl": "see urllib.request",
    "yaml": "PyYAML: no YAML is read to print help",
    "logging": "the choices of --log-level come from agent.report.loglevels",
    "dataclasses": "with inspect, ast and dis: the notifier's and the hub's types",
    "hashlib": "OpenSSL's library: no digest is taken",
    "hub.serve": "the server: hub serve's options are in hub.serve_options",
    "hub.channel": "the notification channel's server side",
    "hub.notify": "the commit statuses and alerts",
    "hub.status": "the status aggregate (git)",
    "hub.fleet": "the fleet loader",
    "hub.publish": "the publisher",
    "fleetlet.demo": "the demo (PyYAML; its scenarios pack agent artifacts)",
    "agent.upgrade.artifact": "the agent's upgrade artifacts",
    "agent.upgrade.deployment": "the in-pod upgrade (agent install's --help names its settings only)",
    "agent.report.logs": "logging's set-up",
    "kubernetes": "the Kubernetes client",
    "cryptography": "no key is read",
    "sigstore": "no signature is made or checked",
    "pygit2": "no git repository is read",
    "uvicorn": "the web server",
    "jsonschema": "no document is validated",
}


def _fleetlet(*args: str) -> tuple[dict[str, object], set[str], str]:
    """The probe's report, the modules the command loaded and what it wrote to stderr."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": COLUMNS},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return result, set(result["modules"]), done.stderr


def _loaded(modules: set[str], unused: dict[str, str]) -> dict[str, str]:
    return {
        name: why
        for name, why in unused.items()
        if name in modules or any(m.startswith(name + ".") for m in modules)
    }


def _whole_tree_help(path: list[str]) -> str:
    """The help of ``fleetlet PATH --help`` from the whole command tree, built here with the
    server's code, the notifier and the demo loaded."""
    import importlib

    from fleetlet.cli import build_parser

    for name in ("fleetlet.demo.scenarios", "hub.channel", "hub.notify", "hub.serve"):
        importlib.import_module(name)

    parser = build_parser()
    for word in path:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[word]
    return parser.format_help()


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        pytest.param([], "import", id="fleetlet --help"),
        pytest.param(["hub"], "channel-token", id="hub --help"),
        pytest.param(["hub", "serve"], "--channel-keepalive DURATION", id="hub serve --help"),
        pytest.param(["hub", "publish"], "--log-level {debug,info,warning,error}", id="publish"),
        pytest.param(["hub", "rollout"], "COMMAND", id="hub rollout --help"),
        pytest.param(["installations", "list"], "--token-file FILE", id="installations list"),
        pytest.param(["explain"], "CLUSTER", id="explain --help"),
        pytest.param(["agent", "run"], "--log-format {text,json}", id="agent run --help"),
        pytest.param(
            ["demo"], "{install,failed-upgrade,approval,rollout,agent-upgrade}", id="demo --help"
        ),
    ],
)
def test_help_loads_none_of_the_commands_code_and_reads_the_same(
    path: list[str], shown: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, modules, _ = _fleetlet(*path, "--help")
    assert result["code"] == 0
    loaded = _loaded(modules, NOT_LOADED_BY_HELP)
    assert loaded == {}, f"fleetlet {' '.join(path)} --help loaded: {loaded}"
    monkeypatch.setenv("COLUMNS", COLUMNS)
    assert result["output"] == _whole_tree_help(path)
    assert shown in str(result["output"])


def test_the_demo_offers_its_scenarios_by_name() -> None:
    """``--scenario``'s choices are written in fleetlet.cli (importing the demo loads PyYAML
    and the agent's artifacts): the same names, in the same order, as the demo plays."""
    from fleetlet.cli import DEMO_SCENARIOS
    from fleetlet.demo.scenarios import SCENARIOS

    assert list(DEMO_SCENARIOS) == list(SCENARIOS)


def test_health_offline_loads_neither_the_api_validation_nor_a_client(tmp_path: Path) -> None:
    objects = tmp_path / "objects.yaml"
    objects.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: shop}\n"
        "data: {a: b}\n"
    )
    result, modules, _ = _fleetlet("health", "-f", str(objects), "--offline")
    assert result["code"] == 0
    assert "ConfigMap/shop/settings  Current" in str(result["output"])
    unused = {
        "agent.api.validation": "the API's validation: health checks come with a bundle, not -f",
        "agent.api.models": "the API's types (see agent.api.validation)",
        "hashlib": "the kube transport's discovery cache: no cluster is read",
        "tempfile": "see hashlib",
        "kubernetes": "the Kubernetes client",
        "logging": "nothing is logged",
        "hub": "the hub's code",
    }
    assert _loaded(modules, unused) == {}


def test_explain_against_a_hub_loads_none_of_the_hubs_server_code() -> None:
    """``explain --hub`` asks the hub and prints its answer: the rollout state, the status
    queries and the fleet loader (about 300 ms) are the hub's and ``--repo``'s. Here the hub
    does not answer: the command fails with its one line, having got as far as asking."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result, modules, stderr = _fleetlet("explain", "store-1", "--hub", f"http://127.0.0.1:{port}")
    assert result["code"] == 1
    assert f"hub http://127.0.0.1:{port} did not answer" in stderr
    unused = {
        "hub.rollout.state": "the rollout state (the fleet's content, rendered)",
        "hub.status": "the status aggregate and its queries",
        "hub.fleet": "the fleet loader",
        "pygit2": "no git repository is read",
        "sigstore": "no signature is checked",
    }
    assert _loaded(modules, unused) == {}


def test_hub_shards_loads_the_fleet_without_git_or_sigstore() -> None:
    """Loading a fleet repo parses its commit and source signing policies: the code that
    checks a signature, reads a commit or fetches from a registry loads only when it does."""
    result, modules, _ = _fleetlet("hub", "shards", str(REPO_ROOT / "fleet-examples"))
    assert result["code"] == 0
    assert "store-eu-1" in str(result["output"])
    unused = {
        "pygit2": "no commit is read (hub.fleet.commits.verify_commit imports it)",
        "agent.verify.cosign": "no signature is checked (with Sigstore's verifier, oras, requests)",
        "agent.verify.publication": "the publication's format (agent.verify exports on first use)",
        "sigstore": "no signature is checked",
        "cryptography": "no key or certificate is read",
        "requests": "no registry is asked",
        "kubernetes": "the Kubernetes client",
    }
    assert _loaded(modules, unused) == {}


def test_agent_verify_exports_each_name_from_its_module() -> None:
    """``agent.verify`` exports its names on first use: each from the module that defines it."""
    import importlib

    import agent.verify as verify

    assert sorted(verify._FROM) == sorted(verify.__all__)
    for name, module in verify._FROM.items():
        assert getattr(verify, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = verify.nothing  # type: ignore[attr-defined]
