"""The enrollment API, mounted by :func:`hub.api.app.create_app` when ``hub serve --enroll``.

- ``POST /api/v1/enroll`` and ``GET /api/v1/enroll/{cluster}``: the agent's side, with an
  enrollment token as bearer token; the request body signed by the cluster's key
  (``Fleetlet-Signature``, :mod:`hub.enroll.signed`). An enrollment token opens nothing else: it is not an API
  token, so every other endpoint answers 401 to it.
- ``GET /api/v1/enrollments[?state=pending]`` (any API token) and
  ``POST /api/v1/enrollments/{cluster}/accept|deny`` (admin tokens, recorded with the token's
  name): the operator's side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from agent.install.enroll import SIGNATURE_HEADER
from hub.api.openapi import API_PREFIX
from hub.enroll.refused import EnrollRefused
from hub.enroll.service import Enrollment

MAX_BODY = 128 * 1024


def _error(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="fleetlet-enroll"'} if status == 401 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def _json(request: Request) -> Any:
    body = await request.body()
    if len(body) > MAX_BODY:
        raise EnrollRefused(413, f"the request is larger than {MAX_BODY} bytes")
    try:
        import json

        return json.loads(body or b"{}")
    except ValueError:
        raise EnrollRefused(400, "the body must be JSON") from None


def enroll_routes(
    enrollment: Enrollment,
    caller: Callable[[Request], tuple[str, str] | None],
) -> list[BaseRoute]:
    """The routes above; ``caller`` names the API token of a request (None: unknown)."""
    p = API_PREFIX

    async def answer(work: Callable[[], dict[str, Any]]) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(work))
        except EnrollRefused as exc:
            return _error(exc.status, exc.message)

    async def submit(request: Request) -> Response:
        token = _bearer(request)
        if not token:
            return _error(401, "an enrollment token is required (Authorization: Bearer ...)")
        body = await request.body()
        if len(body) > MAX_BODY:
            return _error(413, f"the request is larger than {MAX_BODY} bytes")
        signature = request.headers.get(SIGNATURE_HEADER, "")
        return await answer(lambda: enrollment.submit(token, body, signature))

    async def poll(request: Request) -> Response:
        token = _bearer(request)
        return await answer(lambda: enrollment.poll(token, request.path_params["cluster"]))

    async def listing(request: Request) -> Response:
        if caller(request) is None:
            return _error(401, "missing or unknown bearer token")
        return await answer(lambda: enrollment.list(request.query_params.get("state") or None))

    async def decide(request: Request) -> Response:
        who = caller(request)
        if who is None:
            return _error(401, "missing or unknown bearer token")
        name, role = who
        verdict = request.path_params["verdict"]
        if verdict not in ("accept", "deny"):
            return _error(404, f"no such action {verdict!r}: accept or deny")
        if role != "admin":
            return _error(403, f"{verdict} needs an admin token; {name!r} has the {role} role")
        try:
            body = await _json(request)
        except EnrollRefused as exc:
            return _error(exc.status, exc.message)
        reason = body.get("reason", "") if isinstance(body, dict) else ""
        if not isinstance(reason, str) or len(reason) > 1000:
            return _error(400, "reason must be a string of at most 1000 characters")
        cluster = request.path_params["cluster"]
        return await answer(lambda: enrollment.decide(cluster, verdict, by=name, reason=reason))

    return [
        Route(f"{p}/enroll", submit, methods=["POST"]),
        Route(f"{p}/enroll/{{cluster}}", poll),
        Route(f"{p}/enrollments", listing),
        Route(f"{p}/enrollments/{{cluster}}/{{verdict}}", decide, methods=["POST"]),
    ]
