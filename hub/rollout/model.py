"""A rollout strategy as the fleet repo writes it (``rollout:`` in a bundle or in ``fleet.yaml``).

::

    rollout:
      waves:                                  # in order; canaries first
        - name: canary
          clusterSelector: {matchLabels: {tier: canary}}
        - name: early
          size: 25%                           # of the targeted clusters not in an earlier wave
          pauseBefore: true                   # waits for `fleetlet hub rollout promote`
        - name: rest                          # (clusters left after the last wave form one more)
      maxUnavailable: 10%                     # clusters moving or failed at once (of the rollout)
      maxFailures: 2                          # failures tolerated; one more halts (count or %)
      soakTime: 10m                           # a settled wave stays Ready this long first
      progressDeadline: 30m                   # a cluster not Ready on the new revision by then failed
      onFailure: revert                       # halt | revert

:func:`parse_strategy` reports every problem at once (as :class:`~agent.errors.FieldProblem`,
like the rest of the fleet repo) and returns a :class:`Strategy`; :meth:`Strategy.to_dict` is
the canonical form a rollout records in git, read back by :func:`strategy_from_dict`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from agent.errors import FieldProblem
from hub.fleet.durations import format_duration, parse_duration
from hub.fleet.selectors import LabelSelector, parse_selector

OnFailure = Literal["halt", "revert"]
ON_FAILURE: tuple[OnFailure, ...] = ("halt", "revert")
NONE = "none"
"""``rollout: none`` in a bundle: its group is published to every cluster at once, whatever
``fleet.yaml`` says."""
DEFAULT_DEADLINE = timedelta(minutes=30)
REMAINING = "remaining"
"""The name of the wave the clusters left after the last written wave form."""
MAX_WAVES = 64
_WAVE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PERCENT = re.compile(r"^(\d{1,3})%$")
_KEYS = ("waves", "maxUnavailable", "maxFailures", "soakTime", "progressDeadline", "onFailure")
_WAVE_KEYS = ("name", "clusterSelector", "size", "pauseBefore")


@dataclass(frozen=True, slots=True)
class Quantity:
    """A count of clusters, or a percentage of some number of them."""

    value: int
    percent: bool

    def of(self, total: int, *, up: bool) -> int:
        """The count this quantity is of ``total`` clusters: a percentage rounded up (``up``)
        or down; a count as it is."""
        if not self.percent:
            return self.value
        exact = total * self.value / 100
        return math.ceil(exact) if up else math.floor(exact)

    def text(self) -> str | int:
        return f"{self.value}%" if self.percent else self.value


@dataclass(frozen=True, slots=True)
class Wave:
    """One wave: the clusters its selector matches among those left (all without one), at most
    ``size`` of them (a count, or a percentage of those, rounded up); ``pause_before``: it
    starts only once promoted."""

    name: str
    selector: LabelSelector | None = None
    selector_raw: Mapping[str, Any] | None = None
    size: Quantity | None = None
    pause_before: bool = False


@dataclass(frozen=True, slots=True)
class Strategy:
    """How a group's new revision spreads over the clusters that receive it."""

    waves: tuple[Wave, ...]
    max_unavailable: Quantity = Quantity(100, True)
    max_failures: Quantity = Quantity(0, False)
    soak: timedelta = timedelta(0)
    progress_deadline: timedelta = DEFAULT_DEADLINE
    on_failure: OnFailure = "halt"

    def budget(self, members: int) -> int:
        """Failures tolerated among ``members`` clusters (a percentage rounded down)."""
        return self.max_failures.of(members, up=False)

    def concurrency(self, members: int) -> int:
        """Clusters that may be moving or failed at once (a percentage rounded down, at
        least one)."""
        return max(1, self.max_unavailable.of(members, up=False))

    def to_dict(self) -> dict[str, Any]:
        waves: list[dict[str, Any]] = []
        for w in self.waves:
            item: dict[str, Any] = {"name": w.name}
            if w.selector_raw is not None:
                item["clusterSelector"] = dict(w.selector_raw)
            if w.size is not None:
                item["size"] = w.size.text()
            if w.pause_before:
                item["pauseBefore"] = True
            waves.append(item)
        return {
            "waves": waves,
            "maxUnavailable": self.max_unavailable.text(),
            "maxFailures": self.max_failures.text(),
            "soakTime": format_duration(self.soak),
            "progressDeadline": format_duration(self.progress_deadline),
            "onFailure": self.on_failure,
        }


def strategy_from_dict(raw: Mapping[str, Any], *, origin: str) -> Strategy:
    """A strategy recorded by :meth:`Strategy.to_dict`. Raises ValueError naming ``origin``."""
    problems: list[FieldProblem] = []
    found = parse_strategy(dict(raw), "rollout", problems)
    if not isinstance(found, Strategy):
        raise ValueError(f"{origin}: " + ("; ".join(str(p) for p in problems) or "none"))
    return found


