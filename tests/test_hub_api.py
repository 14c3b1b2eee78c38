"""The hub API (``python -m hub.serve``: uvicorn, real port) and ``fleetlet installations``.

Status documents are pushed to a repository on the session's git daemon like agents push them;
the hub serves them with bearer tokens and its X25519 key. The OpenAPI document is validated
and every path in it is called with real parameters, each answer checked against the schema it
declares.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import requests
import yaml
from nacl.public import PrivateKey
from openapi_spec_validator import validate as validate_spec

from agent.report.seal import OutputPlace, agent_sealing_key, seal
from hub import installations as cli
from hub.api.tokens import write_clear_tokens
from tests.realenv.gitserver import GitDaemon
from tests.realenv.hubserver import serving_hub
from tests.test_hub_status import StatusPusher, make_bundle, make_run, make_status, new_repo

ADMIN = "admin-token-0123456789"
READER = "read-token-0123456789"
SECRET = "db-password-s3cr3t"


@dataclass
class Hub:
    url: str
    repo: str
    pusher: StatusPusher
    key_file: Path
    workdir: Path
    log: Path

    def get(self, path: str, token: str | None = ADMIN, **params: str) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.get(f"{self.url}{path}", headers=headers, params=params, timeout=30)


def _seal(key: PrivateKey, value: str, place: OutputPlace, *, by_agent: bool = True) -> str:
    """What the cluster's agent seals (with its sealing key), or anybody holding only the
    hub's public key (``by_agent=False``)."""
    sender = agent_sealing_key(key, place.cluster) if by_agent else None
    return seal(key.public_key, value, place=place, sender=sender)


WEB_A3 = "edge-a.web.3.1"


def _documents(key: PrivateKey) -> dict[str, Any]:
    now = datetime.now(UTC)
    password = _seal(
        key, SECRET, OutputPlace(cluster="edge-a", bundle="web", output="password", run=WEB_A3)
    )
    outputs = {
        "address": {"value": "10.0.0.7"},
        "password": {"sealed": password},
        # Sealed for its place, but with the hub's public key alone: anybody could have.
        "planted": {
            "sealed": _seal(
                key,
                "planted-value",
                OutputPlace(cluster="edge-a", bundle="web", output="planted", run=WEB_A3),
                by_agent=False,
            )
        },
        # The genuine box of another output, replayed under this name.
        "replayed": {"sealed": password},
    }
    # ... and replayed under another cluster.
    failed_b = make_run("edge-b", "web", 1, 1, result="Failed")
    failed_b["outputs"] = {"password": {"sealed": password}}
    web_a = [
        make_run("edge-a", "web", 3, 1, operation="upgrade", outputs=outputs),
        make_run("edge-a", "web", 2, 1, result="RolledBack", operation="upgrade"),
        make_run("edge-a", "web", 1, 1, outputs={"address": {"value": "10.0.0.1"}}),
    ]
    db_a = [make_run("edge-a", "db", 1, 1, outputs={"token": {"omitted": True}})]
    return {
        "edge-a": make_status(
            "edge-a", bundles={"web": make_bundle(web_a), "db": make_bundle(db_a)}
        ),
        "edge-b": make_status(
            "edge-b",
            bundles={"web": make_bundle([failed_b], ready=False)},
        ),
        "edge-old": make_status("edge-old", heartbeat=now - timedelta(hours=1)),
    }


