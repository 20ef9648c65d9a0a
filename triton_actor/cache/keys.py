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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..inference import InferRequest
from ..runtime import fastpath

if TYPE_CHECKING:
    from ..protocol.dtypes import DType

RAW_MAX = 512  # bytes: a key this long or shorter is kept as it is
_LEN = struct.Struct("<I")


def request_key(model: str, version: int, request: InferRequest) -> bytes:
    """The key of ``request`` as served by ``model`` version ``version``."""
    inputs = request.inputs
    parts = [_model_head(model, version)]
    for name in (sorted(inputs) if len(inputs) > 1 else inputs):
        tensor = inputs[name]
        data = tensor.data
        parts.append(_input_head(name, tensor.dtype, tensor.shape))
        parts.append(_bytes_elements(data) if data.dtype.kind == "O" else data.tobytes())
    outputs = request.outputs
    if outputs is not None:
        parts.append(repr(sorted(o.name for o in outputs)).encode())
    if request.parameters:
        parts.append(b"\0p" + repr(sorted((k, type(v).__name__, v) for k, v in request.parameters.items())).encode())
    text = b"".join(parts)
    if len(text) <= RAW_MAX:
        return b"r" + text
    return b"h" + hashlib.blake2b(text, digest_size=16).digest()


# The parts of a key that a repeating client repeats (its model, each input's name, type and shape),
# kept as bytes: formatting them took most of a small request's key. Fast paths; the functions below
# them are the specification, and a kept part is the same bytes.
_MODEL_HEADS = fastpath.cache("cache.key_models", 256)
_INPUT_HEADS = fastpath.cache("cache.key_inputs", 1024)


def _model_head(model: str, version: int) -> bytes:
    key = (model, version)
    head = _MODEL_HEADS.get(key)
    if head is None:
        head = f"{model}\0{version}".encode()
        _MODEL_HEADS.put(key, head)
    return head


def _input_head(name: str, dtype: DType, shape: tuple[int, ...]) -> bytes:
    key = (name, dtype, shape)
    head = _INPUT_HEADS.get(key)
    if head is None:
        head = f"\0{name}\0{dtype.wire}\0{shape}\0".encode()
        _INPUT_HEADS.put(key, head)
    return head


def _bytes_elements(data: np.ndarray) -> bytes:
    """A BYTES tensor: each element length-prefixed, so ["ab", "c"] and ["a", "bc"] differ."""
    out: list[Any] = []
    for item in data.reshape(-1):
        raw = item.encode() if isinstance(item, str) else bytes(item)
        out.append(_LEN.pack(len(raw)))
        out.append(raw)
    return b"".join(out)
