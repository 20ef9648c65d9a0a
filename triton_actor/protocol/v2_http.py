"""KServe V2 REST inference payloads with Triton's binary tensor extension (https://github.com/kserve/kserve/blob/master/docs/predict-api/v2/required_api.md, https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md).

Sans-I/O: bytes in, :class:`InferRequest` out (responses, :class:`InferResponse` in, bytes out, are
:mod:`.v2_http_response`'s). No web framework here. Error texts follow Triton's ``http_server.cc`` so
clients see the same messages.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import orjson

from ..errors import TritonError
from ..inference import InferInput, InferRequest, RequestedOutput
from ..runtime import fastpath
from . import bytes_codec
from .dtypes import BF16, BF16_NUMPY, BY_WIRE, BYTES, DType
from .shm_windows import parse_window
from .tensor_shapes import element_count, json_shape_error

if TYPE_CHECKING:
    from .shm_windows import SharedMemoryAccess

# Request parameters Triton consumes itself; everything else (except triton_*) goes to the model.
_CONSUMED = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"})
SEQUENCE_START, SEQUENCE_END = 1, 2


def _loads(buf: bytes | memoryview) -> Any:
    try:
        return orjson.loads(buf)
    except orjson.JSONDecodeError as e:
        # Triton answers JSON syntax errors with INTERNAL (HTTP 500); we mirror it.
        raise TritonError.internal(f"failed to parse the request JSON buffer: {e}") from None


def parse_header_length(value: str | None) -> int | None:
    """``Inference-Header-Content-Length``: None when absent."""
    if value is None:
        return None
    value = value.strip(" \t")
    # ASCII digits only, as Content-Length (RFC 9112): int() would also take "+5", "1_0" and other scripts' digits
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise TritonError.invalid_arg("Unable to parse Inference-Header-Content-Length")
    return int(value)


# an Inference-Header-Content-Length text of a request decoded from a plan, parsed (decode_planned)
_LENGTHS = fastpath.cache("v2_http.header_lengths", 256)


class _Plan(NamedTuple):
    """What a JSON inference header says, for a header whose inputs are all plain binary tensors:
    (name, numpy dtype, dtype, shape, count, offset after the header, one-dimensional) per input."""

    rid: str
    inputs: tuple[tuple[str, np.dtype, DType, tuple[int, ...], int, int, bool], ...]
    size: int  # bytes of binary data after the header
    outputs: tuple[RequestedOutput, ...] | None
    params: dict[str, Any]
    tail: tuple[Any, ...]  # InferRequest's fields after ``parameters``


# A client repeating a request sends the same JSON header each time (perf_analyzer, a tritonclient
# loop): a header decoded once is kept (by its bytes) as a plan, so the steady state only slices the
# binary part. Nothing in a plan depends on a model: validation runs on every request as before.
_PLANS = fastpath.cache("v2_http.plans", 256)
_PLAN_HEADER_MAX = 4096


def decode_infer_request(body: bytes, header_length: int | None, model_name: str, model_version: int,
                         shm: SharedMemoryAccess | None = None,
                         known_inputs: Container[str] | None = None) -> InferRequest:
    """Decode an ``/infer`` body; binary tensors become zero-copy views of ``body``; tensors naming a
    system shared-memory region are read from ``shm``. ``known_inputs``: the model's input names
    (read only for a request with many inputs, see :func:`refuse_unknown_inputs`)."""
    key = None
    if header_length is not None and 0 < header_length <= _PLAN_HEADER_MAX and header_length <= len(body):
        key = bytes(body[:header_length])
        plan = _PLANS.get(key)
        if plan is not None and header_length + plan.size == len(body):
            return _from_plan(plan, body, header_length, model_name, model_version)
    request, header = _decode(body, header_length, model_name, model_version, shm, known_inputs)
    if key is not None:
        plan = _plan_of(header, request)
        if plan is not None:
            _PLANS.put(key, plan)
            _LENGTHS.put(str(header_length), header_length)
    return request


def decode_planned(body: bytes, header_length: str | None, model_name: str, model_version: int) -> InferRequest | None:
    """:func:`decode_infer_request` of an identity body from a kept plan, given the request's
    ``Inference-Header-Content-Length`` as sent; None (always, while fast paths are off) when its header
    was not planned before: decode it the regular way, which plans it."""
    hl = _LENGTHS.get(header_length)
    if hl is None:
        return None
    plan = _PLANS.get(bytes(body[:hl]))
    if plan is None or hl + plan.size != len(body):
        return None
    return _from_plan(plan, body, hl, model_name, model_version)


def planned(body: bytes, header_length: int | None) -> bool:
    """Whether ``body`` was decoded from a kept plan: plain binary tensors in the body, nothing read
    from shared memory, so the same bytes always decode to the same request."""
    return header_length is not None and 0 < header_length <= _PLAN_HEADER_MAX and header_length <= len(body) \
        and _PLANS.get(bytes(body[:header_length])) is not None


assert InferInput._fields == ("name", "dtype", "shape", "data")
assert InferRequest._fields[:6] == ("model_name", "model_version", "id", "inputs", "outputs", "parameters")


def _from_plan(plan: _Plan, body: bytes, offset: int, model_name: str, model_version: int) -> InferRequest:
    inputs = {}
    frombuffer, new_tuple = np.frombuffer, fastpath.new_tuple
    for name, np_dtype, dtype, shape, count, at, flat in plan.inputs:
        data = frombuffer(body, np_dtype, count, offset + at)
        inputs[name] = new_tuple(InferInput, (name, dtype, shape, data if flat else data.reshape(shape)))
    params = dict(plan.params) if plan.params else {}
    return fastpath.new_tuple(InferRequest, (model_name, model_version, plan.rid, inputs, plan.outputs, params, *plan.tail))


def _plan_of(header: dict[str, Any], request: InferRequest) -> _Plan | None:
    """The plan of a header just decoded (its inputs are the header's, in order: duplicates were
    refused), or None when the fast path would not reproduce it (JSON data, shared memory, BYTES/BF16,
    empty or oddly sized tensors)."""
    planned, total = [], 0
    for item, tensor in zip(header["inputs"], request.inputs.values(), strict=True):
        params = item.get("parameters")
        if params.__class__ is not dict or "data" in item or "shared_memory_region" in params:
            return None
        size = params.get("binary_data_size")
        dtype = tensor.dtype
        count = tensor.data.size
        if size.__class__ is not int or dtype is BYTES or dtype is BF16 or not count or size != count * dtype.itemsize:
            return None
        planned.append((tensor.name, dtype.numpy, dtype, tensor.shape, count, total, len(tensor.shape) == 1))
        total += size
    if request.outputs is not None and any(o.shm is not None for o in request.outputs):
        return None
    return _Plan(request.id, tuple(planned), total, request.outputs, request.parameters, tuple(request[6:]))


def _decode(body: bytes, header_length: int | None, model_name: str, model_version: int,
            shm: SharedMemoryAccess | None,
            known_inputs: Container[str] | None = None) -> tuple[InferRequest, dict[str, Any]]:
    if header_length is None:
        header, binary, offset = _loads(body), body, len(body)
    else:
        if header_length > len(body):
            raise TritonError.invalid_arg(
                f"inference header size should be in range (0, {len(body)}), got: {header_length}"
            )
        header, binary, offset = _loads(memoryview(body)[:header_length]), body, header_length
    if not isinstance(header, dict):
        raise TritonError.invalid_arg("request JSON must be an object")
    rid = header.get("id", "")
    if not isinstance(rid, str):
        raise TritonError.invalid_arg("request 'id' must be a string")
    prefix = f"[request id: {rid or '<id_unknown>'}] "
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise TritonError.internal(
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
            if raw_inputs is None
            else "Unable to parse 'inputs': 'inputs' must be an array"
        )
    if len(raw_inputs) > MANY_INPUTS and known_inputs is not None:
        refuse_unknown_inputs([i.get("name") if isinstance(i, dict) else None for i in raw_inputs],
                              known_inputs, model_name, prefix)
    inputs: dict[str, InferInput] = {}
    for item in raw_inputs:
        tensor, offset = _decode_input(item, binary, offset, model_name, prefix, shm)
        if tensor.name in inputs:
            raise TritonError.invalid_arg(f"{prefix}input '{tensor.name}' already exists in request")
        inputs[tensor.name] = tensor
    if offset != len(body):
        raise TritonError.invalid_arg(f"unexpected additional input data for model '{model_name}'")
    params, kwargs = _decode_parameters(header.get("parameters"), prefix)
    outputs = _decode_outputs(header.get("outputs"), prefix, shm)
    return InferRequest(model_name, model_version, rid, inputs, outputs, params, **kwargs), header


MANY_INPUTS = 16  # more inputs than this in one request: checked against the model's names first


def refuse_unknown_inputs(names: list[Any], known: Container[str] | None, model_name: str, prefix: str) -> None:
    """A request naming more inputs than the model has names one it does not have (or one twice):
    refuse the first unknown name before any tensor is converted, with the validator's answer. Each
    input costs tens of microseconds of conversion: 400,000 one-element inputs in 24 MB of JSON took
    4.4 s, and their objects' garbage collection held other clients up to 1.5 s, to be refused after.
    Fewer inputs than :data:`MANY_INPUTS` are not looked up (no cost on the common path)."""
    if known is None or len(names) <= len(known):
        return
    for name in names:
        if isinstance(name, str) and name not in known:
            raise TritonError.invalid_arg(f"{prefix}unexpected inference input '{name}' for model '{model_name}'")


def _decode_input(item: Any, body: bytes, offset: int, model_name: str, prefix: str,
                  shm: SharedMemoryAccess | None) -> tuple[InferInput, int]:
    if not isinstance(item, dict):
        raise TritonError.invalid_arg(prefix + "each entry of 'inputs' must be an object")
    name, wire, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str):
        raise TritonError.invalid_arg(prefix + "input is missing a string 'name'")
    dtype = BY_WIRE.get(wire) if isinstance(wire, str) else None
    if dtype is None:
        raise TritonError.invalid_arg(f"{prefix}invalid datatype '{wire}' for input '{name}'")
    count = element_count(shape) if shape.__class__ is list else None
    if count is None:
        raise json_shape_error(shape, dtype, name, prefix)
    shape_t = tuple(shape)
    params = item.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    window = _shm_window(params, f"{prefix}input '{name}'", shm)
    if window is not None:
        if "data" in item or size is not None:
            raise TritonError.invalid_arg(f"{prefix}input '{name}' has both shared memory and other data")
        buf = shm.read(*window, f"{prefix}input '{name}'")  # type: ignore[union-attr]
        return InferInput(name, dtype, shape_t, tensor_from_bytes(buf, dtype, shape_t, count, name, model_name, prefix)), offset
    if size is not None:
        if "data" in item:
            raise TritonError.invalid_arg(f"{prefix}input '{name}' has both 'data' and 'binary_data_size'")
        if type(size) is not int or size < 0 or offset + size > len(body):  # JSON true is no size
            raise TritonError.invalid_arg(
                f"unexpected size for input '{name}', expecting {len(body) - offset} additional bytes "
                f"for model '{model_name}'"
            )
        if dtype is BYTES or dtype is BF16 or size != count * dtype.itemsize:
            data = tensor_from_bytes(memoryview(body)[offset : offset + size], dtype, shape_t, count, name, model_name, prefix)
        else:  # the common case: a zero-copy view of the body
            data = np.frombuffer(body, dtype=dtype.numpy, count=count, offset=offset)
            if len(shape_t) != 1:
                data = data.reshape(shape_t)
        return InferInput(name, dtype, shape_t, data), offset + size
    if "data" not in item:
        raise TritonError.invalid_arg(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            "'shared_memory_region' in 'parameters'. But no field is set"
        )
    data = _from_json(item["data"], dtype, shape_t, count, name, prefix)
    return InferInput(name, dtype, shape_t, data), offset


def tensor_from_bytes(
    buf: bytes | memoryview, dtype: DType, shape: tuple[int, ...], count: int, name: str, model: str, prefix: str
) -> np.ndarray:
    """One input's raw bytes (HTTP binary extension, gRPC ``raw_input_contents``) as an array view."""
    if dtype is BYTES:
        return bytes_codec.deserialize(buf, count, f"{prefix}input '{name}'").reshape(shape)
    expected = count * dtype.itemsize
    if len(buf) != expected:
        raise TritonError.invalid_arg(
            f"{prefix}input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {len(buf)}"
        )
    if dtype is BF16:
        return np.frombuffer(buf, dtype=BF16_NUMPY).reshape(shape)  # raw bit patterns; no numpy bf16
    return np.frombuffer(buf, dtype=dtype.numpy).reshape(shape)


