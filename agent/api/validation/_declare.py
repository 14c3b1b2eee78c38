"""What an API declaration is made of, and how its problems are reported.

:class:`Rule` (CEL and Python), :class:`Meta` (a field's JSON name, description and
constraints) and :func:`api_field`; the problem paths (:func:`join`, :func:`rebase`), the one
error for a list of problems (:func:`error_for`) and the API's time format. Part of
:mod:`agent.api.validation`; used by its other modules and, through it, by
:mod:`agent.api.models`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agent.errors import FieldProblem, FloatingReferenceError, ValidationError

# The largest integer every JSON implementation represents exactly (RFC 8785 refuses more).
MAX_SAFE_INTEGER = 2**53 - 1
# Free-form values (helm values) nest at most this deep: deep enough for any real chart, shallow
# enough that a hostile document cannot exhaust the stack.
MAX_JSON_DEPTH = 64
TIME_EXAMPLE = "2026-11-22T22:00:00Z"
_TIME_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z\Z")
ROOT_PATH = "(document)"


class PinProblem(FieldProblem):
    """A problem that is an unpinned (floating) reference: a tag, a branch, a URL without a hash.

    A document whose only problems are these raises :class:`~agent.errors.FloatingReferenceError`.
    """

    __slots__ = ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """A validation rule stated twice, once in CEL (for the API server) and once in Python.

    ``cel`` is evaluated with ``self`` bound to the object (or to the field's value for a rule in
    :class:`Meta`). ``field`` is the JSON name of the field the problem is reported on (the CEL
    ``fieldPath``), or ``None`` for the object itself. ``expected`` completes "expected ...".
    ``check`` is the Python equivalent (``None`` for transition rules, which need the old object
    and exist only in the API server). ``pin`` marks a missing pin (a floating reference).
    """

    cel: str
    expected: str
    check: Callable[[Any], bool] | None
    field: str | None = None
    pin: bool = False
    transition: bool = False

    @property
    def message(self) -> str:
        """The message the API server reports when the rule fails."""
        return f"expected {self.expected}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Meta:
    """What one field is: its JSON name, description and constraints.

    For a list of strings, ``pattern``/``expected``/``enum``/lengths apply to each item and
    ``min_items``/``max_items`` to the list. ``expected`` is how a person reads the pattern
    (``sha256:<64 hex>``). ``list_type`` is ``set`` (unique scalars) or ``map`` (unique by
    ``list_keys``). ``pin`` marks a content pin: a problem with it is a floating reference.
    ``free_form`` marks a JSON object kept as given (helm values).
    """

    doc: str
    name: str | None = None
    pattern: str | None = None
    expected: str | None = None
    enum: tuple[str, ...] | None = None
    min_length: int | None = None
    max_length: int | None = None
    minimum: int | None = None
    maximum: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    list_type: str | None = None
    list_keys: tuple[str, ...] = ()
    pin: bool = False
    free_form: bool = False
    rules: tuple[Rule, ...] = ()


def api_field(doc: str, *, default: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """Declare an API field: ``doc`` and ``meta`` (see :class:`Meta`); no default = required."""
    return dataclasses.field(default=default, metadata={"api": Meta(doc=doc, **meta)})


# --- paths, rendering, errors ---------------------------------------------------------------


def join(path: str, child: str) -> str:
    """Join a path and a child (``a`` + ``b`` -> ``a.b``; ``a`` + ``[0]`` -> ``a[0]``)."""
    if not path or path == ROOT_PATH:
        return child or path
    if not child:
        return path
    return path + child if child.startswith("[") else f"{path}.{child}"


def rebase(problem: FieldProblem, prefix: str) -> FieldProblem:
    """The same problem with its path below ``prefix`` (keeps its class, e.g. PinProblem)."""
    return type(problem)(
        path=join(prefix, problem.path), expected=problem.expected, found=problem.found
    )


def error_for(problems: list[FieldProblem], *, origin: str = "") -> ValidationError:
    """The error for ``problems``: FloatingReferenceError when every one is a PinProblem."""
    if problems and all(isinstance(p, PinProblem) for p in problems):
        return FloatingReferenceError(problems, origin=origin)
    return ValidationError(problems, origin=origin)


def format_time(value: datetime) -> str:
    """RFC 3339 UTC with second precision: ``2026-11-22T22:00:00Z``."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime | None:
    """Parse ``YYYY-MM-DDTHH:MM:SSZ`` (the only accepted form); ``None`` when it is not one."""
    match = _TIME_RE.match(text)
    if not match:
        return None
    try:
        year, month, day, hour, minute, second = (int(g) for g in match.groups())
        return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
