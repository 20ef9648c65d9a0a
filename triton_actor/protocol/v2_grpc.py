"""KServe V2 gRPC messages (``inference.GRPCInferenceService``, https://github.com/triton-inference-server/common/blob/main/protobuf/grpc_service.proto): protobuf ↔ our values.

Sans-I/O: a ``ModelInferRequest`` in, an :class:`InferRequest` out; an :class:`InferResponse` in, a
``ModelInferResponse`` out; plus the metadata, statistics, index and settings messages built from
the same dicts the HTTP front end serves. No grpc server here, only the generated messages.
Tensors travel as ``raw_input_contents`` (zero-copy ``np.frombuffer`` views) or typed ``contents``
in, and always as ``raw_output_contents`` out, as Triton answers.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from google.protobuf import json_format

from ..errors import TritonError
from ..inference import InferInput, InferRequest, InferResponse, RequestedOutput
from ..runtime import fastpath
from . import bytes_codec
from ._generated import grpc_service_pb2 as pb
from .classification import selected_outputs
from .dtypes import BY_WIRE, BYTES, DType, from_numpy
from .shm_windows import parse_window, write_output
from .tensor_shapes import element_count
from .v2_http import MANY_INPUTS, SLICE, refuse_unknown_inputs, tensor_from_bytes

if TYPE_CHECKING:
    from .shm_windows import SharedMemoryAccess

SEQUENCE_START, SEQUENCE_END = 1, 2
# The only ``triton_`` request parameter a gRPC client may set (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_parameters.md).
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
_NO_ID_PREFIX = "[request id: <id_unknown>] "  # error-message prefix of a request without an id

# The per-request values are NamedTuples; ``tuple.__new__`` on the full field tuple builds the same
# object as the generated ``__new__`` in half the time. The defaults come from the classes themselves.
assert InferInput._fields == ("name", "dtype", "shape", "data")
assert InferRequest._fields[:5] == ("model_name", "model_version", "id", "inputs", "outputs")
_REQUEST_TAIL = tuple(InferRequest._field_defaults[f] for f in InferRequest._fields[5:])
_OUTPUT_TAIL = tuple(RequestedOutput._field_defaults[f] for f in RequestedOutput._fields[1:])

# InferTensorContents field holding each datatype's typed elements (grpc_service.proto).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
# The numpy type of each field's elements: a field is wider than its narrower datatypes (int_contents
# is int32 for INT8 and INT16), and Triton keeps the low bytes of each element (little-endian), so
# values are read at the field's width and then narrowed, wrapping as Triton's copy does.
_FIELD_NUMPY = {
    "bool_contents": np.bool_, "int_contents": np.int32, "int64_contents": np.int64, "uint_contents": np.uint32,
    "uint64_contents": np.uint64, "fp32_contents": np.float32, "fp64_contents": np.float64,
}


def parse_version(text: str) -> int:
    """``model_version``: empty means the highest ready version (-1)."""
    if not text:
        return -1
    # ASCII digits only, as std::stol reads them: str.isdigit() also passes '²' (int() refuses it)
    # and the other scripts' decimal digits (int() reads them)
    if not (text.isascii() and text.isdigit()):
        raise TritonError.invalid_arg(f"failed to get model version from specified version string '{text}' "
                                      "(details: stol), version should be an integral value > 0")
    return int(text)


# -- ModelInfer request ---------------------------------------------------------------------------
def decode_infer_request(msg: pb.ModelInferRequest, shm: SharedMemoryAccess | None = None,
                         known_inputs: Container[str] | None = None) -> InferRequest:
    """Decode a ``ModelInferRequest``; raw contents become zero-copy numpy views. Inputs naming a
    shared-memory region are read from ``shm``; they take no ``raw_input_contents`` entry.
    ``known_inputs``: the model's input names, read only for a request with many inputs
    (:func:`.v2_http.refuse_unknown_inputs`)."""
    # Per-request hot path. Repeated protobuf fields are read with one slice each: upb answers a slice
    # about twice as fast as iterating or indexing its container element by element.
    model = msg.model_name
    request_id = msg.id
    prefix = f"[request id: {request_id}] " if request_id else _NO_ID_PREFIX
    raw = msg.raw_input_contents[:]
    next_raw = 0
    inputs: dict[str, InferInput] = {}
    tensors = msg.inputs[:]
    if len(tensors) > MANY_INPUTS and known_inputs is not None:
        refuse_unknown_inputs([t.name for t in tensors], known_inputs, model, prefix)
    for tensor in tensors:
        name = tensor.name
        if name in inputs:
            raise TritonError.invalid_arg(f"{prefix}input '{name}' already exists in request")
        dtype = BY_WIRE.get(tensor.datatype)
        if dtype is None:
            raise TritonError.invalid_arg(f"{prefix}invalid datatype '{tensor.datatype}' for input '{name}'")
        shape = tuple(tensor.shape[:])
        count = element_count(shape)
        if count is None:
            raise TritonError.invalid_arg(f"{prefix}invalid shape {list(shape)} for input '{name}'")
        params = tensor.parameters
        region = _shm_window(params, f"input '{name}'", shm) if params else None
        if region is not None:
            buf = shm.read(*region, f"{prefix}input '{name}'")  # type: ignore[union-attr]
            data = tensor_from_bytes(buf, dtype, shape, count, name, model, prefix)
        elif raw:
            if tensor.HasField("contents"):
                raise TritonError.invalid_arg(f"contents field must not be specified when using raw_input_contents "
                                              f"for '{name}' for model '{model}'")
            if next_raw >= len(raw):
                raise TritonError.invalid_arg(f"unable to find data for input tensor '{name}' for model '{model}' "
                                              "in request.")
            data = tensor_from_bytes(raw[next_raw], dtype, shape, count, name, model, prefix)
            next_raw += 1
        elif tensor.HasField("contents"):
            data = _from_contents(tensor.contents, dtype, shape, count, name, model, prefix)
        else:
            raise TritonError.invalid_arg(f"unable to find data for input tensor '{name}' for model '{model}' "
                                          "in request.")
        inputs[name] = fastpath.new_tuple(InferInput, (name, dtype, shape, data))
    version_text = msg.model_version
    version = parse_version(version_text) if version_text else -1
    requested = msg.outputs[:]
    outputs = _decode_outputs(requested, prefix, shm) if requested else None
    params = msg.parameters
    if not params:
        return fastpath.new_tuple(InferRequest, (model, version, request_id, inputs, outputs, *_REQUEST_TAIL))
    forwarded, kwargs = _decode_parameters(params, prefix)
    return InferRequest(model, version, request_id, inputs, outputs, forwarded, **kwargs)


def _shm_window(params: Any, what: str, shm: SharedMemoryAccess | None) -> tuple[str, int, int] | None:
    """(region, offset, byte size) from ``shared_memory_*`` tensor parameters; None when absent."""
    if not params or "shared_memory_region" not in params:
        return None
    if shm is None:
        raise TritonError.unsupported(f"{what}: shared memory is not available on this endpoint")
    size, offset = params.get("shared_memory_byte_size"), params.get("shared_memory_offset")
    return parse_window(oneof_value(params["shared_memory_region"]), None if offset is None else oneof_value(offset),
                        None if size is None else oneof_value(size), what)


def _from_contents(contents: pb.InferTensorContents, dtype: DType, shape: tuple[int, ...], count: int, name: str,
                   model: str, prefix: str) -> np.ndarray:
    field = _CONTENTS_FIELD.get(dtype.wire)
    if field is None:
        raise TritonError.invalid_arg(f"{prefix}{dtype.wire} input '{name}' can only be sent in raw_input_contents")
    present = [f.name for f, _ in contents.ListFields()]
    if any(f != field for f in present):
        raise TritonError.invalid_arg(
            f"{prefix}input '{name}' of type {dtype.wire} must use 'contents.{field}', got {', '.join(present)}"
        )
    values = getattr(contents, field)
    if len(values) != count:
        if dtype is BYTES:
            raise TritonError.invalid_arg(
                f"{prefix}unexpected number of string elements {len(values)} for inference input '{name}' for "
                f"model '{model}', expecting {count}"
            )
        raise TritonError.invalid_arg(  # Triton's text: the byte size the typed contents amount to
            f"{prefix}input byte size mismatch for input '{name}' for model '{model}'. "
            f"Expected {count * dtype.itemsize}, got {len(values) * dtype.itemsize}"
        )
    if dtype is BYTES:
        arr = np.empty(count, dtype=np.object_)
        arr[:] = list(values)
    elif count > SLICE:
        # each C call converts one slice: a decode on a native thread (see frontends/grpc.py) lets the
        # hub in between; one call over 14 M floats held the interpreter 1.2 s
        arr = np.empty(count, dtype=_FIELD_NUMPY[field])
        for i in range(0, count, SLICE):
            arr[i:i + SLICE] = values[i:i + SLICE]
        arr = arr.astype(dtype.numpy, copy=False)
    else:
        arr = np.array(values, dtype=_FIELD_NUMPY[field]).astype(dtype.numpy, copy=False)
    return arr.reshape(shape)


def decode_work(msg: pb.ModelInferRequest) -> int:
    """About how many elements' worth of Python work decoding ``msg`` is: each typed ``contents``
    element one, each input, requested output and request parameter :data:`ENTRY_WORK` (raw contents
    are zero-copy views: nothing). Counted without reading the values."""
    entries = len(msg.inputs) + len(msg.outputs) + len(msg.parameters)
    if msg.raw_input_contents:
        return ENTRY_WORK * entries
    total = ENTRY_WORK * entries
    for tensor in msg.inputs:
        if tensor.HasField("contents"):
            total += element_count(tensor.shape[:]) or 0
    return total


ENTRY_WORK = 32  # an input, output or parameter costs about as much to decode as 32 typed elements


def oneof_value(p: Any) -> Any:
    """The value a ``parameter_choice`` oneof holds (InferParameter, LogSettings values...); None if unset."""
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def _decode_parameters(params: Any, prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Triton's ``SetInferenceRequestMetadata`` (server's gRPC front end): consumed keys become request fields."""
    if not params:
        return {}, {}
    forwarded: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    flags = 0
    for key, p in params.items():
        kind = p.WhichOneof("parameter_choice")
        value = oneof_value(p)
        # sequence keys: real Triton 2.51's texts, without the request id prefix; it refuses uint64_param
        # and reads an int64 id as the uint64 of the same bits (-5 → 2**64 - 5)
        if key == "sequence_id":
            if kind not in ("int64_param", "string_param"):
                raise TritonError.invalid_arg("invalid value type for 'sequence_id' parameter, "
                                              "expected int64_param or string_param.")
            kwargs["correlation_id"] = value % (1 << 64) if kind == "int64_param" else value
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise TritonError.invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
            if value:
                flags |= SEQUENCE_START if key == "sequence_start" else SEQUENCE_END
        elif key in ("priority", "timeout"):
            if kind not in ("int64_param", "uint64_param") or value < 0:
                raise TritonError.invalid_arg(f"{prefix}invalid value type for '{key}' parameter, "
                                              "expected a non-negative int64_param or uint64_param.")
            kwargs["priority" if key == "priority" else "timeout_us"] = value
        elif key == EMPTY_FINAL_RESPONSE:
            if kind != "bool_param":
                raise TritonError.invalid_arg(f"{prefix}invalid value type for '{key}' parameter, expected bool_param.")
        elif key.startswith("triton_"):
            raise TritonError.invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                f"starting with 'triton_' are allowed: {EMPTY_FINAL_RESPONSE}"
            )
        elif kind is None or kind == "uint64_param":
            raise TritonError.invalid_arg(f"{prefix}unsupported value type for parameter '{key}'")
        else:
            forwarded[key] = value
    if flags:
        kwargs["flags"] = flags
    return forwarded, kwargs


