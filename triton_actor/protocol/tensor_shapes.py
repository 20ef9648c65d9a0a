"""A request's tensor shape (sans-I/O): its element count, and why a shape is no tensor's, in Triton's words.

Shared by the HTTP and gRPC decoders (``v2_http.py``, ``v2_grpc.py``). The refusals of an HTTP JSON shape
are the HTTP front end's of Triton's current server (``http_server.cc``; its ``qa/L0_http/http_test.py``
sends each): a dimension that is not a non-negative integer fails the JSON parse (500), an element count
past INT64_MAX and a byte size past it are 400s that say which.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import TritonError
from .dtypes import BYTES, DType

INT64_MAX = 2**63 - 1

# numpy holds at most 2**63 - 1 bytes and its widest elements (FP64, INT64, object) take 8: a shape
# whose non-zero dimensions multiply past this is no array even when a 0 dimension leaves it empty
# (numpy: "array is too big"), and no real tensor has that many elements.
_MAX_ELEMENTS = INT64_MAX // 8


def element_count(shape: Any) -> int | None:
    """The element count of a request's shape (JSON list or protobuf dims); None when a dimension is
    not a non-negative integer or the shape is too large for any array (zero dimensions included)."""
    count = span = 1
    for d in shape:
        if d.__class__ is not int or d < 0:
            return None
        count *= d
        if d:
            span *= d
    return count if span <= _MAX_ELEMENTS else None


def json_shape_error(shape: Any, dtype: DType, name: str, prefix: str) -> TritonError:
    """Why ``shape`` (an HTTP JSON input's, for which :func:`element_count` gave None) is refused."""
    if shape.__class__ is list:
        if not all(d.__class__ is int and d >= 0 for d in shape):  # a bool, a float, a negative number
            return TritonError.internal(
                "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer")
        count = math.prod(shape)
        if count > INT64_MAX:
            return TritonError.invalid_arg(
                f"{prefix}invalid shape for input '{name}': shape [{','.join(map(str, shape))}] causes total "
                f"element count to exceed maximum size of {INT64_MAX}")
        if dtype is not BYTES and dtype.itemsize > 1 and count * dtype.itemsize > INT64_MAX:
            return TritonError.invalid_arg(
                f"{prefix}byte size overflow for input '{name}': element count ({count}) * data type size "
                f"({dtype.itemsize}) exceeds maximum allowed size ({INT64_MAX})")
    return TritonError.invalid_arg(f"{prefix}invalid shape {shape!r} for input '{name}'")
