"""The argument checks of Triton's pybind11 layer (``pb_stub.cc``'s ``c_python_backend_utils`` bindings).

Owner: nobody; pure functions. In Triton a call whose arguments pybind11 cannot convert to the C++
types never reaches the stub's code: pybind11 raises a plain ``TypeError`` ("incompatible constructor
arguments" / "incompatible function arguments", the bound signature, the arguments it was given),
and only the stub's own checks raise ``TritonModelException``. Triton's ``qa/L0_backend_python``
argument_validation tells the two apart, so our classes raise the same types; ``incompatible``
builds pybind11's text (signatures as Triton 2.51 prints them, measured with a probe model; see
scripts/triton_reference/NOTES.md). The conversions are pybind11's: ``str`` takes str or bytes, an
integer takes int (bool included, float not) within the C++ type's range, a ``List[...]`` takes any
sequence but str/bytes, a class takes its instances (a ``shared_ptr`` one takes None too).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

_OURS = __name__.rsplit(".", 1)[0]


def pybind_repr(value: Any) -> str:
    """``repr`` as pybind11 prints an argument; our classes print as Triton's C++ classes do."""
    cls = type(value)
    if cls is list:
        return "[" + ", ".join(pybind_repr(v) for v in value) + "]"
    if cls is tuple:
        return "(" + ", ".join(pybind_repr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if cls.__module__.startswith(_OURS):
        return f"<c_python_backend_utils.{cls.__name__} object at {id(value):#x}>"
    return repr(value)


def incompatible(name: str, signature: str, args: Iterable[Any] = (), kwargs: Iterable[tuple[str, Any]] = (),
                 constructor: bool = False) -> TypeError:
    """pybind11's ``TypeError`` for a call none of whose overloads (here one) takes these arguments."""
    kind = "constructor" if constructor else "function"
    invoked = ", ".join(pybind_repr(a) for a in args)
    pairs = list(kwargs)
    if pairs:
        invoked += ("; " if invoked else "") + "kwargs: " + ", ".join(f"{k}={pybind_repr(v)}" for k, v in pairs)
    return TypeError(f"{name}(): incompatible {kind} arguments. The following argument types are supported:\n"
                     f"    1. {signature}\n\nInvoked with: {invoked}")


def is_str(value: Any) -> bool:
    """pybind11's ``std::string``: a str or bytes (not None)."""
    return isinstance(value, (str, bytes))


def as_str(value: str | bytes) -> str:
    """What the C++ string gives back to Python."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def is_int(value: Any, low: int, high: int) -> bool:
    """pybind11's integer casters: an int (bool too) or an ``__index__`` object, in the C++ type's range."""
    if isinstance(value, float) or value is None:
        return False
    try:
        number = operator.index(value)
    except TypeError:
        return False
    return low <= number <= high


def is_list_of(value: Any, check: Any) -> bool:
    """pybind11's ``std::vector``: any sequence but str/bytes, each item passing ``check``."""
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        return False
    return all(check(item) for item in value)


INT64 = (-(2**63), 2**63 - 1)
UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)