def _decode_outputs(outputs: Any, prefix: str, shm: SharedMemoryAccess | None) -> tuple[RequestedOutput, ...]:
    result = []
    for o in outputs:
        params = o.parameters
        if not params:
            result.append(fastpath.new_tuple(RequestedOutput, (o.name, *_OUTPUT_TAIL)))
            continue
        cls = 0
        region = _shm_window(params, f"{prefix}output '{o.name}'", shm)
        p = params.get("classification")
        if p is not None:
            cls = oneof_value(p)
            if not isinstance(cls, int) or isinstance(cls, bool) or cls < 0:
                raise TritonError.invalid_arg(
                    f"{prefix}'classification' of output '{o.name}' must be a non-negative int64_param"
                )
        result.append(RequestedOutput(o.name, None, cls, region))
    return tuple(result)


# -- ModelInfer response --------------------------------------------------------------------------
def encode_infer_response(request: InferRequest, response: InferResponse, model_version: int,
                          labels: dict[str, list[str]], batching: bool,
                          shm: SharedMemoryAccess | None = None) -> pb.ModelInferResponse:
    """Outputs in the model's order (only the requested ones), as ``raw_output_contents``; an output
    sent to shared memory is written there and gets an empty raw entry."""
    msg = pb.ModelInferResponse(model_name=request.model_name, model_version=str(model_version), id=request.id)
    add_output = msg.outputs.add
    raw: list[bytes] = []
    requested = request.outputs
    if requested is None:  # every output, as the model gave them (what selected_outputs yields)
        selected: Any = [(name, array, None) for name, array in response.outputs]
    else:
        selected = selected_outputs(request, response, labels, batching)
    for name, array, spec in selected:
        dtype = from_numpy(array.dtype)
        if dtype is None:
            raise TritonError.internal(f"unsupported output data type {array.dtype}")
        # tobytes() copies in C order whatever the array's layout: no ascontiguousarray first
        data = bytes_codec.serialize(array) if dtype is BYTES else array.tobytes()
        if spec is not None and spec.shm is not None:
            out = add_output(name=name, datatype=dtype.wire, shape=array.shape)
            set_parameters(out.parameters, write_output(shm, spec.shm, data, f"output '{name}'"))
            data = b""
        else:
            msg.MergeFromString(_output_header(name, dtype.wire, array.shape))
        raw.append(data)
    msg.raw_output_contents.extend(raw)  # one call into upb instead of one per output
    if response.parameters:
        set_parameters(msg.parameters, response.parameters)
    return msg


