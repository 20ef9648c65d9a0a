"""``pb_utils.Logger``: model logging through the stdlib logger ``triton_actor.model``.

Owner: the stdlib logging module (thread-safe); any thread may log. Levels map INFO/WARNING/ERROR to
the stdlib levels of the same name and VERBOSE to DEBUG. Failure: a message that is no str (or bytes)
or a level that is no ``LogLevel`` (a plain int too) raises pybind11's ``TypeError``, as Triton's
bound ``Logger`` does.
"""

from __future__ import annotations

import logging
from enum import IntEnum

from .pybind_args import as_str, incompatible, is_str

_LOGGER = logging.getLogger("triton_actor.model")


class LogLevel(IntEnum):
    """Triton's ``Logger.LogLevel`` values."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_STD_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


_LOG_SIGNATURE = "(message: str, level: c_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"
_ONE_SIGNATURE = "(message: str) -> None"


def _message(function: str, message: object) -> str:
    if not is_str(message):
        raise incompatible(function, _ONE_SIGNATURE, (message,))
    return as_str(message)  # type: ignore[arg-type]


class Logger:
    """Model logging through the stdlib logger ``triton_actor.model`` (VERBOSE = DEBUG)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        """Log ``message`` at a ``Logger`` level."""
        if not is_str(message) or type(level) is not LogLevel:
            raise incompatible("log", _LOG_SIGNATURE, (message,) if level is LogLevel.INFO else (message, level))
        _LOGGER.log(_STD_LEVELS[level], "%s", as_str(message), stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        _LOGGER.log(logging.INFO, "%s", _message("log_info", message), stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        _LOGGER.log(logging.WARNING, "%s", _message("log_warn", message), stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        _LOGGER.log(logging.ERROR, "%s", _message("log_error", message), stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at VERBOSE (stdlib DEBUG)."""
        _LOGGER.log(logging.DEBUG, "%s", _message("log_verbose", message), stacklevel=2)
