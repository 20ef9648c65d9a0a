"""``pb_utils.InferenceRequest``: what ``execute`` receives (and what a model builds for BLS), with its
options ``PreferredMemory`` and ``InferenceTrace``, and ``get_input_tensor_by_name``.

Owner: the server builds one request per client request on the instance's native thread
(``InferenceRequest._from_server``, hot path: no copying, no JSON) and hands it to ``execute``; after
that the model owns it, and may use it from threads it started (``get_response_sender``,
``is_cancelled``). The server sets ``_response_sender`` / ``_cancelled`` (decoupled models) or a
``_sender_factory`` (others), and reads ``_release_flags`` after ``execute`` (rescheduling).
Failure: bad constructor arguments raise ``TypeError``/``ValueError`` that are also
``TritonModelException``; ``exec`` / ``async_exec`` go through ``server_calls`` and raise
``TritonModelException`` while no server wired BLS (a model used outside the server).
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
from .tensor import Tensor


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


class InferenceRequest(JsonParameters):
    """A request given to ``execute`` or built by a model for BLS.

    The server builds requests with this constructor too and then sets
    ``_response_sender`` and ``_cancelled``; construction does no copying or JSON work.
    """

    # Defaults of what a request rarely changes: instances store only what differs, which keeps the
    # per-request construction short (the server builds one per request, see ``_from_server``).
    _preferred_memory: PreferredMemory | None = None
    _trace: InferenceTrace | None = None
    _input_map: dict[str, Tensor] | None = None
    _input_map_len = 0
    _release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
    _response_sender: Any = None
    _sender_factory: Callable[[InferenceRequest], Any] | None = None
    _cancelled: Any = False

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        if parameters is not None:
            check_parameters(parameters, allow_float=True)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = inputs if isinstance(inputs, list) else list(inputs or ())
        self._requested_output_names = (
            requested_output_names
            if isinstance(requested_output_names, list)
            else list(requested_output_names or ())
        )
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        if preferred_memory is not None:
            self._preferred_memory = preferred_memory
        if trace is not None:
            self._trace = trace
        self._parameters = parameters

    @classmethod
    def _from_server(
        cls,
        request_id: str,
        correlation_id: int | str,
        inputs: dict[str, Tensor],
        requested_output_names: list[str],
        model_name: str,
        model_version: int,
        flags: int,
        timeout: int,
        parameters: dict[str, Any],
        sender_factory: Callable[[InferenceRequest], Any] | None = None,
    ) -> InferenceRequest:
        """The server's constructor for a request given to ``execute`` (hot path): ``inputs`` maps
        unique names to tensors and becomes the lookup index as it is; parameters are checked only
        when there are some, as the constructor would."""
        if parameters:
            check_parameters(parameters, allow_float=True)
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = list(inputs.values())
        request._input_map = inputs  # already name -> tensor: no second dict per request
        request._input_map_len = len(inputs)
        request._requested_output_names = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters
        if sender_factory is not None:
            request._sender_factory = sender_factory
        return request

    def inputs(self) -> list[Tensor]:
        """Return the input tensors."""
        return self._inputs

    def _get_input(self, name: str) -> Tensor | None:
        """Find an input by name through a lazily built (first-wins) index."""
        inputs = self._inputs
        index = self._input_map
        if index is None or self._input_map_len != len(inputs):
            index = {t._name: t for t in reversed(inputs)}
            self._input_map = index
            self._input_map_len = len(inputs)
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
        self._flags = flags

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
        return self._requested_output_names

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
        return sender

    def set_release_flags(self, flags: int) -> None:
        """Set how the request is released (``TRITONSERVER_REQUEST_RELEASE_*``)."""
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (BLS) and return the response(s)."""
        return server_calls.bls_exec(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """Like ``exec`` but returns an awaitable; call from a running event loop."""
        return server_calls.bls_async_exec(self, decoupled)

    def __repr__(self) -> str:
        names = [t.name() for t in self._inputs]
        return (
            f"InferenceRequest(request_id={self._request_id!r}, "
            f"model_name={self._model_name!r}, inputs={names})"
        )



def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    """Return the request's input tensor called ``name``, or None."""
    if type(inference_request) is InferenceRequest:  # the usual case: its index, while still current
        index = inference_request._input_map
        if index is not None and inference_request._input_map_len == len(inference_request._inputs):
            return index.get(name)
        return inference_request._get_input(name)
    finder = getattr(inference_request, "_get_input", None)
    if finder is not None:
        return finder(name)
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None