def encode_infer_response_bytes(request: InferRequest, response: InferResponse, model_version: int,
                                labels: dict[str, list[str]], batching: bool) -> bytes | None:
    """:func:`encode_infer_response`'s message, serialized, built as bytes from kept pieces (a fast path:
    the response's name, version and id fields, each output's entry, each raw entry's tag and length);
    None for a response it does not cover (parameters, an output to shared memory, BYTES outputs)."""
    if response.parameters:
        return None
    requested = request.outputs
    if requested is None:
        pairs: Any = response.outputs
    else:
        # outputs named without classification or shared memory (perf_analyzer names every output): a
        # filter by name, kept per requested tuple (a planned request's is the plan's), instead of the
        # generator's resumptions (87 bytecodes a request for add_sub's two)
        names = _PLAIN_NAMES.get(requested)
        if names is None:
            names = frozenset(o.name for o in requested) if all(
                not o.classification and o.shm is None for o in requested) else ()
            _PLAIN_NAMES.put(requested, names)
        if names:
            pairs = [pair for pair in response.outputs if pair[0] in names]
        else:
            pairs = []
            for name, array, spec in selected_outputs(request, response, labels, batching):
                if spec is not None and spec.shm is not None:
                    return None
                pairs.append((name, array))
    key = (request.model_name, model_version, request.id)
    head = _HEADS.get(key)
    if head is None:
        head = pb.ModelInferResponse(model_name=key[0], model_version=str(model_version), id=key[2]).SerializeToString()
        _HEADS.put(key, head)
    parts, raw = [head], []
    for name, array in pairs:
        # the output's entry and its raw entry's tag and length follow from its name, dtype and shape
        pieces = _PIECES.get((name, array.dtype, array.shape))
        if pieces is None:
            pieces = _pieces_of(name, array)
            if pieces is None:
                return None
        parts.append(pieces[0])
        raw += (pieces[1], array.tobytes())
    return b"".join(parts + raw)