_NO_ID = "[request id: <id_unknown>] "  # Triton's LogRequest() for a request without an id (a raw one has none)

# JSON 'data' nested deeper than this is refused, not recursed: Triton's HTTP_MAX_JSON_NESTING_DEPTH and its words
_MAX_NESTING = 100


def _flatten(data: list[Any], out: list[Any], name: str) -> None:
    """Row-major elements of nested lists, without recursion (a client controls the depth)."""
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                if len(stack) >= _MAX_NESTING:
                    raise TritonError.invalid_arg(
                        f"Unable to parse 'data' of input '{name}': JSON nesting depth exceeds maximum allowed "
                        f"limit ({_MAX_NESTING})")
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()


def _from_json(data: Any, dtype: DType, shape: tuple[int, ...], count: int, name: str, prefix: str) -> np.ndarray:
    if dtype.wire in ("FP16", "BF16"):
        raise TritonError.invalid_arg(
            f"receiving {dtype.wire} data via JSON is not supported. Please use the binary data format for input {name}"
        )
    if fastpath.enabled and type(data) is list and dtype is not BYTES and dtype.wire != "BOOL":
        flat_numbers = _flat_numbers(data, dtype, shape, count, name)
        if flat_numbers is not None:
            return flat_numbers.reshape(shape)
    flat: list[Any] = []
    if isinstance(data, list):
        _flatten(data, flat, name)
    else:
        flat.append(data)
    if len(flat) != count:
        raise _shape_mismatch(name, shape, count, len(flat))
    try:
        if dtype is BYTES:
            arr = np.empty(count, dtype=np.object_)
            arr[:] = [x.encode("utf-8") if isinstance(x, str) else _not_str(x) for x in flat]
        elif dtype.wire == "BOOL":
            if not set(map(type, flat)) <= _BOOLEANS:
                raise TypeError("expected JSON booleans")
            arr = np.array(flat, dtype=np.bool_)
        else:
            if not set(map(type, flat)) <= _NUMBERS:  # JSON gives exact types: no subclasses to miss
                raise TypeError("expected JSON numbers")
            with np.errstate(over="ignore"):  # see _NUMBERS
                arr = np.array(flat, dtype=dtype.numpy)
    except (TypeError, ValueError, OverflowError) as e:
        raise TritonError.internal(f"Unable to parse 'data': input '{name}' of type {dtype.wire}: {e}") from None
    return arr.reshape(shape)


