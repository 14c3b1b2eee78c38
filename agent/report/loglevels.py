"""The choices of ``--log-level`` and ``--log-format``: here, apart from :mod:`agent.report.logs`
(which imports :mod:`logging`, about 6 ms), so that building a command's parser
(:func:`agent.options.add_logging_arguments`) loads nothing else."""

from __future__ import annotations

from typing import Final

LEVELS: Final = ("debug", "info", "warning", "error")
FORMATS: Final = ("text", "json")
