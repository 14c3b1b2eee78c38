"""The enrollment endpoints of the hub's OpenAPI document (:func:`hub.api.openapi.openapi_document`
adds them when the hub runs with ``--enroll``)."""

from __future__ import annotations

from typing import Any

from hub.api.openapi import API_PREFIX
from hub.enroll.service import STATES


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json({"$ref": "#/components/schemas/Error"}, description)


def enroll_api(schemas: dict[str, Any], paths: dict[str, Any]) -> None:
    """The requests' schemas and the four enrollment endpoints (docs/operations.md)."""
    strings = {"type": "object", "additionalProperties": {"type": "string"}}
    schemas["EnrollmentRequest"] = {
        "type": "object",
        "required": ["cluster", "token", "labels", "facts", "state", "requestedAt"],
        "properties": {
            "cluster": {"type": "string"},
            "token": {"type": "string", "description": "the enrollment token's id"},
            "labels": {
                **strings,
                "description": "what the cluster gets: its claim and the token's",
            },
            "facts": {
                "type": "object",
                "description": "kubernetesVersion, apiGroupVersions, formats, as reported",
            },
            "state": {"type": "string", "enum": list(STATES)},
            "requestedAt": {"type": "string"},
            "decidedAt": {"type": "string"},
            "decidedBy": {
                "type": "string",
                "description": "the API token's name, or token:<id> (policy) for an automatic one",
            },
            "reason": {"type": "string", "description": "given with a denial"},
            "waiting": {
                "type": "string",
                "description": "why a pending request was not accepted by its token's policy",
            },
        },
    }
    request = {"$ref": "#/components/schemas/EnrollmentRequest"}
    answer = {
        "allOf": [
            request,
            {
                "type": "object",
                "properties": {
                    "config": {
                        "type": "object",
                        "description": "once accepted: repo, statusRepo, identity, issuer, "
                        "trustedRoot, hubPublicKey",
                    },
                    "sealedCredentials": {
                        "type": "string",
                        "description": "once accepted: the git credentials, sealed to the "
                        "cluster's key (libsodium sealed box, base64)",
                    },
                },
            },
        ]
    }
    cluster = {"name": "cluster", "in": "path", "required": True, "schema": {"type": "string"}}
    unauthorized = _error("no enrollment token, or an unknown one; a bad signature; a stale time")
    p = API_PREFIX
    paths[f"{p}/enroll"] = {
        "post": {
            "summary": "Ask to enroll",
            "operationId": "ask_to_enroll",
            "description": "The agent's side (`fleetlet agent install --enroll`), with an "
            "enrollment token as bearer token. The body carries the cluster's Ed25519 public "
            "key, a nonce and the time, and is signed with that key (the `Fleetlet-Signature` "
            "header: base64 of the signature of `fleetlet-enroll-v1\\nPOST /api/v1/enroll\\n` "
            "and the body's bytes).",
            "parameters": [
                {
                    "name": "Fleetlet-Signature",
                    "in": "header",
                    "required": True,
                    "schema": {"type": "string"},
                }
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["cluster", "publicKey", "nonce", "issuedAt"],
                            "additionalProperties": False,
                            "properties": {
                                "cluster": {"type": "string"},
                                "labels": strings,
                                "facts": {"type": "object"},
                                "publicKey": {"type": "string"},
                                "nonce": {"type": "string"},
                                "issuedAt": {"type": "string"},
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json(answer, "recorded: pending, or accepted"),
                "400": _error("a malformed request"),
                "401": unauthorized,
                "403": _error(
                    "the token expired, was revoked or is exhausted; labels out of scope"
                ),
                "409": _error("the name is taken (no takeover), or the request was replayed"),
            },
        }
    }
    paths[f"{p}/enroll/{{cluster}}"] = {
        "get": {
            "summary": "Show own enrollment",
            "operationId": "show_own_enrollment",
            "description": "The agent's side: its request's state, with the token that made it.",
            "parameters": [cluster],
            "responses": {
                "200": _json(answer, "the request"),
                "401": unauthorized,
                "404": _error("no such request by this token"),
            },
        }
    }
    paths[f"{p}/enrollments"] = {
        "get": {
            "summary": "List enrollment requests",
            "operationId": "list_enrollment_requests",
            "parameters": [
                {
                    "name": "state",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": list(STATES)},
                }
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "required": ["items"],
                        "properties": {"items": {"type": "array", "items": request}},
                    },
                    "every request, pending, accepted and denied",
                ),
                "400": _error("unknown state"),
                "401": _error("missing or unknown bearer token"),
            },
        }
    }
    paths[f"{p}/enrollments/{{cluster}}/{{verdict}}"] = {
        "post": {
            "summary": "Decide an enrollment request",
            "operationId": "decide_enrollment_request",
            "description": "accept or deny a pending request. Admin tokens only; recorded with "
            "the token's name.",
            "parameters": [
                cluster,
                {
                    "name": "verdict",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": ["accept", "deny"]},
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
                "200": _json(request, "decided"),
                "401": _error("missing or unknown bearer token"),
                "403": _error("the token is not an admin token"),
                "404": _error("no such request"),
                "409": _error("the request was decided already"),
            },
        }
    }
