"""The API's names and the patterns its fields are checked against (Go RE2 syntax, checked
the same way in Python and by the API server), with the limits and enumerations they share.

Used by every declaration of :mod:`agent.api.models`, and by :mod:`agent.api.pins` and
:mod:`agent.api.crds`.
"""

from __future__ import annotations

from typing import Literal

from agent.api.validation import Rule

API_GROUP = "fleetlet.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

BUILTIN_FORMATS = ("plain", "kustomize", "helm", "registry+v1")


# --- patterns (Go RE2 syntax, checked the same way in Python and by the API server) ----------

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_TEXT = "a DNS-1123 label (lower case letters, digits and '-', at most 63)"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_SUBDOMAIN_TEXT = "a DNS-1123 subdomain (lower case letters, digits, '-' and '.')"
OBJECT_NAME = r"^[A-Za-z0-9]([A-Za-z0-9:._-]*[A-Za-z0-9])?$"
RELATIVE_PATH = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
RELATIVE_PATH_TEXT = "a relative path (segments of letters, digits, '.', '_', '-' joined by '/')"
DIGEST = r"^sha256:[0-9a-f]{64}$"
DIGEST_TEXT = "sha256:<64 hex>"
COMMIT = r"^[0-9a-f]{40}$"
COMMIT_TEXT = "a full commit id (40 lower-case hex)"
SHA256_HEX = r"^[0-9a-f]{64}$"
SHA256_HEX_TEXT = "<64 hex> (the sha256 of the archive)"
PIN = r"^(sha256:[0-9a-f]{64}|[0-9a-f]{40}|[0-9a-f]{64})$"
HTTP_URL = r"^https?://\S+$"
HTTP_URL_TEXT = "an http:// or https:// URL without whitespace"
CHART_NAME = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
CHART_NAME_TEXT = "a chart name (letters, digits, '.', '_', '-')"
# One exact SemVer 2 version (Helm tolerates a leading 'v'); ranges are resolved by the hub.
CHART_VERSION = (
    r"^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
CHART_VERSION_TEXT = "one exact version such as 1.2.3 (ranges are resolved by the hub)"
RELEASE_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
RELEASE_NAME_TEXT = "a Helm release name (lower case letters, digits, '-' and '.', at most 53)"
FORMAT_NAME = r"^[a-z0-9]([a-z0-9.+-]*[a-z0-9])?$"
API_VERSION_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+"
    r"((alpha|beta)[0-9]+)?$"
)
KIND = r"^[A-Z][A-Za-z0-9]*$"
FIELD_PATH = r"^(\.[A-Za-z0-9_-]+|\[[0-9]+\]|\['[^']+'\])+$"
FIELD_PATH_TEXT = "a field path such as .spec.clusterIP, .data.password or .items[0]['a.b']"
OUTPUT_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*$"
CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
REASON_TEXT = "a CamelCase reason (letters, digits, '_', ',', ':'; starting with a letter)"
RUN_ID = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
NO_WHITESPACE = r"^\S+$"

MAX_SOURCES = 16
MAX_NAMES = 256

SourceKind = Literal["image", "git", "http", "helm"]
Approval = Literal["none", "manual"]
DeletionPolicy = Literal["Delete", "Orphan"]
ApiServiceHealth = Literal["Available", "Endpoints"]
ConditionStatus = Literal["True", "False", "Unknown"]


def _escapes(path: str) -> bool:
    return path == ".." or path.startswith("../") or path.endswith("/..") or "/../" in path


# Paths are relative by pattern (no leading '/'); this rule refuses '..' segments.
STAYS_INSIDE = Rule(
    cel="!(self == '..' || self.startsWith('../') || self.endsWith('/..') "
    "|| self.contains('/../'))",
    expected="a path without '..' segments (it must stay inside the bundle tree)",
    check=lambda value: not _escapes(value),
)
