"""``pb_utils.InferenceRequest``: what ``execute`` receives (and what a model builds for BLS), with its
options ``PreferredMemory`` and ``InferenceTrace``, and ``get_input_tensor_by_name``.

Owner: the server builds one request per client request on the instance's native thread
(``InferenceRequest._served``, hot path: no copying, no JSON, one call) and hands it to ``execute``; after
that the model owns it, and may use it from threads it started (``get_response_sender``,
``is_cancelled``). The server sets ``_response_sender`` / ``_cancelled`` (decoupled models) or a
``_sender_factory`` (others), and reads ``_release_flags`` after ``execute`` (rescheduling).
Failure: constructor arguments Triton's pybind11 would not convert raise its plain ``TypeError``, the
stub's own checks ``TritonModelException``; ``exec`` / ``async_exec`` go through ``server_calls`` and raise
``TritonModelException`` while no server wired BLS (a model used outside the server).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from . import server_calls
from .constants import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_RELEASE_ALL,
)
from .errors import TritonModelException, _ArgValueError
from .parameters import JsonParameters, check_parameters
from .pybind_args import INT64, UINT32, UINT64, as_str, incompatible, is_int, is_list_of, is_str, pybind_repr
from .tensor import Tensor, _InputTensor


class PreferredMemory:
    """Where BLS outputs should be placed (``TRITONSERVER_MEMORY_*`` and a device id)."""

    def __init__(self, memory_type: int, device_id: int = 0) -> None:
        if memory_type not in (
            TRITONSERVER_MEMORY_CPU,
            TRITONSERVER_MEMORY_CPU_PINNED,
            TRITONSERVER_MEMORY_GPU,
        ):
            raise _ArgValueError(f"unknown preferred memory type {memory_type!r}")
        self.memory_type = int(memory_type)
        self.device_id = int(device_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PreferredMemory):
            return NotImplemented
        return (self.memory_type, self.device_id) == (other.memory_type, other.device_id)

    def __hash__(self) -> int:
        return hash((self.memory_type, self.device_id))

    def __repr__(self) -> str:
        return f"PreferredMemory({self.memory_type}, device_id={self.device_id})"


class InferenceTrace:
    """A request's trace handle (``request.trace()``): given to a BLS request (``trace=``), it makes that
    request's spans children of this request's, as Triton's (OpenTelemetry mode; otherwise nothing)."""

    __slots__ = ("_span_trace",)

    def __init__(self, span_trace: Any = None) -> None:
        self._span_trace = span_trace  # the server's (observability/otel.py SpanTrace), None: not traced

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """Return the trace context (None here: not passed on as text)."""
        return None


_NO_TRACE = InferenceTrace()
_new = object.__new__
_DEFAULT_MEMORY = PreferredMemory(TRITONSERVER_MEMORY_CPU)  # shown as the default in pybind11's signature

# the constructor's parameters as Triton binds them (pb_stub.cc), in its order
_PARAMS = ("request_id", "correlation_id", "inputs", "requested_output_names", "model_name", "model_version",
           "flags", "timeout", "preferred_memory", "trace", "parameters")
_PARAM_SET = frozenset(_PARAMS)


def _tensor_or_none(item: Any) -> bool:
    return item is None or isinstance(item, Tensor)  # a shared_ptr: None converts (the stub refuses it later)


def _incompatible(args: tuple[Any, ...], kwargs: dict[str, Any]) -> TypeError:
    signature = (
        "c_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, inputs: "
        "List[triton::backend::python::PbTensor], requested_output_names: List[str], model_name: str, "
        "model_version: int = -1, flags: int = 0, timeout: int = 0, preferred_memory: "
        f"c_python_backend_utils.PreferredMemory = {pybind_repr(_DEFAULT_MEMORY)}, trace: "
        f"c_python_backend_utils.InferenceTrace = {pybind_repr(_NO_TRACE)}, parameters: object = None)")
    return incompatible("__init__", signature, args, kwargs.items(), constructor=True)


