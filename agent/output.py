"""How every ``fleetlet`` command prints data: ``-o table|json|yaml``, one implementation.

Commands add the option with :func:`agent.options.add_output_option` and print with
:func:`render`: JSON
(indented, keys sorted), YAML (block style, keys sorted) or the command's own table, for which
:func:`table` lays out columns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

OUTPUT_FORMATS = ("table", "json", "yaml")

T = TypeVar("T")


def render(data: T, output: str, *, table: Callable[[T], str], sort_keys: bool = True) -> str:
    """``data`` as ``output`` (without a trailing newline): JSON, YAML, or ``table(data)``.

    Raises ValueError for another output name.
    """
    if output == "json":
        return json.dumps(data, indent=2, sort_keys=sort_keys, default=str)
    if output == "yaml":
        import yaml

        from agent.api.yamlio import KUBE_DUMPER

        dumped: str = yaml.dump(
            data, Dumper=KUBE_DUMPER, sort_keys=sort_keys, default_flow_style=False
        )
        return dumped.rstrip("\n")
    if output == "table":
        return table(data)
    raise ValueError(f"unknown output format {output!r} ({', '.join(OUTPUT_FORMATS)})")


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """Columns padded to their widest cell, two spaces apart (``None`` shows as ``-``)."""
    cells = [[str(h) for h in header]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


__all__ = ["OUTPUT_FORMATS", "render", "table"]