@pytest.fixture(scope="module")
def hub(git_daemon: GitDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """``python -m hub.serve`` on a free loopback port over a freshly pushed status repo."""
    workdir = tmp_path_factory.mktemp("hub-api")
    key = PrivateKey.generate()
    key_file = workdir / "hub.key"
    key_file.write_text(base64.b64encode(bytes(key)).decode() + "\n")
    tokens = workdir / "tokens.yaml"
    write_clear_tokens(tokens, {ADMIN: "admin", READER: "read"})
    repo = new_repo(git_daemon, "hub-api")
    pusher = StatusPusher(repo, workdir / "agents")
    pusher.push(_documents(key))
    with serving_hub(repo, workdir, ["--tokens", str(tokens), "--hub-key", str(key_file)]) as url:
        yield Hub(url, repo, pusher, key_file, workdir, workdir / "hub.log")


def test_tokens_are_required(hub: Hub) -> None:
    for token in (None, "not-a-known-token"):
        answer = hub.get("/api/v1/installations", token=token)
        assert answer.status_code == 401
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        assert answer.json() == {"error": "missing or unknown bearer token"}
    assert hub.get("/api/v1/installations", token=READER).status_code == 200


def test_sensitive_outputs_open_for_admin_only(hub: Hub) -> None:
    path = "/api/v1/installations/edge-a/web/runs/latest/outputs"
    admin = {o["name"]: o for o in hub.get(path, token=ADMIN).json()["items"]}
    reader = {o["name"]: o for o in hub.get(path, token=READER).json()["items"]}
    assert admin["password"] == {
        "name": "password",
        "value": SECRET,
        "sensitive": True,
        "sealedBy": "agent",
    }
    assert reader["password"] == {"name": "password", "value": "<sensitive>", "sensitive": True}
    assert admin["address"]["value"] == reader["address"]["value"] == "10.0.0.7"
    # Nothing a read token can reach shows the value, in any endpoint.
    for other in ("/api/v1/installations/edge-a/web", "/api/v1/installations/edge-a/web/runs"):
        assert SECRET not in hub.get(other, token=READER).text
        assert SECRET in hub.get(other, token=ADMIN).text
    omitted = hub.get("/api/v1/installations/edge-a/db/runs/latest/outputs").json()["items"]
    assert omitted == [{"name": "token", "value": None, "sensitive": True, "omitted": True}]


def test_a_sealed_value_shows_only_in_its_place_and_says_who_sealed_it(hub: Hub) -> None:
    path = "/api/v1/installations/edge-a/web/runs/latest/outputs"
    admin = {o["name"]: o for o in hub.get(path, token=ADMIN).json()["items"]}
    # Anybody with the hub's public key can seal a value for a place: it opens, and says so.
    assert admin["planted"]["value"] == "planted-value"
    assert admin["planted"]["sealedBy"] == "anyone"
    # The agent's genuine box, copied under another output name or to another cluster, does
    # not open there: it is not shown as a value of that place.
    assert SECRET not in json.dumps(admin["replayed"])
    assert admin["replayed"]["value"].startswith("<sealed: does not open here")
    assert "sealedBy" not in admin["replayed"]
    other = hub.get(
        "/api/v1/installations/edge-b/web/runs/edge-b.web.1.1/outputs", token=ADMIN
    ).json()["items"]
    assert other[0]["name"] == "password" and SECRET not in json.dumps(other)
    assert other[0]["value"].startswith("<sealed: does not open here")


def test_installations_filters_states_and_runs(hub: Hub) -> None:
    items = hub.get("/api/v1/installations").json()["items"]
    assert {i["name"]: i["state"] for i in items} == {
        "edge-a/db": "Ready",
        "edge-a/web": "Ready",
        "edge-b/web": "Degraded",
        "edge-old/web": "Stale",
    }
    stale = hub.get("/api/v1/installations", state="Stale").json()["items"]
    assert [i["name"] for i in stale] == ["edge-old/web"]
    by_cluster = hub.get("/api/v1/installations", cluster="edge-a", bundle="web").json()
    assert [i["name"] for i in by_cluster["items"]] == ["edge-a/web"]
    bad = hub.get("/api/v1/installations", state="Happy")
    assert bad.status_code == 400 and "state must be one of" in bad.json()["error"]

    runs = hub.get("/api/v1/installations/edge-a/web/runs").json()["items"]
    assert [(r["id"], r["result"]) for r in runs] == [
        ("edge-a.web.3.1", "Succeeded"),
        ("edge-a.web.2.1", "RolledBack"),
        ("edge-a.web.1.1", "Succeeded"),
    ]
    older = hub.get("/api/v1/installations/edge-a/web/runs/edge-a.web.1.1/outputs").json()
    assert older["run"] == "edge-a.web.1.1" and older["items"][0]["value"] == "10.0.0.1"

    clusters = {c["name"]: c for c in hub.get("/api/v1/clusters").json()["items"]}
    assert not clusters["edge-a"]["stale"] and clusters["edge-old"]["stale"]
    assert clusters["edge-old"]["heartbeatAgeSeconds"] >= 3600

    # Pages: what a client of a large fleet asks for.
    page = hub.get("/api/v1/installations", offset="1", limit="2").json()
    assert (page["total"], page["offset"], page["limit"]) == (4, 1, 2)
    assert [i["name"] for i in page["items"]] == ["edge-a/web", "edge-b/web"]
    ready = hub.get("/api/v1/installations", state="Ready", limit="1", offset="1").json()
    assert ready["total"] == 2 and [i["name"] for i in ready["items"]] == ["edge-a/web"]
    first = hub.get("/api/v1/clusters", limit="2").json()
    assert first["total"] == 3 and [c["name"] for c in first["items"]] == ["edge-a", "edge-b"]
    assert hub.get("/api/v1/clusters", limit="0").status_code == 400


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/api/v1/installations/nowhere/web", "unknown cluster 'nowhere'"),
        ("/api/v1/installations/edge-a/nothing/runs", "no installation of bundle 'nothing'"),
        ("/api/v1/installations/edge-b/web/runs/latest/outputs", "has no succeeded run"),
        ("/api/v1/installations/edge-a/web/runs/edge-a.web.9.9/outputs", "no run"),
        ("/api/v1/clusters/nowhere", "unknown cluster"),
        ("/api/v1/nothing-here", "no such endpoint"),
    ],
)
def test_unknown_things_are_404_json(hub: Hub, path: str, message: str) -> None:
    answer = hub.get(path)
    assert answer.status_code == 404
    assert message in answer.json()["error"]


