"""The scenarios of ``fleetlet demo --scenario NAME``: what happens once every installation is
Ready. Each is a module here with ``run(demo)``, which acts on the running
:class:`~fleetlet.demo.environment.Demo` and returns once its goal is reached (raising
:class:`~fleetlet.demo.realenv.DemoError` otherwise). Adding one is a module and a line in
:data:`SCENARIOS`; ``fleetlet.cli`` offers these names to ``--scenario`` and
:func:`fleetlet.demo.command.steps` plays the chosen one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fleetlet.demo.scenarios import approval, failed_upgrade, rollout

if TYPE_CHECKING:
    from fleetlet.demo.environment import Demo


Scenario = Callable[["Demo"], None]

SCENARIOS: dict[str, Scenario | None] = {
    "install": None,  # the install every run starts with, and nothing more
    "failed-upgrade": failed_upgrade.run,
    "approval": approval.run,
    "rollout": rollout.run,
}

__all__ = ["SCENARIOS", "Scenario"]
