"""The ``ModelStreamInfer`` half of a gRPC call (:class:`~.grpc_calls.Call` is a :class:`StreamCall`): the
stream's greenlet takes its messages from the inbox, runs a greenlet per request (at most
``STREAM_REQUESTS`` at once) that writes that request's responses as they come, and ends the call with
its status once the client has closed its side and every request is answered.
"""

from __future__ import annotations

import logging
from typing import Any

import gevent
import gevent.pool

from ..protocol._generated import grpc_service_pb2 as pb
from ..runtime.response_channel import StreamAccount
from .grpc import StreamError
from .grpc_methods import DEADLINE_EXCEEDED, GRPC_STATUS, INTERNAL, OK, Refused

log = logging.getLogger(__name__)

_END = object()  # the client closed its side of a stream
_GONE = object()  # the stream is over (reset, or the connection closed)
_DEADLINE = Refused(DEADLINE_EXCEEDED, "Deadline Exceeded")  # grpc-core's status text


class StreamCall:
    """What :class:`~.grpc_calls.Call` runs for ``ModelStreamInfer`` (its state is the call's)."""

    __slots__ = ()

    STREAM_REQUESTS = 128  # ModelStreamInfer requests running at once on one stream; more wait in the inbox

    def _run_stream(self) -> None:
        """A greenlet per request writes that request's responses as they come; the call ends (OK
        trailers) once the client has closed its side and every request is answered."""
        group = self.requests = gevent.pool.Pool(self.STREAM_REQUESTS)
        self.account = StreamAccount()
        refused: Refused | None = None
        try:
            while True:
                item = self.inbox.get()
                if type(item) is tuple:
                    size = len(item[1]) + 5
                    self.conn.h2.consumed(self.stream, size)  # its bytes stay held until it is answered
                if item is _END:
                    break
                if item is _GONE or isinstance(item, Refused):
                    refused = item if item is not _GONE else None
                    self._stop_waiting(group)
                    break
                try:
                    request, inflated = self._decode(*item)
                except Refused as e:
                    self._answered(size)
                    self._stream_send(pb.ModelStreamInferResponse(error_message=e.message))
                    continue
                group.spawn(self._stream_one, request, size + inflated)  # waits while STREAM_REQUESTS run
            group.join()
            if refused is None and self.expired:
                refused = _DEADLINE
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

    def _stream_one(self, request: pb.ModelInferRequest, size: int) -> None:
        """The responses of one request on a stream; once the client has gone, closing the generator
        cancels the request (a decoupled model sees ``is_cancelled()``). Its ``size`` bytes of the budget
        are held until then."""
        try:
            responses = self.method.call(request, self.forwarded, self.account)
            try:
                for response in responses:
                    if type(response) is StreamError:
                        if self.errors_end_stream:  # the stream ends with this status; the others are cancelled
                            self.inbox.put(Refused(GRPC_STATUS.get(response.code, INTERNAL), response.message))
                            break
                        response = response.response
                    if not self._stream_send(response):
                        break
            finally:
                responses.close()
        finally:
            self._answered(size)

    def _stop_waiting(self, group: gevent.pool.Group) -> None:
        """The stream is over: its request greenlets stop now (GreenletExit closes their generators,
        which cancels the requests), but never the one inside a socket write."""
        for greenlet in list(group):
            if greenlet is not self.conn.writer and greenlet is not gevent.getcurrent():
                greenlet.kill(block=False)

    def _stream_send(self, response: Any) -> bool:
        with self.send_lock:  # one message's frames stay together on the stream
            try:
                return self.send_message(response.SerializeToString(), final=False)
            except Refused as e:
                return self.send_message(pb.ModelStreamInferResponse(error_message=e.message).SerializeToString(),
                                         final=False)
