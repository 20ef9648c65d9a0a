"""The one error type of the server, with Triton's error codes.

Everything below the front ends raises :class:`TritonError`; the front ends map the code to an HTTP
status or a gRPC status (``frontends/``), nothing else does.
"""

from __future__ import annotations

import enum
from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class Code(enum.IntEnum):
    """Triton's ``TRITONSERVER_Error_Code`` values (also ``pb_utils.TritonError`` codes)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


_STATUS_NAMES = {
    Code.UNKNOWN: "Unknown",
    Code.INTERNAL: "Internal",
    Code.NOT_FOUND: "Not found",
    Code.INVALID_ARG: "Invalid argument",
    Code.UNAVAILABLE: "Unavailable",
    Code.UNSUPPORTED: "Unsupported",
    Code.ALREADY_EXISTS: "Already exists",
    Code.CANCELLED: "Cancelled",
}


def answered(error: E) -> E:
    """``error``, let go of its traceback (and of a context it was raised ``from None``) once it is
    turned into an answer: the traceback's frames hold what holds the error (a failed request's pending
    reply, a route that carries it), a cycle per failed request that only the collector freed, with the
    request, its connection's objects and its tensors in it."""
    error.__traceback__ = None
    if error.__suppress_context__:
        error.__context__ = None
    return error


class TritonError(Exception):
    """An error with a Triton code; ``str()`` is the message clients see."""

    __slots__ = ("code", "message")

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"TritonError({self.code.name}, {self.message!r})"

    def status_text(self) -> str:
        """Triton's ``Status::AsString()``: ``"Internal: <message>"`` (used for load-failure reasons)."""
        return f"{_STATUS_NAMES[self.code]}: {self.message}"

    @classmethod
    def invalid_arg(cls, message: str) -> TritonError:
        return cls(Code.INVALID_ARG, message)

    @classmethod
    def not_found(cls, message: str) -> TritonError:
        return cls(Code.NOT_FOUND, message)

    @classmethod
    def unavailable(cls, message: str) -> TritonError:
        return cls(Code.UNAVAILABLE, message)

    @classmethod
    def internal(cls, message: str) -> TritonError:
        return cls(Code.INTERNAL, message)

    @classmethod
    def unsupported(cls, message: str) -> TritonError:
        return cls(Code.UNSUPPORTED, message)

    @classmethod
    def already_exists(cls, message: str) -> TritonError:
        return cls(Code.ALREADY_EXISTS, message)
