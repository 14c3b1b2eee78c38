"""Logging for the agent and the hub: text or JSON lines, with context, and never a secret.

:func:`setup_logging` is called once, at the CLI edge (``--log-level``, ``--log-format``). Every
record then carries, where they apply, the ``cluster`` (fixed at set-up) and the ``bundle``,
``group``, ``serial`` and ``run`` of the work in progress, which the code doing that work sets
with :func:`log_context` (context variables: correct across threads and nested calls)::

    with log_context(group="web", serial=12):
        ...  # every log line in here says group=web serial=12

No secret is logged: a filter on the handler masks, in the message and in tracebacks,

- every value registered with :func:`mask` (like a CI system's ``add-mask``), and its base64
  form: the code that reads a password, a token or a sensitive output registers it as it
  reads it;
- what looks like a credential whatever its source: the password of a URL
  (``https://user:***@host``), ``Authorization`` headers, ``password=``/``token=``-style
  pairs, PEM private keys.

Masked text is replaced by ``***``.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import json
import logging
import re
import sys
import threading
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from agent.report.loglevels import FORMATS, LEVELS

MASK: Final = "***"
CONTEXT_FIELDS: Final = ("cluster", "bundle", "group", "serial", "run")
_MIN_MASKED_LENGTH = 4  # shorter values would mask ordinary words and numbers
_MAX_MASKS = 10_000

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fleetlet_log_context", default=None
)
_masks: dict[str, None] = {}  # insertion-ordered: the oldest go first past _MAX_MASKS
_masks_lock = threading.Lock()
_masks_pattern: re.Pattern[str] | None = None

# Credentials recognised by their shape, wherever they come from.
_PATTERNS: Final = (
    # scheme://user:password@host
    (re.compile(r"(?P<keep>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^/\s@]+(?=@)"), r"\g<keep>***"),
    # Authorization: Bearer xyz / Basic xyz
    (
        re.compile(
            r"(?P<keep>\b(?:authorization|proxy-authorization)\b[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)?\s*)[^\s\"',;]+",
            re.I,
        ),
        r"\g<keep>***",
    ),
    # password=..., token=... (and "password": "..." in JSON); not "token: " in prose.
    (
        re.compile(
            r"(?P<keep>\b(?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key)\s*=\s*[\"']?)[^\s\"',;&}]+",
            re.I,
        ),
        r"\g<keep>***",
    ),
    (
        re.compile(
            r"(?P<keep>[\"'](?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key)[\"']\s*:\s*[\"'])[^\"']*",
            re.I,
        ),
        r"\g<keep>***",
    ),
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S
        ),
        "-----BEGIN PRIVATE KEY----- *** -----END PRIVATE KEY-----",
    ),
)


# --- context --------------------------------------------------------------------------------


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (``bundle``, ``group``, ``serial``, ``run``...) to every log record made
    inside the ``with`` block, on top of the fields of enclosing blocks. ``None`` values are
    left out."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, Any]:
    """The fields :func:`log_context` set for the code running now."""
    return dict(_context.get() or {})


# --- masking --------------------------------------------------------------------------------


def mask(value: str | bytes | None) -> None:
    """Never log ``value`` (nor any line of it, for a multi-line value): it is replaced by
    ``***`` in every record from now on. Values shorter than 4 characters are ignored."""
    global _masks_pattern
    if value is None:
        return
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    parts = {text.strip(), *(line.strip() for line in text.splitlines())}
    # As a Secret's data holds it, or an HTTP basic-auth header: base64 of the value.
    parts |= {base64.b64encode(p.encode()).decode() for p in list(parts) if p}
    added = False
    with _masks_lock:
        for part in parts:
            if len(part) >= _MIN_MASKED_LENGTH and part not in _masks:
                _masks[part] = None
                added = True
        while len(_masks) > _MAX_MASKS:
            del _masks[next(iter(_masks))]
        if added:
            # Longest first: a value that contains another is masked whole.
            ordered = sorted(_masks, key=len, reverse=True)
            _masks_pattern = re.compile("|".join(re.escape(m) for m in ordered))


def redact(text: str) -> str:
    """``text`` with every masked value and credential-shaped part replaced by ``***``."""
    pattern = _masks_pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for shape, replacement in _PATTERNS:
        text = shape.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Masks secrets in a record's message and traceback (see the module docstring); the
    record's arguments are merged into the message first, so none escapes through them."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        if record.exc_info:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


# --- formatters -----------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``,
    the context fields that apply, and ``error`` (the traceback) when there is one."""

    def __init__(self, *, cluster: str | None = None) -> None:
        super().__init__()
        self._cluster = cluster

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        entry: dict[str, Any] = {
            "time": when.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_fields(record, self._cluster))
        error = record.exc_text or (
            self.formatException(record.exc_info) if record.exc_info else None
        )
        if error:
            entry["error"] = error
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``TIME LEVEL logger: message [cluster=... group=... serial=...]``."""

    def __init__(self, *, cluster: str | None = None) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._cluster = cluster

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _fields(record, self._cluster)
        if not fields:
            return text
        first, newline, rest = text.partition("\n")
        shown = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{first} [{shown}]{newline}{rest}"


def _fields(record: logging.LogRecord, cluster: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"cluster": cluster} if cluster else {}
    fields.update(_context.get() or {})
    # ``logger.info(..., extra={"bundle": ...})`` works too.
    for name in CONTEXT_FIELDS:
        if name in record.__dict__:
            fields[name] = record.__dict__[name]
    order = [*CONTEXT_FIELDS, *sorted(set(fields) - set(CONTEXT_FIELDS))]
    return {k: fields[k] for k in order if k in fields}


# --- set-up ---------------------------------------------------------------------------------


class LoggingSetupError(ValueError):
    """A log level or format that does not exist (argparse ``choices`` normally prevent it)."""


def setup_logging(
    *,
    level: str = "info",
    format: str = "text",
    cluster: str | None = None,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every log record at ``level`` or above to ``stream`` (stderr), as ``format``
    (``text`` or ``json``), with ``cluster`` on every record, secrets masked. Replaces the
    handlers the root logger had; returns the new handler.

    Raises LoggingSetupError for an unknown level or format.
    """
    if level.lower() not in LEVELS:
        raise LoggingSetupError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if format not in FORMATS:
        raise LoggingSetupError(f"log format must be text or json, got {format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(
        JsonFormatter(cluster=cluster) if format == "json" else TextFormatter(cluster=cluster)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Warnings (deprecations from libraries) go through the same handler, masked.
    logging.captureWarnings(True)
    return handler


def error_line(message: str, *, prefix: str = "fleetlet: ") -> None:
    """A command's one line about a failure on stderr: a log record when JSON logs are set up
    (so every line of stderr is JSON), else ``prefix`` + the message, secrets masked."""
    if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
        logging.getLogger("fleetlet").error(message)
    else:
        print(f"{prefix}{redact(message)}", file=sys.stderr)