def _fill(path: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    return path


def _check(document: dict[str, Any], operation: dict[str, Any], answer: requests.Response) -> None:
    declared = operation["responses"]
    assert str(answer.status_code) in declared, (answer.status_code, answer.text)
    schema = declared[str(answer.status_code)]["content"]["application/json"]["schema"]
    # The document's components travel with the schema, so "#/components/..." resolves.
    jsonschema.Draft202012Validator(
        {**schema, "components": document["components"]},
        format_checker=jsonschema.FormatChecker(),
    ).validate(answer.json())


def test_openapi_document_is_valid_and_every_endpoint_answers_as_declared(hub: Hub) -> None:
    document = hub.get("/api/v1/openapi.json", token=READER).json()
    validate_spec(document)
    real = {"cluster": "edge-a", "bundle": "web", "run": "latest"}
    unknown = {"cluster": "edge-z", "bundle": "nope", "run": "nope"}
    called = []
    for template, item in document["paths"].items():
        operation = item["get"]
        params = {p["name"]: p for p in operation["parameters"]}
        # Real parameters, then every query filter with a real value.
        answer = hub.get(_fill(template, real))
        assert answer.status_code == 200, (template, answer.text)
        _check(document, operation, answer)
        for name, param in params.items():
            if param["in"] == "query":
                value = param["schema"].get("enum", [real.get(name, "edge-a")])[0]
                _check(document, operation, hub.get(_fill(template, real), **{name: value}))
        if any(p["in"] == "path" for p in params.values()):
            missing = hub.get(_fill(template, unknown))
            assert missing.status_code == 404
            _check(document, operation, missing)
        anonymous = hub.get(_fill(template, real), token=None)
        assert anonymous.status_code == 401
        _check(document, operation, anonymous)
        called.append(template)
    assert len(called) == 9


def test_the_refresh_loop_picks_up_new_documents(hub: Hub) -> None:
    key = PrivateKey(base64.b64decode(hub.key_file.read_text()))
    doc = _documents(key)["edge-b"]
    doc["sequence"] = 2
    doc["bundles"]["web"] = make_bundle(
        [make_run("edge-b", "web", 2, 1), *doc["bundles"]["web"]["runs"]]
    )
    hub.pusher.push({"edge-b": doc})
    deadline = time.monotonic() + 60
    state = None
    while time.monotonic() < deadline:
        state = hub.get("/api/v1/installations/edge-b/web").json()["state"]
        if state == "Ready":
            break
        time.sleep(0.2)
    assert state == "Ready"
    latest = hub.get("/api/v1/installations/edge-b/web/runs/latest/outputs").json()
    assert latest["run"] == "edge-b.web.2.1"


def _cli(capsys: pytest.CaptureFixture[str], handler: Any, **fields: Any) -> str:
    capsys.readouterr()
    assert handler(argparse.Namespace(**fields)) == 0
    return capsys.readouterr().out


def test_cli_hub_and_repo_modes_print_the_same(
    hub: Hub, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(READER + "\n")
    via_hub = {"hub": hub.url, "repo": None, "token_file": str(token_file)}
    via_repo = {"hub": None, "repo": hub.repo, "cache_dir": str(tmp_path / "cache")}
    commands: list[tuple[Any, dict[str, Any]]] = [
        (cli.installations_list, {}),
        (cli.installations_list, {"state": "Stale"}),
        (cli.installations_show, {"installation": "edge-a/web"}),
        (cli.runs_list, {"installation": "edge-a/web"}),
        (cli.outputs_list, {"installation": "edge-a/web", "run": "latest"}),
        (cli.outputs_list, {"installation": "edge-a/web", "run": "edge-a.web.1.1"}),
    ]
    for handler, extra in commands:
        hub_out = _cli(capsys, handler, output="json", **via_hub, **extra)
        repo_out = _cli(capsys, handler, output="json", **via_repo, **extra)
        assert json.loads(hub_out) == json.loads(repo_out), handler.__name__
        assert SECRET not in hub_out

    table = _cli(capsys, cli.runs_list, output="table", installation="edge-a/web", **via_hub)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["RUN", "OPERATION", "SERIAL", "RESULT"]
    assert [line.split()[3] for line in lines[1:]] == ["Succeeded", "RolledBack", "Succeeded"]
    outputs = _cli(
        capsys, cli.outputs_list, output="yaml", installation="edge-a/web", run="latest", **via_hub
    )
    assert yaml.safe_load(outputs)["run"] == "edge-a.web.3.1"
    listing = _cli(capsys, cli.installations_list, output="table", **via_repo)
    assert "edge-old/web" in listing and "Stale" in listing

    # The token from the environment; the admin token sees the value, as --hub-key does locally.
    monkeypatch.setenv(cli.TOKEN_ENV, ADMIN)
    admin = _cli(
        capsys,
        cli.outputs_list,
        output="json",
        installation="edge-a/web",
        run="latest",
        hub=hub.url,
        repo=None,
        token_file=None,
    )
    local = _cli(
        capsys,
        cli.outputs_list,
        output="json",
        installation="edge-a/web",
        run="latest",
        hub_key=str(hub.key_file),
        **via_repo,
    )
    assert json.loads(admin) == json.loads(local)
    assert SECRET in admin


def test_cli_errors_are_clear(hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cli.TOKEN_ENV, raising=False)
    args = argparse.Namespace(
        hub=hub.url, repo=None, token_file=None, output="json", installation="edge-a/web"
    )
    with pytest.raises(cli.InstallationsError, match="401 missing or unknown bearer token"):
        cli.runs_list(args)
    args = argparse.Namespace(
        hub=None, repo=hub.repo, cache_dir=str(tmp_path), output="json", installation="x/web"
    )
    with pytest.raises(cli.InstallationsError, match="unknown cluster 'x'"):
        cli.runs_list(args)
    with pytest.raises(cli.InstallationsError, match="CLUSTER/BUNDLE"):
        cli.runs_list(argparse.Namespace(hub=hub.url, repo=None, installation="nobundle"))


def test_no_secret_in_any_pushed_object(hub: Hub) -> None:
    # What the agents pushed (every object of every status branch) holds only the sealed box.
    odb = hub.pusher.repo.odb
    assert all(SECRET.encode() not in odb.read(oid)[1] for oid in odb)


def test_anonymous_access_only_when_enabled(
    hub: Hub, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from hub.serve import main

    # No tokens and no --allow-anonymous: refused before anything starts.
    assert main(["--repo", hub.repo, "--listen", "127.0.0.1:1"]) == 1
    assert "needs --tokens FILE" in capsys.readouterr().err
    # Enabled: requests without a token read, sealed values stay sealed; a wrong token is 401.
    with serving_hub(hub.repo, tmp_path, ["--allow-anonymous"]) as url:
        path = f"{url}/api/v1/installations/edge-a/web/runs/latest/outputs"
        answer = requests.get(path, timeout=30)
        assert answer.status_code == 200
        assert {o["name"]: o["value"] for o in answer.json()["items"]}["password"] == "<sensitive>"
        wrong = requests.get(path, headers={"Authorization": "Bearer nope-nope-nope"}, timeout=30)
        assert wrong.status_code == 401


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a-long-token-123: admin\n", "holds tokens in clear.*fleetlet hub tokens migrate"),
        ("tokens: {a-long-token-123: read}\n", "holds tokens in clear"),
        (
            f"tokens:\n- {{name: ci, role: root, sha256: {'a' * 64}}}\n",
            "role must be admin or read",
        ),
        ("tokens:\n- {name: ci, role: read, sha256: abc}\n", "sha256 must be 64"),
        ("- just a list\n", "expected `tokens:`"),
    ],
)
def test_bad_tokens_files_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    from hub.api import HubConfigError, load_tokens

    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(HubConfigError, match=problem):
        load_tokens(path)
