"""Logs (``agent.report.logs``): text or JSON lines with context, and never a secret.

Unit tests check the formatters, the context fields and the masking. The end-to-end test runs
real agents (``fleetlet agent sync --once --log-level debug --log-format json``: an install, an
upgrade that is rolled back, a fixed upgrade) whose status goes to a git server with basic auth,
with a sensitive output read from a Secret, then the hub serving those outputs to an admin
token, and greps every line both wrote for the password, the sensitive value (and its base64
form) and the token.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agent.report.logs import (
    LoggingSetupError,
    current_context,
    log_context,
    mask,
    redact,
    setup_logging,
)
from agent.report.seal import write_keypair
from hub.api.tokens import write_clear_tokens
from tests.fleetlab import REPO_ROOT, Lab, configmap, deployment, namespace_manifest
from tests.realenv.git_fixtures import GIT_PASSWORD, GIT_USER, GitServerFactory
from tests.realenv.hubserver import serving_hub
from tests.realenv.kube import Cluster
from tests.test_crds import crds as crds  # the fixture: the CRDs installed


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger's output, restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


# --- unit ----------------------------------------------------------------------------------


def test_json_lines_carry_the_cluster_and_the_context(captured: io.StringIO) -> None:
    setup_logging(level="info", format="json", cluster="edge-1", stream=captured)
    log = logging.getLogger("agent.lockstep")
    log.info("before")
    with log_context(group="shop", serial=12):
        with log_context(bundle="web", run="edge-1.web.12.1"):
            log.warning("moving %s", "web")
        log.info("group done")
    log.debug("not at info")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [entry["message"] for entry in lines] == ["before", "moving web", "group done"]
    assert lines[0] == {
        "time": lines[0]["time"],
        "level": "info",
        "logger": "agent.lockstep",
        "message": "before",
        "cluster": "edge-1",
    }
    assert lines[1]["level"] == "warning"
    assert {k: lines[1][k] for k in ("cluster", "bundle", "group", "serial", "run")} == {
        "cluster": "edge-1",
        "bundle": "web",
        "group": "shop",
        "serial": 12,
        "run": "edge-1.web.12.1",
    }
    assert "bundle" not in lines[2] and lines[2]["group"] == "shop"
    assert lines[0]["time"].endswith("Z")
    assert current_context() == {}


def test_text_lines_show_the_context(captured: io.StringIO) -> None:
    setup_logging(level="debug", format="text", cluster="edge-1", stream=captured)
    with log_context(group="shop", serial=3):
        logging.getLogger("x").debug("hello")
    (line,) = captured.getvalue().splitlines()
    assert line.endswith("DEBUG x: hello [cluster=edge-1 group=shop serial=3]")


def test_context_is_per_thread(captured: io.StringIO) -> None:
    setup_logging(level="info", format="json", stream=captured)
    seen: dict[str, dict[str, object]] = {}

    def work(group: str) -> None:
        with log_context(group=group):
            barrier.wait()
            seen[group] = current_context()

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=work, args=(g,)) for g in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"a": {"group": "a"}, "b": {"group": "b"}}


def test_masked_values_and_credential_shapes_never_reach_a_line(captured: io.StringIO) -> None:
    setup_logging(level="info", format="json", stream=captured)
    secret = "s3cr3t-" + os.urandom(4).hex()
    mask(secret)
    log = logging.getLogger("agent.report.outputs")
    log.info("read value %s", secret)
    log.info("as a Secret holds it: %s", base64.b64encode(secret.encode()).decode())
    log.info("cloning https://user:hunter22@git.example/x.git")
    log.info("header Authorization: Bearer abc.def.ghi")
    log.info("password=%s token=%s", "pw-123456", "tok-987654")
    log.info("key -----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----")
    try:
        raise RuntimeError(f"failed with {secret}")
    except RuntimeError:
        log.exception("boom")
    text = captured.getvalue()
    for leaked in (secret, base64.b64encode(secret.encode()).decode(), "hunter22",
                   "abc.def.ghi", "pw-123456", "tok-987654", "MHcCAQEE"):  # fmt: skip
        assert leaked not in text, leaked
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[2]["message"] == "cloning https://user:***@git.example/x.git"
    assert "failed with ***" in lines[-1]["error"]
    # Prose that merely mentions a token is left alone.
    assert redact("no OIDC identity token: give --identity-token FILE").endswith("FILE")


def test_unknown_level_or_format_is_refused() -> None:
    with pytest.raises(LoggingSetupError, match="log level must be one of"):
        setup_logging(level="verbose")
    with pytest.raises(LoggingSetupError, match="text or json"):
        setup_logging(format="xml")


# --- end to end: no secret in any log ------------------------------------------------------


def _secret_manifest(name: str, namespace: str, value: str) -> str:
    encoded = base64.b64encode(value.encode()).decode()
    return (
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        f"data:\n  password: {encoded}\n"
    )


def test_no_secret_in_any_log_of_an_end_to_end_run(
    lab: Lab,
    crds: Cluster,
    namespace: str,
    tmp_path: Path,
    git_server_factory: GitServerFactory,
) -> None:
    secret_value = f"pw-{lab.suffix}-never-logged"
    status = git_server_factory("http")  # basic auth: GIT_USER / GIT_PASSWORD
    status.create_bare("status.git")
    private_key, public_key = tmp_path / "hub.key", tmp_path / "hub.pub"
    write_keypair(private_key, public_key)
    ns, conf, web = lab.name("logs"), lab.name("conf"), lab.name("web")

    def publish(image: str, tag: str) -> None:
        conf_digest = lab.push(
            "conf",
            {
                "01.yaml": namespace_manifest(ns),
                "02.yaml": configmap("settings", ns, {"endpoint": f"db-{tag}"}),
                "03.yaml": _secret_manifest("creds", ns, secret_value),
            },
            tag=tag,
        )
        web_digest = lab.push("web", {"d.yaml": deployment("web", ns, image)}, tag=tag)
        outputs = [
            {"name": "password", "object": {"apiVersion": "v1", "kind": "Secret", "namespace": ns, "name": "creds"},
             "fieldPath": ".data.password", "sensitive": True},
        ]  # fmt: skip
        lab.publish(
            [
                {"name": conf, "sources": [lab.source("conf", conf_digest)], "group": "shop",
                 "outputs": outputs, "healthChecks": {"timeoutSeconds": 10}},
                {"name": web, "sources": [lab.source("web", web_digest)], "group": "shop",
                 "healthChecks": {"timeoutSeconds": 10}},
            ]
        )  # fmt: skip

    args = lab.agent_args(
        "edge-1", crds, namespace=namespace, workdir=tmp_path / "agent", hub_public_key=public_key
    )
    # Credentials in the URL, as some users write them: any line naming the URL would leak.
    with_password = status.url_for("status.git").replace("://", f"://{GIT_USER}:{GIT_PASSWORD}@")
    args[args.index("--status-repo") + 1] = with_password
    logs: list[str] = []

    def sync() -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "fleetlet", "agent", "sync", "--once", *args,
             "--log-level", "debug", "--log-format", "json"],
            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
            env=dict(os.environ),
        )  # fmt: skip
        logs.append(done.stderr)
        return done

    publish("example/web:1", "one")
    assert sync().returncode == 0, logs[-1][-3000:]
    publish("example/web-2:broken", "two")
    assert sync().returncode == 1  # rolled back: warnings and an error line
    publish("example/web:3", "three")
    assert sync().returncode == 0, logs[-1][-3000:]
    # The status server away: the agent warns, naming the repository it could not reach.
    status.stop()
    sync()
    assert "status not pushed yet" in logs[-1] and "://fleetlet:***@" in logs[-1]
    status.start()

    # Every agent line is JSON and names the cluster.
    for text in logs:
        for line in filter(None, text.splitlines()):
            entry = json.loads(line)
            assert entry["cluster"] == "edge-1", line
    assert any(json.loads(line)["level"] == "debug" for line in logs[0].splitlines() if line)

    # The hub, logging at debug too, serves the opened sensitive output to an admin token.
    admin = "admin-token-" + os.urandom(8).hex()
    tokens = tmp_path / "tokens.yaml"
    write_clear_tokens(tokens, {admin: "admin"})
    workdir = tmp_path / "hub"
    workdir.mkdir()
    hub_env = {"FLEETLET_GIT_USERNAME": GIT_USER, "FLEETLET_GIT_PASSWORD": GIT_PASSWORD}
    os.environ.update(hub_env)  # serving_hub passes its environment on
    try:
        with serving_hub(
            status.url_for("status.git"),
            workdir,
            ["--tokens", str(tokens), "--hub-key", str(private_key),
             "--log-level", "debug", "--log-format", "json"],
        ) as url:  # fmt: skip
            path = f"{url}/api/v1/installations/edge-1/{conf}/runs/latest/outputs"
            opened = requests.get(path, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
            assert opened.status_code == 200
            assert {o["name"]: o["value"] for o in opened.json()["items"]} == {
                "password": secret_value
            }
    finally:
        for key in hub_env:
            os.environ.pop(key, None)
    logs.append((workdir / "hub.log").read_text())

    everything = "\n".join(logs)
    assert everything.strip()
    for leaked in (
        secret_value,
        base64.b64encode(secret_value.encode()).decode(),
        GIT_PASSWORD,
        admin,
    ):
        assert leaked not in everything, f"{leaked!r} was logged"
