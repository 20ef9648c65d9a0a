"""Data types and the BYTES wire form: config type strings and Triton type numbers to numpy and back,
and the 4-byte length-prefixed encoding of BYTES tensors.

Owner: nobody; the tables are built at import and only read, so any thread may call these. Failure:
unknown types map to None (as Triton's helpers do), except ``triton_string_to_numpy`` (KeyError);
a truncated BYTES buffer raises a ``ValueError`` that is also a ``TritonModelException``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .constants import (
    TYPE_BOOL,
    TYPE_FP16,
    TYPE_FP32,
    TYPE_FP64,
    TYPE_INT8,
    TYPE_INT16,
    TYPE_INT32,
    TYPE_INT64,
    TYPE_STRING,
    TYPE_UINT8,
    TYPE_UINT16,
    TYPE_UINT32,
    TYPE_UINT64,
)
from .errors import _ArgValueError

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_TRITON_TO_NUMPY: dict[int, type] = {
    TYPE_BOOL: np.bool_,
    TYPE_UINT8: np.uint8,
    TYPE_UINT16: np.uint16,
    TYPE_UINT32: np.uint32,
    TYPE_UINT64: np.uint64,
    TYPE_INT8: np.int8,
    TYPE_INT16: np.int16,
    TYPE_INT32: np.int32,
    TYPE_INT64: np.int64,
    TYPE_FP16: np.float16,
    TYPE_FP32: np.float32,
    TYPE_FP64: np.float64,
    TYPE_STRING: np.object_,
}

# Keyed by ``dtype.type`` so that a lookup is a single dict access.
_NUMPY_TO_TRITON: dict[type, int] = {v: k for k, v in _TRITON_TO_NUMPY.items()}
_NUMPY_TO_TRITON[np.bytes_] = TYPE_STRING
_NUMPY_TO_TRITON[np.str_] = TYPE_STRING

_UINT32 = struct.Struct("<I")


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """Map a config type string (``"TYPE_FP32"``) to a numpy type; KeyError if unknown."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type | None:
    """Map a Triton data type number to a numpy type, or None (e.g. BF16, INVALID)."""
    if isinstance(data_type, (int, np.integer)) and not isinstance(data_type, bool):
        return _TRITON_TO_NUMPY.get(int(data_type))
    return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """Map a numpy dtype/type to a Triton data type number, or None if it has none."""
    if data_type is None:
        return None
    if isinstance(data_type, np.dtype):
        return _NUMPY_TO_TRITON.get(data_type.type)
    try:
        found = _NUMPY_TO_TRITON.get(data_type)
        if found is not None:
            return found
        return _NUMPY_TO_TRITON.get(np.dtype(data_type).type)
    except (TypeError, ValueError):
        return None


def _element_bytes(obj: Any) -> bytes:
    """Return the raw bytes of one BYTES-tensor element."""
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    return str(obj).encode("utf-8")


def _serialize_bytes(array: np.ndarray) -> bytes:
    """Length-prefix (4-byte little-endian) every element in C order; always bytes."""
    pack = _UINT32.pack
    parts: list[bytes] = []
    append = parts.append
    for obj in array.ravel(order="C").tolist():
        data = _element_bytes(obj)
        append(pack(len(data)))
        append(data)
    return b"".join(parts)


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple | None:
    """Serialize an object/bytes/str array to Triton's length-prefixed wire form.

    Like Triton: returns ``bytes``; ``()`` for an empty array; None for numeric arrays.
    """
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in "OSU":
        return None
    return _serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """Parse length-prefixed elements into a 1-D object array of ``bytes``."""
    if isinstance(encoded_tensor, bytes):
        view = encoded_tensor
    else:
        view = bytes(memoryview(encoded_tensor).cast("B"))
    total = len(view)
    unpack = _UINT32.unpack_from
    items: list[bytes] = []
    offset = 0
    while offset < total:
        if offset + 4 > total:
            raise _ArgValueError(
                f"truncated BYTES tensor: length prefix at offset {offset} runs past the end"
            )
        (length,) = unpack(view, offset)
        offset += 4
        end = offset + length
        if end > total:
            raise _ArgValueError(
                f"truncated BYTES tensor: element of {length} bytes at offset {offset} "
                f"runs past the end ({total} bytes)"
            )
        items.append(view[offset:end])
        offset = end
    return np.fromiter(items, dtype=np.object_, count=len(items))