_NUMBERS = frozenset({int, float})
# A JSON number beyond FP32's range becomes +-inf, as Triton's double-to-float store gives; numpy's
# overflow warning (once per process, without the request) is not an error here. (A fresh errstate
# each time: one instance entered by two threads at once restores the wrong state.)
SLICE = 1 << 18  # elements converted per C call: a decode on a native thread lets the hub in between


def _flat_numbers(data: list[Any], dtype: DType, shape: tuple[int, ...], count: int, name: str) -> np.ndarray | None:
    """A flat list of JSON numbers converted by C loops (type checks, then numpy) in slices of
    ``SLICE`` elements, so no single call holds the interpreter long; None when ``data`` is nested
    or holds anything but numbers (the general path then says what is wrong). A fast path: the
    general path gives the same answers."""
    n = len(data)
    for i in range(0, n, SLICE):
        if not set(map(type, data[i:i + SLICE])) <= _NUMBERS:
            return None
    if n != count:
        raise _shape_mismatch(name, shape, count, n)
    out = np.empty(n, dtype=dtype.numpy)
    try:
        with np.errstate(over="ignore"):  # see _NUMBERS
            for i in range(0, n, SLICE):
                out[i:i + SLICE] = data[i:i + SLICE]
    except (TypeError, ValueError, OverflowError) as e:
        raise TritonError.internal(f"Unable to parse 'data': input '{name}' of type {dtype.wire}: {e}") from None
    return out
