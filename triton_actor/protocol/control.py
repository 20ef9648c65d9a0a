"""The control protocol between worker processes (sans-I/O): length-prefixed JSON frames.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON. A call is
``{"id": n, "kind": str, "args": {...}}``; its answer ``{"id": n, "ok": data}`` or
``{"id": n, "error": [code, message]}``. Bytes values (file overrides of a model load) travel as
``{"__b64__": "..."}``; a dict whose one key is ``__b64__`` or ``__dict__`` travels as
``{"__dict__": {...}}``, so no dict reads back as bytes. Frames are bounded (``MAX_FRAME``): a load
with file overrides is the largest.

Only workers of one arbiter speak it, over Unix sockets in a 0700 run directory; it is still parsed as
untrusted input (bounded, JSON only, no pickle).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import orjson

MAX_FRAME = 1 << 30  # a model load may carry file overrides of several hundred MB (HTTP allows 64 MiB * n)
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """A peer sent something that is not a frame of this protocol."""


_MARKERS = ("__b64__", "__dict__")  # one-key objects that mean bytes, or an escaped dict


def _encode_value(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__b64__": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        encoded = {str(k): _encode_value(v) for k, v in value.items()}
        # a dict that would read as a marker (a client's parameters may hold any key) is escaped
        return {"__dict__": encoded} if len(encoded) == 1 and next(iter(encoded)) in _MARKERS else encoded
    if isinstance(value, (list, tuple)):
        return [_encode_value(v) for v in value]
    return value


# orjson writes at most 254 levels of nesting, so no frame of ours nests deeper; orjson reads up to
# 1024, deeper than Python's recursion limit lets _decode_value go.
MAX_DEPTH = 256


def _decode_value(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"control message nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        if len(value) == 1 and "__b64__" in value:
            try:
                return base64.b64decode(value["__b64__"], validate=True)
            except (TypeError, ValueError) as e:  # binascii.Error is a ValueError
                raise ProtocolError(f"control message holds invalid base64: {e}") from None
        if len(value) == 1 and isinstance(value.get("__dict__"), dict):  # an escaped dict: its keys are plain
            value = value["__dict__"]
        return {k: _decode_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_value(v, depth + 1) for v in value]
    return value


def encode(message: dict[str, Any]) -> bytes:
    """One frame holding ``message``."""
    body = orjson.dumps(_encode_value(message))
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"control message of {len(body)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Bytes in, messages out: ``feed(data)`` returns every message completed by ``data``."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > self.max_frame:
                raise ProtocolError(f"control frame of {size} bytes exceeds {self.max_frame}")
            if len(self._buffer) < _HEADER.size + size:
                break
            body = bytes(self._buffer[_HEADER.size:_HEADER.size + size])
            del self._buffer[:_HEADER.size + size]
            try:
                message = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise ProtocolError(f"control frame is not JSON: {e}") from e
            if not isinstance(message, dict):
                raise ProtocolError("control frame is not a JSON object")
            messages.append(_decode_value(message))
        return messages
