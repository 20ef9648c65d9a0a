"""gRPC calls over our HTTP/2 connection: one :class:`Call` per stream (its ModelStreamInfer half is
in :mod:`.grpc_stream_call`).

The connection driver (:mod:`.grpc_h2`) hands each stream's events here; a call decodes its
messages (``grpc-encoding`` gzip/deflate, size limits → RESOURCE_EXHAUSTED), runs the servicer
method (:mod:`.grpc`) and answers: a unary call with HEADERS + DATA + trailers in one write when the
windows allow, a ``ModelStreamInfer`` call with a greenlet per request. Status codes are mapped
in :mod:`.grpc_methods` (with the method table); ``grpc-message`` is percent-encoded here.

Runs in the connection's greenlets on the hub: the reader (the driver's, for the events) and a
greenlet per call; one :class:`Call` is touched by no other connection.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

import gevent
import gevent.lock
import gevent.pool
import gevent.queue
from google.protobuf.message import DecodeError

from ..errors import TritonError, answered
from ..observability.wire_trace import WireTrace
from ..protocol import codings
from ..protocol import http2 as h2
from ..protocol.h2_events import H2Stream, StreamClosedError
from ..runtime import fastpath
from ..runtime.response_channel import StreamAccount
from . import compression
from .budget import with_room
from .grpc_methods import (
    CANCELLED,
    CODED_HEADS,
    GRPC_STATUS,
    INTERNAL,
    OK,
    OK_TRAILERS,
    RESOURCE_EXHAUSTED,
    RESPONSE_HEAD,
    UNIMPLEMENTED,
    CallConnection,
    Method,
    Refused,
)
from .grpc_stream_call import DEADLINE as _DEADLINE
from .grpc_stream_call import END as _END
from .grpc_stream_call import GONE as _GONE
from .grpc_stream_call import StreamCall

log = logging.getLogger(__name__)

_MOST_MESSAGE = 2048  # characters of a status message (grpc's clients take 8-16 KiB of headers)
_TAKEN_MIN = 64 * 1024  # a unary message at least this big is parsed from its buffer (h2.take_message)


class Call(StreamCall):
    """One gRPC call on one stream; its life is its handler's (``started`` … :meth:`finish`)."""

    # What a call starts with, as class attributes (an assignment shadows one): a call is made per
    # request, and setting them all in ``__init__`` ran 74 bytecodes per unary call (measured with
    # scripts/bench_request_path.py --opcodes), a class attribute none.
    inbox: gevent.queue.SimpleQueue | None = None  # a ModelStreamInfer call's messages
    send_lock: gevent.lock.Semaphore | None = None
    greenlet: gevent.Greenlet | None = None
    input_done = False
    done = False  # our side is over (answered, refused, or the stream is gone)
    finished = False  # counted out of the running calls
    started = False  # its handler runs (or ran)
    requests: gevent.pool.Pool | None = None  # a ModelStreamInfer call's running requests
    # ``triton_grpc_error: true`` on a stream: an error ends the stream with its gRPC status (Triton 24.08+)
    errors_end_stream = False
    held = 0  # bytes of the request memory budget this call holds (budget.py)
    kept = 0  # of them, the bytes of a stream's messages received whole and not answered yet
    deadline: Any = None  # the hub's timer for the client's grpc-timeout, while it runs
    expired = False  # the client's deadline passed: the call ends DEADLINE_EXCEEDED
    out_coding: str | None = None  # its answers' grpc-encoding (--grpc-infer-response-compression-level)
    account: StreamAccount | None = None  # a stream's bound on undelivered responses, all its requests'
    forwarded: dict[str, str] | None = None  # metadata given to the model (--grpc-header-forward-pattern)
    wire: WireTrace | None = None  # a ModelInfer call's wire stamps, while the server traces
    stream_context: str | None = None  # a ModelStreamInfer call's (grpc_stream_call.py)

    def __init__(self, conn: CallConnection, stream: H2Stream, method: Method, encoding: bytes | None) -> None:
        self.conn = conn
        self.stream = stream
        self.sid = stream.id
        self.method = method
        self.encoding = encoding
        self.buf = bytearray()

    def set_deadline(self, timeout: float | None) -> None:
        """The client's ``grpc-timeout``: when it passes before the call is over, the call's work is
        cancelled (the request leaves the queue, a running model sees ``is_cancelled()``) and the client
        gets DEADLINE_EXCEEDED, as a grpc-core server (Triton's) cancels a call at its deadline. A client
        of grpcio cancels on its own deadline too; a hand-made one kept the call running for ever."""
        if timeout is None:
            return
        self.deadline = gevent.get_hub().loop.timer(max(0.0, timeout))
        self.deadline.start(gevent.spawn, self.expire)  # fired in the loop: the work needs a greenlet

    def expire(self) -> None:
        """The deadline passed (its own greenlet)."""
        if self.done or self.finished:
            return
        self.expired = True
        if self.inbox is not None:  # a stream: its greenlet sends the status once its senders are gone
            if not self.input_done:
                self.refuse(_DEADLINE)
            if self.requests is not None:
                self._stop_waiting(self.requests)
            return
        if not self.input_done:
            self.input_done = True
            self.buf = bytearray()
            self.conn.h2.consumed(self.stream)
        self.send_status(_DEADLINE.status, _DEADLINE.message)
        self.cancel()

    # -- events from the reader ---------------------------------------------------------------
    def begin(self, end_stream: bool) -> None:
        if self.method.streaming:
            self.stream.long_lived = True  # a bidirectional stream may idle between requests
            self.inbox = gevent.queue.SimpleQueue()
            self.send_lock = gevent.lock.Semaphore()
            self.started = True
            self.greenlet = gevent.spawn(self._run_stream)
        if end_stream:
            self.end_input()

    def on_data(self, data: bytes, end_stream: bool) -> None:
        if self.done:  # answered or refused (its DATA came in the same read): nothing more is held for it
            return
        if end_stream and fastpath.enabled and self.method.whole and not self.buf:
            # a unary ModelInfer whose one uncompressed message is all of its one DATA frame (what every
            # gRPC client sends for a small request): not copied into ``buf`` and split out of it again
            # (the parse still takes the message as one slice of it, as the buffered path's split does:
            # briefly twice its ``n`` bytes, of which the budget counts ``n``); the limits below, in short
            # (one message of ``n`` bytes, all of it here),
            # then end_input's part for a unary ModelInfer
            n, server = len(data), self.conn.server
            if n > 5 and not data[0] and int.from_bytes(data[1:5], "big") == n - 5 <= server.max_receive:
                budget = server.budget
                if not budget.try_reserve(n, barge=True):
                    self.refuse(Refused(RESOURCE_EXHAUSTED, budget.refusal()))
                    return
                self.held = n
                self.input_done = self.started = True
                if self.wire is not None:  # Triton's GRPC_WAITREAD_END: the request message is in
                    self.wire.recv_end = perf_counter_ns()
                self.conn.h2.consumed(self.stream)  # the request is the handler's from here
                self._start_infer(data)
                return
        buf = self.buf
        buf += data
        announced = h2.pending_length(buf)
        limit = self.conn.server.max_receive
        refused = None
        if announced > limit:
            refused = Refused(RESOURCE_EXHAUSTED, f"Received message larger than max ({announced} vs. {limit})")
        elif self.inbox is None and len(buf) > announced + 5 >= 5:
            refused = Refused(INTERNAL, "a unary call takes one request message, got more")
        elif len(buf) + self.kept > self.held:
            # what arrived and some room ahead, within the message: reserving all it announces let a
            # 5-byte prefix take the whole budget (for the minimum rate's grace, then again)
            refused = self._hold(self.kept + max(len(buf), min(announced + 5, with_room(len(buf)))))
        if refused is not None:
            self.refuse(refused)
            return
        if self.inbox is not None:
            messages = h2.split_messages(buf)
            for message in messages:
                self.inbox.put(message)
                self.kept += len(message[1]) + 5
            # a stream's request stays held, as an HTTP or unary one does, while it waits in the inbox
            # and until it is answered (_answered): a stream that sent requests faster than the model
            # answered them took all the memory they needed (the window bounds only what waits to be read)
            self._hold(len(buf) + self.kept)  # what was reserved, less the room ahead
            if messages:  # each message of a stream has its own minimum-rate clock (h2_connection.body_idle)
                self.conn.h2.body_idle(self.stream)
        if end_stream:
            self.end_input()

    def refuse(self, refused: Refused) -> None:
        """End the call's input with ``refused`` (its status): what else comes on the stream is dropped.
        The reader calls it for a message over a limit, and for a request body under the minimum rate
        (``h2_events.StreamTooSlow``: DEADLINE_EXCEEDED, as HTTP/1 answers 408)."""
        self.input_done = True
        self.buf = bytearray()
        self.conn.h2.consumed(self.stream)
        if self.inbox is not None:
            self.inbox.put(refused)  # its greenlet answers once its senders are done
        else:
            self.send_status(refused.status, refused.message)
            self.finish()

    def _hold(self, n: int) -> Refused | None:
        """Hold ``n`` bytes of the request memory budget (more or fewer than now); a refusal when the
        budget is spent (a stream cannot wait for it without stalling its connection's other streams)."""
        budget = self.conn.server.budget
        if n <= self.held:
            budget.release(self.held - n)
            self.held = n
            return None
        if not budget.try_reserve(n - self.held, barge=True):
            return Refused(RESOURCE_EXHAUSTED, budget.refusal())
        self.held = n
        return None

    def end_input(self) -> None:
        if self.input_done:
            return
        self.input_done = True
        if self.wire is not None:  # Triton's GRPC_WAITREAD_END: the request message is in
            self.wire.recv_end = perf_counter_ns()
        if self.inbox is not None:
            self.inbox.put(_END)
        elif not self.done:
            self.started = True
            self.conn.h2.consumed(self.stream)  # the request is the handler's from here
            # a compressed message is inflated in its own greenlet: in the reader, its slices on a
            # thread held the connection's other calls (a small one waited 2.3 s behind 512 MiB)
            if self.method.start is not None and fastpath.enabled and self.buf[:1] != b"\x01":
                self._start_infer()
            else:  # the specification: a greenlet per call
                self.greenlet = gevent.spawn(self._run_unary)

    def cancel(self) -> None:
        """The stream is gone (reset by the client, or the connection lost): the call's work stops.
        A greenlet that is writing is never interrupted mid-frame; it sees the stream closed after."""
        self.done = self.input_done = True
        if self.inbox is not None:
            self.inbox.put(_GONE)
            if self.requests is not None:
                self._stop_waiting(self.requests)  # frees the pool the reading loop may wait on
        elif self.greenlet is not None and self.greenlet is not self.conn.writer and \
                self.greenlet is not gevent.getcurrent():  # its own (a send timed out): it ends itself
            self.greenlet.kill(block=False)  # GreenletExit where it waits for the model's answer
            self.finish()
        elif self.greenlet is None:
            self.finish()  # no handler will (never started, or started inline in the reader, which is here)

    # -- sending ------------------------------------------------------------------------------
    def send_message(self, payload: bytes, final: bool) -> bool:
        """One gRPC message (the response head first if not sent yet); with ``final`` the OK
        trailers too (a unary answer: one write when it fits the windows)."""
        if self.done:
            return False
        if self.wire is not None:
            self.wire.sending()
        limit = self.conn.server.max_send
        if len(payload) > limit:
            raise Refused(RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(payload)} vs. {limit})")
        msg, conn, h2c = self._message(payload), self.conn, self.conn.h2
        head = RESPONSE_HEAD if self.out_coding is None else CODED_HEADS[self.out_coding]
        try:
            if final and h2c.send_response(self.sid, head, msg, OK_TRAILERS):
                self.done = True
                return conn.flush()
            if not self.stream.headers_sent:
                h2c.send_headers(self.sid, head)
            view = memoryview(msg)
            while view:
                if not conn.wait_window(self.stream):
                    return False
                view = view[h2c.send_data(self.sid, view):]
                if not conn.flush():
                    return False
        except StreamClosedError:
            return False
        return self.send_status(OK, "") if final else conn.flush()

    def _message(self, payload: bytes) -> bytes:
        """``payload`` framed; compressed in the call's coding when that makes it smaller (grpc-core sends
        a message that does not shrink as it is, flag 0). A big one is compressed off the hub."""
        if self.out_coding is not None and payload:
            compressed = compression.compress(self.out_coding, [payload])
            if len(compressed) < len(payload):
                return h2.grpc_message(compressed, compressed=True)
        return h2.grpc_message(payload)

    def send_status(self, status: int, message: str) -> bool:
        """The call's trailers (a trailers-only response if nothing was sent yet); ends the stream."""
        if self.done:
            return False
        self.done = True
        fields = [(b"grpc-status", b"%d" % status)]
        if message:
            if len(message) > _MOST_MESSAGE:  # a client's 100 KB model name, echoed: past the client's header
                message = message[:_MOST_MESSAGE] + "... (truncated)"  # list limit it loses the real status
            fields.append((b"grpc-message", h2.percent_encode(message)))
        if not self.stream.headers_sent:
            fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), *fields]
        try:
            self.conn.h2.send_headers(self.sid, fields, end_stream=True)
        except StreamClosedError:
            return False
        return self.conn.flush()

    def refuse_at_start(self, status: int, message: str) -> None:
        """Answer a call refused before it ran (an unknown method, the restricted API, a bad forwarded
        header): it never counted as running, and lets go of its stream as :meth:`finish` does."""
        self.finished = True
        self.stream.call = None
        self.send_status(status, message)

    def finish(self) -> None:
        """The call's handler is done (or never ran): it no longer counts as running."""
        if not self.finished:
            self.finished = True
            # the stream points at its call and the call at its stream: a cycle per call that only the
            # collector freed (two objects a call: 2.7 young collections per 1000 calls at c=1). What
            # comes for the stream after this (a reset, late DATA) finds no call, as for an answered one.
            self.stream.call = None
            # likewise the call's greenlet, which keeps the error it ended with (a kill, a lost
            # connection): its traceback's frames hold this call
            self.greenlet = None
            if self.wire is not None:  # the request's InferRequest span ends here, answered or not
                self.wire.sent()
            if self.deadline is not None:
                self.deadline.close()
                self.deadline = None
            if self.held:
                self.conn.server.budget.release(self.held)
                self.held = 0
            self.conn.call_finished()

    # -- unary calls --------------------------------------------------------------------------
    def _decode(self, flag: int, data: bytes | bytearray) -> tuple[Any, int]:
        """The request message, and the bytes of the budget its inflation holds (0 if not compressed):
        a stream's message keeps them with its own until it is answered (``kept``)."""
        if flag:
            encoding = (self.encoding or b"identity").decode("latin-1")
            if not codings.known(encoding):
                raise Refused(UNIMPLEMENTED, f"unsupported grpc-encoding '{encoding}'")
            limit = self.conn.server.max_inflated
            try:
                data = compression.inflate(encoding, data, limit, self._hold_more)
            except OverflowError as e:
                raise Refused(RESOURCE_EXHAUSTED, f"Received message larger than max ({e.args[0]} vs. {limit}) "
                              "after decompression. Use --http-max-input-size to increase the limit.") from None
            except zlib.error as e:
                raise Refused(INTERNAL, f"could not decompress the message: {e}") from None
            inflated = len(data)  # inflate() holds as many bytes as it returns
        else:
            return self._parse(data), 0
        try:
            return self._parse(data), inflated
        except Refused:
            self._hold_more(-inflated)
            raise

    def _parse(self, data: bytes | bytearray) -> Any:
        """The request message of an uncompressed ``data``."""
        try:
            return self.method.parse(data)
        except DecodeError:
            # Triton answers INTERNAL "Unable to parse request" (checked against 2.51)
            raise Refused(INTERNAL, "Unable to parse request") from None

    def _hold_more(self, n: int) -> None:
        """``n`` more bytes of the budget held for the message being inflated (:meth:`_decode`); on a
        stream they are kept with its messages' (n < 0 gives some back). Once the call is over (it
        gave back all it held) nothing is taken nor given back: a cancelled call's inflation stops."""
        if self.finished:
            if n > 0:
                raise Refused(CANCELLED, "the call is over")
            return
        refused = self._hold(self.held + n)
        if refused is not None:
            try:
                raise refused
            finally:
                del refused  # no cycle (this frame → the error → its traceback → this frame) to collect
        if self.inbox is not None:
            self.kept += n

    def _one_request(self) -> Any:
        if len(self.buf) >= _TAKEN_MIN and not self.method.infer:  # a large message (a load's override)
            taken = h2.take_message(self.buf)  # not copied: parsed from the buffer, which its parse may empty
            if taken is not None:
                self.buf = bytearray()
                return self._decode(*taken)[0]
        messages = h2.split_messages(self.buf)
        if len(messages) != 1 or self.buf:
            raise Refused(INTERNAL, f"a unary call takes one request message, got {len(messages)}")
        return self._decode(*messages[0])[0]

    def _answer(self, payload: Callable[[], bytes]) -> None:
        """Send a unary call's answer (or its error as the status); the call is over after."""
        try:
            self.send_message(payload(), final=True)
        except Exception as e:  # noqa: BLE001 - every failure is answered as the call's status
            self._failed(e)
        finally:
            self.finish()

    def _run_unary(self) -> None:
        if self.forwarded is None:
            self._answer(lambda: self.method.call(self._one_request()).SerializeToString())
        else:  # ModelInfer with metadata for the model (--grpc-header-forward-pattern)
            self._answer(lambda: self.method.call(self._one_request(), self.forwarded).SerializeToString())

    def _start_infer(self, message: bytes | None = None) -> None:
        """ModelInfer, in the reader (a fast path): decode and queue the request here; when the
        model answered at once (a quick model runs inline, :class:`ModelInstance`) and the answer
        fits the windows, answer here too — the reader flushes it with the rest of its read.
        Otherwise a greenlet waits for the answer, so the reader never waits for a model's thread
        or on flow control. The one case the reader is held: a model promoted to run inline that
        then yields in ``execute`` holds this connection's other streams for that one run; the
        instance is demoted back to its thread right after it (``ModelInstance``, DEMOTE_WALL_NS)."""
        start, finish = self.method.start, self.method.finish  # (ModelInfer's: never None here)
        try:
            # first, a message answered from the response cache before, by its bytes (cached_answers.py)
            again = self.method.again
            if message is not None:  # whole in its DATA frame (on_data)
                payload, kept = (None, None) if again is None or self.forwarded is not None else again(message)
                parsed = None if payload is not None else self._parse(message[5:])
            else:
                payload, kept = (None, None) if again is None or self.forwarded is not None else again(self.buf)
                parsed = None if payload is not None else self._one_request()
            if payload is None:
                request, pending = start(parsed, self.forwarded)
                if not pending.reply.ready():
                    self.greenlet = gevent.spawn(self._answer, lambda: finish(request, pending))
                    return
                payload = finish(request, pending)
                if kept is not None:
                    self.method.learn(kept, request, pending)
        except Exception as e:  # noqa: BLE001 - every failure is answered as the call's status
            self._failed(e)
            self.finish()
            return
        if self.out_coding is not None:  # compressed in its own greenlet (a big answer, on a thread)
            self.greenlet = gevent.spawn(self._answer, lambda: payload)
            return
        if self.wire is not None:
            self.wire.sending()
        conn = self.conn
        try:
            sent = len(payload) <= conn.server.max_send and \
                conn.h2.send_response(self.sid, RESPONSE_HEAD, h2.grpc_message(payload), OK_TRAILERS)
        except StreamClosedError:  # reset in the read that completed it: its StreamReset comes next
            sent = True
        if sent:
            self.done = True
            self.finish()
        else:
            self.greenlet = gevent.spawn(self._answer, lambda: payload)

    def _failed(self, error: Exception) -> None:
        """A unary call's error as its status (Triton's code for a TritonError)."""
        if not isinstance(error, (Refused, TritonError)):
            log.error("unexpected error in gRPC %s", getattr(self.method.call, "__name__", "call"), exc_info=error)
        answered(error)
        if isinstance(error, Refused):
            self.send_status(error.status, error.message)
        elif isinstance(error, TritonError):
            self.send_status(GRPC_STATUS[error.code], error.message)
        else:
            self.send_status(INTERNAL, f"internal error: {error!r}")
