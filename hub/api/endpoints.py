"""Every endpoint of the hub API, declared once: its path, method, parameters and answers.

:func:`hub.api.app.create_app` makes its routes from these declarations and reads each request's
parameters through them (:meth:`Param.read`: the same bounds the document states), and
:mod:`hub.api.openapi` writes the OpenAPI document from them and the resources of
:mod:`hub.api.resources`. ``tests/test_hub_api.py`` compares the served document with the app's
routes, and every real answer with its declared schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from hub.api import resources as r
from hub.status.queries import (
    DEFAULT_PAGE,
    MAX_NAME_FILTER,
    MAX_PAGE,
    MAX_REQUIREMENTS,
    MAX_SELECTOR_LENGTH,
    QueryError,
)

if TYPE_CHECKING:
    from starlette.requests import Request

API_PREFIX = "/api/v1"
STATES: tuple[str, ...] = get_args(r.State)
"""Installation states, as :data:`hub.status.document.STATES` (a test keeps them equal)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """A path or query parameter: how the document describes it and how a request's value is
    read (:meth:`read`)."""

    name: str
    description: str
    where: Literal["path", "query"] = "query"
    kind: type[str] | type[int] = str
    enum: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    default: int | None = None

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema in the document."""
        schema: dict[str, Any] = {"type": "integer" if self.kind is int else "string"}
        for key, value in (
            ("enum", list(self.enum) if self.enum else None),
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("maxLength", self.max_length),
            ("default", self.default),
        ):
            if value is not None:
                schema[key] = value
        return schema

    def read(self, request: Request) -> Any:
        """The request's value (None or the default when not given, or given empty).

        Raises QueryError (400) naming the parameter when the value breaks what the document
        says of it.
        """
        if self.where == "path":
            text: str | None = request.path_params[self.name]
        else:
            text = request.query_params.get(self.name) or None
        if text is None:
            return self.default
        if self.max_length is not None and len(text) > self.max_length:
            raise QueryError(
                400, f"{self.name} must be at most {self.max_length} characters, got {len(text)}"
            )
        if self.enum is not None and text not in self.enum:
            raise QueryError(
                400, f"{self.name} must be one of {', '.join(self.enum)}, got {text!r}"
            )
        if self.kind is not int:
            return text
        try:
            value = int(text)
        except ValueError:
            raise QueryError(400, f"{self.name} must be a whole number, got {text!r}") from None
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f">= {low}"
            raise QueryError(400, f"{self.name} must be {bounds}, got {value}")
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One operation of the API."""

    operation: str
    """Its operationId, and the name of its handler in :func:`hub.api.app.create_app`."""
    method: Literal["GET", "POST"]
    path: str
    """Below :data:`API_PREFIX`, with ``{name}`` for each path parameter."""
    summary: str
    answer: Any
    """The resource of a 200 answer (:mod:`hub.api.resources`)."""
    params: tuple[Param, ...] = ()
    description: str | None = None
    body: Any = None
    """The resource of the request's JSON body, if it takes one (never required)."""
    errors: dict[int, str] = field(default_factory=dict)
    """Other answers than 200 and 401, each an :class:`~hub.api.resources.Error`."""
    auth: str = "an API token (admin or read)"

    @property
    def url_path(self) -> str:
        return API_PREFIX + self.path

    def values(self, request: Request) -> dict[str, Any]:
        """Each parameter's value in ``request`` (:meth:`Param.read`). Raises QueryError."""
        return {param.name: param.read(request) for param in self.params}


def _path(name: str, description: str) -> Param:
    return Param(name=name, description=description, where="path")


CLUSTER = _path("cluster", "cluster name")
BUNDLE = _path("bundle", "bundle name")
OFFSET = Param(
    name="offset", description="items to skip (with limit: a page)", kind=int, minimum=0, default=0
)
LIMIT = Param(
    name="limit",
    description=f"items per page ({DEFAULT_PAGE} when not given, at most {MAX_PAGE}); the answer "
    "has `total`, `offset` and `limit`: page through with `offset`",
    kind=int,
    minimum=1,
    maximum=MAX_PAGE,
    default=DEFAULT_PAGE,
)
STATE = Param(name="state", description="only this state", enum=STATES)
_UNKNOWN = {404: "unknown cluster, bundle or run"}

