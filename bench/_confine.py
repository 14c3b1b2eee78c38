"""Run renders without the renderers' confinement, to measure what it costs.

Only benchmarks do this: fleetlet itself always confines its renderers where the kernel can
(:mod:`agent.render.confine`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import agent.render._process as process


@contextlib.contextmanager
def unconfined() -> Iterator[None]:
    """Within the block, renderers start as they did before confinement (same bounds)."""
    confined = process.run_confined

    def start_directly(_confinement: Any, start: Callable[[], Any]) -> Any:
        return start()

    process.run_confined = start_directly  # type: ignore[assignment]
    try:
        yield
    finally:
        process.run_confined = confined  # type: ignore[assignment]
