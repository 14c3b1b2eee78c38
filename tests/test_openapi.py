"""The hub API's OpenAPI document is written from the same declarations the app's routes are made
from: the served document and the routes name the same operations, methods and parameters,
whichever parts the hub serves. (tests/test_hub_api.py checks every real answer against the
document's schemas, over a real status repository.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from openapi_spec_validator import validate as validate_spec
from starlette.routing import Route

from hub.api._schema import schema_of
from hub.api.app import create_app
from hub.api.endpoints import STATES as API_STATES
from hub.api.resources import RolloutStatus
from hub.enroll.service import STATES as ENROLL_STATES
from hub.rollout.state import STATUSES
from hub.status.aggregate import FleetStatus
from hub.status.document import STATES

TOKEN = "reader-token-for-the-document"


def _app(tmp_path: Path, *, rollouts: bool, enrollment: bool) -> Any:
    # Nothing is read from the status repository until a request needs it.
    status = FleetStatus(repo_url="git://127.0.0.1:9/none.git", cache_dir=tmp_path / "status")
    return create_app(
        status=status,
        tokens={TOKEN: "read"},
        rollouts=object() if rollouts else None,  # type: ignore[arg-type]
        enrollment=object() if enrollment else None,
    )


def _served(app: Any, path: str) -> tuple[int, Any]:
    """GET ``path`` from the ASGI app itself, with the reader's token."""
    sent: list[dict[str, Any]] = []
    path, _, query = path.partition("?")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode()), (b"host", b"hub")],
        "client": ("127.0.0.1", 1),
        "server": ("hub", 80),
    }
    anyio.run(app, scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


def _routes(app: Any) -> dict[str, set[str]]:
    """The app's API routes: path -> methods."""
    found: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith("/api/"):
            methods = {m for m in route.methods or {"GET"} if m != "HEAD"}
            found.setdefault(route.path, set()).update(methods)
    return found


@pytest.mark.parametrize(("rollouts", "enrollment"), [(False, False), (True, False), (True, True)])
def test_the_served_document_names_exactly_the_routes_the_hub_serves(
    tmp_path: Path, rollouts: bool, enrollment: bool
) -> None:
    app = _app(tmp_path, rollouts=rollouts, enrollment=enrollment)
    status, document = _served(app, "/api/v1/openapi.json")
    assert status == 200
    validate_spec(document)
    declared = {path: {m.upper() for m in item} for path, item in document["paths"].items()}
    assert declared == _routes(app)
    assert any(p.startswith("/api/v1/rollouts") for p in declared) == rollouts
    assert any(p.startswith("/api/v1/enroll") for p in declared) == enrollment
    for path, item in document["paths"].items():
        for operation in item.values():
            # Every {name} of the path is a declared path parameter, and nothing more.
            in_path = {p["name"] for p in operation["parameters"] if p["in"] == "path"}
            assert in_path == set(re.findall(r"{(\w+)}", path)), path
            assert "401" in operation["responses"] and "200" in operation["responses"]


def test_the_documents_vocabularies_are_the_hubs() -> None:
    # The resources spell the states out for the document; they are the status reader's.
    assert API_STATES == STATES
    assert RolloutStatus.__args__ == STATUSES  # type: ignore[attr-defined]
    assert ENROLL_STATES == ("pending", "accepted", "denied")


def test_a_parameter_out_of_its_declared_bounds_is_refused_as_the_document_says(
    tmp_path: Path,
) -> None:
    app = _app(tmp_path, rollouts=False, enrollment=False)
    document = _served(app, "/api/v1/openapi.json")[1]
    limit = next(
        p
        for p in document["paths"]["/api/v1/clusters"]["get"]["parameters"]
        if p["name"] == "limit"
    )
    too_many = limit["schema"]["maximum"] + 1
    status, answer = _served(app, f"/api/v1/clusters?limit={too_many}")
    assert (status, answer) == (400, {"error": f"limit must be between 1 and 500, got {too_many}"})


def test_a_type_the_writer_does_not_know_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="no JSON Schema for"):
        schema_of(set[int], {})


def test_the_reference_page_is_what_the_declarations_write() -> None:
    from hub.api.reference import main

    assert main(["--check"]) == 0, "docs/hub-api.md is stale: python -m hub.api.reference --write"
