"""The fleetlet.io/v1alpha1 API: the types the hub publishes and the agent accepts.

Each type is declared once here; parsing, validation, the CRD schemas (:mod:`agent.api.crds`)
and ``docs/api.md`` are derived from these declarations. Constructors validate and raise
:class:`~agent.errors.ValidationError` (paths relative to the object constructed).
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal

import yaml

from agent.api.depgraph import find_cycle
from agent.api.helmsets import (
    HELM_SET_RULES,
    MAX_SET_CHARS,
    MAX_SET_ITEMS,
    SET_ASSIGNMENT,
    SET_ASSIGNMENT_TEXT,
    SET_FILE,
    SET_FILE_INSIDE,
    SET_FILE_TEXT,
)
from agent.api.reasons import Phase, RunResult
from agent.api.validation import ApiObject, PinProblem, Rule, api_field, show
from agent.api.yamlio import KUBE_LOADER
from agent.errors import FieldProblem

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


# --- sources --------------------------------------------------------------------------------


def _only(field: str, attr: str, kind: str) -> Rule:
    return Rule(
        cel=f"!has(self.{field}) || self.kind == '{kind}'",
        expected=f"{field} only on {kind} sources",
        check=lambda s: getattr(s, attr) is None or s.kind == kind,
        field=field,
    )


def _only_kinds(field: str, attr: str, kinds: tuple[str, ...]) -> Rule:
    listed = ", ".join(f"'{k}'" for k in kinds)
    return Rule(
        cel=f"!has(self.{field}) || self.kind in [{listed}]",
        expected=f"{field} only on {' or '.join(kinds)} sources",
        check=lambda s: getattr(s, attr) is None or s.kind in kinds,
        field=field,
    )


def _pinned(field: str, attr: str, kind: str, text: str) -> Rule:
    return Rule(
        cel=f"self.kind != '{kind}' || has(self.{field})",
        expected=f"{text} ({kind} sources are pinned by {field})",
        check=lambda s: s.kind != kind or getattr(s, attr) is not None,
        field=field,
        pin=True,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Source(ApiObject):
    """One place content is fetched from, pinned to immutable content.

    Exactly one pin, matching ``kind``: ``digest`` for ``image``, ``commit`` for ``git``,
    ``sha256`` for ``http`` and ``helm``. Floating references (tags, branches, URLs without a
    hash, version ranges) are never accepted. Several sources compose one tree through
    ``destination``.

    A ``helm`` source is a chart of a Helm repository: ``uri`` is the repository, ``chart`` and
    ``version`` say which chart, and the hub resolved them (from the repository's
    ``index.yaml``) to ``archiveUrl`` and its ``sha256``. The agent downloads ``archiveUrl``
    and checks the sha256; it never reads the index.
    """

    RULES: ClassVar[tuple[Rule, ...]] = (
        _pinned("digest", "digest", "image", DIGEST_TEXT),
        _pinned("commit", "commit", "git", COMMIT_TEXT),
        _pinned("sha256", "sha256", "http", SHA256_HEX_TEXT),
        _pinned("sha256", "sha256", "helm", SHA256_HEX_TEXT),
        _pinned("version", "version", "helm", CHART_VERSION_TEXT),
        _pinned("archiveUrl", "archive_url", "helm", HTTP_URL_TEXT),
        _only("digest", "digest", "image"),
        _only("commit", "commit", "git"),
        _only_kinds("sha256", "sha256", ("http", "helm")),
        _only("directory", "directory", "git"),
        _only("chart", "chart", "helm"),
        _only("version", "version", "helm"),
        _only("archiveUrl", "archive_url", "helm"),
        Rule(
            cel="self.kind != 'helm' || has(self.chart)",
            expected="chart (the chart's name in the repository) on a helm source",
            check=lambda s: s.kind != "helm" or s.chart is not None,
            field="chart",
        ),
        Rule(
            cel="!(self.kind in ['http', 'helm']) || self.uri.startsWith('https://') "
            "|| self.uri.startsWith('http://')",
            expected="an http(s):// URL for an http or helm source",
            check=lambda s: (
                s.kind not in ("http", "helm") or s.uri.startswith(("https://", "http://"))
            ),
            field="uri",
        ),
        Rule(
            cel="self.kind != 'image' || !(self.uri.contains('@') || self.uri.contains('://'))",
            expected="an image repository without scheme or @digest "
            "(registry/repository[:tag]; the pin goes in digest)",
            check=lambda s: s.kind != "image" or not ("@" in s.uri or "://" in s.uri),
            field="uri",
        ),
    )

    kind: SourceKind = api_field(
        "What the source is: an OCI artifact or image (`image`, also a Helm chart pushed to "
        "a registry), a git repository (`git`), an archive over HTTP(S) (`http`, tar or "
        "tar.gz) or a chart of a Helm repository (`helm`)."
    )
    uri: str = api_field(
        "Where the content lives. `image`: `registry/repository[:tag]` (a tag is informational "
        "only; content is fetched by `digest`); `git`: the repository URL; `http`: the "
        "archive's URL; `helm`: the Helm repository's URL (where its `index.yaml` is).",
        pattern=NO_WHITESPACE,
        expected="a URI without whitespace",
        max_length=2048,
    )
    digest: str | None = api_field(
        "`image` pin: the OCI manifest or index digest.",
        default=None,
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        pin=True,
        max_length=71,
    )
    commit: str | None = api_field(
        "`git` pin: the full commit id.",
        default=None,
        pattern=COMMIT,
        expected=COMMIT_TEXT,
        pin=True,
        max_length=40,
    )
    sha256: str | None = api_field(
        "`http` and `helm` pin: the sha256 of the archive, in hex.",
        default=None,
        pattern=SHA256_HEX,
        expected=SHA256_HEX_TEXT,
        pin=True,
        max_length=64,
    )
    chart: str | None = api_field(
        "`helm` only: the chart's name in the repository.",
        default=None,
        pattern=CHART_NAME,
        expected=CHART_NAME_TEXT,
        max_length=250,
    )
    version: str | None = api_field(
        "`helm` only: the chart's exact version (the hub resolves a range to one).",
        default=None,
        pattern=CHART_VERSION,
        expected=CHART_VERSION_TEXT,
        pin=True,
        max_length=128,
    )
    archive_url: str | None = api_field(
        "`helm` pin: the URL of the chart archive (`.tgz`) that the hub resolved from the "
        "repository's index; the agent downloads it and checks `sha256`.",
        default=None,
        pattern=HTTP_URL,
        expected=HTTP_URL_TEXT,
        pin=True,
        max_length=2048,
    )
    directory: str | None = api_field(
        "`git` only: the directory of the repository to take (default: the whole tree).",
        default=None,
        pattern=RELATIVE_PATH,
        expected=RELATIVE_PATH_TEXT,
        max_length=512,
        rules=(STAYS_INSIDE,),
    )
    destination: str | None = api_field(
        "Where this source's content goes inside the bundle's tree (default: its root). "
        "Relative, without `..`.",
        default=None,
        pattern=RELATIVE_PATH,
        expected=RELATIVE_PATH_TEXT,
        max_length=512,
        rules=(STAYS_INSIDE,),
    )
    auth: SourceAuth | None = api_field(
        "Credentials, as a reference to a Secret in the agent's namespace.", default=None
    )

    @property
    def pin(self) -> str:
        """The pin of this source, whatever its kind."""
        return self.digest or self.commit or self.sha256 or ""


# --- format, health, outputs ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class FormatOptions(ApiObject):
    """Options of the format that renders the bundle's tree into manifests."""

    values: Mapping[str, Any] | None = api_field(
        "`helm` (and plugin formats): the chart values, free-form.",
        default=None,
        free_form=True,
    )
    encrypted_values: Mapping[str, Any] | None = api_field(
        "`helm` (and plugin formats): values encrypted with SOPS to the cluster's age key, as "
        "sops wrote the file (the hub carries it from the fleet repo's `encryptedValues`). "
        "The agent decrypts it at render, verifies its MAC and merges the values over "
        "`values`; nothing else can open it (docs/secrets.md).",
        default=None,
        free_form=True,
    )
    values_files: tuple[str, ...] = api_field(
        "`helm`: values files inside the bundle tree (paths from the tree's root), applied in "
        "order over the chart's own `values.yaml` and under `values`.",
        default=(),
        pattern=RELATIVE_PATH,
        expected=RELATIVE_PATH_TEXT,
        max_length=512,
        max_items=32,
        rules=(STAYS_INSIDE,),
    )
    set_json: tuple[str, ...] = api_field(
        "`helm`: helm's `--set-json` arguments (`key=<JSON>`), applied in order over `values`.",
        default=(),
        pattern=SET_ASSIGNMENT,
        expected=SET_ASSIGNMENT_TEXT,
        max_length=MAX_SET_CHARS,
        max_items=MAX_SET_ITEMS,
    )
    set_string: tuple[str, ...] = api_field(
        "`helm`: helm's `--set-string` arguments (`a.b=x,c[0]=y`: every value a string), "
        "applied in order over `values` and `setJson`.",
        default=(),
        pattern=SET_ASSIGNMENT,
        expected=SET_ASSIGNMENT_TEXT,
        max_length=MAX_SET_CHARS,
        max_items=MAX_SET_ITEMS,
    )
    set_file: tuple[str, ...] = api_field(
        "`helm`: helm's `--set-file` arguments (`key=path`, a file of the bundle tree whose "
        "text becomes the value), applied in order over everything else.",
        default=(),
        pattern=SET_FILE,
        expected=SET_FILE_TEXT,
        max_length=1024,
        max_items=MAX_SET_ITEMS,
        rules=(SET_FILE_INSIDE,),
    )
    release_name: str | None = api_field(
        "`helm`: the release name (`.Release.Name`). Default: the bundle's name.",
        default=None,
        pattern=RELEASE_NAME,
        expected=RELEASE_NAME_TEXT,
        max_length=53,
    )
    path: str | None = api_field(
        "Directory inside the bundle tree to render from (a kustomize overlay, a helm chart, "
        "a directory of plain manifests). Default: the tree's root (for `helm`: the root, or "
        "the one chart directory at the root, as a chart archive unpacks).",
        default=None,
        pattern=RELATIVE_PATH,
        expected=RELATIVE_PATH_TEXT,
        max_length=512,
        rules=(STAYS_INSIDE,),
    )
    target_namespace: str | None = api_field(
        "Namespace given to namespaced objects that name none (and helm's release namespace).",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    install_namespace: str | None = api_field(
        "`registry+v1`: namespace the operator is installed in.",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    watch_namespace: str | None = api_field(
        "`registry+v1`: the one namespace the operator watches (default: all namespaces).",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )


_JSON6902_OPS = ("add", "remove", "replace", "move", "copy", "test")
MAX_PATCH_CHARS = 65536


@dataclass(frozen=True, kw_only=True, slots=True)
class PatchTarget(ApiObject):
    """Which rendered objects a patch applies to (kustomize's selector, as Flux's
    ``patches[].target``): every given field must match. ``name`` and ``namespace`` are regular
    expressions matched against the whole value."""

    group: str | None = api_field(
        "API group, e.g. `apps` (empty for the core group).",
        default=None,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$",
        expected="an API group (DNS subdomain) or empty",
        max_length=253,
    )
    version: str | None = api_field(
        "API version within the group, e.g. `v1`.",
        default=None,
        pattern=r"^v[0-9]+((alpha|beta)[0-9]+)?$",
        expected="a version such as v1 or v1beta1",
        max_length=63,
    )
    kind: str | None = api_field(
        "Kind, e.g. `Deployment`.",
        default=None,
        pattern=KIND,
        max_length=63,
        expected="a Kind (CamelCase, e.g. Deployment)",
    )
    name: str | None = api_field(
        "Name (a regular expression).", default=None, max_length=253, min_length=1
    )
    namespace: str | None = api_field(
        "Namespace as rendered, before the target namespace is given (a regular expression).",
        default=None,
        max_length=253,
        min_length=1,
    )
    label_selector: str | None = api_field(
        "Label selector, e.g. `app=web,tier in (a,b)`.", default=None, max_length=1024, min_length=1
    )
    annotation_selector: str | None = api_field(
        "Annotation selector, in label selector syntax.",
        default=None,
        max_length=1024,
        min_length=1,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Patch(ApiObject):
    """A patch applied to the rendered objects, for every format, as Flux's Kustomization
    ``patches``: a strategic merge patch (a YAML object, or several documents) or a JSON 6902
    patch (a YAML/JSON list of operations, which needs ``target``). Patches apply in order,
    after rendering and before the target namespace is given."""

    patch: str = api_field(
        "The patch, as YAML or JSON text.", max_length=MAX_PATCH_CHARS, min_length=1
    )
    target: PatchTarget | None = api_field(
        "Objects to patch. Without it a strategic merge patch patches the object it names "
        "(apiVersion, kind, metadata.name and metadata.namespace); with it, a strategic merge "
        "patch may leave those out.",
        default=None,
    )

    def extra_problems(self) -> list[FieldProblem]:
        """The text is YAML: a list of JSON 6902 operations (with ``target``), or strategic
        merge documents (each naming apiVersion, kind and metadata.name without ``target``)."""
        try:
            documents = [d for d in yaml.load_all(self.patch, Loader=KUBE_LOADER) if d is not None]
        except (yaml.YAMLError, RecursionError) as exc:
            return [_patch_problem("patch", "a YAML or JSON patch", _first_line(exc))]
        if not documents:
            return [_patch_problem("patch", "a patch", "an empty document")]
        if isinstance(documents[0], list):
            return self._json6902_problems(documents)
        problems = []
        for i, document in enumerate(documents):
            where = "patch" if len(documents) == 1 else f"patch (document {i + 1})"
            if not isinstance(document, dict):
                problems.append(
                    _patch_problem(where, "a strategic merge patch (an object)", show(document))
                )
                continue
            if self.target is not None:
                continue
            metadata = document.get("metadata")
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not (document.get("apiVersion") and document.get("kind") and name):
                problems.append(
                    _patch_problem(
                        where,
                        "apiVersion, kind and metadata.name in a strategic merge patch without "
                        "target (they say which object it patches)",
                        show(document),
                    )
                )
        return problems

    def _json6902_problems(self, documents: list[Any]) -> list[FieldProblem]:
        problems = []
        if len(documents) > 1:
            problems.append(
                _patch_problem(
                    "patch", "one list of JSON 6902 operations", f"{len(documents)} documents"
                )
            )
        if self.target is None:
            problems.append(_patch_problem("target", "a target for a JSON 6902 patch", "nothing"))
        for i, op in enumerate(documents[0]):
            ok = (
                isinstance(op, dict)
                and op.get("op") in _JSON6902_OPS
                and isinstance(op.get("path"), str)
            )
            if not ok:
                problems.append(
                    _patch_problem(
                        f"patch[{i}]",
                        "a JSON 6902 operation {op: add|remove|replace|move|copy|test, path: ...}",
                        show(op),
                    )
                )
        return problems


def _patch_problem(path: str, expected: str, found: str) -> FieldProblem:
    return FieldProblem(path=path, expected=expected, found=found)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass(frozen=True, kw_only=True, slots=True)
class ConditionCheck(ApiObject):
    """Healthy when the object has a status condition of this type with this status."""

    type: str = api_field(
        "Condition type, e.g. `Available`.",
        pattern=CONDITION_TYPE,
        max_length=316,
        expected="a condition type such as Available",
    )
    status: ConditionStatus = api_field("Status the condition must have.", default="True")


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldExpression(ApiObject):
    """Healthy when the field at ``fieldPath`` equals ``equals``.

    The field's value is compared as text: strings as they are, numbers in decimal, booleans
    as ``true``/``false``. A missing field is not healthy.
    """

    field_path: str = api_field(
        "Path of the field inside the object: `.`-separated names, `[N]` list indexes and "
        "`['key']` for names with dots, e.g. `.status.phase`.",
        pattern=FIELD_PATH,
        expected=FIELD_PATH_TEXT,
        max_length=512,
    )
    equals: str = api_field("The value the field must have, as text.", max_length=1024)


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthCheck(ApiObject):
    """An extra health check on one named object: a condition or a field expression."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="has(self.condition) != has(self.expression)",
            expected="exactly one of condition or expression",
            check=lambda c: (c.condition is None) != (c.expression is None),
        ),
    )

    object: ObjectReference = api_field("The object to check.")
    condition: ConditionCheck | None = api_field("Check a status condition.", default=None)
    expression: FieldExpression | None = api_field("Check a field's value.", default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthChecks(ApiObject):
    """How the agent decides that the bundle is healthy after an apply."""

    builtin: bool = api_field(
        "Assess every applied object with the built-in (kstatus-style) rules.", default=True
    )
    timeout_seconds: int = api_field(
        "How long the group may take to become healthy before it is rolled back.",
        default=300,
        minimum=1,
        maximum=86400,
    )
    checks: tuple[HealthCheck, ...] = api_field(
        "Extra checks on named objects; all must pass.", default=(), max_items=64
    )
    wait_for_load_balancer: bool = api_field(
        "Also wait until each LoadBalancer Service has an ingress address (by default it is "
        "healthy once it has a cluster IP, as in kstatus: most edge clusters have no "
        "load-balancer controller).",
        default=False,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ManifestSelector(ApiObject):
    """Manifests of this API group and kind (and name, if given)."""

    api_group: str = api_field(
        "API group (empty for the core group), e.g. `monitoring.coreos.com`.",
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$",
        expected="an API group (DNS subdomain) or empty",
        max_length=253,
    )
    kind: str = api_field(
        "Kind, e.g. `ServiceMonitor`.",
        pattern=KIND,
        max_length=63,
        expected="a Kind (CamelCase, e.g. ServiceMonitor)",
    )
    name: str | None = api_field(
        "Only the manifest with this name (default: every manifest of the kind).",
        default=None,
        pattern=OBJECT_NAME,
        expected="an object name",
        max_length=253,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Output(ApiObject):
    """A value read from the cluster after each successful run (Porter-style outputs).

    Secret ``.data`` values are base64-decoded; other non-string values are rendered as JSON.
    Sensitive outputs are kept in a Secret in the agent's namespace, never in plain text
    outside the cluster.
    """

    name: str = api_field(
        "Name of the output, unique in the bundle.",
        pattern=OUTPUT_NAME,
        max_length=63,
        expected="an output name (letters, digits, '_', '-'; not starting with a digit)",
    )
    object: ObjectReference = api_field("The object the value is read from.")
    field_path: str = api_field(
        "Path of the field, e.g. `.spec.clusterIP` or `.data.password`.",
        pattern=FIELD_PATH,
        expected=FIELD_PATH_TEXT,
        max_length=512,
    )
    sensitive: bool = api_field(
        "Keep the value only in a Secret (reported as a reference, never as text).",
        default=False,
    )


def _format_option_only(field: str, attr: str, refused: tuple[str, ...], who: str) -> Rule:
    names = ", ".join(f"'{f}'" for f in refused)
    return Rule(
        cel=f"!has(self.formatOptions) || !has(self.formatOptions.{field}) "
        f"|| !(self.format in [{names}])",
        expected=f"formatOptions.{field} only with {who}",
        check=lambda s: getattr(s.format_options, attr) is None or s.format not in refused,
        field=f"formatOptions.{field}",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentSpec(ApiObject):
    """What one cluster runs of one bundle: where the content is, how to render it, how to
    roll it out, check it and report on it."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        _format_option_only(
            "values", "values", ("plain", "kustomize", "registry+v1"), "helm or a plugin format"
        ),
        _format_option_only(
            "encryptedValues",
            "encrypted_values",
            ("plain", "kustomize", "registry+v1"),
            "helm or a plugin format",
        ),
        *HELM_SET_RULES,
        _format_option_only(
            "installNamespace",
            "install_namespace",
            ("plain", "kustomize", "helm"),
            "registry+v1 or a plugin format",
        ),
        _format_option_only(
            "watchNamespace",
            "watch_namespace",
            ("plain", "kustomize", "helm"),
            "registry+v1 or a plugin format",
        ),
        Rule(
            cel="!has(self.createNamespace) || !self.createNamespace || "
            "(has(self.formatOptions) && has(self.formatOptions.targetNamespace))",
            expected="formatOptions.targetNamespace with createNamespace (the namespace to create)",
            check=lambda s: not s.create_namespace or s.format_options.target_namespace is not None,
            field="createNamespace",
        ),
    )

    sources: tuple[Source, ...] = api_field(
        "Where the content comes from, each pinned; together they compose the bundle's tree.",
        min_items=1,
        max_items=MAX_SOURCES,
    )
    format: str = api_field(
        "How the tree is rendered: `plain`, `kustomize`, `helm`, `registry+v1`, or the name "
        "of a format plugin (entry point group `fleetlet.formats`).",
        default="plain",
        pattern=FORMAT_NAME,
        max_length=63,
        expected="a format name (plain, kustomize, helm, registry+v1 or a plugin's name)",
    )
    format_options: FormatOptions = api_field("Options of the format.", default=FormatOptions())
    patches: tuple[Patch, ...] = api_field(
        "Patches applied to the rendered objects, in order (any format): per-cluster tweaks "
        "without a new bundle. The hub appends the patches of matching overrides.",
        default=(),
        max_items=64,
    )
    group: str | None = api_field(
        "Lockstep group: the bundles of a group are applied, health-checked and rolled back "
        "together. Default: the bundle's own name (a group of one).",
        default=None,
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    depends_on: tuple[str, ...] = api_field(
        "Groups that must be healthy before this bundle's group is applied.",
        default=(),
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
        max_items=32,
        list_type="set",
    )
    paused: bool = api_field(
        "Leave the bundle's objects as they are: no apply, no drift correction.", default=False
    )
    health_checks: HealthChecks = api_field("Health assessment.", default=HealthChecks())
    optional: tuple[ManifestSelector, ...] = api_field(
        "Manifests skipped (and reported) when their API is not served by the cluster, e.g. "
        "ServiceMonitors where Prometheus is not installed.",
        default=(),
        max_items=64,
    )
    outputs: tuple[Output, ...] = api_field(
        "Values read from the cluster after each successful run.",
        default=(),
        max_items=64,
        list_type="map",
        list_keys=("name",),
    )
    approval: Approval = api_field(
        "`manual`: a change to this bundle waits for an approved BundleDeploymentRequest.",
        default="none",
    )
    service_account_name: str | None = api_field(
        "Apply as this ServiceAccount of the agent's namespace (impersonation) instead of the "
        "agent's own identity.",
        default=None,
        pattern=DNS_SUBDOMAIN,
        expected=DNS_SUBDOMAIN_TEXT,
        max_length=253,
    )
    deletion_policy: DeletionPolicy = api_field(
        "What happens to the bundle's objects when the bundle is removed: `Delete` them or "
        "`Orphan` them (leave them, without the agent's ownership).",
        default="Delete",
    )
    keep_crds: bool = api_field(
        "Keep CustomResourceDefinitions (and so every custom resource) when deleting.",
        default=True,
        name="keepCRDs",
    )
    take_ownership: bool = api_field(
        "Take over fields owned by other field managers (server-side apply with force). "
        "Default false: a conflict fails the apply.",
        default=False,
    )
    create_namespace: bool = api_field(
        "Create `formatOptions.targetNamespace` with the bundle when it does not render it "
        "(Fleet's and Argo CD's CreateNamespace), with `namespaceLabels` and "
        "`namespaceAnnotations` (e.g. Pod Security labels). The namespace is kept when the "
        "bundle is removed.",
        default=False,
    )
    namespace_labels: Mapping[str, Any] | None = api_field(
        "Labels of the namespace `createNamespace` makes (label key to string value).",
        default=None,
        free_form=True,
    )
    namespace_annotations: Mapping[str, Any] | None = api_field(
        "Annotations of the namespace `createNamespace` makes (key to string value).",
        default=None,
        free_form=True,
    )

    def extra_problems(self) -> list[FieldProblem]:
        """Namespace labels and annotations are string to string."""
        problems: list[FieldProblem] = []
        for field_name, values in (
            ("namespaceLabels", self.namespace_labels),
            ("namespaceAnnotations", self.namespace_annotations),
        ):
            for key, value in (values or {}).items():
                if not isinstance(value, str):
                    problems.append(
                        FieldProblem(
                            path=f"{field_name}.{key}", expected="a string value", found=show(value)
                        )
                    )
        return problems


# --- status ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition(ApiObject):
    """A condition in the manner of ``metav1.Condition``."""

    type: str = api_field(
        "Type: `Ready`, `Progressing`, `Degraded` or `Paused` (BundleDeployment); `Approved`, "
        "`Denied` or `Superseded` (BundleDeploymentRequest).",
        pattern=CONDITION_TYPE,
        max_length=316,
        expected="a condition type such as Ready",
    )
    status: ConditionStatus = api_field("Status of the condition.")
    reason: str = api_field(
        "Why, in one CamelCase word (e.g. `HealthCheckFailed`).",
        pattern=REASON,
        expected=REASON_TEXT,
        max_length=1024,
    )
    message: str = api_field("What happened, for a person.", default="", max_length=32768)
    last_transition_time: datetime = api_field("When the status last changed.")
    observed_generation: int | None = api_field(
        "The `metadata.generation` this condition was computed for.", default=None, minimum=0
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Revision(ApiObject):
    """A revision of a bundle: the set serial it came with and the pins of its sources."""

    serial: int = api_field(
        "Serial of the BundleDeploymentSet the revision came with.",
        minimum=1,
        maximum=2**53 - 1,
    )
    sources: tuple[str, ...] = api_field(
        "The pin of each source, in the order of `spec.sources`.",
        default=(),
        pattern=PIN,
        expected="a pin (sha256:<64 hex>, 40 hex or 64 hex)",
        max_length=71,
        max_items=MAX_SOURCES,
    )
    set_digest: str | None = api_field(
        "Digest of the set's canonical bytes.",
        default=None,
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        max_length=71,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ResourceCounts(ApiObject):
    """Counts of the bundle's objects."""

    total: int = api_field("Objects the bundle renders to.", default=0, minimum=0)
    ready: int = api_field("Objects assessed healthy.", default=0, minimum=0)
    not_ready: int = api_field("Objects not (yet) healthy.", default=0, minimum=0)
    skipped: int = api_field(
        "Optional objects skipped because their API is not served.", default=0, minimum=0
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary(ApiObject):
    """One run of the agent on this bundle (an apply, a rollback, a deletion)."""

    id: str = api_field(
        "Identifier of the run (unique per cluster).",
        pattern=RUN_ID,
        max_length=128,
        expected="a run id (letters, digits, '.', '_', '-')",
    )
    result: RunResult = api_field("How the run ended (or `Running`).")
    started_at: datetime = api_field("When the run started.")
    finished_at: datetime | None = api_field("When the run finished.", default=None)
    message: str = api_field("Summary for a person.", default="", max_length=32768)


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentStatus(ApiObject):
    """What the agent observed and did for this bundle."""

    observed_generation: int | None = api_field(
        "The `metadata.generation` last acted on.", default=None, minimum=0
    )
    conditions: tuple[Condition, ...] = api_field(
        "`Ready`, `Progressing`, `Degraded`, `Paused`.",
        default=(),
        max_items=16,
        list_type="map",
        list_keys=("type",),
    )
    phase: str | None = api_field(
        "What is happening now: " + ", ".join(f"`{p}`" for p in Phase) + ".",
        default=None,
        enum=tuple(str(p) for p in Phase),
    )
    applied_revision: Revision | None = api_field("The revision currently applied.", default=None)
    target_revision: Revision | None = api_field(
        "The revision the agent is moving to, or stopped short of (the applied revision "
        "once it is there).",
        default=None,
    )
    last_healthy_revision: Revision | None = api_field(
        "The last revision that passed its health checks (what a rollback returns to).",
        default=None,
    )
    resources: ResourceCounts | None = api_field("Counts of the bundle's objects.", default=None)
    last_run: RunSummary | None = api_field("The latest run.", default=None)
    drift_count: int = api_field(
        "How many times objects were found changed outside fleetlet and corrected.",
        default=0,
        minimum=0,
    )


# --- outputs -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputValue(ApiObject):
    """One output: its value as text, or (sensitive) a reference to the Secret key holding it."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="has(self.value) != has(self.secretRef)",
            expected="exactly one of value or secretRef",
            check=lambda o: (o.value is None) != (o.secret_ref is None),
        ),
        Rule(
            cel="self.sensitive == has(self.secretRef)",
            expected="secretRef for a sensitive output and value for the others",
            check=lambda o: o.sensitive == (o.secret_ref is not None),
            field="sensitive",
        ),
    )

    name: str = api_field(
        "Name of the output (as declared in the bundle).",
        pattern=OUTPUT_NAME,
        max_length=63,
        expected="an output name",
    )
    sensitive: bool = api_field("Whether the value is kept only in a Secret.", default=False)
    value: str | None = api_field(
        "The value (non-sensitive outputs).", default=None, max_length=32768
    )
    secret_ref: SecretKeyReference | None = api_field(
        "Where the value is (sensitive outputs): a Secret key in the agent's namespace.",
        default=None,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleOutputsSpec(ApiObject):
    """The outputs of a bundle's latest successful run. Written by the agent only."""

    bundle_deployment: str = api_field(
        "Name of the BundleDeployment (also the name of this object).",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    run_id: str = api_field(
        "The run the values come from.", pattern=RUN_ID, max_length=128, expected="a run id"
    )
    serial: int = api_field("Serial of the set that run applied.", minimum=1)
    updated_at: datetime = api_field("When the values were read.")
    outputs: tuple[OutputValue, ...] = api_field(
        "The outputs, by name.", default=(), max_items=64, list_type="map", list_keys=("name",)
    )


# --- the per-cluster publication ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitSignature(ApiObject):
    """Who signed the fleet commit, as the hub verified it against its commit policy before
    publishing (`fleet.yaml: commitSigning`)."""

    format: Literal["ssh"] = api_field("`ssh`: an SSH signature (git's `gpg.format=ssh`).")
    principal: str = api_field(
        "The signer, as the policy names it (e.g. alice@example.com).",
        pattern=NO_WHITESPACE,
        expected="an identity without whitespace",
        max_length=253,
    )
    key: str = api_field(
        "The signing key's fingerprint (`SHA256:...`, as `ssh-keygen -l` prints it).",
        pattern=r"^SHA256:[A-Za-z0-9+/]{43}$",
        expected="SHA256:<43 base64 characters>",
        max_length=50,
    )
    policy: str = api_field(
        "Digest of the commit policy the signature was verified against.",
        pattern=DIGEST,
        expected=DIGEST_TEXT,
        max_length=71,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SetSource(ApiObject):
    """The fleet repository commit a set was rendered from."""

    repo: str = api_field(
        "URL of the fleet repository.",
        pattern=NO_WHITESPACE,
        max_length=2048,
        expected="a URL without whitespace",
    )
    commit: str = api_field(
        "The fleet repository's commit.", pattern=COMMIT, expected=COMMIT_TEXT, max_length=40
    )
    signed_by: CommitSignature | None = api_field(
        "Who signed the commit, verified by the hub (absent: no commit policy).", default=None
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentEntry(ApiObject):
    """One bundle of a set: its name (the BundleDeployment's name) and spec."""

    name: str = api_field(
        "Name of the bundle, unique in the set; the name of its BundleDeployment.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    spec: BundleDeploymentSpec = api_field("The BundleDeployment's spec.")

    @property
    def group(self) -> str:
        """The lockstep group: ``spec.group``, or the bundle's own name."""
        return self.spec.group or self.name


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleDeploymentSet(ApiObject):
    """Everything one cluster runs: the payload of a publication, one per cluster.

    Written as ``set.yaml`` on the cluster's branch. Each bundle's group is listed in
    ``groups``, which gives the order groups are applied in: a group comes after every group
    it depends on.
    """

    API_KIND: ClassVar[tuple[str, str] | None] = (GROUP_VERSION, "BundleDeploymentSet")

    cluster: str = api_field(
        "The cluster this set is for; an agent refuses a set for another cluster.",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    serial: int = api_field(
        "Grows each time this cluster's content changes; an agent refuses a serial not "
        "greater than the last it accepted.",
        minimum=1,
        maximum=2**53 - 1,
    )
    issued_at: datetime = api_field("When the set was published.")
    expires_at: datetime = api_field(
        "After this time an agent refuses the set (so a frozen hub cannot pin old content)."
    )
    source: SetSource = api_field("The fleet repository commit the set was rendered from.")
    bundle_deployments: tuple[BundleDeploymentEntry, ...] = api_field(
        "The bundles, by name.",
        default=(),
        max_items=10000,
        list_type="map",
        list_keys=("name",),
    )
    groups: tuple[str, ...] = api_field(
        "Every group of the set, each after the groups it depends on: the apply order.",
        default=(),
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
        max_items=10000,
        list_type="set",
    )

    def entry(self, name: str) -> BundleDeploymentEntry | None:
        """The bundle named ``name``, or ``None``."""
        return next((e for e in self.bundle_deployments if e.name == name), None)

    def extra_problems(self) -> list[FieldProblem]:
        """Time order, groups listed and used, dependencies known, acyclic and in order."""
        problems: list[FieldProblem] = []
        if self.expires_at <= self.issued_at:
            problems.append(
                FieldProblem(
                    path="expiresAt", expected="a time after issuedAt", found=show(self.expires_at)
                )
            )
        position = {g: i for i, g in enumerate(self.groups)}
        listed = "a group listed in groups"
        deps: dict[str, set[str]] = defaultdict(set)
        # Where each dependency is declared, to report a cycle on the entry that closes it.
        declared: dict[tuple[str, str], str] = {}
        for i, entry in enumerate(self.bundle_deployments):
            base = f"bundleDeployments[{i}]"
            group = entry.group
            if group not in position:
                where = f"{base}.spec.group" if entry.spec.group else f"{base}.name"
                found = show(group) + ("" if entry.spec.group else " (the default group)")
                problems.append(FieldProblem(path=where, expected=listed, found=found))
            for j, dep in enumerate(entry.spec.depends_on):
                where = f"{base}.spec.dependsOn[{j}]"
                if dep == group:
                    problems.append(
                        FieldProblem(
                            path=where,
                            expected=f"another group than the bundle's own ({group})",
                            found=show(dep),
                        )
                    )
                elif dep not in position:
                    problems.append(FieldProblem(path=where, expected=listed, found=show(dep)))
                else:
                    deps[group].add(dep)
                    declared.setdefault((group, dep), where)
        used = {e.group for e in self.bundle_deployments}
        for k, group in enumerate(self.groups):
            if group not in used:
                problems.append(
                    FieldProblem(
                        path=f"groups[{k}]",
                        expected="a group that has at least one bundle",
                        found=show(group),
                    )
                )
        cycle = find_cycle(deps)
        if cycle:
            where = declared[(cycle[-2], cycle[-1])]
            problems.append(
                FieldProblem(
                    path=where,
                    expected="no dependency cycle",
                    found=f"{show(cycle[-1])} (cycle " + " -> ".join(cycle) + ")",
                )
            )
            return problems
        for group, needs in sorted(deps.items()):
            for dep in sorted(needs):
                if group in position and position[dep] > position[group]:
                    problems.append(
                        FieldProblem(
                            path=f"groups[{position[group]}]",
                            expected=f"{show(group)} after the groups it depends on ({show(dep)})",
                            found=f"{show(group)} at {position[group]}, {show(dep)} at "
                            f"{position[dep]}",
                        )
                    )
        return problems


__all__ = [
    "API_GROUP",
    "API_VERSION",
    "BUILTIN_FORMATS",
    "GROUP_VERSION",
    "BundleDeploymentEntry",
    "BundleDeploymentSet",
    "BundleDeploymentSpec",
    "BundleDeploymentStatus",
    "BundleOutputsSpec",
    "CommitSignature",
    "Condition",
    "ConditionCheck",
    "FieldExpression",
    "FormatOptions",
    "HealthCheck",
    "HealthChecks",
    "ManifestSelector",
    "ObjectReference",
    "Output",
    "OutputValue",
    "Patch",
    "PatchTarget",
    "PinProblem",
    "ResourceCounts",
    "Revision",
    "RunSummary",
    "SecretKeyReference",
    "SecretReference",
    "SetSource",
    "Source",
    "SourceAuth",
]
