"""What a request's result is once ``execute`` ran: the rules of Triton's python backend stub for what
``execute`` returns and what the model sent through the request's response sender.

Built from ``pb_stub.cc`` (``ProcessReturnedResponses``, the error path of ``ProcessRequests``) and
``response_sender.cc`` in triton-inference-server/python_backend:

* non-decoupled: a request's one response is the one ``execute`` returns for it, or, where it returns
  None (or None in its list), the one the model sends through the sender, from ``execute`` or from a
  thread or task of its own after ``execute`` returned (the instance waits for it: :func:`wait_sent`).
  A response sent first wins: one returned after it is dropped. When ``execute`` raises, a request
  that already has its response keeps it and the others get the error; every sender is closed.
* decoupled: ``execute`` must return None; anything else is the error
  "Python model '<instance>' is using the decoupled mode and the execute function must return None."
  sent as the final response of each request whose sender is still open; then all senders close, so a
  later ``send`` raises "Response sender has been closed." (:func:`fail_decoupled`).

Threads: the instance's thread (or the model's asyncio loop thread for a background ``execute``);
a slot is filled by whichever thread sends. Failure: nothing here raises; errors become results.
"""

from __future__ import annotations

from typing import Any

from ...errors import TritonError
from ...runtime.threads import NativeEvent
from . import triton_python_backend_utils as pb_utils

CANCEL_POLL_S = 1.0  # how often a wait for a sent response looks whether the client went away


class SentSlot:
    """A non-decoupled request's response sent through its sender (the first one; the sender refuses more)."""

    __slots__ = ("response", "sent")

    def __init__(self) -> None:
        self.response: Any = None
        self.sent = NativeEvent()

    def deliver(self, response: Any, _final: bool) -> None:
        """The sending thread (the sender has checked Triton's rules: a response comes before the final flag)."""
        if response is not None and self.response is None:
            self.response = response
            self.sent.set()


def default_mode_sender(request: Any) -> Any:
    """The sender of a non-decoupled model's request, made when the model asks for it."""
    slot = request._slot = SentSlot()
    return pb_utils.InferenceResponseSender(slot.deliver, request.is_cancelled, decoupled=False)


def sent_response(request: Any) -> Any:
    """The response already sent through ``request``'s sender, or None."""
    slot = getattr(request, "_slot", None)
    return None if slot is None else slot.response


def take_returned(request: Any, response: Any) -> Any:
    """``execute`` returned ``response`` for ``request``: what the request's response is."""
    sender = request._response_sender
    if sender is None:
        return response
    sent = sent_response(request)
    if sent is not None:  # sent first: the returned one is dropped (Triton: the sender is closed, or full)
        return sent
    try:
        sender._returned(response)  # counts as sent with the final flag: later sends raise
    except pb_utils.TritonModelException:
        pass  # a closed sender with nothing sent cannot be: it refuses a final flag before a response
    return response


def wait_sent(request: Any, instance_name: str) -> Any:
    """``execute`` returned None for ``request``: its response is the one sent through its sender, now
    or later from the model's own thread; wait for it (until the client cancels). A request whose
    sender the model never asked for gets an error: nothing can answer it any more."""
    slot = getattr(request, "_slot", None)
    if slot is None:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(
            "execute() returned None and sent no response for this request through its response sender"))
    while not slot.sent.wait(CANCEL_POLL_S):
        if request.is_cancelled():
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"model instance '{instance_name}': the request was cancelled while waiting for the response "
                "its model sends after execute() returned", pb_utils.TritonError.CANCELLED))
    return slot.response


def close_senders(requests: list[Any]) -> list[bool]:
    """Close every request's sender (Triton's stub does after a failed ``execute``); whether each was open."""
    was_open = []
    for request in requests:
        sender = request._response_sender
        was_open.append(sender is None or not sender.is_closed())
        if sender is not None:
            sender.close()
    return was_open


def fail_default(requests: list[Any], error: TritonError) -> list[Any]:
    """A non-decoupled ``execute`` failed: a response already sent stands, the others get ``error``."""
    close_senders(requests)
    return [error if (sent := sent_response(r)) is None else sent for r in requests]


def fail_decoupled(requests: list[Any], error: TritonError) -> list[TritonError | None]:
    """A decoupled ``execute`` failed: ``error`` is the final response of requests still open; the
    others are over already (None: nothing more to send)."""
    return [error if was_open else None for was_open in close_senders(requests)]


def must_return_none(instance_name: str) -> TritonError:
    return TritonError.internal(
        f"Failed to process the request(s) for model '{instance_name}', message: Python model '{instance_name}' "
        "is using the decoupled mode and the execute function must return None.")
