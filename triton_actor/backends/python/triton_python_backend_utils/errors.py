"""The errors a model sees: ``TritonModelException`` (raised) and ``TritonError`` (attached to a response).

Owner: nobody; plain values. Where Triton's pybind11 layer refuses an argument (``Tensor``,
``InferenceRequest``, ``InferenceResponse``, ``TritonError``, ``Logger``) the classes raise its plain
``TypeError`` (``pybind_args``), and the stub's own checks ``TritonModelException``, as Triton's
``qa/L0_backend_python`` argument_validation expects. The other argument checks raise
``_ArgTypeError`` / ``_ArgValueError``, which a model can catch as the builtin ``TypeError`` /
``ValueError`` or as ``TritonModelException``.
"""

from __future__ import annotations

from enum import IntEnum

from .pybind_args import as_str, incompatible, is_str


class TritonModelException(Exception):
    """Raised by, or to, a model to report a failure (str() is the message)."""

    def message(self) -> str:
        """Return the exception message."""
        return str(self)


class _ArgTypeError(TritonModelException, TypeError):
    """Bad argument type; catchable as TypeError or TritonModelException."""


class _ArgValueError(TritonModelException, ValueError):
    """Bad argument value; catchable as ValueError or TritonModelException."""


class _ErrorCode(IntEnum):
    """``TritonError.__ErrorCode``: Triton binds the codes as an enum, and its constructor takes only
    members (``TritonError("m", 3)`` is a ``TypeError`` there); members compare equal to the numbers."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


# its repr, as in pybind11's signature text: <__ErrorCode.INTERNAL: 1> (the qualname stays: pickle finds it)
_ErrorCode.__name__ = "__ErrorCode"

_SIGNATURE = ("c_python_backend_utils.TritonError(message: str, code: c_python_backend_utils.TritonError.__ErrorCode"
              " = <__ErrorCode.INTERNAL: 1>)")


class TritonError:
    """Error attached to an ``InferenceResponse``; codes are ``TRITONSERVER_Error_Code``."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: _ErrorCode = _ErrorCode.INTERNAL) -> None:
        if not is_str(message) or type(code) is not _ErrorCode:
            given = (message,) if code is _ErrorCode.INTERNAL else (message, code)  # the default shows as not given
            raise incompatible("__init__", _SIGNATURE, given, constructor=True)
        self._message = as_str(message)
        self._code = code

    @classmethod
    def _of(cls, message: str, code: int) -> TritonError:
        """The server's constructor: an error it answers a model with, from a numeric code."""
        return cls(message, _ErrorCode(int(code)))

    def message(self) -> str:
        """Return the error message."""
        return self._message

    def code(self) -> _ErrorCode:
        """Return the error code (e.g. ``TritonError.INTERNAL``; equal to its number)."""
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return self._message
