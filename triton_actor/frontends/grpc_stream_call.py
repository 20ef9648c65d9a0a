"""A ``ModelStreamInfer`` call's own part (:class:`StreamCall`, a base of :class:`~.grpc_calls.Call`):
the stream's reading loop, a greenlet per request writing that request's responses as they come, and the
stream's end once every request is answered.

Split from :mod:`.grpc_calls` (the module cap) along what it owns: everything here runs only for a
streaming call; the call's events, sends and unary path stay there. Hub only, as the rest of the call.

Traces: while the server traces, each request message gets a :class:`~..observability.wire_trace.WireTrace`
as Triton's ``ModelStreamInferHandler`` stamps its states: ``GRPC_WAITREAD_START`` when the stream starts
waiting for that message (the call's start for the first, right after the previous one was taken for the
others), ``GRPC_WAITREAD_END`` when it is taken, ``INFER_RESPONSE_COMPLETE`` at its first response and a
``GRPC_SEND_START``/``GRPC_SEND_END`` pair around each response's send; its ``InferRequest`` span (or its
trace file entry) is ended after its last.
"""

from __future__ import annotations

import logging
from time import perf_counter_ns
from typing import Any

import gevent
import gevent.pool

from ..observability.wire_trace import WireTrace
from ..protocol import header_forward
from ..protocol._generated import grpc_service_pb2 as pb
from ..runtime.response_channel import StreamAccount
from .grpc import StreamError
from .grpc_methods import DEADLINE_EXCEEDED, GRPC_STATUS, INTERNAL, OK, Refused

END = object()  # the client closed its side of a stream
GONE = object()  # the stream is over (reset, or the connection closed)
DEADLINE = Refused(DEADLINE_EXCEEDED, "Deadline Exceeded")  # grpc-core's status text
log = logging.getLogger("triton_actor.frontends.grpc_calls")  # the call's logger, as before the split


class StreamCall:
    """The streaming half of a gRPC call: ``Call`` holds the state (its slots) and the sends; this the loop."""

    # the W3C traceparent the stream's call came with ("" without one), set by the driver while the
    # server traces; None: not traced (one attribute check per message)
    __slots__ = ("stream_context",)

    STREAM_REQUESTS = 128  # ModelStreamInfer requests running at once on one stream; more wait in the inbox

    def _run_stream(self) -> None:
        """A greenlet per request writes that request's responses as they come; the call ends (OK
        trailers) once the client has closed its side and every request is answered."""
        group = self.requests = gevent.pool.Pool(self.STREAM_REQUESTS)
        self.account = StreamAccount()
        refused: Refused | None = None
        try:
            while True:
                waited = perf_counter_ns() if self.stream_context is not None else 0
                item = self.inbox.get()
                if type(item) is tuple:
                    size = len(item[1]) + 5
                    self.conn.h2.consumed(self.stream, size)  # its bytes stay held until it is answered
                if item is END:
                    break
                if item is GONE or isinstance(item, Refused):
                    refused = item if item is not GONE else None
                    self._stop_waiting(group)
                    break
                try:
                    request, inflated = self._decode(*item)
                except Refused as e:
                    self._answered(size)
                    self._stream_send(pb.ModelStreamInferResponse(error_message=e.message))
                    continue
                wire = None
                if waited:  # the message's read stamps, as Triton's GRPC_WAITREAD_START and _END
                    wire = WireTrace("GRPC", self.stream_context or None, waited)
                    wire.recv_end = perf_counter_ns()
                group.spawn(self._stream_one, request, size + inflated, wire)  # waits while STREAM_REQUESTS run
            group.join()
            if refused is None and self.expired:
                refused = DEADLINE
            if refused is not None:  # its senders are done: the status can go out
                self.send_status(refused.status, refused.message)
            else:
                self.send_status(OK, "")
        except Exception as e:
            log.exception("ModelStreamInfer failed")
            self.send_status(INTERNAL, f"internal error: {e!r}")
        finally:
            self.finish()

    def _answered(self, size: int) -> None:
        """A stream's request of ``size`` bytes is over: what it held of the budget goes back."""
        self.kept -= size
        if not self.finished:
            self._hold(max(0, self.held - size))

    def _stream_one(self, request: pb.ModelInferRequest, size: int, wire: WireTrace | None = None) -> None:
        """The responses of one request on a stream; once the client has gone, closing the generator
        cancels the request (a decoupled model sees ``is_cancelled()``). Its ``size`` bytes of the budget
        are held until then. ``wire``: its stamps while the server traces (the module doc)."""
        try:
            forwarded = self.forwarded if wire is None else header_forward.with_trace(self.forwarded, wire)
            responses = self.method.call(request, forwarded, self.account)
            try:
                for response in responses:
                    if type(response) is StreamError:
                        if self.errors_end_stream:  # the stream ends with this status; the others are cancelled
                            self.inbox.put(Refused(GRPC_STATUS.get(response.code, INTERNAL), response.message))
                            break
                        response = response.response
                    if wire is not None:
                        wire.answered()
                    if not self._stream_send(response, wire):
                        break
            finally:
                responses.close()
        finally:
            self._answered(size)
            if wire is not None:  # its InferRequest span ends here, answered or not
                wire.sent()

    def _stop_waiting(self, group: gevent.pool.Group) -> None:
        """The stream is over: its request greenlets stop now (GreenletExit closes their generators,
        which cancels the requests), but never the one inside a socket write."""
        for greenlet in list(group):
            if greenlet is not self.conn.writer and greenlet is not gevent.getcurrent():
                greenlet.kill(block=False)

    def _stream_send(self, response: Any, wire: WireTrace | None = None) -> bool:
        with self.send_lock:  # one message's frames stay together on the stream
            if wire is not None:
                wire.sending()
            try:
                return self.send_message(response.SerializeToString(), final=False)
            except Refused as e:
                return self.send_message(pb.ModelStreamInferResponse(error_message=e.message).SerializeToString(),
                                         final=False)
            finally:
                if wire is not None:
                    wire.written()