_BOOLEANS = frozenset({bool})


def _shape_mismatch(name: str, shape: tuple[int, ...], count: int, got: int) -> TritonError:
    # Triton: INTERNAL (HTTP 500) with this text; we add the counts.
    return TritonError.internal(
        f"Unable to parse 'data': Shape does not match true shape of 'data' field "
        f"(input '{name}': shape {list(shape)} has {count} elements, 'data' has {got})"
    )


def _not_str(x: Any) -> bytes:
    raise TypeError(f"expected JSON strings, got {type(x).__name__}")


def _decode_parameters(params: Any, prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if params is None:
        return {}, {}
    if not isinstance(params, dict):
        raise TritonError.invalid_arg(prefix + "'parameters' must be an object")
    forwarded: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    flags = 0
    for key, value in params.items():
        if key.startswith("triton_"):
            raise TritonError.invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        if key not in _CONSUMED:
            if not isinstance(value, str | int | float | bool):
                raise TritonError.invalid_arg(f"{prefix}parameter '{key}' must be a string, number or boolean")
            forwarded[key] = value
        elif key == "binary_data_output":
            kwargs["binary_output"] = _bool(value, key, prefix)
        elif key == "sequence_id":
            if not isinstance(value, int | str) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
                # Triton reads a uint64, else a string: its JSON parser's words, as INTERNAL (HTTP 500)
                raise TritonError.internal("Unable to parse 'sequence_id': attempt to access JSON non-string as string")
            kwargs["correlation_id"] = value
        elif key in ("sequence_start", "sequence_end"):
            if not isinstance(value, bool):
                raise TritonError.internal(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
            flags |= (SEQUENCE_START if key == "sequence_start" else SEQUENCE_END) if value else 0
        else:  # priority, timeout
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TritonError.invalid_arg(f"{prefix}'{key}' must be an unsigned integer")
            kwargs["priority" if key == "priority" else "timeout_us"] = value
    if flags:
        kwargs["flags"] = flags
    return forwarded, kwargs


def _bool(value: Any, key: str, prefix: str) -> bool:
    if not isinstance(value, bool):
        raise TritonError.invalid_arg(f"{prefix}'{key}' must be a boolean")
    return value


def _shm_window(params: Any, what: str, shm: SharedMemoryAccess | None) -> tuple[str, int, int] | None:
    if not isinstance(params, dict) or "shared_memory_region" not in params:
        return None
    if shm is None:
        raise TritonError.unsupported(f"{what}: shared memory is not available on this endpoint")
    return parse_window(params["shared_memory_region"], params.get("shared_memory_offset"),
                        params.get("shared_memory_byte_size"), what)


def _decode_outputs(outputs: Any, prefix: str, shm: SharedMemoryAccess | None) -> tuple[RequestedOutput, ...] | None:
    if outputs is None:
        return None
    if not isinstance(outputs, list):
        raise TritonError.invalid_arg(prefix + "'outputs' must be an array")
    result = []
    for item in outputs:
        if item.__class__ is not dict or item.get("name").__class__ is not str:
            raise TritonError.invalid_arg(prefix + "each entry of 'outputs' must be an object with a 'name'")
        params = item.get("parameters")
        if not params:
            result.append(RequestedOutput(item["name"]))
            continue
        if params.__class__ is not dict:
            raise TritonError.invalid_arg(prefix + f"'parameters' of output '{item['name']}' must be an object")
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise TritonError.invalid_arg(prefix + f"'binary_data' of output '{item['name']}' must be a boolean")
        cls = params.get("classification", 0)
        if not isinstance(cls, int) or isinstance(cls, bool) or cls < 0:
            raise TritonError.invalid_arg(
                prefix + f"'classification' of output '{item['name']}' must be a non-negative integer"
            )
        window = _shm_window(params, f"{prefix}output '{item['name']}'", shm)
        result.append(RequestedOutput(item["name"], binary, cls, window))
    return tuple(result)


def decode_raw_request(
    body: bytes, spec: tuple[str, DType, tuple[int, ...], int], model_name: str, model_version: int
) -> InferRequest:
    """``Inference-Header-Content-Length: 0``: the whole body is the model's only input (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_binary_data.md).

    ``spec`` is (input name, dtype, config dims, max_batch_size). A batching model gets batch 1; at most
    one variable dimension is allowed (filled from the body size); every output comes back binary.
    """
    name, dtype, dims, max_batch = spec
    variable = [i for i, d in enumerate(dims) if d < 0]
    if len(variable) > 1:  # Triton core's words (InferenceRequest::Normalize), as the others here
        raise TritonError.invalid_arg(f"{_NO_ID}The shape of the raw input '{name}' can not be deduced because there "
                                      "are more than one variable-sized dimension")
    if dtype is BYTES:
        if list(dims) != [1]:
            raise TritonError.invalid_arg(
                f"{_NO_ID}For BYTE datatype raw input '{name}', the model must have input shape [1]")
        data = np.empty(1, dtype=np.object_)
        data[0] = bytes(body)
        shape: tuple[int, ...] = (1,)
    else:
        known = 1
        for d in dims:
            known *= d if d > 0 else 1
        elements, rest = divmod(len(body), dtype.itemsize)
        if rest or (variable and elements % known) or (not variable and elements != known):
            raise TritonError.invalid_arg(
                f"raw binary request for model '{model_name}': {len(body)} bytes do not form input '{name}' "
                f"of type {dtype.wire} and dims {list(dims)}"
            )
        shape = tuple(elements // known if d < 0 else d for d in dims)
        data = tensor_from_bytes(memoryview(body), dtype, shape, elements, name, model_name, "")
    if max_batch > 0:
        shape = (1, *shape)
        data = data.reshape(shape)
    tensor = InferInput(name, dtype, shape, data)
    return InferRequest(model_name, model_version, "", {name: tensor}, None, {}, binary_output=True)
