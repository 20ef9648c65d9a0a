"""KServe V2 REST inference responses, with Triton's binary tensor extension: :class:`InferResponse` in,
bytes out (:func:`encode_infer_response`). It owns the output encoding (binary blobs or JSON ``data``,
classification labels, outputs written to shared memory, big numeric outputs converted in slices)
and the cache of all-binary response headers. Requests are :mod:`.v2_http`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..runtime import fastpath
from . import bytes_codec
from .classification import selected_outputs
from .dtypes import BYTES, DType, from_numpy
from .shm_windows import write_output
from .v2_http import SLICE

if TYPE_CHECKING:
    from .shm_windows import SharedMemoryAccess
def encode_infer_response(
    request: InferRequest,
    response: InferResponse,
    model_version: int,
    labels: dict[str, list[str]],
    batching: bool,
    shm: SharedMemoryAccess | None = None,
) -> tuple[list[bytes], int | None]:
    """Encode the response; returns the body chunks and the JSON header length (None: pure JSON).
    Outputs requested in shared memory are written there; their entries carry no data."""
    if fastpath.enabled and not response.parameters:
        fast = _encode_binary(request, response, model_version, labels, batching)
        if fast is not None:
            return fast
    out_json: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array, spec in selected_outputs(request, response, labels, batching):
        if spec is not None and spec.shm is not None:
            dtype = _wire_dtype(array)
            data = bytes_codec.serialize(array) if dtype is BYTES else np.ascontiguousarray(array).tobytes()
            write_output(shm, spec.shm, data, f"output '{name}'")
            # Triton's HTTP entry for an output in shared memory has no "parameters": its C++ client
            # (perf_analyzer --shared-memory) reads "binary_data_size" from any output that has them
            out_json.append({"name": name, "datatype": dtype.wire, "shape": list(array.shape)})
            continue
        binary = request.binary_output if spec is None or spec.binary is None else spec.binary
        out_json.append(_encode_output(name, array, binary, blobs))
    header: dict[str, Any] = {}
    if request.id:
        header["id"] = request.id
    header["model_name"] = request.model_name
    header["model_version"] = str(model_version)
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = out_json
    head = orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return [head], None
    return [head, *blobs], len(head)


# The answer to an all-binary response depends only on what the request asked (its ``outputs`` entries
# and binary default), its id, the model, and each output's name, dtype and shape: the JSON header built
# once and which outputs it carries are kept by those (a plan), so the steady state builds no JSON and
# selects nothing (a repeated request from perf_analyzer or a client loop). Fast path; the slow path is
# the general encoder.
_ANSWERS = fastpath.cache("v2_http.binary_answers", 256)
_ID_MAX = 256  # a longer request id is not worth a plan (ids are client-chosen)


def encode_planned(request: InferRequest, response: InferResponse, model_version: int) -> tuple[list[bytes], int] | None:
    """:func:`encode_infer_response`'s answer from a kept plan (always None while fast paths are off, or
    for a response with parameters): one key, one lookup, one ``tobytes`` per output carried. Its
    ``labels`` and ``batching`` do not matter: a classified output is never planned."""
    if response.parameters:
        return None
    outputs = response.outputs
    key = [request.outputs, request.binary_output, request.id, request.model_name, model_version]
    for name, array in outputs:
        key += (name, array.dtype, array.shape)
    plan = _ANSWERS.get(tuple(key))
    if plan is None:  # looked up before any copy: a response never planned (JSON, BYTES, large) copies nothing here
        return None
    head, picks = plan
    if picks is None:
        return [head, *[array.tobytes() for _, array in outputs]], len(head)
    return [head, *[outputs[i - 1][1].tobytes() for i in picks]], len(head)


def _encode_binary(request: InferRequest, response: InferResponse, model_version: int,
                   labels: dict[str, list[str]], batching: bool) -> tuple[list[bytes], int] | None:
    """The all-binary case (no shared memory, classification, BYTES or response parameters), planned for
    :func:`encode_planned` as it is encoded; None when the response is not of that kind."""
    key: list[Any] = [request.outputs, request.binary_output, request.id, request.model_name, model_version]
    for name, array in response.outputs:
        key += (name, array.dtype, array.shape)
    picks: list[int] = []
    chunks: list[bytes] = [b""]
    outputs = []
    default = request.binary_output
    wanted = None if request.outputs is None else {o.name: o for o in request.outputs}
    for i, (name, array) in enumerate(response.outputs):
        spec = None if wanted is None else wanted.get(name, False)
        if spec is False:
            continue  # not asked for
        if spec is not None and (spec.shm is not None or spec.classification):
            return None
        if not (default if spec is None or spec.binary is None else spec.binary) or array.dtype.kind in "OSU":
            return None  # JSON data, or BYTES (length-prefixed elements: the general encoder)
        picks.append(i)
        chunks.append(array.tobytes())
        outputs.append({"name": name, "datatype": _wire_dtype(array).wire, "shape": list(array.shape),
                        "parameters": {"binary_data_size": array.nbytes}})
    if not picks:
        return None  # no output selected: a pure JSON answer
    header: dict[str, Any] = {"id": request.id} if request.id else {}
    header.update(model_name=request.model_name, model_version=str(model_version), outputs=outputs)
    head = chunks[0] = orjson.dumps(header)
    if len(request.id) <= _ID_MAX:  # picks None: every output, in order
        _ANSWERS.put(tuple(key), (head, None if len(picks) == len(response.outputs) else tuple(i + 1 for i in picks)))
    return chunks, len(head)


def json_output_elements(request: InferRequest, response: InferResponse, labels: dict[str, list[str]],
                         batching: bool) -> int:
    """Elements the response will write as JSON text (what encoding it costs); 0 when an output goes to
    shared memory (written by the hub, which owns the regions)."""
    total = 0
    default = request.binary_output
    for _name, array, spec in selected_outputs(request, response, labels, batching):
        if spec is not None and spec.shm is not None:
            return 0
        if not (default if spec is None or spec.binary is None else spec.binary):
            total += array.size
    return total


def _encode_output(name: str, array: np.ndarray, binary: bool, blobs: list[bytes]) -> dict[str, Any]:
    dtype = _wire_dtype(array)
    entry: dict[str, Any] = {"name": name, "datatype": dtype.wire, "shape": list(array.shape)}
    if binary:
        raw = bytes_codec.serialize(array) if dtype is BYTES else np.ascontiguousarray(array).tobytes()
        entry["parameters"] = {"binary_data_size": len(raw)}
        blobs.append(raw)
    elif dtype is BYTES:
        entry["data"] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]
    elif dtype.wire in ("FP16", "BF16"):
        raise TritonError.invalid_arg(
            f"sending {dtype.wire} data via JSON is not supported. Please use the binary data format for output '{name}'"
        )
    elif fastpath.enabled and array.size > SLICE:
        entry["data"] = _json_numbers_in_slices(array.reshape(-1))
    else:
        entry["data"] = array.reshape(-1).tolist()
    return entry


def _json_numbers_in_slices(flat: np.ndarray) -> orjson.Fragment:
    """A big numeric output as JSON text, converted and written ``SLICE`` elements at a time, so an
    encode on a native thread lets the hub in between (``tolist`` then one ``dumps`` of 14 M floats were
    two C calls of 0.3 and 0.7 s). The same text as the general path, which it is checked against."""
    parts = [orjson.dumps(flat[i:i + SLICE].tolist())[1:-1] for i in range(0, flat.size, SLICE)]
    return orjson.Fragment(b"[" + b",".join(parts) + b"]")


def _wire_dtype(array: np.ndarray) -> DType:
    dtype = from_numpy(array.dtype)
    if dtype is None:
        raise TritonError.internal(f"unsupported output data type {array.dtype}")
    return dtype
