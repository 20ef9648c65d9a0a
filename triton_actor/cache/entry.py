"""What the cache holds for one request: a response's outputs and parameters, frozen, with their size.

A hit hands out a fresh :class:`~..inference.InferResponse` each time (encoders and ensembles set
fields on it) whose arrays are the entry's read-only copies: the model that produced them may reuse
its buffers after answering, and no reader may change what the next hit gets. Beside the tensors an
entry keeps the answers front ends encoded from it (``encoded``: a front end's variant, such as HTTP
with binary outputs, to its bytes without a request id), so a repeated hit is not encoded again
(``frontends/cached_answers.py``, a fast path); the store counts their bytes (``extra``) in its size. :func:`encode` and
:func:`decode` are the bytes a Redis server stores: a JSON head (names, datatypes, shapes, lengths,
parameters) then the raw buffers, BYTES elements length-prefixed as on Triton's wire; no pickle, so
a shared Redis cannot make this process run code.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ..inference import InferResponse

_HEAD = struct.Struct("<I")
_OVERHEAD = 64  # bytes an entry costs besides its buffers (key, bookkeeping): a floor for tiny outputs


@dataclass(slots=True, eq=False)
class Entry:
    """Never changed once stored, but for ``encoded`` and ``extra`` (the hub thread's, as the store)."""

    outputs: tuple[tuple[str, np.ndarray], ...]
    parameters: dict[str, Any]
    nbytes: int
    encoded: dict[Any, Any] = field(default_factory=dict)
    extra: int = 0  # bytes of ``encoded``

    def response(self) -> InferResponse:
        return InferResponse(list(self.outputs), dict(self.parameters))


def from_response(response: InferResponse) -> Entry | None:
    """A copy of ``response`` to keep; None when an output is not a numpy array (nothing to cache)."""
    outputs = []
    size = _OVERHEAD
    for name, array in response.outputs:
        if not isinstance(array, np.ndarray):
            return None
        kept = np.array(array, copy=True)
        kept.flags.writeable = False
        outputs.append((name, kept))
        size += len(name) + _array_bytes(kept)
    return Entry(tuple(outputs), dict(response.parameters), size)


def _array_bytes(array: np.ndarray) -> int:
    if array.dtype.kind != "O":
        return array.nbytes
    return sum(4 + len(x if isinstance(x, bytes) else str(x).encode()) for x in array.reshape(-1))


def encode(entry: Entry) -> bytes:
    heads, buffers = [], []
    for name, array in entry.outputs:
        raw = _bytes_tensor(array) if array.dtype.kind == "O" else np.ascontiguousarray(array).tobytes()
        heads.append([name, "BYTES" if array.dtype.kind == "O" else array.dtype.str, list(array.shape), len(raw)])
        buffers.append(raw)
    head = orjson.dumps({"o": heads, "p": entry.parameters})
    return b"".join([_HEAD.pack(len(head)), head, *buffers])


def decode(blob: bytes) -> Entry:
    """The entry ``encode`` wrote; ValueError (or a struct/orjson error) on anything else."""
    (n,) = _HEAD.unpack_from(blob)
    head = orjson.loads(blob[_HEAD.size:_HEAD.size + n])
    offset = _HEAD.size + n
    outputs = []
    for name, kind, shape, length in head["o"]:
        raw = blob[offset:offset + length]
        if len(raw) != length:
            raise ValueError("truncated cache entry")
        offset += length
        array = _bytes_array(raw) if kind == "BYTES" else np.frombuffer(raw, dtype=np.dtype(kind))
        array = array.reshape(shape)
        array.flags.writeable = False
        outputs.append((name, array))
    return Entry(tuple(outputs), head["p"], len(blob))


def _bytes_tensor(array: np.ndarray) -> bytes:
    parts = []
    for item in array.reshape(-1):
        raw = item if isinstance(item, bytes) else str(item).encode()
        parts.append(_HEAD.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def _bytes_array(raw: bytes) -> np.ndarray:
    items, offset = [], 0
    while offset < len(raw):
        (n,) = _HEAD.unpack_from(raw, offset)
        offset += _HEAD.size
        items.append(raw[offset:offset + n])
        offset += n
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
