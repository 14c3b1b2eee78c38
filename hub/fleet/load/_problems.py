"""What every file kind of the fleet loader shares: the list of problems (each ``FILE: FIELD``,
expected, found), reading one YAML file within its size limit, and the name rule of clusters,
bundles and namespaces. Called by the loaders of :mod:`hub.fleet.load`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from agent.api.yamlio import KUBE_LOADER
from agent.errors import FieldProblem

# Cluster and bundle names end up in branch names and Kubernetes object names.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class _Problems:
    """Collects problems as ``FILE: FIELD`` paths."""

    def __init__(self) -> None:
        self.items: list[FieldProblem] = []

    def add(self, file: str, where: str, expected: str, found: object) -> None:
        path = f"{file}: {where}" if where else file
        self.items.append(FieldProblem(path=path, expected=expected, found=_show(found)))

    def extend(self, file: str, problems: list[FieldProblem]) -> None:
        for p in problems:
            self.items.append(
                FieldProblem(path=f"{file}: {p.path}", expected=p.expected, found=p.found)
            )


def _show(value: object) -> str:
    if isinstance(value, str) and value.startswith("\x00"):
        return value[1:]  # already phrased
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _found(text: str) -> str:
    return "\x00" + text


_MAX_FILE_BYTES = 16 * 1024 * 1024


def _load_yaml(path: Path, rel: str, problems: _Problems, *, data: bytes | None = None) -> Any:
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            problems.add(rel, "", "a readable file", _found(str(exc.strerror or exc)))
            return None
    if len(data) > _MAX_FILE_BYTES:
        problems.add(rel, "", f"at most {_MAX_FILE_BYTES} bytes", _found(f"{len(data)} bytes"))
        return None
    try:
        return yaml.load(data, Loader=KUBE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        problems.add(rel, where, "valid YAML", _found(str(problem)))
        return None
