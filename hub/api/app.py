"""The hub's HTTP/JSON API (Starlette): clusters, installations, runs and outputs; the dashboard.

Porter-style: installations (cluster × bundle) filtered by cluster, bundle and state; the runs
of an installation; the outputs of a run, where the run id may be ``latest`` (the newest
succeeded run); the fleet matrix a page at a time. The OpenAPI 3.1 document is served at
``/api/v1/openapi.json``.

Every API request needs a bearer token from the tokens file (role ``admin`` or ``read``) unless
anonymous read access was explicitly enabled. Sensitive outputs arrive sealed to the hub's
X25519 key: they are opened only for admin tokens; others see ``<sensitive>``.

The dashboard (``/`` and ``/ui/...``) is static files from ``hub/api/dashboard`` (no build
step, nothing from another origin): the shell is public, its data comes from the API above
with the token the user gives it. See ``docs/dashboard.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nacl.public import PrivateKey
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from hub.rollout.service import RolloutService

from agent.errors import FleetletError, TemporaryError
from hub.api.metrics import HubMetrics
from hub.api.tokens import HubConfigError, Tokens, load_tokens
from hub.status.aggregate import FleetStatus
from hub.status.document import STATES
from hub.status.queries import (
    DEFAULT_PAGE,
    MAX_PAGE,
    SENSITIVE,
    Labels,
    QueryError,
    StatusQueries,
    load_private_key,
    sealed_opener,
)

API_PREFIX = "/api/v1"
_T = TypeVar("_T")
DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboard"
# Everything the page loads comes from the hub itself: no CDN, no inline script or style.
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


def _int_param(request: Request, name: str, default: int) -> int:
    """A whole-number query parameter. Raises QueryError (400)."""
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise QueryError(400, f"{name} must be a whole number, got {text!r}") from None


def _opt_int_param(request: Request, name: str) -> int | None:
    """An optional whole-number query parameter. Raises QueryError (400)."""
    if not request.query_params.get(name):
        return None
    return _int_param(request, name, 0)


class _DashboardFiles(StaticFiles):
    """The dashboard's files, revalidated on each load (ETag, 304 when unchanged), so a new
    hub version never runs with an old script."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