CORE: tuple[Endpoint, ...] = (
    Endpoint(
        operation="openapi_document",
        method="GET",
        path="/openapi.json",
        summary="OpenAPI document",
        answer=r.OpenAPIDocument,
    ),
    Endpoint(
        operation="list_clusters",
        method="GET",
        path="/clusters",
        summary="List clusters",
        answer=r.ClusterList,
        params=(OFFSET, LIMIT),
        errors={400: "bad page"},
    ),
    Endpoint(
        operation="show_cluster",
        method="GET",
        path="/clusters/{cluster}",
        summary="Show cluster",
        answer=r.Cluster,
        params=(CLUSTER,),
        errors=_UNKNOWN,
    ),
    Endpoint(
        operation="list_installations",
        method="GET",
        path="/installations",
        summary="List installations",
        answer=r.InstallationList,
        params=(
            Param(name="cluster", description="only this cluster"),
            Param(name="bundle", description="only this bundle"),
            STATE,
            OFFSET,
            LIMIT,
        ),
        errors={400: "unknown state or bad page"},
    ),
    Endpoint(
        operation="show_installation",
        method="GET",
        path="/installations/{cluster}/{bundle}",
        summary="Show installation",
        answer=r.Installation,
        params=(CLUSTER, BUNDLE),
        errors=_UNKNOWN,
    ),
    Endpoint(
        operation="list_runs",
        method="GET",
        path="/installations/{cluster}/{bundle}/runs",
        summary="List runs",
        answer=r.RunList,
        params=(CLUSTER, BUNDLE),
        errors=_UNKNOWN,
    ),
    Endpoint(
        operation="list_outputs",
        method="GET",
        path="/installations/{cluster}/{bundle}/runs/{run}/outputs",
        summary="List outputs",
        answer=r.OutputList,
        params=(CLUSTER, BUNDLE, _path("run", "a run id, or `latest` (newest succeeded)")),
        errors=_UNKNOWN,
    ),
    Endpoint(
        operation="fleet_matrix",
        method="GET",
        path="/matrix",
        summary="Fleet matrix",
        description="Clusters (rows, sorted by name) × bundles (columns), one state per cell, a "
        "page at a time; the filters apply to the whole fleet before paging. What the dashboard "
        "shows.",
        answer=r.Matrix,
        params=(
            Param(
                name="label",
                description="a label selector: `key=value`, `key!=value`, `key`, `!key`, "
                "`key in (a,b)`, `key notin (a,b)`, comma-separated, all must hold; at most "
                f"{MAX_REQUIREMENTS} requirements and {MAX_SELECTOR_LENGTH} characters",
                max_length=MAX_SELECTOR_LENGTH,
            ),
            Param(
                name="bundle", description="only this bundle's column (and clusters that have it)"
            ),
            Param(
                name="state",
                description="only clusters with a shown cell in this state",
                enum=STATES,
            ),
            Param(
                name="name",
                description="only clusters whose name contains this",
                max_length=MAX_NAME_FILTER,
            ),
            Param(
                name="offset",
                description="clusters to skip (by name)",
                kind=int,
                minimum=0,
                default=0,
            ),
            Param(
                name="limit",
                description=f"clusters per page ({DEFAULT_PAGE} when not given, at most {MAX_PAGE})",
                kind=int,
                minimum=1,
                maximum=MAX_PAGE,
                default=DEFAULT_PAGE,
            ),
        ),
        errors={400: "unknown state, bad label selector or page"},
    ),
    Endpoint(
        operation="explain_cluster",
        method="GET",
        path="/explain/{cluster}",
        summary="Explain cluster",
        answer=r.Explanation,
        params=(CLUSTER, Param(name="bundle", description="only this bundle and its group")),
        errors=_UNKNOWN,
    ),
)
"""What every hub serves."""


