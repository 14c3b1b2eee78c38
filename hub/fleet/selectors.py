"""Kubernetes label selectors (``matchLabels`` + ``matchExpressions``) over cluster labels.

Semantics follow ``metav1.LabelSelector``: every ``matchLabels`` pair and every expression must
hold; ``In`` needs the key with one of the values, ``NotIn`` holds when the key is absent or has
none of the values, ``Exists``/``DoesNotExist`` test the key only. An empty selector matches
every cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import FieldProblem

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

# Kubernetes label syntax: optional DNS-subdomain prefix and "/", then a 63-char name.
_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_LABEL_KEY = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$"
)
_LABEL_VALUE = re.compile(rf"^{_NAME}?$")


def label_key_ok(key: object) -> bool:
    return isinstance(key, str) and len(key) <= 317 and bool(_LABEL_KEY.match(key))


def label_value_ok(value: object) -> bool:
    return isinstance(value, str) and bool(_LABEL_VALUE.match(value))


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed selector; build it with :func:`parse_selector`."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def parse_selector(raw: Any, path: str, problems: list[FieldProblem]) -> LabelSelector | None:
    """Parse ``raw`` (a LabelSelector mapping); append every problem found under ``path``.

    Returns None when the selector is invalid (the problems say why).
    """
    start = len(problems)
    if not isinstance(raw, dict):
        problems.append(FieldProblem(path=path, expected="a mapping", found=_show(raw)))
        return None
    for key in sorted(set(raw) - {"matchLabels", "matchExpressions"}, key=str):
        problems.append(
            FieldProblem(
                path=f"{path}.{key}", expected="matchLabels or matchExpressions", found="unknown"
            )
        )
    reqs: list[Requirement] = []
    labels = raw.get("matchLabels", {})
    if not isinstance(labels, dict):
        problems.append(
            FieldProblem(path=f"{path}.matchLabels", expected="a mapping", found=_show(labels))
        )
        labels = {}
    for key, value in labels.items():
        where = f"{path}.matchLabels.{key}"
        if not label_key_ok(key):
            problems.append(FieldProblem(path=where, expected="a label key", found=_show(key)))
        elif not label_value_ok(value):
            problems.append(FieldProblem(path=where, expected="a label value", found=_show(value)))
        else:
            reqs.append(Requirement(key, "In", frozenset([value])))
    exprs = raw.get("matchExpressions", [])
    if not isinstance(exprs, list):
        problems.append(
            FieldProblem(path=f"{path}.matchExpressions", expected="a list", found=_show(exprs))
        )
        exprs = []
    for i, expr in enumerate(exprs):
        req = _parse_expression(expr, f"{path}.matchExpressions[{i}]", problems)
        if req is not None:
            reqs.append(req)
    if len(problems) > start:
        return None
    # Sorted so that equal selectors compare equal whatever the order they were written in.
    return LabelSelector(tuple(sorted(reqs, key=lambda r: (r.key, r.operator, sorted(r.values)))))


def _parse_expression(raw: Any, path: str, problems: list[FieldProblem]) -> Requirement | None:
    if not isinstance(raw, dict):
        problems.append(FieldProblem(path=path, expected="a mapping", found=_show(raw)))
        return None
    bad = len(problems)
    for key in sorted(set(raw) - {"key", "operator", "values"}, key=str):
        problems.append(
            FieldProblem(path=f"{path}.{key}", expected="key, operator or values", found="unknown")
        )
    key = raw.get("key")
    if not label_key_ok(key):
        problems.append(FieldProblem(path=f"{path}.key", expected="a label key", found=_show(key)))
    op = raw.get("operator")
    if op not in OPERATORS:
        problems.append(
            FieldProblem(path=f"{path}.operator", expected=" | ".join(OPERATORS), found=_show(op))
        )
    values = raw.get("values", [])
    if not isinstance(values, list):
        problems.append(FieldProblem(path=f"{path}.values", expected="a list", found=_show(values)))
        values = []
    for j, v in enumerate(values):
        if not label_value_ok(v):
            problems.append(
                FieldProblem(path=f"{path}.values[{j}]", expected="a label value", found=_show(v))
            )
    if op in ("In", "NotIn") and not values:
        problems.append(
            FieldProblem(path=f"{path}.values", expected=f"at least one value for {op}", found="[]")
        )
    if op in ("Exists", "DoesNotExist") and values:
        problems.append(
            FieldProblem(path=f"{path}.values", expected=f"no values for {op}", found=_show(values))
        )
    if len(problems) > bad:
        return None
    return Requirement(str(key), str(op), frozenset(str(v) for v in values))


def _show(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 80 else text[:77] + "..."
