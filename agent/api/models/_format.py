"""How a bundle's tree is rendered into manifests: the format's options and the patches applied
to what it rendered.

Part of :mod:`agent.api.models`; used by :class:`BundleDeploymentSpec` and by
:mod:`agent.render` (through :mod:`agent.api`).
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from agent.api.helmsets import (
    MAX_SET_CHARS,
    MAX_SET_ITEMS,
    SET_ASSIGNMENT,
    SET_ASSIGNMENT_TEXT,
    SET_FILE,
    SET_FILE_INSIDE,
    SET_FILE_TEXT,
)
from agent.api.models._patterns import (
    DNS_LABEL,
    DNS_LABEL_TEXT,
    KIND,
    RELATIVE_PATH,
    RELATIVE_PATH_TEXT,
    RELEASE_NAME,
    RELEASE_NAME_TEXT,
    STAYS_INSIDE,
)
from agent.api.validation import ApiObject, api_field, show
from agent.api.yamlio import KUBE_LOADER
from agent.errors import FieldProblem

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
