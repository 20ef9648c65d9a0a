"""``pb_utils.InferenceResponse``, the ``InferenceResponseSender`` of decoupled models, and
``get_output_tensor_by_name``.

Owner: the model builds responses (on the instance's native thread or a thread it started) and gives
them to the server by returning them from ``execute`` or through the request's sender; the server
reads ``_output_tensors`` / ``_error`` / ``_parameters`` directly on the hot path. A sender belongs to
one request: the server gives it ``deliver(response, final)`` and ``cancelled()``; after the final
flag it is closed. Failure: bad arguments raise ``TypeError`` that is also ``TritonModelException``;
misuse of a sender (after close, bad flags) raises ``TritonModelException`` with Triton's wording.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .constants import TRITONSERVER_RESPONSE_COMPLETE_FINAL
from .errors import TritonError, TritonModelException, _ArgTypeError
from .parameters import JsonParameters, check_parameters
from .tensor import Tensor


class InferenceResponseSender:
    """What ``request.get_response_sender()`` returns for a decoupled model: sends any number of
    responses for one request, the last one (or a response-less call) with
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. The server gives it ``deliver(response, final)`` and
    ``cancelled()``; ``send`` may be called from ``execute`` or from a thread the model started."""

    def __init__(self, deliver: Callable[[Any, bool], None], cancelled: Callable[[], bool]) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException(f"Invalid response flags: {flags}")
        if response is None:
            if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                raise TritonModelException(
                    "Inference Response object must be provided when the response flags is set to zero."
                )
        elif not isinstance(response, InferenceResponse):
            raise _ArgTypeError(f"send() expects an InferenceResponse, got {type(response).__name__}")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if final:
            self._closed = True
        self._deliver(response, final)

    def is_cancelled(self) -> bool:
        return bool(self._cancelled())


class InferenceResponse(JsonParameters):
    """A response: output tensors and/or an error, plus optional parameters."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, bool | int | str] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        elif type(output_tensors) is not list and not isinstance(output_tensors, list):
            if isinstance(output_tensors, (str, bytes, Tensor)) or not isinstance(
                output_tensors, Iterable
            ):
                raise _ArgTypeError(
                    "output_tensors must be a list of Tensor, got "
                    f"{type(output_tensors).__name__}"
                )
            output_tensors = list(output_tensors)
        for tensor in output_tensors:
            if type(tensor) is not Tensor and not isinstance(tensor, Tensor):
                raise _ArgTypeError(
                    f"output_tensors must contain Tensor objects, found {type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise _ArgTypeError(
                f"error must be a TritonError or None, got {type(error).__name__}"
            )
        if parameters is not None:
            check_parameters(parameters, allow_float=False)
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = parameters

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