_HEADS = fastpath.cache("v2_grpc.response_heads", 1024)  # serialized name, version and id of a response
_PIECES = fastpath.cache("v2_grpc.output_pieces", 4096)  # (name, dtype, shape) → (entry, raw entry's prefix)
_PLAIN_NAMES = fastpath.cache("v2_grpc.plain_outputs", 256)  # requested outputs → their names, () if not all plain
_RAW_OUT_SHORT = tuple(bytes((6 << 3 | 2, n)) for n in range(128))  # raw_output_contents' tag and a one-byte length


def _pieces_of(name: str, array: np.ndarray) -> tuple[bytes, bytes] | None:
    """An output's serialized ``outputs`` entry and its raw entry's tag and length (kept in ``_PIECES``);
    None for a BYTES output (its size is its contents')."""
    dtype = from_numpy(array.dtype)
    if dtype is None:
        raise TritonError.internal(f"unsupported output data type {array.dtype}")
    if dtype is BYTES:
        return None
    size = array.size * array.dtype.itemsize  # what tobytes() gives
    pieces = (_output_header(name, dtype.wire, array.shape), _RAW_OUT_SHORT[size] if size < 128 else _raw_out_prefix(size))
    _PIECES.put((name, array.dtype, array.shape), pieces)
    return pieces


