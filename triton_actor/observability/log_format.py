"""The process's log handler: Triton's two line formats and its per-severity switches.

Owner: :class:`~.log_trace_settings.RuntimeSettings` holds the settings (what ``/v2/logging`` shows and
changes) and calls :func:`apply` on every change; the CLI (or a gunicorn worker) calls :func:`install`
once at start, with the start settings. Runs in the hub thread; a record is formatted in whatever thread
logs it (``logging`` serialises the handler).

Triton's lines (docs/user_guide/logging.md; file:line is our logger name here)::

    default  I0520 20:03:25.829575 3355 triton_actor.server] Started HTTPService at 0.0.0.0:8000
    ISO8601  2024-05-20T20:03:25Z I 3355 triton_actor.server] Started HTTPService at 0.0.0.0:8000

Triton's severities are switches (``log_info``, ``log_warning``, ``log_error``) rather than a threshold;
a filter applies them, and verbose messages (debug) pass while ``log_verbose_level`` > 0.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

FORMATS = ("default", "ISO8601")
_HANDLER: logging.Handler | None = None  # the one install() made, which apply() changes


class TritonFormatter(logging.Formatter):
    """``default`` or ``ISO8601`` (UTC, as Triton's ``Z``), severity as one letter (I, W, E, V)."""

    def __init__(self, style: str = "default") -> None:
        super().__init__()
        self.style_name = style

    def format(self, record: logging.LogRecord) -> str:
        letter = "V" if record.levelno < logging.INFO else record.levelname[:1]
        if self.style_name == "ISO8601":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            head = f"{stamp} {letter} {record.process} {record.name}] "
        else:
            micros = int((record.created % 1) * 1_000_000)
            stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
            head = f"{letter}{stamp}.{micros:06d} {record.process} {record.name}] "
        text = head + record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text


class SeverityFilter(logging.Filter):
    """Triton's switches: each severity on or off on its own; debug only while verbose."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self.warning = self.error = True
        self.verbose = 0

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.error
        if level >= logging.WARNING:
            return self.warning
        if level >= logging.INFO:
            return self.info
        return self.verbose > 0


def start_settings(settings: Any) -> dict[str, Any]:
    """The log settings of a :class:`~..config.settings.Settings`, as ``/v2/logging`` names them."""
    return {"log_file": settings.log_file, "log_info": settings.log_info, "log_warning": settings.log_warning,
            "log_error": settings.log_error, "log_verbose_level": settings.log_verbose,
            "log_format": settings.log_format}


def install(log_file: str, log: dict[str, Any]) -> None:
    """Send the root logger to ``log_file`` (appended) or stderr, in ``log``'s format and switches.
    Raises OSError when the file cannot be opened."""
    global _HANDLER
    handler: logging.Handler = logging.FileHandler(log_file, encoding="utf-8") if log_file \
        else logging.StreamHandler(sys.stderr)
    handler.setFormatter(TritonFormatter())
    handler.addFilter(SeverityFilter())
    root = logging.getLogger()
    if _HANDLER is not None:
        root.removeHandler(_HANDLER)
        _HANDLER.close()
    root.addHandler(handler)
    _HANDLER = handler
    apply(log)


def apply(log: dict[str, Any]) -> None:
    """Current settings → the root logger's level and our handler's format and filter (a process
    without :func:`install`, e.g. a unit test, gets the level only)."""
    verbose = log["log_verbose_level"]
    switches = ((verbose > 0, logging.DEBUG), (log["log_info"], logging.INFO),
                (log["log_warning"], logging.WARNING), (log["log_error"], logging.ERROR))
    logging.getLogger().setLevel(next((level for on, level in switches if on), logging.CRITICAL + 1))
    if _HANDLER is None:
        return
    formatter = _HANDLER.formatter
    if isinstance(formatter, TritonFormatter):
        formatter.style_name = log["log_format"]
    for f in _HANDLER.filters:
        if isinstance(f, SeverityFilter):
            f.info, f.warning, f.error, f.verbose = log["log_info"], log["log_warning"], log["log_error"], verbose
