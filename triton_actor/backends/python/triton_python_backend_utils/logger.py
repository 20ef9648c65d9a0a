"""``pb_utils.Logger``: model logging through the stdlib logger ``triton_actor.model``.

Owner: the stdlib logging module (thread-safe); any thread may log. Levels map INFO/WARNING/ERROR to
the stdlib levels of the same name and VERBOSE to DEBUG. Failure: an unknown level raises
``ValueError`` that is also a ``TritonModelException``.
"""

from __future__ import annotations

import logging
from enum import IntEnum

from .errors import _ArgValueError

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


class Logger:
    """Model logging through the stdlib logger ``triton_actor.model`` (VERBOSE = DEBUG)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        """Log ``message`` at a ``Logger`` level."""
        std_level = _STD_LEVELS.get(level)
        if std_level is None:
            raise _ArgValueError(f"unknown log level {level!r}")
        _LOGGER.log(std_level, "%s", message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        _LOGGER.log(logging.INFO, "%s", message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        _LOGGER.log(logging.WARNING, "%s", message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        _LOGGER.log(logging.ERROR, "%s", message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at VERBOSE (stdlib DEBUG)."""
        _LOGGER.log(logging.DEBUG, "%s", message, stacklevel=2)