def rollout_endpoints(
    *, actions: tuple[str, ...], verdicts: tuple[str, ...], max_members: int
) -> tuple[Endpoint, ...]:
    """The rollout endpoints (``hub serve --rollouts``, docs/rollouts.md); the vocabularies come
    from :mod:`hub.rollout`, which the API does not import."""
    rollout = _path("rollout", "rollout id")
    return (
        Endpoint(
            operation="list_rollouts",
            method="GET",
            path="/rollouts",
            summary="List rollouts",
            answer=r.RolloutList,
        ),
        Endpoint(
            operation="show_rollout",
            method="GET",
            path="/rollouts/{rollout}",
            summary="Show rollout",
            answer=r.Rollout,
            params=(
                rollout,
                Param(name="wave", description="only the clusters of this wave"),
                Param(
                    name="verdict", description="only the clusters with this verdict", enum=verdicts
                ),
                Param(
                    name="offset", description="clusters to skip", kind=int, minimum=0, default=0
                ),
                Param(
                    name="limit",
                    description=f"clusters per page (100 when not given; more than {max_members} "
                    f"gives {max_members})",
                    kind=int,
                    minimum=1,
                    default=100,
                ),
            ),
            errors={404: "unknown rollout"},
        ),
        Endpoint(
            operation="act_on_rollout",
            method="POST",
            path="/rollouts/{rollout}/{action}",
            summary="Act on a rollout",
            description="promote (start the next wave), pause, resume (after a pause or a halt), "
            "abort (send the clusters that got the new revision back). Admin tokens only; "
            "recorded in git with the token's name.",
            answer=r.RolloutAction,
            params=(
                rollout,
                Param(name="action", description="what to do", where="path", enum=actions),
            ),
            body=r.ActionBody,
            errors={
                400: "the body is not JSON, or its reason is too long",
                403: "the token is not an admin token",
                404: "unknown rollout or action",
                409: "the action does not apply to the rollout as it is",
            },
            auth="an admin API token",
        ),
    )


def enroll_endpoints(*, states: tuple[str, ...]) -> tuple[Endpoint, ...]:
    """The enrollment endpoints (``hub serve --enroll``, :mod:`hub.enroll.routes`)."""
    token = "an enrollment token (`hub enroll-token create`): it opens nothing else"
    return (
        Endpoint(
            operation="submit_enrollment",
            method="POST",
            path="/enroll",
            summary="Ask to join the fleet",
            description="The agent's request (`agent install --enroll`): its name, claimed "
            "labels, facts, public key, a nonce and the time, signed with that key: the "
            "`Fleetlet-Signature` header is base64 of the Ed25519 signature of "
            "`fleetlet-enroll-v1\\nPOST /api/v1/enroll\\n` and the body's exact bytes. "
            "Accepted by the token's policy, or pending until `hub clusters accept|deny`. "
            "401 also when the signature does not verify (edited in flight) or the time is "
            "outside the window (a late replay).",
            answer=r.EnrollmentAnswer,
            body=r.EnrollmentSubmission,
            errors={
                400: "a malformed request",
                403: "the token is expired, revoked, used up, or the labels are out of its scope",
                409: "the name is enrolled already, or the request was received already (a replay)",
                413: "the request is too large",
            },
            auth=token,
        ),
        Endpoint(
            operation="poll_enrollment",
            method="GET",
            path="/enroll/{cluster}",
            summary="An enrollment request's state",
            description="For the token that made the request; once accepted, with the "
            "cluster's credentials sealed to its key.",
            answer=r.EnrollmentAnswer,
            params=(CLUSTER,),
            errors={404: "no request of this token for this cluster"},
            auth=token,
        ),
        Endpoint(
            operation="list_enrollments",
            method="GET",
            path="/enrollments",
            summary="List enrollment requests",
            answer=r.EnrollmentList,
            params=(Param(name="state", description="only this state", enum=states),),
            errors={400: "unknown state"},
        ),
        Endpoint(
            operation="decide_enrollment",
            method="POST",
            path="/enrollments/{cluster}/{verdict}",
            summary="Accept or deny an enrollment request",
            answer=r.EnrollmentAnswer,
            params=(
                CLUSTER,
                Param(
                    name="verdict",
                    description="accept or deny",
                    where="path",
                    enum=("accept", "deny"),
                ),
            ),
            body=r.ActionBody,
            errors={
                400: "the body is not JSON, or its reason is too long",
                403: "the token is not an admin token",
                404: "no such request or verdict",
                409: "the request is decided already",
            },
            auth="an admin API token",
        ),
    )