class InferenceRequest(JsonParameters):
    """A request given to ``execute`` or built by a model for BLS.

    The server builds requests with this constructor too and then sets
    ``_response_sender`` and ``_cancelled``; construction does no copying or JSON work.
    """

    # Defaults of what a request rarely changes: instances store only what differs, which keeps the
    # per-request construction short (the server builds one per request, see ``_served``).
    _preferred_memory: PreferredMemory | None = None
    _trace: InferenceTrace | None = None
    # The inputs, held twice at most and each built when first needed: ``_inputs`` in the given order
    # (None: a served request, built from the index by ``inputs()``) and ``_input_map``, name to tensor,
    # the first of a name winning (None: built by the first lookup). Neither changes after construction:
    # ``inputs()`` hands out a copy, as Triton's pybind11 converts the vector to a new list each call.
    _inputs: list[Tensor] | None = None
    _input_map: dict[str, Tensor] | None = None
    _requested_output_names: list[str] | None = None  # None: a served request, listed from _outputs_asked
    _outputs_asked: Any = None  # a served request's RequestedOutput tuple (None: every output)
    _release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
    _response_sender: Any = None
    # neither a response sender asked for nor release flags set: the server takes the response ``execute``
    # returned as it is (backend.py's ``_execute_one``); stored only when False
    _untouched = True
    _sender_factory: Callable[[InferenceRequest], Any] | None = None
    _cancelled: Any = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """``InferenceRequest(request_id="", correlation_id=0, inputs, requested_output_names, model_name,
        model_version=-1, flags=0, timeout=0, preferred_memory=..., trace=..., parameters=None)``.
        Arguments pybind11 would not convert raise its ``TypeError`` (None included); then the stub's
        checks (parameters, correlation id, empty inputs and output names) raise ``TritonModelException``,
        in its order. Bound by hand so that the error shows the call as pybind11 does. Triton requires
        ``inputs``, ``requested_output_names`` and ``model_name``; here they may be left out (no inputs,
        every output, the model's own name is not assumed: ""), as this server always allowed."""
        values = dict(zip(_PARAMS, args, strict=False))  # past the end: refused below
        if len(args) > len(_PARAMS) or any(k not in _PARAM_SET or k in values for k in kwargs):
            raise _incompatible(args, kwargs)
        values.update(kwargs)
        get = values.get
        request_id, correlation_id = get("request_id", ""), get("correlation_id", 0)
        inputs, names, model_name = get("inputs", ()), get("requested_output_names", ()), get("model_name", "")
        model_version, flags, timeout = get("model_version", -1), get("flags", 0), get("timeout", 0)
        preferred_memory, trace = get("preferred_memory"), get("trace")
        if not (is_str(request_id) and correlation_id is not None and is_list_of(inputs, _tensor_or_none)
                and is_list_of(names, is_str) and is_str(model_name) and is_int(model_version, *INT64)
                and is_int(flags, *UINT32) and is_int(timeout, *UINT64)
                and ("preferred_memory" not in values or isinstance(preferred_memory, PreferredMemory))
                and ("trace" not in values or isinstance(trace, InferenceTrace))):
            raise _incompatible(args, kwargs)
        parameters = get("parameters")
        if parameters is not None:
            check_parameters(parameters, allow_float=True)
        request_id, model_name = as_str(request_id), as_str(model_name)
        if isinstance(correlation_id, int):
            if not 0 <= correlation_id < 2**64:  # pybind11's cast to uint64_t
                raise RuntimeError("Unable to cast Python instance to C++ type (#define "
                                   "PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)")
            correlation_id = int(correlation_id)
        elif not isinstance(correlation_id, str):
            raise TritonModelException("Correlation ID must be integer or string")
        if any(t is None for t in inputs):
            raise TritonModelException(f"Input tensor for request with id '{request_id}' and model name "
                                       f"'{model_name}' should not be empty.")
        if any(not n for n in names):
            raise TritonModelException(f"Requested output name for request with id '{request_id}' and model name "
                                       f"'{model_name}' should not be empty.")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)  # pybind11 copies into a vector: the caller's list may change later
        self._requested_output_names = [as_str(n) for n in names]
        self._model_name = model_name
        self._model_version = operator.index(model_version)
        self._flags = operator.index(flags)
        self._timeout = operator.index(timeout)
        if preferred_memory is not None:
            self._preferred_memory = preferred_memory
        if trace is not None:
            self._trace = trace
        self._parameters = parameters

    @classmethod
    def _served(cls, request: Any, sender_factory: Callable[[InferenceRequest], Any] | None = None
                ) -> InferenceRequest:
        """The server's constructor for a request given to ``execute`` (hot path, one call): ``request`` is
        the server's ``InferRequest`` (validated; its inputs are unique names); the tensors share its
        arrays and the name index is built with them; parameters are checked only when there are some,
        as the constructor would."""
        parameters = request.parameters
        if parameters:
            check_parameters(parameters, allow_float=True)
        index = {}
        for name, given in request.inputs.items():
            tensor = _new(Tensor)
            tensor._name = name
            tensor._array = given.data
            tensor._triton_dtype = given.dtype.enum_value
            index[name] = tensor
        served = _new(cls)
        served._input_map = index
        served._request_id = request.id
        served._correlation_id = request.correlation_id
        served._outputs_asked = request.outputs  # names listed when the model asks (requested_output_names)
        served._model_name = request.model_name
        served._model_version = request.model_version
        served._flags = request.flags
        served._timeout = request.timeout_us
        served._parameters = parameters
        if sender_factory is not None:
            served._sender_factory = sender_factory
        cancelled = request.is_cancelled
        if cancelled is not None:
            served._cancelled = cancelled
        trace = request.trace
        if trace is not None:  # OpenTelemetry: request.trace() hands it to the model's BLS requests
            served._trace = InferenceTrace(trace)
        return served

    def inputs(self) -> list[Tensor]:
        """Return the input tensors (a new list each call, as Triton's)."""
        inputs = self._inputs
        if inputs is None:
            inputs = self._inputs = list(self._input_map.values())  # type: ignore[union-attr]
        return list(inputs)

    def _get_input(self, name: str) -> Tensor | None:
        """Find an input by name through the index, built at the first lookup (the first of a name wins)."""
        index = self._input_map
        if index is None:
            index = self._input_map = {t._name: t for t in reversed(self._inputs or ())}
        return index.get(name)

    def request_id(self) -> str:
        """Return the request id ("" if none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """Return the correlation (sequence) id; 0 if none."""
        return self._correlation_id

    def flags(self) -> int:
        """Return the request flags (``TRITONSERVER_REQUEST_FLAG_*``)."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Set the request flags."""
        if not is_int(flags, *UINT32):
            raise incompatible("set_flags", "(self: c_python_backend_utils.InferenceRequest, arg0: int) -> None",
                               (self, flags))
        self._flags = operator.index(flags)

    def timeout(self) -> int:
        """Return the timeout in microseconds (0 = none)."""
        return self._timeout

    def _parameters_dict(self) -> dict[str, Any]:
        """Return the parameters as a dict (for the server's BLS path)."""
        params = self._parameters
        if params is None:
            return {}
        if isinstance(params, str):
            return json.loads(params)
        return dict(params)

    def requested_output_names(self) -> list[str]:
        """Return the names of the requested outputs (empty = all)."""
        names = self._requested_output_names
        if names is None:
            asked = self._outputs_asked
            names = self._requested_output_names = [] if asked is None else [o.name for o in asked]
        return names

    def model_name(self) -> str:
        """Return the target model name (BLS) or the model's own name."""
        return self._model_name

    def model_version(self) -> int:
        """Return the target model version (-1 = latest/unspecified)."""
        return self._model_version

    def preferred_memory(self) -> PreferredMemory | None:
        """Return the preferred output memory, if one was given."""
        return self._preferred_memory

    def trace(self) -> InferenceTrace:
        """Return the trace handle of the request."""
        trace = self._trace
        return _NO_TRACE if trace is None else trace

    def is_cancelled(self) -> bool:
        """Return True once the client has cancelled this request."""
        cancelled = self._cancelled
        return bool(cancelled() if callable(cancelled) else cancelled)

    def get_response_sender(self) -> Any:
        """Return the response sender attached by the server."""
        sender = self._response_sender
        if sender is None:
            # a non-decoupled model may answer through a sender too (one response, final flag) and
            # return None from execute; the server gives the factory, the sender is built on demand
            factory = self._sender_factory
            if factory is None:
                raise TritonModelException("this request has no response sender")
            sender = self._response_sender = factory(self)
            self._untouched = False
        return sender

    def set_release_flags(self, flags: int) -> None:
        """Set how the request is released (``TRITONSERVER_REQUEST_RELEASE_*``)."""
        self._release_flags = flags
        self._untouched = False

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (BLS) and return the response(s)."""
        return server_calls.bls_exec(self, _decoupled(self, "exec", decoupled))

    def async_exec(self, decoupled: bool = False) -> Any:
        """Like ``exec`` but returns an awaitable; call from a running event loop."""
        return server_calls.bls_async_exec(self, _decoupled(self, "async_exec", decoupled))

    def __repr__(self) -> str:
        names = [t.name() for t in self.inputs()]
        return (
            f"InferenceRequest(request_id={self._request_id!r}, "
            f"model_name={self._model_name!r}, inputs={names})"
        )


class _ServedRequest(InferenceRequest):
    """A request the server hands ``execute`` while fast paths are on (``_served_lean``): what it holds of
    the server's ``InferRequest`` (an immutable NamedTuple) is read from that request when asked, by getters
    in C, instead of being copied into every request built (seven stores fewer per request: the per-call
    share of a pipeline step); its inputs are ``_InputTensor`` objects, likewise. Shown as an ``InferenceRequest``."""

    _request_id = property(attrgetter("_req.id"))
    _correlation_id = property(attrgetter("_req.correlation_id"))
    _outputs_asked = property(attrgetter("_req.outputs"))
    _model_name = property(attrgetter("_req.model_name"))
    _model_version = property(attrgetter("_req.model_version"))
    _timeout = property(attrgetter("_req.timeout_us"))
    _parameters = property(attrgetter("_req.parameters"))  # type: ignore[assignment]
    _cancelled = property(attrgetter("_req.is_cancelled"))  # None: never cancelled (is_cancelled() is False)

    @property
    def _trace(self) -> InferenceTrace | None:  # type: ignore[override]
        """OpenTelemetry: request.trace() hands it to the model's BLS requests (built when asked)."""
        trace = self._req.trace
        return None if trace is None else InferenceTrace(trace)

    @property
    def _flags(self) -> int:  # type: ignore[override]
        return self.__dict__.get("_flags_set", self._req.flags)

    @_flags.setter
    def _flags(self, flags: int) -> None:  # set_flags
        self.__dict__["_flags_set"] = flags

    @classmethod
    def _served_lean(cls, request: Any, sender_factory: Callable[[InferenceRequest], Any] | None = None
                     ) -> InferenceRequest:
        """``_served`` with the request's fields left on ``request`` (the getters above)."""
        if request.parameters:
            check_parameters(request.parameters, allow_float=True)
        index = {}
        for name, given in request.inputs.items():
            tensor = _new(_InputTensor)
            tensor._given = given
            index[name] = tensor
        served = _new(cls)
        served._req = request
        served._input_map = index
        if sender_factory is not None:
            served._sender_factory = sender_factory
        return served


_ServedRequest.__name__ = "InferenceRequest"  # pybind11's texts print the class name; pickle reads __qualname__


def _decoupled(request: InferenceRequest, method: str, value: Any) -> bool:
    """pybind11's ``bool`` with ``none(false)``: anything with a truth value but None."""
    if value is None or not hasattr(type(value), "__bool__"):
        raise incompatible(method, "(self: c_python_backend_utils.InferenceRequest, decoupled: bool = False) -> object",
                           (request,), [("decoupled", value)])
    return bool(value)


def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    """Return the request's input tensor called ``name``, or None."""
    kind = type(inference_request)
    if kind is _ServedRequest:  # what the server hands execute (fast paths): its index is built with it
        return inference_request._input_map.get(name)
    if kind is InferenceRequest:  # its index, built once
        index = inference_request._input_map
        if index is not None:
            return index.get(name)
        return inference_request._get_input(name)
    finder = getattr(inference_request, "_get_input", None)
    if finder is not None:
        return finder(name)
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None

