"""The cache key of a request: the bytes of what decides the model's answer, or their digest.

Triton hashes the model name, the version that serves the request and every input's name and bytes,
inputs in name order, into 64 bits (core ``cache_manager.cc``, ``TritonCache::Hash``): two requests
whose hashes collide share an answer. We add each input's datatype and shape (the same bytes as FP32
[4] and INT32 [2,2] are different questions), the requested output names (a model may compute only
those) and the parameters forwarded to the model (``request.parameters``; Triton's own ones, priority,
timeout, sequence controls, are consumed before). Up to :data:`RAW_MAX` bytes the key is that text
itself, so a small request is compared exactly and costs no digest; above, a 128-bit BLAKE2b digest of
it (the prefixes keep the two kinds apart). Pure; runs in the request's greenlet.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np

from ..inference import InferRequest

RAW_MAX = 512  # bytes: a key this long or shorter is kept as it is
_LEN = struct.Struct("<I")


def request_key(model: str, version: int, request: InferRequest) -> bytes:
    """The key of ``request`` as served by ``model`` version ``version``."""
    inputs = request.inputs
    parts = [f"{model}\0{version}".encode()]
    for name in (sorted(inputs) if len(inputs) > 1 else inputs):
        tensor = inputs[name]
        data = tensor.data
        parts.append(f"\0{name}\0{tensor.dtype.wire}\0{tensor.shape}\0".encode())
        parts.append(_bytes_elements(data) if data.dtype.kind == "O" else data.tobytes())
    outputs = request.requested_output_names
    if outputs is not None:
        parts.append(repr(sorted(outputs)).encode())
    if request.parameters:
        parts.append(b"\0p" + repr(sorted((k, type(v).__name__, v) for k, v in request.parameters.items())).encode())
    text = b"".join(parts)
    if len(text) <= RAW_MAX:
        return b"r" + text
    return b"h" + hashlib.blake2b(text, digest_size=16).digest()


def _bytes_elements(data: np.ndarray) -> bytes:
    """A BYTES tensor: each element length-prefixed, so ["ab", "c"] and ["a", "bc"] differ."""
    out: list[Any] = []
    for item in data.reshape(-1):
        raw = item.encode() if isinstance(item, str) else bytes(item)
        out.append(_LEN.pack(len(raw)))
        out.append(raw)
    return b"".join(out)
