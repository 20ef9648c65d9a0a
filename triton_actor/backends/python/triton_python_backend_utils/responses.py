"""``pb_utils.InferenceResponse``, the ``InferenceResponseSender`` of decoupled models, and
``get_output_tensor_by_name``.

Owner: the model builds responses (on the instance's native thread or a thread it started) and gives
them to the server by returning them from ``execute`` or through the request's sender; the server
reads ``_output_tensors`` / ``_error`` / ``_parameters`` directly on the hot path. A sender belongs to
one request: the server gives it ``deliver(response, final)`` and ``cancelled()``; after the final
flag it is closed. Failure: arguments Triton's pybind11 would not convert raise its plain ``TypeError``,
a None output tensor ``TritonModelException`` (the stub's check);
misuse of a sender (after close, bad flags) raises ``TritonModelException`` with Triton's wording.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .constants import TRITONSERVER_RESPONSE_COMPLETE_FINAL
from .errors import TritonError, TritonModelException, _ArgTypeError
from .parameters import JsonParameters, check_parameters
from .pybind_args import incompatible, is_list_of
from .tensor import Tensor


class InferenceResponseSender:
    """What ``request.get_response_sender()`` returns: sends responses for one request, the last one (or
    a response-less call) with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. The server gives it
    ``deliver(response, final)`` and ``cancelled()``; ``send`` may be called from ``execute`` or from a
    thread the model started. The checks and their texts are those of Triton's ``response_sender.cc``,
    in its order; a non-decoupled model's sender takes one response (and the final flag after it)."""

    def __init__(self, deliver: Callable[[Any, bool], None], cancelled: Callable[[], bool],
                 decoupled: bool = True) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0  # calls that went through, the final flag's included (Triton's counter)

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise _ArgTypeError(f"send() expects an InferenceResponse, got {type(response).__name__}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self._count(response, final)
        self._deliver(response, final)

    def _count(self, response: InferenceResponse | None, final: bool) -> None:
        """Refuse what Triton refuses, then count the call (and close on the final flag)."""
        if not self._decoupled:
            if response is not None and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response.")
            if response is None and not self._sent:
                raise TritonModelException("Unable to send response. Non-decoupled model cannot send "
                                           "complete final before sending a response.")
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if final:
            self._closed = True
        self._sent += 1

    def _returned(self, response: InferenceResponse) -> None:
        """The server: ``execute`` returned ``response`` for this request, which counts as sending it
        with the final flag (Triton's stub does that before it delivers returned responses)."""
        self._count(response, True)

    def close(self) -> None:
        """The server: the request is over (``execute`` failed): later sends raise."""
        self._closed = True

    def is_closed(self) -> bool:
        return self._closed

    def is_cancelled(self) -> bool:
        return bool(self._cancelled())


def _tensor_or_none(item: Any) -> bool:
    return item is None or isinstance(item, Tensor)


def _incompatible(output_tensors: Any, error: Any, parameters: Any) -> TypeError:
    """pybind11's text for a bad argument; the call is shown with the arguments it gave as keywords."""
    given = [("output_tensors", output_tensors)]
    if error is not None:
        given.append(("error", error))
    if parameters is not None:
        given.append(("parameters", parameters))
    signature = ("c_python_backend_utils.InferenceResponse(output_tensors: List[c_python_backend_utils.Tensor] = [], "
                 "error: c_python_backend_utils.TritonError = None, parameters: object = None)")
    return incompatible("__init__", signature, (), given, constructor=True)


class InferenceResponse(JsonParameters):
    """A response: output tensors and/or an error, plus optional parameters."""

    # what most responses have: an instance stores only what differs (two stores fewer per response)
    _error: TritonError | None = None
    _parameters: Any = None
    # no error, no parameters and only exact Tensors when built: the server then reads each tensor's name
    # and array straight from ``_output_tensors`` (backend.py's ``_execute_one``); stored only when False
    _plain = True

    def __init__(
        self,
        output_tensors: list[Tensor] | tuple[()] = (),  # a tuple: each response gets a list
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        # what pybind11 would not convert (None or a non-sequence for the list, an item that is no Tensor
        # or None, an error that is no TritonError) is its TypeError; a None item is the stub's error
        if type(output_tensors) is not list:
            if not is_list_of(output_tensors, _tensor_or_none):
                raise _incompatible(output_tensors, error, parameters)
            output_tensors = list(output_tensors)
        plain = True
        empty = False  # one pass over the tensors (per-response path); the stub's check comes after pybind11's
        for tensor in output_tensors:
            if type(tensor) is not Tensor:
                plain = False
                if not isinstance(tensor, Tensor):
                    if tensor is not None:
                        raise _incompatible(output_tensors, error, parameters)
                    empty = True
        if error is not None:
            if not isinstance(error, TritonError):
                raise _incompatible(output_tensors, error, parameters)
            self._error = error
            plain = False
        if parameters is not None:
            check_parameters(parameters, allow_float=False)
            self._parameters = parameters
            plain = False
        if empty:
            raise TritonModelException("Output tensor for inference response should not be empty.")
        if not plain:
            self._plain = False
        self._output_tensors = output_tensors

    @classmethod
    def _trusted(cls, output_tensors: list[Tensor]) -> InferenceResponse:
        """Server-side constructor of a BLS answer (exact Tensors, no error, no parameters: plain; hot path)."""
        response = cls.__new__(cls)
        response._output_tensors = output_tensors
        return response

    def output_tensors(self) -> list[Tensor]:
        """Return the output tensors."""
        return self._output_tensors

    def has_error(self) -> bool:
        """Return True if the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """Return the error, or None."""
        return self._error

    def __repr__(self) -> str:
        names = [t.name() for t in self._output_tensors]
        return f"InferenceResponse(outputs={names}, error={self._error!r})"



def get_output_tensor_by_name(inference_response: Any, name: str) -> Tensor | None:
    """Return the response's output tensor called ``name``, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None
