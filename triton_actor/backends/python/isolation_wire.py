"""What the values of the Python backend look like inside isolation frames: plain tuples of numpy
arrays, strings and numbers, converted on each side of the pipe (pure functions, any thread).

Requests and results are rebuilt field by field rather than pickled as they are, so that what only
makes sense in one process (a request's response channel, a cancellation probe, the ``DType``
objects the server compares) never crosses, and fields the server adds later are not required here.

Server → model process: :func:`request_to_wire` / :func:`request_from_wire`; the model's process →
server: :func:`result_to_wire` / :func:`result_from_wire` and :func:`error_to_wire`. BLS travels the
other way round: ``pb_utils.InferenceRequest`` from the model, ``pb_utils.InferenceResponse`` back.
A traced request (OpenTelemetry) crosses as a number, its trace's token in the session
(``isolated_session._Session.hold_trace``): the model's ``request.trace()`` holds that number, a BLS request
given it brings it back, and the server makes that call a child of the caller's trace, as in process.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import Code, TritonError
from ...inference import InferInput, InferRequest, InferResponse, RequestedOutput
from ...protocol.dtypes import BY_ENUM_VALUE
from ..base import RESCHEDULE, Result
from . import triton_python_backend_utils as pb_utils

_RESCHEDULE_WIRE = ("reschedule",)


# -- tensors ----------------------------------------------------------------------------------------
def pack(array: np.ndarray) -> tuple[str, tuple[int, ...], Any]:
    """A tensor as its dtype, shape and raw bytes (a ``PickleBuffer`` of a contiguous array: no copy; large
    ones travel out of band). Pickling the ndarray itself costs ten times more (measured: 10 µs vs 0.8
    µs for a 4-element FP32 tensor). BYTES tensors are object arrays: pickled as they are (measured
    faster than the BYTES codec, docs/isolation.md)."""
    if array.dtype.hasobject:
        return ("O", array.shape, array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return (array.dtype.str, array.shape, pickle.PickleBuffer(array))


def unpack(packed: tuple[str, tuple[int, ...], Any]) -> np.ndarray:
    dtype, shape, data = packed
    if dtype == "O":
        return data
    return np.frombuffer(data, dtype).reshape(shape)  # writable when the buffer came out of band


# -- requests of execute() --------------------------------------------------------------------------
def request_to_wire(request: InferRequest, key: int | None, trace: int | None = None) -> tuple[Any, ...]:
    """Server: one request of a batch; ``key`` names its response channel (decoupled) or its cancellation
    (``("cancel", key)`` frames), else None; ``trace``: its trace's token, None when it is not traced."""
    inputs = [(t.name, t.dtype.enum_value, pack(t.data)) for t in request.inputs.values()]
    outputs = None if request.outputs is None else [o.name for o in request.outputs]
    return (request.model_name, request.model_version, request.id, inputs, outputs, request.parameters,
            request.timeout_us, request.correlation_id, request.flags, key, trace)


def request_from_wire(wire: tuple[Any, ...], attach: Callable[[int], tuple[Any, Any]]) -> InferRequest:
    """Model process: the request as ``PythonInstance.execute`` takes it; ``attach(key)`` gives the
    ``(responses, is_cancelled)`` of a request with a key: the stand-in response channel of a decoupled
    request, or the cancellation flag of another one."""
    model_name, version, request_id, inputs, outputs, parameters, timeout_us, correlation_id, flags, key, trace = wire
    tensors = {}
    for name, dtype, packed in inputs:
        data = unpack(packed)
        tensors[name] = InferInput(name, BY_ENUM_VALUE[dtype], data.shape, data)
    requested = None if outputs is None else tuple(RequestedOutput(n) for n in outputs)
    responses, is_cancelled = (None, None) if key is None else attach(key)
    # trace: the token, as request.trace() hands it to a BLS request (pb_request_to_wire sends it back)
    return InferRequest(model_name, version, request_id, tensors, requested, parameters, False, 0, timeout_us,
                        correlation_id, flags, responses, is_cancelled, trace)


