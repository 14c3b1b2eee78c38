"""Cluster templating in a bundle's values: ``${cluster.name}`` and ``${cluster.labels.<key>}``.

The hub substitutes them per cluster when it builds each set, so the signed set holds the final
values and the agent never interprets templates. Only string values are substituted (anywhere
in the values tree, not in keys); a string may hold several references and other text
(``"${cluster.name}.shop.example"``); ``$${cluster.name}`` writes ``${cluster.name}`` as is. A reference to a label
the cluster does not have, or to anything else under ``cluster.``, is an error naming the
bundle file, the cluster and the reference.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent.errors import FieldProblem

# ${cluster.name} | ${cluster.labels.<label key>} ; $${ is an escaped ${
_REFERENCE = re.compile(r"\$(\$?)\{\s*cluster\.([^}\s]*)\s*\}")
_LABEL_KEY = re.compile(r"^([A-Za-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


def references(values: Any) -> frozenset[str]:
    """What ``values`` refer to: ``name`` and/or ``labels`` (to key caches by what matters)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, str):
            for escaped, path in _REFERENCE.findall(node):
                if not escaped:
                    found.add("name" if path == "name" else "labels")
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(values)
    return frozenset(found)


def substitute(
    values: Any,
    *,
    cluster: str,
    labels: Mapping[str, str],
    where: str,
    problems: list[FieldProblem],
) -> Any:
    """A copy of ``values`` with every reference replaced; problems appended to ``problems``
    (``where`` names the file and field)."""

    def replace(match: re.Match[str], path: str) -> str:
        escaped, reference = match.group(1), match.group(2)
        if escaped:
            return match.group(0)[1:]
        if reference == "name":
            return cluster
        if reference.startswith("labels."):
            key = reference.removeprefix("labels.")
            if _LABEL_KEY.match(key) and key in labels:
                return labels[key]
            problems.append(
                FieldProblem(
                    path=f"{where}{path}",
                    expected=f"a label of cluster {cluster} (it has: "
                    f"{', '.join(sorted(labels)) or 'none'})",
                    found=f'"${{cluster.labels.{key}}}"',
                )
            )
            return match.group(0)
        problems.append(
            FieldProblem(
                path=f"{where}{path}",
                expected="${cluster.name} or ${cluster.labels.<key>}",
                found=f'"${{cluster.{reference}}}"',
            )
        )
        return match.group(0)

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, str):
            if "${" not in node:
                return node
            return _REFERENCE.sub(lambda m: replace(m, path), node)
        if isinstance(node, dict):
            return {k: walk(v, f"{path}.{k}") for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(values, "")


__all__ = ["references", "substitute"]
