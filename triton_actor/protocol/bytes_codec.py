"""BYTES tensors on the wire: each element is a 4-byte little-endian length followed by its bytes."""

from __future__ import annotations

import struct

import numpy as np

from ..errors import TritonError

_LEN = struct.Struct("<I")


def serialize(array: np.ndarray) -> bytes:
    """Encode an object/bytes/str array (row-major) into Triton's length-prefixed layout."""
    parts: list[bytes] = []
    append = parts.append
    pack = _LEN.pack
    for item in array.reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes | bytearray):
            item = str(item).encode("utf-8")
        append(pack(len(item)))
        append(item)
    return b"".join(parts)


def deserialize(buf: bytes | memoryview, count: int | None, what: str) -> np.ndarray:
    """Decode a length-prefixed buffer into a 1-D object array of ``bytes``.

    ``count`` is the element count the shape promises (None: take all); a buffer that does not hold
    exactly that many well-formed elements is an INVALID_ARG naming ``what``.
    """
    mv = memoryview(buf)
    items: list[bytes] = []
    offset, end = 0, len(mv)
    unpack = _LEN.unpack_from
    while offset < end:
        if offset + 4 > end:
            raise TritonError.invalid_arg(f"{what}: incomplete string length prefix at byte {offset}")
        (n,) = unpack(mv, offset)
        offset += 4
        if offset + n > end:
            raise TritonError.invalid_arg(
                f"{what}: string of length {n} at byte {offset - 4} runs past the end of the data"
            )
        items.append(bytes(mv[offset : offset + n]))
        offset += n
        if count is not None and len(items) > count:  # stop early: a huge buffer of empty strings
            raise TritonError.invalid_arg(f"{what}: expected {count} string elements, got more")
    if count is not None and len(items) != count:
        raise TritonError.invalid_arg(f"{what}: expected {count} string elements, got {len(items)}")
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def byte_size(array: np.ndarray) -> int:
    """Serialized size of a BYTES array."""
    total = 0
    for item in array.reshape(-1):
        total += 4 + (len(item) if isinstance(item, bytes | bytearray) else len(str(item).encode()))
    return total
