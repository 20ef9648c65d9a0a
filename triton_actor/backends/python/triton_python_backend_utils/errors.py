"""The errors a model sees: ``TritonModelException`` (raised) and ``TritonError`` (attached to a response).

Owner: nobody; plain values. Argument checks across the package raise ``_ArgTypeError`` /
``_ArgValueError``, which a model can catch as the builtin ``TypeError`` / ``ValueError`` or as
``TritonModelException`` (Triton's pybind layer raises either, depending on the call).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np


class TritonModelException(Exception):
    """Raised by, or to, a model to report a failure (str() is the message)."""

    def message(self) -> str:
        """Return the exception message."""
        return str(self)


class _ArgTypeError(TritonModelException, TypeError):
    """Bad argument type; catchable as TypeError or TritonModelException."""


class _ArgValueError(TritonModelException, ValueError):
    """Bad argument value; catchable as ValueError or TritonModelException."""


class TritonError:
    """Error attached to an ``InferenceResponse``; codes are ``TRITONSERVER_Error_Code``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    _CODE_NAMES: ClassVar[dict[int, str]] = {
        0: "UNKNOWN",
        1: "INTERNAL",
        2: "NOT_FOUND",
        3: "INVALID_ARG",
        4: "UNAVAILABLE",
        5: "UNSUPPORTED",
        6: "ALREADY_EXISTS",
        7: "CANCELLED",
    }

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None:
            raise _ArgTypeError("TritonError message must not be None")
        if isinstance(code, bool) or not isinstance(code, (int, np.integer)):
            raise _ArgTypeError(f"TritonError code must be an int, got {type(code).__name__}")
        code = int(code)
        if code not in self._CODE_NAMES:
            raise _ArgValueError(f"unknown TritonError code {code}")
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        """Return the error message."""
        return self._message

    def code(self) -> int:
        """Return the numeric error code (e.g. ``TritonError.INTERNAL``)."""
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return self._message

