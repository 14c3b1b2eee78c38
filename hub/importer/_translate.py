"""Fleet's terms in fleetlet's: ``${ .ClusterName }``/``${ .ClusterLabels.x }`` in values, a
GitRepo target as a fleetlet target, which clusters a Fleet selector picks, and a go-getter
chart address as a ``git`` source. Called by :mod:`hub.importer.fleet`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent.errors import FieldProblem
from hub.fleet.selectors import parse_selector
from hub.importer._layout import _dict, _selector
from hub.importer._result import FleetImportError, Note

_FLEET_NAME = re.compile(r"\$\{\s*\.ClusterName\s*\}")
_FLEET_LABEL = re.compile(r"\$\{\s*\.ClusterLabels\.([A-Za-z0-9./_-]+)\s*\}")
_FLEET_TEMPLATE = re.compile(r"\$\{[^}]*\}")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


# go-getter's forced getters (``git::``) and its detectors' forms (``github.com/...``, ``//``
# for a subdirectory, ``?ref=``).
_GO_GETTER = re.compile(r"^[a-z0-9]+::|^(github\.com|gitlab\.com|bitbucket\.org)/|\?ref=|[^:]//")


def _fleet_values(value: Any, notes: list[Note], bundle: str, where: str) -> Any:
    """Fleet's ``${ .ClusterName }``/``${ .ClusterLabels.x }`` as fleetlet's templating."""
    if isinstance(value, str):
        text = _FLEET_NAME.sub("${cluster.name}", value)
        text = _FLEET_LABEL.sub(lambda m: "${cluster.labels." + m.group(1) + "}", text)
        for other in _FLEET_TEMPLATE.findall(text):
            if not other.startswith("${cluster."):
                notes.append(Note(bundle, where, f"Fleet template {other} is not converted"))
        return text
    if isinstance(value, dict):
        return {k: _fleet_values(v, notes, bundle, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_fleet_values(v, notes, bundle, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _fleet_target(c: Mapping[str, Any]) -> dict[str, Any]:
    target: dict[str, Any] = {}
    if isinstance(c.get("clusterSelector"), dict):
        target["clusterSelector"] = _selector(c["clusterSelector"])
    if c.get("clusterName"):
        target["clusters"] = [c["clusterName"]]
    return target


def _selects(target: Mapping[str, Any], cluster: Mapping[str, Any]) -> bool:
    """A Fleet/fleetlet target (clusters and/or clusterSelector) against one cluster; a target
    with neither selects nothing (as Fleet's empty customization)."""
    if not target:
        return False
    names = target.get("clusters")
    if names is not None and cluster.get("name") not in names:
        return False
    raw = target.get("clusterSelector")
    if raw is not None:
        problems: list[FieldProblem] = []
        selector = parse_selector(raw, "clusterSelector", problems)
        if selector is None or problems:
            raise FleetImportError(f"clusterSelector {raw!r}: {'; '.join(map(str, problems))}")
        return selector.matches(_dict(cluster.get("labels")))
    return True


def _go_getter_source(chart: str) -> dict[str, Any] | None:
    """A go-getter git address (``git::https://host/repo//sub/dir?ref=v1``,
    ``github.com/org/repo//dir?ref=v1``) as a git source with its directory; None when it
    names no ref (fleetlet pins every source) or another getter."""
    text = chart.removeprefix("git::")
    if "::" in text:
        return None
    url, _, query = text.partition("?")
    ref = next((v for k, _, v in (p.partition("=") for p in query.split("&")) if k == "ref"), "")
    if not ref:
        return None
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "https", url
    repo, _, directory = rest.partition("//")
    source: dict[str, Any] = {"kind": "git", "uri": f"{scheme}://{repo}"}
    if _COMMIT.match(ref):
        source["commit"] = ref
    else:  # go-getter does not say which: a version is a tag, anything else a branch
        source["tag" if re.match(r"v?[0-9]", ref) else "branch"] = ref
    if directory:
        source["directory"] = directory.strip("/")
    return source
