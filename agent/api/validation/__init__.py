"""Fields declared once, and everything derived from them: parsing, validation, ``to_dict``.

An API type is a frozen, keyword-only, slotted dataclass deriving from :class:`ApiObject`. Each
field is declared with :func:`api_field`, whose :class:`Meta` carries the JSON name, the
description and the constraints (pattern, enum, bounds, list semantics). Class-level
:class:`Rule` objects carry a CEL expression (for the CRD's ``x-kubernetes-validations``)
together with the same rule in Python. :mod:`agent.api.schema` turns the same declarations into
OpenAPI v3 and markdown, so the Python checks, the CRDs and the docs cannot disagree.

Instances are always valid: the constructor checks every field and rule and raises
:class:`~agent.errors.ValidationError`; :func:`from_dict` checks a whole document and reports
every problem with its path (``bundleDeployments[3].spec.sources[0].digest``), then builds the
objects without checking them twice.

Callers (:mod:`agent.api.models`, :mod:`agent.api.schema`, :mod:`agent.api.crds`, the hub)
import from here; the private modules are, bottom up:

- ``_declare``: what a declaration is made of (:class:`Rule`, :class:`Meta`,
  :func:`api_field`), and the paths, times and errors problems are reported with;
- ``_object``: :class:`ApiObject`, its resolved fields, the checks its constructor runs,
  free-form JSON and serialising (:func:`to_dict`);
- ``_parse``: :func:`from_dict`, a whole document checked and built at once.
"""

from __future__ import annotations

from agent.api.validation._declare import (
    MAX_SAFE_INTEGER,
    ROOT_PATH,
    Meta,
    PinProblem,
    Rule,
    api_field,
    error_for,
    format_time,
    parse_time,
)
from agent.api.validation._object import (
    ApiObject,
    FieldSpec,
    TypeInfo,
    all_types,
    fields_of,
    iter_rules,
    json_items,
    memo,
    show,
    thaw,
    to_dict,
)
from agent.api.validation._parse import from_dict

__all__ = [
    "MAX_SAFE_INTEGER",
    "ROOT_PATH",
    "ApiObject",
    "FieldSpec",
    "Meta",
    "PinProblem",
    "Rule",
    "TypeInfo",
    "all_types",
    "api_field",
    "error_for",
    "fields_of",
    "format_time",
    "from_dict",
    "iter_rules",
    "json_items",
    "memo",
    "parse_time",
    "show",
    "thaw",
    "to_dict",
]
