"""References from the API to other things: Secrets and their keys in the agent's namespace,
a source's credentials and the cluster objects health checks and outputs read.

Part of :mod:`agent.api.models`; used by its sources, health checks and outputs.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass

from agent.api.models._patterns import (
    API_VERSION_PATTERN,
    DNS_LABEL,
    DNS_LABEL_TEXT,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_TEXT,
    KIND,
    OBJECT_NAME,
    SECRET_KEY,
)
from agent.api.validation import ApiObject, api_field

# --- references -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class SecretReference(ApiObject):
    """A Secret in the agent's own namespace (never another namespace, never inline data)."""

    name: str = api_field(
        "Name of the Secret.", pattern=DNS_SUBDOMAIN, expected=DNS_SUBDOMAIN_TEXT, max_length=253
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SecretKeyReference(ApiObject):
    """One key of a Secret in the agent's namespace."""

    name: str = api_field(
        "Name of the Secret.", pattern=DNS_SUBDOMAIN, expected=DNS_SUBDOMAIN_TEXT, max_length=253
    )
    key: str = api_field(
        "Key inside the Secret's data.",
        pattern=SECRET_KEY,
        max_length=253,
        expected="a Secret key (letters, digits, '-', '_', '.')",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceAuth(ApiObject):
    """Credentials for fetching a source, by reference only.

    The Secret holds ``username``/``password`` (http and git over https), ``ssh-privatekey``
    (git over ssh) or ``.dockerconfigjson`` (image).
    """

    secret_ref: SecretReference = api_field(
        "The Secret holding the credentials, in the agent's namespace. It must be labelled "
        '`fleetlet.io/source-credential: "true"` (never the agent\'s own Secrets nor a '
        "bundle's outputs) and name the hosts it is for in annotation "
        "`fleetlet.io/source-hosts` (comma-separated `host[:port]`; a `.dockerconfigjson` "
        "names them in its entries): the credentials are sent to no other host, not after a "
        "redirect."
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectReference(ApiObject):
    """A Kubernetes object by API version, kind, name and (for namespaced kinds) namespace."""

    api_version: str = api_field(
        "API version of the object, e.g. `v1` or `apps/v1`.",
        pattern=API_VERSION_PATTERN,
        expected="an API version such as v1 or apps/v1",
        max_length=253,
    )
    kind: str = api_field(
        "Kind of the object, e.g. `Service`.",
        pattern=KIND,
        max_length=63,
        expected="a Kind (CamelCase, e.g. Deployment)",
    )
    name: str = api_field(
        "Name of the object.", pattern=OBJECT_NAME, max_length=253, expected="an object name"
    )
    namespace: str | None = api_field(
        "Namespace of a namespaced object. Default: the bundle's target namespace.",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
