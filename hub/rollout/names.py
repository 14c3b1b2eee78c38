"""The words of a rollout the command line offers as choices: the verdicts a cluster's wave
step can have and the actions a person can take. Kept apart from the rollout's logic
(:mod:`hub.rollout.evaluate`, :mod:`hub.rollout.advance`), which import them from here, so
that registering ``fleetlet hub rollout`` loads neither git nor the fleet's model."""

from __future__ import annotations

from typing import Literal

Verdict = Literal["held", "pending", "passed", "failed", "skipped", "reverting", "reverted"]
VERDICTS: tuple[Verdict, ...] = (
    "held",
    "pending",
    "passed",
    "failed",
    "skipped",
    "reverting",
    "reverted",
)

ACTIONS = ("promote", "pause", "resume", "abort")
"""What ``fleetlet hub rollout ACTION`` may do."""
