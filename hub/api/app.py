"""The hub's HTTP/JSON API (Starlette): clusters, installations, runs and outputs; the dashboard.

Porter-style: installations (cluster × bundle) filtered by cluster, bundle and state; the runs
of an installation; the outputs of a run, where the run id may be ``latest`` (the newest
succeeded run); the fleet matrix a page at a time. The OpenAPI 3.1 document is served at
``/api/v1/openapi.json``.

Every API request needs a bearer token from the tokens file (role ``admin`` or ``read``) unless
anonymous read access was explicitly enabled. Sensitive outputs arrive sealed to the hub's
X25519 key: they are opened only for admin tokens; others see ``<sensitive>``.

Bounded (:class:`Bounds`): every list is paged (100 by default, at most 500), at most
``concurrency`` API requests are worked on at once (``large`` of them asking for larger
pages) and ``queue`` more wait; past that, and for
a request that runs out of time or whose status documents cannot be fetched, the answer is 503
with ``Retry-After``.

The dashboard (``/`` and ``/ui/...``) is static files from ``hub/api/dashboard`` (no build
step, nothing from another origin): the shell is public, its data comes from the API above
with the token the user gives it. See ``docs/dashboard.md``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
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
from hub.api.endpoints import API_PREFIX, CORE, Endpoint, enroll_endpoints, rollout_endpoints
from hub.api.metrics import HubMetrics
from hub.api.openapi import openapi_document
from hub.api.tokens import HubConfigError, Tokens, load_tokens
from hub.explain import answer as explain_answer
from hub.status.aggregate import FleetStatus
from hub.status.queries import (
    DEFAULT_PAGE,
    SENSITIVE,
    Labels,
    QueryError,
    StatusQueries,
    load_private_key,
    sealed_opener,
)

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


@dataclass(frozen=True, slots=True)
class Bounds:
    """How much work the API takes on at once (``hub serve --concurrency``, ``--queue``,
    ``--request-timeout``).

    ``concurrency`` API requests are worked on at once (each in a thread); ``queue`` more may
    wait for one of them; past that a request is answered at once with 503 and
    ``Retry-After``. A request not answered within ``request_timeout`` seconds (waiting
    included) gets 503 and ``Retry-After`` too.
    """

    concurrency: int = 16
    queue: int = 64
    request_timeout: float = 30.0
    large: int = 2
    """Of the requests worked on, how many may ask for pages larger than the default."""


BUSY_RETRY_AFTER = 1
"""Seconds a client is told to wait when every place of :class:`Bounds` is taken."""
SLOW_RETRY_AFTER = 5
"""Seconds a client is told to wait after its request ran out of time."""


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}))


def _unavailable(message: str, retry_after: float | None) -> JSONResponse:
    """503 with a Retry-After (whole seconds, at least 1)."""
    wait = max(1, math.ceil(retry_after if retry_after is not None else SLOW_RETRY_AFTER))
    return _error(503, message, {"Retry-After": str(wait)})


def _large(request: Request) -> bool:
    """Whether ``request`` asks for a page larger than the default."""
    text = request.query_params.get("limit") or ""
    return text.isdigit() and int(text) > DEFAULT_PAGE


class _Threads:
    """Counts the API's handler threads that are running (abandoned ones included)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0

    def answer(
        self, handler: Callable[[Request, bool], dict[str, Any]], request: Request, admin: bool
    ) -> Response:
        with self._lock:
            self.running += 1
        try:
            return JSONResponse(handler(request, admin))
        finally:
            with self._lock:
                self.running -= 1


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
    bounds: Bounds | None = None,
    enrollment: Any = None,
) -> Starlette:
    """The API and the dashboard over ``status``.

    Anonymous requests get the ``read`` role only if allowed. ``labels`` (cluster -> labels,
    from the fleet repo) feed the label filter; ``metrics`` are served at ``/metrics`` (a
    token needed, as for the API). ``app.state.queries`` is the
    :class:`StatusQueries` behind the API (``warm()`` it after a refresh). ``rollouts``
    serves ``/api/v1/rollouts`` (reads for every token; actions for admin tokens, recorded with
    the token's name). ``bounds`` limit the work taken on at once (:class:`Bounds`). Raises
    HubConfigError if the dashboard's files are missing from the installation.
    """
    bounds = bounds or Bounds()
    # API requests being worked on or waiting for a thread (touched on the event loop only).
    pending = 0
    limiter: list[anyio.CapacityLimiter] = []  # made in the event loop, at the first request
    threads = _Threads()
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
            nonlocal pending
            # Threads still running past the limiter's count were abandoned (out of time):
            # they take places too, until they end.
            orphans = max(0, threads.running - bounds.concurrency)
            if pending + orphans >= bounds.concurrency + bounds.queue:
                return _unavailable(
                    f"the hub is busy: {pending + orphans} API requests in progress or "
                    "waiting; retry later",
                    BUSY_RETRY_AFTER,
                )
            if not limiter:
                limiter.append(anyio.CapacityLimiter(bounds.concurrency))
                limiter.append(anyio.CapacityLimiter(bounds.large))
            # Pages larger than the default take one of a few places of their own: a handful
            # of them must not take the CPU from every other client.
            lane = limiter[1] if _large(request) else limiter[0]
            pending += 1
            try:
                with anyio.fail_after(bounds.request_timeout):
                    # In a worker thread: listing 10,000 clusters' installations must not
                    # stall the event loop for the requests around it; the JSON is made there
                    # too. Abandoned (left to finish) if it runs out of time.
                    return await anyio.to_thread.run_sync(
                        threads.answer,
                        handler,
                        request,
                        role == "admin",
                        limiter=lane,
                        abandon_on_cancel=True,
                    )
            except TimeoutError:
                return _unavailable(
                    f"no answer within {bounds.request_timeout:g}s (the hub is overloaded or "
                    "a git server is slow); retry later",
                    SLOW_RETRY_AFTER,
                )
            except QueryError as exc:
                if exc.status == 503:
                    return _unavailable(exc.message, exc.retry_after)
                return _error(exc.status, exc.message)
            except TemporaryError as exc:
                # A status document could not be fetched now (DocumentsUnavailable), ...
                return _unavailable(str(exc), exc.delay)
            finally:
                pending -= 1

        return endpoint

    served = [*CORE]
    if rollouts is not None:
        served += _rollout_endpoints()
    if enrollment is not None:
        served += _enroll_endpoints()
    document = openapi_document(served)
    Values = dict[str, Any]

    def installation(v: Values) -> tuple[str, str]:
        return v["cluster"], v["bundle"]

    answers: dict[str, Callable[[Values, bool], dict[str, Any]]] = {
        "openapi_document": lambda v, a: document,
        "list_clusters": lambda v, a: queries.clusters(offset=v["offset"], limit=v["limit"]),
        "show_cluster": lambda v, a: queries.cluster(v["cluster"]),
        "list_installations": lambda v, a: queries.installations(**v),
        "show_installation": lambda v, a: queries.installation(*installation(v), admin=a),
        "list_runs": lambda v, a: queries.runs(*installation(v), admin=a),
        "list_outputs": lambda v, a: queries.outputs(*installation(v), v["run"], admin=a),
        "explain_cluster": lambda v, a: explain_answer(
            queries, v["cluster"], v["bundle"], rollouts.state if rollouts is not None else None
        ),
        "fleet_matrix": lambda v, a: queries.matrix(**v),
    }

    def route(endpoint: Endpoint, answer: Callable[[Values, bool], dict[str, Any]]) -> Route:
        return Route(
            endpoint.url_path,
            guarded(lambda r, a: answer(endpoint.values(r), a)),
            methods=[endpoint.method],
        )

    routes: list[BaseRoute] = [route(endpoint, answers[endpoint.operation]) for endpoint in CORE]
    if rollouts is not None:
        routes += _rollout_routes(rollouts, guarded, caller)
    if enrollment is not None:
        routes += _enroll_routes(enrollment, caller)

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
    app.state.openapi = document  # served as is: hub.channel adds its path when in front
    return app


