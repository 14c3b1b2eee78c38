"""The hub API's OpenAPI 3.1 document (served at ``/api/v1/openapi.json``), written from the
endpoints' declarations (:mod:`hub.api.endpoints`) and their resources
(:mod:`hub.api.resources`): the routes the app serves are made from the same declarations, so
the two cannot disagree. Called by :func:`hub.api.app.create_app`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hub.api._schema import schema_of
from hub.api.endpoints import API_PREFIX, Endpoint
from hub.api.resources import Error

_UNAUTHORIZED = "missing or unknown bearer token"


def openapi_document(endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``endpoints``.

    Raises TypeError if a resource has a type the schema writer does not know (a programming
    error, caught by the document's test).
    """
    components: dict[str, Any] = {}
    error = schema_of(Error, components)
    paths: dict[str, Any] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.url_path, {})[endpoint.method.lower()] = _operation(
            endpoint, components, error
        )
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
            "schemas": dict(sorted(components.items())),
        },
        "paths": paths,
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _operation(
    endpoint: Endpoint, components: dict[str, Any], error: dict[str, Any]
) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": _json(schema_of(endpoint.answer, components), endpoint.summary),
        "401": {
            **_json(error, _UNAUTHORIZED),
            "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
        },
    }
    for status, description in sorted(endpoint.errors.items()):
        responses[str(status)] = _json(error, description)
    operation: dict[str, Any] = {
        "summary": endpoint.summary,
        "operationId": endpoint.operation,
        "description": f"{endpoint.description + ' ' if endpoint.description else ''}"
        f"Needs {endpoint.auth}.",
        "parameters": [
            {
                "name": param.name,
                "in": param.where,
                "required": param.where == "path",
                "description": param.description,
                "schema": param.schema(),
            }
            for param in endpoint.params
        ],
        "responses": responses,
    }
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": schema_of(endpoint.body, components)}},
        }
    return operation


__all__ = ["API_PREFIX", "openapi_document"]
