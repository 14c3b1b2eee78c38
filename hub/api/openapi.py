"""The hub API's OpenAPI 3.1 document (served at ``/api/v1/openapi.json``): every endpoint,
its parameters and its answers' schemas, with the rollout endpoints when the hub runs rollouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hub.status.document import STATES
from hub.status.queries import (
    DEFAULT_PAGE,
    MAX_NAME_FILTER,
    MAX_PAGE,
    MAX_REQUIREMENTS,
    MAX_SELECTOR_LENGTH,
)

API_PREFIX = "/api/v1"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


_CHANNEL = {
    "type": ["string", "null"],
    "enum": ["up", "down", None],
    "description": "the agent's notification channel to the hub: `up` (told of moves at once), "
    "`down` (polling while it reconnects); null: no channel configured, the agent only polls",
}

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
        f"items per page ({DEFAULT_PAGE} when not given, at most {MAX_PAGE}); the answer has "
        "`total`, `offset` and `limit`: page through with `offset`",
        {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE},
    ),
]
_BUNDLE = _path_param("bundle", "bundle name")


_FINDING: dict[str, Any] = {
    "type": "object",
    "required": ["check", "blocking", "summary"],
    "properties": {
        "check": {
            "type": "string",
            "enum": [
                "agent", "publication", "rollout", "stale", "approval", "dependency",
                "failure", "paused", "moving", "ok",
            ],
        },
        "blocking": {"type": "boolean"},
        "summary": {"type": "string", "description": "one line"},
        "bundle": {"type": "string"},
        "details": {"type": "array", "items": {"type": "string"}},
        "unblock": {"type": "string", "description": "the command that would unblock it"},
    },
}  # fmt: skip
_EXPLANATION: dict[str, Any] = {
    "type": "object",
    "description": "Why the cluster is not running the latest (docs/operations.md, "
    '"Why is this not running the latest"): the first blocking finding, and every finding '
    "in the order checked.",
    "required": ["cluster", "blocked", "reason", "findings", "rolloutsRead"],
    "properties": {
        "cluster": {"type": "string"},
        "bundle": _nullable("string"),
        "blocked": {"type": "boolean"},
        "reason": {"oneOf": [_FINDING, {"type": "null"}]},
        "findings": {"type": "array", "items": _FINDING},
        "rolloutsRead": {"type": "boolean", "description": "false: the hub runs no rollouts"},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
}


def openapi_document(*, rollouts: bool = False, channel: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this API (``rollouts``: with the rollout endpoints;
    ``channel``: with the agents' notification channel)."""
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
        "notifyChannel": _CHANNEL,
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
                "notifyChannel": _CHANNEL,
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
                "total": {"type": "integer", "description": "every matching item"},
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
                "`key notin (a,b)`, comma-separated, all must hold; at most "
                f"{MAX_REQUIREMENTS} requirements and {MAX_SELECTOR_LENGTH} characters",
                {"type": "string", "maxLength": MAX_SELECTOR_LENGTH},
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
            _query_param(
                "name",
                "only clusters whose name contains this",
                {"type": "string", "maxLength": MAX_NAME_FILTER},
            ),
            _query_param("offset", "clusters to skip (by name)", {"type": "integer", "minimum": 0}),
            _query_param(
                "limit",
                f"clusters per page ({DEFAULT_PAGE} when not given, at most {MAX_PAGE})",
                {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE},
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
        f"{p}/explain/{{cluster}}": op(
            "Explain cluster",
            _EXPLANATION,
            [
                _CLUSTER,
                _query_param("bundle", "only this bundle and its group", {"type": "string"}),
            ],
        ),
    }
    if channel:
        paths[f"{p}/clusters/{{cluster}}/events"] = _events([_CLUSTER])
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
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "channelToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a cluster's channel token: opens its events and nothing else",
                },
            },
            "schemas": schemas,
        },
        "paths": paths,
    }


def _events(parameters: list[Any]) -> dict[str, Any]:
    """The agents' notification channel (:mod:`hub.channel`), served with ``hub serve
    --channel-tokens``: a stream, not JSON."""
    errors = {
        code: _json(_ref("Error"), text)
        for code, text in (
            ("401", "missing or unknown channel token (API tokens do not open a channel)"),
            ("403", "this token opens another cluster's channel"),
            ("503", "too many open channels on this hub: poll, retry after `Retry-After`"),
        )
    }
    return {
        "get": {
            "summary": "Notification channel",
            "description": "Server-sent events for one cluster's agent, authenticated with that "
            "cluster's channel token (`fleetlet hub channel-token add`), held open: `event: look` "
            "when the cluster's branch moved (the agent then lists its branch in git; the event "
            "carries nothing else and is never trusted), a `: ping` comment when idle (every "
            "`--channel-keepalive`). Served only with `hub serve --channel-tokens`.",
            "operationId": "notification_channel",
            "parameters": parameters,
            "security": [{"channelToken": []}],
            "responses": {
                "200": {
                    "description": "the stream (`event: look` / `: ping`), until either side "
                    "closes it",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **errors,
            },
        }
    }


def _rollout_api(schemas: dict[str, Any], paths: dict[str, Any], op: Callable[..., Any]) -> None:
    """The rollout endpoints and their schemas (docs/rollouts.md)."""
    from hub.rollout.advance import ACTIONS
    from hub.rollout.evaluate import VERDICTS
    from hub.rollout.report import MAX_MEMBERS_PAGE
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
            _query_param(
                "limit",
                f"clusters per page (100 when not given; more than {MAX_MEMBERS_PAGE} gives "
                f"{MAX_MEMBERS_PAGE})",
                {"type": "integer", "minimum": 1, "default": 100},
            ),
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