# --- rollouts ------------------------------------------------------------------------------


def _rollout_routes(
    rollouts: RolloutService,
    guarded: Callable[[Callable[[Request, bool], dict[str, Any]]], Callable[[Request], Any]],
    caller: Callable[[Request], tuple[str, str] | None],
) -> list[BaseRoute]:
    """``GET /rollouts``, ``GET /rollouts/{rollout}``, ``POST /rollouts/{rollout}/{action}``."""
    from hub.rollout.advance import RolloutActionError

    listed, shown, acted = _rollout_endpoints()

    def listing(request: Request, admin: bool) -> dict[str, Any]:
        return _answer(rollouts.list)

    def one(request: Request, admin: bool) -> dict[str, Any]:
        v = shown.values(request)
        found = _answer(
            lambda: rollouts.detail(
                v["rollout"],
                wave=v["wave"],
                verdict=v["verdict"],
                offset=v["offset"],
                limit=v["limit"],
            )
        )
        if found is None:
            raise QueryError(404, f"no rollout {v['rollout']!r}")
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
        actions = acted.params[1].enum or ()
        if verb not in actions:
            return _error(404, f"no such action {verb!r}: one of {', '.join(actions)}")
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
                raise QueryError(503, str(exc), retry_after=exc.delay) from exc
            return {"rollout": summary(done, None), "event": done.events[-1].to_dict()}

        try:
            return JSONResponse(await run_in_threadpool(work))
        except QueryError as exc:
            if exc.status == 503:
                return _unavailable(exc.message, exc.retry_after)
            return _error(exc.status, exc.message)

    return [
        Route(listed.url_path, guarded(listing), methods=[listed.method]),
        Route(shown.url_path, guarded(one), methods=[shown.method]),
        Route(acted.url_path, action, methods=[acted.method]),
    ]


def _rollout_endpoints() -> tuple[Endpoint, ...]:
    """The rollout endpoints' declarations, with hub.rollout's vocabularies."""
    from hub.rollout.advance import ACTIONS
    from hub.rollout.evaluate import VERDICTS
    from hub.rollout.report import MAX_MEMBERS_PAGE

    return rollout_endpoints(actions=ACTIONS, verdicts=VERDICTS, max_members=MAX_MEMBERS_PAGE)


def _enroll_endpoints() -> tuple[Endpoint, ...]:
    from hub.enroll.service import STATES

    return enroll_endpoints(states=STATES)


def _enroll_routes(enrollment: Any, caller: Any) -> list[BaseRoute]:
    """Enrollment (``hub serve --enroll``): :mod:`hub.enroll.routes`."""
    from hub.enroll.routes import enroll_routes

    return enroll_routes(enrollment, caller)


def _answer(work: Callable[[], _T]) -> _T:
    """``work()``, with the git server's trouble as a 503."""
    try:
        return work()
    except TemporaryError as exc:
        raise QueryError(503, f"rollout state: {exc}", retry_after=exc.delay) from exc
    except FleetletError as exc:
        raise QueryError(500, f"rollout state: {exc}") from exc


__all__ = [
    "API_PREFIX",
    "SENSITIVE",
    "Bounds",
    "HubConfigError",
    "QueryError",
    "StatusQueries",
    "create_app",
    "load_private_key",
    "load_tokens",
    "sealed_opener",
]