def parse_strategy(raw: Any, where: str, problems: list[FieldProblem]) -> Strategy | str | None:
    """A ``rollout:`` value: a :class:`Strategy`, :data:`NONE` (``rollout: none``), or None
    when it is invalid (every problem appended to ``problems``, paths under ``where``)."""
    if raw == NONE:
        return NONE
    if not isinstance(raw, dict):
        problems.append(
            FieldProblem(
                path=where, expected='a rollout strategy (waves, ...) or "none"', found=_show(raw)
            )
        )
        return None
    start = len(problems)
    for key in sorted(set(raw) - set(_KEYS), key=str):
        problems.append(
            FieldProblem(
                path=f"{where}.{key}", expected="one of " + ", ".join(_KEYS), found="unknown field"
            )
        )
    waves = _waves(raw.get("waves"), f"{where}.waves", problems)
    unavailable = _quantity(
        raw.get("maxUnavailable", "100%"), f"{where}.maxUnavailable", problems, minimum=1
    )
    failures = _quantity(raw.get("maxFailures", 0), f"{where}.maxFailures", problems, minimum=0)
    soak = _duration(raw.get("soakTime"), f"{where}.soakTime", problems, timedelta(0), zero=True)
    deadline = _duration(
        raw.get("progressDeadline"), f"{where}.progressDeadline", problems, DEFAULT_DEADLINE
    )
    on_failure = raw.get("onFailure", "halt")
    if on_failure not in ON_FAILURE:
        problems.append(
            FieldProblem(
                path=f"{where}.onFailure", expected=" | ".join(ON_FAILURE), found=_show(on_failure)
            )
        )
    if len(problems) > start:
        return None
    assert unavailable is not None and failures is not None
    return Strategy(
        waves=waves,
        max_unavailable=unavailable,
        max_failures=failures,
        soak=soak,
        progress_deadline=deadline,
        on_failure=on_failure,
    )


def _waves(raw: Any, where: str, problems: list[FieldProblem]) -> tuple[Wave, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append(
            FieldProblem(path=where, expected="a non-empty list of waves", found=_show(raw))
        )
        return ()
    if len(raw) > MAX_WAVES:
        problems.append(
            FieldProblem(path=where, expected=f"at most {MAX_WAVES} waves", found=str(len(raw)))
        )
    out: list[Wave] = []
    names: dict[str, int] = {}
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            problems.append(
                FieldProblem(
                    path=at,
                    expected="a wave (name, clusterSelector, size, pauseBefore)",
                    found=_show(item),
                )
            )
            continue
        start = len(problems)
        for key in sorted(set(item) - set(_WAVE_KEYS), key=str):
            problems.append(
                FieldProblem(
                    path=f"{at}.{key}",
                    expected="one of " + ", ".join(_WAVE_KEYS),
                    found="unknown field",
                )
            )
        name = item.get("name", f"wave-{i + 1}")
        if not isinstance(name, str) or not _WAVE_NAME.match(name) or name == REMAINING:
            problems.append(
                FieldProblem(
                    path=f"{at}.name",
                    expected=f'a lowercase DNS label other than "{REMAINING}"',
                    found=_show(name),
                )
            )
        elif name in names:
            problems.append(
                FieldProblem(
                    path=f"{at}.name",
                    expected=f"a name no other wave has ({where}[{names[name]}] has it)",
                    found=_show(name),
                )
            )
        else:
            names[name] = i
        selector = None
        selector_raw = item.get("clusterSelector")
        if selector_raw is not None:
            selector = parse_selector(selector_raw, f"{at}.clusterSelector", problems)
        size = None
        if "size" in item:
            size = _quantity(item["size"], f"{at}.size", problems, minimum=1)
        pause = item.get("pauseBefore", False)
        if not isinstance(pause, bool):
            problems.append(
                FieldProblem(path=f"{at}.pauseBefore", expected="true or false", found=_show(pause))
            )
        if len(problems) == start:
            out.append(
                Wave(
                    name=str(name),
                    selector=selector,
                    selector_raw=dict(selector_raw) if isinstance(selector_raw, dict) else None,
                    size=size,
                    pause_before=bool(pause),
                )
            )
    return tuple(out)


def _quantity(
    raw: Any, where: str, problems: list[FieldProblem], *, minimum: int
) -> Quantity | None:
    expected = f"a whole number of clusters (at least {minimum}) or a percentage such as 10%"
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw >= minimum:
            return Quantity(raw, False)
    elif isinstance(raw, str) and (m := _PERCENT.match(raw)):
        value = int(m.group(1))
        if max(minimum, 0) <= value <= 100 and (value > 0 or minimum == 0):
            return Quantity(value, True)
    problems.append(FieldProblem(path=where, expected=expected, found=_show(raw)))
    return None


def _duration(
    raw: Any, where: str, problems: list[FieldProblem], default: timedelta, *, zero: bool = False
) -> timedelta:
    if raw is None:
        return default
    if zero and raw in ("0s", 0) and not isinstance(raw, bool):
        return timedelta(0)
    found = parse_duration(raw)
    if found is None:
        problems.append(
            FieldProblem(
                path=where, expected='a duration such as "10m" or "1h30m"', found=_show(raw)
            )
        )
        return default
    return found


def _show(value: object) -> str:
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = [
    "NONE",
    "REMAINING",
    "Quantity",
    "Strategy",
    "Wave",
    "parse_strategy",
    "strategy_from_dict",
]
