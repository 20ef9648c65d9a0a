"""The cache key of a request: a 128-bit BLAKE2b digest of what decides the model's answer.

Triton hashes the model name, the version that serves the request and every input's name and bytes,
inputs in name order (core ``cache_manager.cc``, ``TritonCache::Hash``). We add each input's datatype
and shape (two requests with the same bytes as FP32 [4] and INT32 [2,2] are different questions), the
requested output names (a model may compute only those) and the parameters forwarded to the model
(``request.parameters``: Triton's own ones, priority, timeout, sequence controls, are consumed before).
Pure; runs in the request's greenlet.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from ..inference import InferRequest

_LEN = struct.Struct("<I")


def request_key(model: str, version: int, request: InferRequest) -> bytes:
    """The digest of ``request`` as served by ``model`` version ``version``."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{len(model)}:{model}:{version}".encode())
    for name in sorted(request.inputs):
        tensor = request.inputs[name]
        data = tensor.data
        h.update(f"|{len(name)}:{name}:{tensor.dtype.wire}:{tensor.shape}|".encode())
        if data.dtype.kind == "O":
            _hash_bytes_elements(h, data)
        else:
            h.update(np.ascontiguousarray(data).view(np.uint8).reshape(-1).data)
    outputs = request.requested_output_names
    h.update(b"|*" if outputs is None else repr(sorted(outputs)).encode())
    if request.parameters:
        h.update(repr(sorted((k, type(v).__name__, v) for k, v in request.parameters.items())).encode())
    return h.digest()


def _hash_bytes_elements(h: hashlib._Hash, data: np.ndarray) -> None:
    """A BYTES tensor: each element length-prefixed, so ["ab", "c"] and ["a", "bc"] differ."""
    for item in data.reshape(-1):
        raw = item.encode() if isinstance(item, str) else bytes(item)
        h.update(_LEN.pack(len(raw)))
        h.update(raw)
