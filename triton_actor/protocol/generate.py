"""The generate extension's JSON (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_generate.md): ``POST .../generate`` and ``.../generate_stream``.

Request: a top-level key named like a model input becomes that input (a scalar or a 1-D list; datatype
and shape come from the model config, a -1 dimension takes the element count, a batching model gets
a batch of 1); ``id`` is the request id; ``parameters`` (an object) and every other top-level key
become request parameters. Response: ``{"id"?, "model_name", "model_version", <output>: value}``,
where a one-element tensor is a scalar, BYTES are text, anything else a flat list.
Server-Sent Events frame each streamed response as ``data: <json>\\n\\n``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ..errors import TritonError
from ..inference import InferInput, InferRequest, InferResponse
from .dtypes import BYTES, DType
from .payloads import json_object

InputSpec = tuple[str, DType, tuple[int, ...]]


def decode_request(body: bytes, model: str, version: int, inputs: list[InputSpec], max_batch_size: int) -> InferRequest:
    data = json_object(body, "a generate request")
    specs = {name: (dtype, dims) for name, dtype, dims in inputs}
    tensors: dict[str, InferInput] = {}
    params: dict[str, Any] = {}
    rid = ""
    for key, value in data.items():
        if key in specs:
            dtype, dims = specs[key]
            tensors[key] = _tensor(key, value, dtype, dims, max_batch_size)
        elif key == "id":
            if not isinstance(value, str):  # as /infer answers (a dict came back as its Python repr)
                raise TritonError.invalid_arg("request 'id' must be a string")
            rid = value
        elif key == "parameters":
            if not isinstance(value, dict):
                raise TritonError.invalid_arg("'parameters' must be a JSON object")
            for pkey, pvalue in value.items():
                params[pkey] = _parameter(pkey, pvalue)
        else:
            params[key] = _parameter(key, value)
    return InferRequest(model, version, rid, tensors, None, params)


def _parameter(key: str, value: Any) -> Any:
    if key.startswith("triton_"):
        raise TritonError.invalid_arg(f"parameter keys starting with 'triton_' are reserved for Triton usage: '{key}'")
    if isinstance(value, bool | int | float | str):
        return value
    try:
        return orjson.dumps(value).decode()  # nested values reach the model as JSON text
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (255 levels)
        raise TritonError.invalid_arg(f"parameter '{key}' is nested too deep") from None


def _tensor(name: str, value: Any, dtype: DType, dims: tuple[int, ...], max_batch_size: int) -> InferInput:
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, list | dict) for v in values):
        raise TritonError.invalid_arg(f"generate input '{name}' must be a scalar or a flat list")
    count = len(values)
    try:
        if dtype is BYTES:
            array = np.array([v.encode() if isinstance(v, str) else str(v).encode() for v in values], dtype=np.object_)
        elif dtype.numpy is None:
            raise TritonError.invalid_arg(f"generate input '{name}': {dtype.wire} cannot be sent as JSON")
        else:
            with np.errstate(over="ignore"):  # beyond FP32's range: +-inf, as Triton's double-to-float store
                array = np.asarray(values, dtype=dtype.numpy)
    except (TypeError, ValueError, OverflowError) as e:
        raise TritonError.invalid_arg(f"generate input '{name}' is not {dtype.wire}: {e}") from None
    known = 1
    for d in dims:
        known *= d if d > 0 else 1
    free = sum(1 for d in dims if d < 0)
    if free > 1 or (free == 0 and known != count) or (free == 1 and count % known):
        raise TritonError.invalid_arg(
            f"generate input '{name}' has {count} element(s), which does not fit the model's dims {list(dims)}")
    shape = tuple(count // known if d < 0 else d for d in dims)
    if max_batch_size > 0:
        shape = (1, *shape)
    return InferInput(name, dtype, shape, array.reshape(shape))


def encode_response(model: str, version: int, request_id: str, response: InferResponse) -> bytes:
    out: dict[str, Any] = {}
    if request_id:
        out["id"] = request_id
    out["model_name"] = model
    out["model_version"] = str(version)
    for name, array in response.outputs:
        flat = array.reshape(-1)
        if array.dtype.kind in ("O", "S", "U"):
            items = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
        else:
            items = flat.tolist()
        out[name] = items[0] if len(items) == 1 else items
    return orjson.dumps(out)


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def sse_error(error: TritonError) -> bytes:
    return sse_event(orjson.dumps({"error": error.message}))