def _raw_out_prefix(size: int) -> bytes:
    """raw_output_contents' tag (field 6, length-delimited) and ``size`` as a varint."""
    out = bytearray((6 << 3 | 2,))
    while size >= 0x80:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


# Serialized ``outputs`` entries (name, datatype, shape) → merged into a response: upb parses them in
# about half the time building the entry field by field takes. A plain memo of a pure function (any
# thread may fill it; dict get/set are atomic), emptied when it grows past what repeated shapes need.
_HEADERS = fastpath.cache("v2_grpc.output_headers", 4096)


def _output_header(name: str, wire: str, shape: tuple[int, ...]) -> bytes:
    key = (name, wire, shape)
    header = _HEADERS.get(key)
    if header is None:
        header = pb.ModelInferResponse(outputs=[pb.ModelInferResponse.InferOutputTensor(
            name=name, datatype=wire, shape=shape)]).SerializeToString()
        _HEADERS.put(key, header)
    return header


def set_parameters(target: Any, values: dict[str, Any]) -> None:
    """Fill a ``map<string, InferParameter>`` from plain Python values."""
    for key, value in values.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = str(value)


def stream_response(response: pb.ModelInferResponse, final: bool = True) -> pb.ModelStreamInferResponse:
    """One message on ``ModelStreamInfer``: every response says whether it is the last (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/decoupled_models.md)."""
    response.parameters["triton_final_response"].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=response)


def wants_empty_final(msg: pb.ModelInferRequest) -> bool:
    """Whether a flags-only final of a decoupled model is sent as an empty response (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/decoupled_models.md)."""
    p = msg.parameters.get(EMPTY_FINAL_RESPONSE)
    return p is not None and p.WhichOneof("parameter_choice") == "bool_param" and p.bool_param


def empty_response(request: InferRequest, model_version: int) -> pb.ModelInferResponse:
    return pb.ModelInferResponse(model_name=request.model_name, model_version=str(model_version), id=request.id)


def stream_error(msg: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """An error for one request on the stream; the stream itself goes on."""
    return pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(
        model_name=msg.model_name, model_version=msg.model_version, id=msg.id))


# -- everything else: the HTTP front end's JSON dicts, as messages ----------------------------------
def from_dict(message_type: type, data: dict[str, Any]) -> Any:
    """Build a message from the JSON form of it (statistics, metadata: same field names as HTTP)."""
    return json_format.ParseDict(data, message_type(), ignore_unknown_fields=False)


def repository_index(models: list[dict[str, Any]]) -> pb.RepositoryIndexResponse:
    msg = pb.RepositoryIndexResponse()
    for m in models:
        msg.models.add(name=m["name"], version=str(m.get("version", "")), state=m.get("state", ""),
                       reason=m.get("reason", ""))
    return msg


class LoadRequest(NamedTuple):
    """A ``RepositoryModelLoadRequest`` as the load takes it (:func:`decode_load_request`)."""

    repository_name: str
    model_name: str
    parameters: dict[str, Any]  # repository_parameters'; the data plane pops the config text from it


def decode_load_request(data: bytes | bytearray) -> LoadRequest:
    """A ``RepositoryModelLoadRequest``'s bytes → :class:`LoadRequest`, the message dropped here: its
    arena held the config override (up to 4 MiB) beside the text taken from it and all that is made of
    it, for the whole load (issue 23). A ``bytearray`` (a large message, the call's own buffer handed
    over: ``frontends/grpc_calls.py``) is emptied once parsed. A request naming a repository is refused
    on that alone (its parameters are not read), as before."""
    msg = pb.RepositoryModelLoadRequest.FromString(data)  # (upb reads a bytearray in place, not a copy)
    if type(data) is bytearray:
        data.clear()
    params = {} if msg.repository_name else repository_parameters(msg.parameters)
    return LoadRequest(msg.repository_name, msg.model_name, params)


def repository_parameters(params: Any) -> dict[str, Any]:
    """``RepositoryModelLoadRequest.parameters`` → the dict ``DataPlane.load_model`` takes:
    ``config`` as JSON text, ``file:<path>`` as bytes, anything else as its plain value."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        kind = p.WhichOneof("parameter_choice")
        value = oneof_value(p)
        if key == "config" and kind != "string_param":
            raise TritonError.invalid_arg("the 'config' parameter must be a string_param holding JSON")
        if key.startswith("file:") and kind != "bytes_param":
            raise TritonError.invalid_arg(f"the '{key}' parameter must be a bytes_param")
        out[key] = value
    return out