class SecurityHeaders:
    """ASGI middleware: the content security policy and friends on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(
    *,
    status: FleetStatus,
    tokens: Tokens | Mapping[str, str],
    private_key: PrivateKey | None = None,
    allow_anonymous: bool = False,
    labels: Labels | None = None,
    metrics: HubMetrics | None = None,
    rollouts: RolloutService | None = None,
) -> Starlette:
    """The API and the dashboard over ``status``.

    Anonymous requests get the ``read`` role only if allowed. ``labels`` (cluster -> labels,
    from the fleet repo) feed the label filter; ``metrics`` are served at ``/metrics`` (a
    token needed, as for the API). ``app.state.queries`` is the
    :class:`StatusQueries` behind the API (``warm()`` it after a refresh). ``rollouts``
    serves ``/api/v1/rollouts`` (reads for every token; actions for admin tokens, recorded with
    the token's name). Raises HubConfigError if the dashboard's files are missing from the
    installation.
    """
    queries = StatusQueries(
        status,
        opener=sealed_opener(private_key) if private_key is not None else None,
        labels=labels,
    )
    try:
        shell = (DASHBOARD_DIR / "index.html").read_text()
    except OSError as exc:
        raise HubConfigError(f"the dashboard is missing from this installation: {exc}") from exc
    known = tokens if isinstance(tokens, Tokens) else Tokens.from_clear(tokens)

    def caller(request: Request) -> tuple[str, str] | None:
        """(the token's name, its role); None: unauthenticated."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return ("anonymous", "read") if allow_anonymous and not header else None
        entry = known.check(token.strip())
        return (entry.name, entry.role) if entry is not None else None

    def role_of(request: Request) -> str | None:
        found = caller(request)
        return found[1] if found is not None else None

    Handler = Callable[[Request, bool], dict[str, Any]]

    def guarded(handler: Handler) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            role = role_of(request)
            if role is None:
                return _error(
                    401,
                    "missing or unknown bearer token",
                    {"WWW-Authenticate": 'Bearer realm="fleetlet-hub"'},
                )
            try:
                # In a worker thread: listing 10,000 clusters' installations must not stall
                # the event loop for the requests around it.
                body = await run_in_threadpool(handler, request, role == "admin")
                return JSONResponse(body)
            except QueryError as exc:
                return _error(exc.status, exc.message)

        return endpoint

    def params(request: Request) -> tuple[str, str]:
        return request.path_params["cluster"], request.path_params["bundle"]

    p = API_PREFIX
    routes: list[BaseRoute] = [
        Route(
            f"{p}/openapi.json",
            guarded(lambda r, a: openapi_document(rollouts=rollouts is not None)),
        ),
        Route(
            f"{p}/clusters",
            guarded(
                lambda r, a: queries.clusters(
                    offset=_int_param(r, "offset", 0), limit=_opt_int_param(r, "limit")
                )
            ),
        ),
        Route(
            f"{p}/clusters/{{cluster}}",
            guarded(lambda r, a: queries.cluster(r.path_params["cluster"])),
        ),
        Route(
            f"{p}/installations",
            guarded(
                lambda r, a: queries.installations(
                    cluster=r.query_params.get("cluster"),
                    bundle=r.query_params.get("bundle"),
                    state=r.query_params.get("state"),
                    offset=_int_param(r, "offset", 0),
                    limit=_opt_int_param(r, "limit"),
                )
            ),
        ),
        Route(
            f"{p}/installations/{{cluster}}/{{bundle}}",
            guarded(lambda r, a: queries.installation(*params(r), admin=a)),
        ),
        Route(
            f"{p}/installations/{{cluster}}/{{bundle}}/runs",
            guarded(lambda r, a: queries.runs(*params(r), admin=a)),
        ),
        Route(
            f"{p}/installations/{{cluster}}/{{bundle}}/runs/{{run}}/outputs",
            guarded(lambda r, a: queries.outputs(*params(r), r.path_params["run"], admin=a)),
        ),
        *(_rollout_routes(rollouts, guarded, caller) if rollouts is not None else []),
        Route(
            f"{p}/matrix",
            guarded(
                lambda r, a: queries.matrix(
                    label=r.query_params.get("label") or None,
                    bundle=r.query_params.get("bundle") or None,
                    state=r.query_params.get("state") or None,
                    name=r.query_params.get("name") or None,
                    offset=_int_param(r, "offset", 0),
                    limit=_int_param(r, "limit", DEFAULT_PAGE),
                )
            ),
        ),
    ]

    async def dashboard(request: Request) -> Response:
        # Every page of the dashboard is the same shell; its script routes by the path.
        return HTMLResponse(shell, headers={"Cache-Control": "no-cache"})

    async def metrics_endpoint(request: Request) -> Response:
        # Counts only, but behind a token like the API (Prometheus sends one: see the
        # ServiceMonitor in deploy/hub/).
        if role_of(request) is None:
            return _error(
                401,
                "missing or unknown bearer token",
                {"WWW-Authenticate": 'Bearer realm="fleetlet-hub"'},
            )
        assert metrics is not None
        return Response(metrics.exposition(), headers={"Content-Type": metrics.content_type})

    async def healthz(request: Request) -> Response:
        # Public, and says nothing: the server listens only after its first status refresh.
        return Response("ok\n", media_type="text/plain")

    routes.append(Route("/healthz", healthz))
    if metrics is not None:
        routes.append(Route("/metrics", metrics_endpoint))
    routes += [
        Route("/", dashboard),
        Mount("/ui/static", _DashboardFiles(directory=DASHBOARD_DIR / "static"), name="static"),
        Route("/ui", dashboard),
        Route("/ui/{page:path}", dashboard),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, f"no such endpoint {request.url.path}")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, f"method {request.method} not allowed on {request.url.path}")

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    app.add_middleware(SecurityHeaders)
    app.state.queries = queries
    return app


# --- rollouts ------------------------------------------------------------------------------


def _rollout_routes(
    rollouts: RolloutService,
    guarded: Callable[[Callable[[Request, bool], dict[str, Any]]], Callable[[Request], Any]],
    caller: Callable[[Request], tuple[str, str] | None],
) -> list[BaseRoute]:
    """``GET /rollouts``, ``GET /rollouts/{rollout}``, ``POST /rollouts/{rollout}/{action}``."""
    from hub.rollout.advance import ACTIONS, RolloutActionError
    from hub.rollout.evaluate import VERDICTS

    p = API_PREFIX

    def listing(request: Request, admin: bool) -> dict[str, Any]:
        return _answer(rollouts.list)

    def one(request: Request, admin: bool) -> dict[str, Any]:
        verdict = request.query_params.get("verdict") or None
        if verdict is not None and verdict not in VERDICTS:
            raise QueryError(400, f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
        found = _answer(
            lambda: rollouts.detail(
                request.path_params["rollout"],
                wave=request.query_params.get("wave") or None,
                verdict=verdict,
                offset=_int_param(request, "offset", 0),
                limit=_int_param(request, "limit", 100),
            )
        )
        if found is None:
            raise QueryError(404, f"no rollout {request.path_params['rollout']!r}")
        return found

    async def action(request: Request) -> Response:
        who = caller(request)
        if who is None:
            return _error(
                401,
                "missing or unknown bearer token",
                {"WWW-Authenticate": 'Bearer realm="fleetlet-hub"'},
            )
        name, role = who
        verb = request.path_params["action"]
        if verb not in ACTIONS:
            return _error(404, f"no such action {verb!r}: one of {', '.join(ACTIONS)}")
        if role != "admin":
            return _error(403, f"{verb} needs an admin token; {name!r} has the {role} role")
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return _error(400, 'the body must be JSON: {"reason": "..."}')
        reason = body.get("reason", "") if isinstance(body, dict) else None
        if not isinstance(reason, str) or len(reason) > 1000:
            return _error(400, "reason must be a string of at most 1000 characters")
        rid = request.path_params["rollout"]

        def work() -> dict[str, Any]:
            from hub.rollout.report import summary

            if rid not in _answer(rollouts.state).rollouts:
                raise QueryError(404, f"no rollout {rid!r}")
            try:
                done = rollouts.act(rid, verb, actor=name, reason=reason)
            except RolloutActionError as exc:
                raise QueryError(409, str(exc)) from exc
            except TemporaryError as exc:
                raise QueryError(503, str(exc)) from exc
            return {"rollout": summary(done, None), "event": done.events[-1].to_dict()}

        try:
            return JSONResponse(await run_in_threadpool(work))
        except QueryError as exc:
            return _error(exc.status, exc.message)

    return [
        Route(f"{p}/rollouts", guarded(listing)),
        Route(f"{p}/rollouts/{{rollout}}", guarded(one)),
        Route(f"{p}/rollouts/{{rollout}}/{{action}}", action, methods=["POST"]),
    ]


def _answer(work: Callable[[], _T]) -> _T:
    """``work()``, with the git server's trouble as a 503."""
    try:
        return work()
    except TemporaryError as exc:
        raise QueryError(503, f"rollout state: {exc}") from exc
    except FleetletError as exc:
        raise QueryError(500, f"rollout state: {exc}") from exc


# --- the OpenAPI document ------------------------------------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


_ERRORS = {
    "401": {
        "description": "missing or unknown bearer token",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
        "content": {"application/json": {"schema": _ref("Error")}},
    },
}
_NOT_FOUND = {"404": _json(_ref("Error"), "unknown cluster, bundle or run")}


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string"},
    }


def _query_param(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_CLUSTER = _path_param("cluster", "cluster name")
_PAGE_PARAMS = [
    _query_param("offset", "items to skip (with limit: a page)", {"type": "integer", "minimum": 0}),
    _query_param(
        "limit",
        f"items per page, at most {MAX_PAGE}; without it every item (at 100,000 clusters ask "
        "for pages: the answer then has `total`, `offset` and `limit`)",
        {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
    ),
]
_BUNDLE = _path_param("bundle", "bundle name")


def openapi_document(*, rollouts: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this API (``rollouts``: with the rollout endpoints)."""
    installation_props: dict[str, Any] = {
        "cluster": {"type": "string"},
        "bundle": {"type": "string"},
        "name": {"type": "string", "description": "CLUSTER/BUNDLE"},
        "group": _nullable("string"),
        "state": {"type": "string", "enum": list(STATES)},
        "appliedSerial": _nullable("integer"),
        "lastRun": {"oneOf": [_ref("RunBrief"), {"type": "null"}]},
        "lastSuccessfulRun": _nullable("string"),
        "driftCount": {"type": "integer"},
    }
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        "Cluster": {
            "type": "object",
            "required": ["name", "heartbeat", "stale", "error"],
            "properties": {
                "name": {"type": "string"},
                "heartbeat": {**_nullable("string"), "format": "date-time"},
                "heartbeatAgeSeconds": _nullable("number"),
                "stale": {"type": "boolean"},
                "agentVersion": _nullable("string"),
                "sequence": _nullable("integer"),
                "lastAcceptedSerial": _nullable("integer"),
                "lastRefusal": _nullable("object"),
                "installations": {"type": "integer"},
                "labels": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "the cluster's labels in the fleet repo (`hub serve --fleet`)",
                },
                "error": {
                    **_nullable("string"),
                    "description": "why the last document was unusable",
                },
            },
        },
        "RunBrief": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "operation": _nullable("string"),
                "result": _nullable("string"),
                "finishedAt": _nullable("string"),
            },
        },
        "InstallationSummary": {
            "type": "object",
            "required": ["cluster", "bundle", "state"],
            "properties": installation_props,
        },
        "Installation": {
            "type": "object",
            "required": ["cluster", "bundle", "state", "conditions", "runs"],
            "properties": {
                **installation_props,
                "conditions": {"type": "array", "items": {"type": "object"}},
                "appliedRevision": _nullable("object"),
                "lastHealthyRevision": _nullable("object"),
                "health": _nullable("object"),
                "runs": {"type": "array", "items": _ref("Run")},
                "requests": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "approval requests of the installation's group (pending "
                    "and the newest decided ones): name, serial, state, decidedBy, decidedAt, "
                    "reason, policy, rule, preview (docs/approvals.md)",
                },
            },
        },
        "Output": {
            "type": "object",
            "required": ["name", "value", "sensitive"],
            "properties": {
                "name": {"type": "string"},
                "value": {"description": "the value; `<sensitive>` unless the token is admin"},
                "sensitive": {"type": "boolean"},
                "omitted": {"type": "boolean"},
            },
        },
        "Run": {
            "type": "object",
            "required": ["id", "result", "outputs"],
            "properties": {
                "id": {"type": "string"},
                "operation": {"type": "string"},
                "serial": _nullable("integer"),
                "sourceDigests": {"type": "array", "items": {"type": "string"}},
                "startedAt": _nullable("string"),
                "finishedAt": _nullable("string"),
                "result": {"type": "string"},
                "failedObject": _nullable("string"),
                "message": _nullable("string"),
                "counts": _nullable("object"),
                "outputs": {"type": "array", "items": _ref("Output")},
            },
        },
    }

    state_counts = {
        "type": "object",
        "required": list(STATES),
        "properties": {state: {"type": "integer"} for state in STATES},
    }
    schemas["MatrixRow"] = {
        "type": "object",
        "required": ["name", "labels", "stale", "cells"],
        "properties": {
            **schemas["Cluster"]["properties"],
            "cells": {
                "type": "object",
                "description": "bundle -> state, for the shown bundles the cluster has",
                "additionalProperties": {"type": "string", "enum": list(STATES)},
            },
        },
    }
    schemas["Matrix"] = {
        "type": "object",
        "required": ["bundles", "allBundles", "labels", "fleet", "total", "items", "states"],
        "properties": {
            "bundles": {
                "type": "array",
                "items": {"type": "string"},
                "description": "the columns: every bundle, or the one filtered on",
            },
            "allBundles": {"type": "array", "items": {"type": "string"}},
            "labels": {
                "type": "object",
                "description": "every label key with its values",
                "additionalProperties": {"type": "array", "items": {"type": "string"}},
            },
            "fleet": {
                "type": "object",
                "description": "the whole fleet, unfiltered",
                "properties": {
                    "clusters": {"type": "integer"},
                    "stale": {"type": "integer"},
                    "errors": {"type": "integer"},
                },
            },
            "total": {"type": "integer", "description": "clusters matching the filters"},
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
            "states": {
                **state_counts,
                "description": "shown cells of every matching cluster, by state",
            },
            "items": {"type": "array", "items": _ref("MatrixRow")},
        },
    }

    def listing(item: str) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["items"],
            "properties": {
                "items": {"type": "array", "items": _ref(item)},
                "total": {"type": "integer", "description": "with limit: every matching item"},
                "offset": {"type": "integer"},
                "limit": {"type": "integer"},
            },
        }

    def op(
        summary: str, ok: dict[str, Any], params: list[dict[str, Any]], *, found: bool = True
    ) -> dict[str, Any]:
        responses = {"200": _json(ok, summary), **_ERRORS}
        if found:
            responses.update(_NOT_FOUND)
        return {
            "get": {
                "summary": summary,
                "operationId": summary.lower().replace(" ", "_"),
                "parameters": params,
                "responses": responses,
            }
        }

    p = API_PREFIX
    runs_schema = {
        "type": "object",
        "required": ["installation", "items"],
        "properties": {
            "installation": {"type": "string"},
            "items": {"type": "array", "items": _ref("Run")},
        },
    }
    outputs_schema = {
        "type": "object",
        "required": ["installation", "run", "items"],
        "properties": {
            "installation": {"type": "string"},
            "run": {"type": "string"},
            "result": _nullable("string"),
            "items": {"type": "array", "items": _ref("Output")},
        },
    }
    installations_op = op(
        "List installations",
        listing("InstallationSummary"),
        [
            _query_param("cluster", "only this cluster", {"type": "string"}),
            _query_param("bundle", "only this bundle", {"type": "string"}),
            _query_param("state", "only this state", {"type": "string", "enum": list(STATES)}),
            *_PAGE_PARAMS,
        ],
        found=False,
    )
    installations_op["get"]["responses"]["400"] = _json(_ref("Error"), "unknown state or bad page")
    clusters_op = op("List clusters", listing("Cluster"), _PAGE_PARAMS, found=False)
    clusters_op["get"]["responses"]["400"] = _json(_ref("Error"), "bad page")
    matrix_op = op(
        "Fleet matrix",
        _ref("Matrix"),
        [
            _query_param(
                "label",
                "a label selector: `key=value`, `key!=value`, `key`, `!key`, `key in (a,b)`, "
                "`key notin (a,b)`, comma-separated, all must hold",
                {"type": "string"},
            ),
            _query_param(
                "bundle",
                "only this bundle's column (and clusters that have it)",
                {"type": "string"},
            ),
            _query_param(
                "state",
                "only clusters with a shown cell in this state",
                {"type": "string", "enum": list(STATES)},
            ),
            _query_param("name", "only clusters whose name contains this", {"type": "string"}),
            _query_param("offset", "clusters to skip (by name)", {"type": "integer", "minimum": 0}),
            _query_param(
                "limit",
                f"clusters per page ({DEFAULT_PAGE})",
                {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
            ),
        ],
        found=False,
    )
    matrix_op["get"]["description"] = (
        "Clusters (rows, sorted by name) × bundles (columns), one state per cell, a page at a "
        "time; the filters apply to the whole fleet before paging. What the dashboard shows."
    )
    matrix_op["get"]["responses"]["400"] = _json(
        _ref("Error"), "unknown state, bad label selector or page"
    )
    paths: dict[str, Any] = {
        f"{p}/openapi.json": op("OpenAPI document", {"type": "object"}, [], found=False),
        f"{p}/clusters": clusters_op,
        f"{p}/clusters/{{cluster}}": op("Show cluster", _ref("Cluster"), [_CLUSTER]),
        f"{p}/installations": installations_op,
        f"{p}/installations/{{cluster}}/{{bundle}}": op(
            "Show installation", _ref("Installation"), [_CLUSTER, _BUNDLE]
        ),
        f"{p}/installations/{{cluster}}/{{bundle}}/runs": op(
            "List runs", runs_schema, [_CLUSTER, _BUNDLE]
        ),
        f"{p}/installations/{{cluster}}/{{bundle}}/runs/{{run}}/outputs": op(
            "List outputs",
            outputs_schema,
            [_CLUSTER, _BUNDLE, _path_param("run", "a run id, or `latest` (newest succeeded)")],
        ),
        f"{p}/matrix": matrix_op,
    }
    if rollouts:
        _rollout_api(schemas, paths, op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fleetlet hub API",
            "version": "v1",
            "description": "What each cluster runs, how each run went and what it produced.",
        },
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
        },
        "paths": paths,
    }


def _rollout_api(schemas: dict[str, Any], paths: dict[str, Any], op: Callable[..., Any]) -> None:
    """The rollout endpoints and their schemas (docs/rollouts.md)."""
    from hub.rollout.advance import ACTIONS
    from hub.rollout.evaluate import VERDICTS
    from hub.rollout.state import STATUSES

    counts = {"type": "object", "additionalProperties": {"type": "integer"}}
    schemas["RolloutWave"] = {
        "type": "object",
        "required": ["name", "pauseBefore", "clusters", "counts"],
        "properties": {
            "name": {"type": "string"},
            "pauseBefore": {"type": "boolean"},
            "startedAt": _nullable("string"),
            "settledAt": _nullable("string"),
            "promotedBy": _nullable("string"),
            "promotedAt": _nullable("string"),
            "clusters": {"type": "integer"},
            "counts": {**counts, "description": "clusters by verdict"},
        },
    }
    summary_props: dict[str, Any] = {
        "id": {"type": "string"},
        "group": {"type": "string"},
        "status": {"type": "string", "enum": list(STATUSES)},
        "createdAt": {"type": "string"},
        "createdBy": {"type": "string"},
        "updatedAt": {"type": "string"},
        "source": {"type": "object"},
        "strategy": {"type": "object"},
        "clusters": {"type": "integer"},
        "counts": {**counts, "description": "clusters by verdict"},
        "currentWave": _nullable("string"),
        "waves": {"type": "array", "items": _ref("RolloutWave")},
        "failures": {"type": "object"},
        "halt": {
            **_nullable("object"),
            "description": "why it halted: at, reason, failures (cluster -> reason)",
        },
        "lastEvent": _nullable("object"),
    }
    schemas["RolloutSummary"] = {
        "type": "object",
        "required": ["id", "group", "status", "waves", "counts"],
        "properties": summary_props,
    }
    schemas["Rollout"] = {
        "type": "object",
        "required": ["id", "group", "status", "waves", "events", "members"],
        "properties": {
            **summary_props,
            "events": {"type": "array", "items": {"type": "object"}},
            "members": {
                "type": "object",
                "description": "a page of the member clusters: cluster, wave, phase, serial, "
                "verdict, reason",
            },
            "controller": {"type": "object"},
        },
    }
    p = API_PREFIX
    rollout = _path_param("rollout", "rollout id")
    paths[f"{p}/rollouts"] = op(
        "List rollouts",
        {
            "type": "object",
            "required": ["items"],
            "properties": {
                "items": {"type": "array", "items": _ref("RolloutSummary")},
                "controller": {"type": "object"},
            },
        },
        [],
        found=False,
    )
    one = op(
        "Show rollout",
        _ref("Rollout"),
        [
            rollout,
            _query_param("wave", "only the clusters of this wave", {"type": "string"}),
            _query_param(
                "verdict",
                "only the clusters with this verdict",
                {"type": "string", "enum": list(VERDICTS)},
            ),
            _query_param("offset", "clusters to skip", {"type": "integer", "minimum": 0}),
            _query_param("limit", "clusters per page (100)", {"type": "integer", "minimum": 1}),
        ],
    )
    paths[f"{p}/rollouts/{{rollout}}"] = one
    paths[f"{p}/rollouts/{{rollout}}/{{action}}"] = {
        "post": {
            "summary": "Act on a rollout",
            "operationId": "act_on_rollout",
            "description": "promote (start the next wave), pause, resume (after a pause or a "
            "halt), abort (send the clusters that got the new revision back). Admin tokens "
            "only; recorded in git with the token's name.",
            "parameters": [
                rollout,
                {
                    "name": "action",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": list(ACTIONS)},
                },
            ],
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {"type": "object", "properties": {"reason": {"type": "string"}}}
                    }
                },
            },
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["rollout", "event"],
                        "properties": {
                            "rollout": _ref("RolloutSummary"),
                            "event": {"type": "object"},
                        },
                    },
                    "recorded; the controller carries it out",
                ),
                **_ERRORS,
                "403": _json(_ref("Error"), "the token is not an admin token"),
                "404": _json(_ref("Error"), "unknown rollout or action"),
                "409": _json(_ref("Error"), "the action does not apply to the rollout as it is"),
            },
        }
    }


__all__ = [
    "API_PREFIX",
    "SENSITIVE",
    "HubConfigError",
    "QueryError",
    "StatusQueries",
    "create_app",
    "load_private_key",
    "load_tokens",
    "openapi_document",
    "sealed_opener",
]