# -- results ----------------------------------------------------------------------------------------
def error_to_wire(error: TritonError) -> tuple[Any, ...]:
    return ("error", int(error.code), error.message)


def result_to_wire(result: Result | Any) -> tuple[Any, ...] | None:
    """Model process: one result of ``PythonInstance.execute`` (or an item a decoupled model sent)."""
    if result is None:
        return None
    if result is RESCHEDULE:
        return _RESCHEDULE_WIRE
    if isinstance(result, TritonError):
        return error_to_wire(result)
    return ("response", [(name, pack(array)) for name, array in result.outputs], result.parameters)


def result_from_wire(wire: tuple[Any, ...] | None) -> Any:
    """Server: what :func:`result_to_wire` sent, as the server's own values."""
    if wire is None:
        return None
    kind = wire[0]
    if kind == "response":
        return InferResponse([(name, unpack(packed)) for name, packed in wire[1]], wire[2])
    if kind == "error":
        return TritonError(Code(wire[1]), wire[2])
    if kind == "reschedule":
        return RESCHEDULE
    raise ValueError(f"unknown result kind {kind!r}")


# -- BLS --------------------------------------------------------------------------------------------
def _tensors_to_wire(tensors: list[Any]) -> list[tuple[str, int, Any]]:
    return [(t._name, t._triton_dtype, pack(t._array)) for t in tensors]


def _tensors_from_wire(wire: list[tuple[str, int, Any]]) -> list[Any]:
    return [pb_utils.Tensor._trusted(name, unpack(packed), dtype) for name, dtype, packed in wire]


def pb_request_to_wire(request: Any) -> tuple[Any, ...]:
    """Model process: a ``pb_utils.InferenceRequest`` the model runs through BLS."""
    memory = request.preferred_memory()
    trace = request._trace._span_trace if request._trace is not None else None  # the token of request.trace()
    return (request.request_id(), request.correlation_id(), _tensors_to_wire(request.inputs()),
            list(request.requested_output_names()), request.model_name(), request.model_version(),
            request.flags(), request.timeout(), request._parameters,
            None if memory is None else (memory.memory_type, memory.device_id),
            trace if type(trace) is int else None)


def pb_request_from_wire(wire: tuple[Any, ...], trace_of: Callable[[int], Any] | None = None) -> Any:
    """Server: the model's BLS request, rebuilt for the server's own ``InferenceRequest.exec``;
    ``trace_of(token)``: the trace a token stands for (None once its request is answered)."""
    request_id, correlation_id, inputs, names, model, version, flags, timeout, parameters, memory, trace = wire
    extra: dict[str, Any] = {} if memory is None else {"preferred_memory": pb_utils.PreferredMemory(*memory)}
    span_trace = trace_of(trace) if trace is not None and trace_of is not None else None
    if span_trace is not None:
        extra["trace"] = pb_utils.InferenceTrace(span_trace)
    return pb_utils.InferenceRequest(
        request_id=request_id, correlation_id=correlation_id, inputs=_tensors_from_wire(inputs),
        requested_output_names=names, model_name=model, model_version=version, flags=flags, timeout=timeout,
        parameters=parameters, **extra)


def pb_response_to_wire(response: Any) -> tuple[Any, ...]:
    """Server: a BLS answer."""
    error = response.error()
    return (_tensors_to_wire(response.output_tensors()),
            None if error is None else (error.message(), int(error.code())), response._parameters)


def pb_response_from_wire(wire: tuple[Any, ...]) -> Any:
    """Model process: the BLS answer as the model would have got it in-process."""
    outputs, error, parameters = wire
    return pb_utils.InferenceResponse(_tensors_from_wire(outputs),
                                      None if error is None else pb_utils.TritonError._of(*error), parameters)


def call_answer(message: tuple[Any, ...]) -> Any:
    """Model process: the value of a ``("call_reply", id, answer)``; a refusal is raised as the model
    would see it in-process."""
    answer = message[2]
    if answer[0] == "raise":
        raise pb_utils.TritonModelException(answer[1])
    return answer[1]
