"""gRPC on our own HTTP/2 connection handling, in hub greenlets (the default gRPC transport).

Why not grpcio's server: measured here (see :mod:`.grpc_server` for the candidates), grpcio's
Python server costs ~450-490 us per unary call before our code runs (a handler thread woken per
call, round trips to its polling thread), which holds gRPC to ~0.45x Triton's rate. The bytes of a
unary gRPC call are few and regular: one HEADERS block (identical on every call once the client's
HPACK table holds it) and one DATA frame in; HEADERS, DATA and trailers out. This module reads them
with one ``recv`` per batch of frames, decodes headers through a cache (:class:`HeaderDecoder`),
runs the servicer method in a greenlet of its own (no thread crossing: the servicer is hub code),
and writes the whole answer with one ``sendall``. grpcio stays available as ``--grpc-server
grpcio``.

What is implemented of HTTP/2 (RFC 9113) is what gRPC clients use: prior-knowledge connections,
SETTINGS (ours and theirs, acknowledged), flow control both ways (connection and stream windows;
large messages wait for WINDOW_UPDATE), frames up to the peer's SETTINGS_MAX_FRAME_SIZE, CONTINUATION,
padding, PING (answered; keepalive pings of our own with ``grpc.keepalive_time_ms`` and
``grpc.keepalive_timeout_ms``; too many pings without data end the connection with
ENHANCE_YOUR_CALM, as grpc does), RST_STREAM (cancels the call: a stream's requests see
``is_cancelled()``), GOAWAY (both ways; ours on shutdown lets running calls finish).
gRPC: unary and bidirectional streaming, ``grpc-encoding`` gzip/deflate on requests, message
size limits (RESOURCE_EXHAUSTED), status and percent-encoded ``grpc-message`` in trailers.
Status codes are mapped here and only here (spec §1.2).
"""

from __future__ import annotations

import errno
import logging
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event
import gevent.lock
import gevent.pool
import gevent.queue
from gevent.server import StreamServer
from google.protobuf.message import DecodeError

from ..errors import Code, TritonError
from ..protocol import http2 as h2
from ..protocol._generated import grpc_service_pb2 as pb
from ..protocol._generated import health_pb2
from .grpc import GrpcServicer
from .socket_io import recv_when_readable, send_all

log = logging.getLogger(__name__)

# grpc status codes (numbers are the wire values)
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS = 0, 1, 2, 3, 5, 6
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14
GRPC_STATUS: dict[Code, int] = {
    Code.INTERNAL: INTERNAL, Code.NOT_FOUND: NOT_FOUND, Code.UNAVAILABLE: UNAVAILABLE,
    Code.UNSUPPORTED: UNIMPLEMENTED, Code.INVALID_ARG: INVALID_ARGUMENT, Code.UNKNOWN: UNKNOWN,
    Code.ALREADY_EXISTS: ALREADY_EXISTS, Code.CANCELLED: CANCELLED,
}
MAX_MESSAGE = 2**31 - 1  # Triton sets INT32_MAX for both directions (spec §2.1)

# what we advertise: large windows (a 16 MiB tensor needs no WINDOW_UPDATE round trip), 1 MiB frames
STREAM_WINDOW = 16 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_FRAME = 1024 * 1024
MAX_HEADER_LIST = 64 * 1024
MAX_STREAMS = 4096
MAX_CONTINUATIONS = 64  # CONTINUATION frames in one header block
_RECV = 256 * 1024

_RESPONSE_HEAD = h2.encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                    (b"grpc-accept-encoding", b"identity,deflate,gzip")])
_OK_TRAILERS = h2.encode_headers([(b"grpc-status", b"0")])
_END = object()  # the client closed its side of a stream
_GONE = object()  # the stream is over (cancelled, or the connection closed)


class _Refused(Exception):
    """A call ends with a gRPC status before (or instead of) reaching the servicer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class _Method:
    parse: Callable[[bytes], Any]
    call: Callable[[Any], Any]
    streaming: bool
    infer: bool = False  # ModelInfer: started in the reader, answered there when the model already has


class _Stream:
    __slots__ = ("id", "method", "encoding", "buf", "recv_unacked", "send_window", "cancelled", "inbox",
                 "send_lock", "headers_sent", "input_done", "answered", "started")

    def __init__(self, stream_id: int, method: _Method | None, encoding: bytes | None, send_window: int) -> None:
        self.id = stream_id
        self.method = method
        self.encoding = encoding
        self.buf = bytearray()
        self.recv_unacked = 0
        self.send_window = send_window
        self.cancelled = False
        self.inbox: gevent.queue.SimpleQueue | None = None
        self.send_lock: gevent.lock.Semaphore | None = None
        self.headers_sent = False
        self.input_done = False
        self.answered = False
        self.started = False  # its handler greenlet runs (or ran)


class GrpcH2Server:
    """``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` over our HTTP/2; create,
    ``start`` and ``stop`` it from the hub thread."""

    def __init__(self, servicer: GrpcServicer, address: str, port: int, options: dict[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.servicer = servicer
        self.address = address
        self.port = port
        self.max_receive = int(opts.get("grpc.max_receive_message_length", MAX_MESSAGE))
        self.max_send = int(opts.get("grpc.max_send_message_length", MAX_MESSAGE))
        self.reuse_port = bool(opts.get("grpc.so_reuseport", 0))
        self.keepalive_time = int(opts.get("grpc.keepalive_time_ms", 7_200_000)) / 1000
        self.keepalive_timeout = int(opts.get("grpc.keepalive_timeout_ms", 20_000)) / 1000
        self.permit_without_calls = bool(opts.get("grpc.keepalive_permit_without_calls", 0))
        self.min_ping_interval = int(opts.get("grpc.http2.min_recv_ping_interval_without_data_ms", 300_000)) / 1000
        self.max_ping_strikes = int(opts.get("grpc.http2.max_ping_strikes", 2))
        self.methods = self._methods()
        self.connections: set[_Connection] = set()
        self.calls = 0  # calls running on all connections
        self.idle = gevent.event.Event()  # set while no call runs
        self.idle.set()
        self._server: StreamServer | None = None
        self.server_port = 0

    def _methods(self) -> dict[bytes, _Method]:
        methods = {}
        for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
            request_type = getattr(pb, method.input_type.name)
            streaming = method.name == "ModelStreamInfer"
            call = self.servicer.stream_infer if streaming else getattr(self.servicer, method.name)
            path = f"/inference.GRPCInferenceService/{method.name}".encode()
            methods[path] = _Method(request_type.FromString, call, streaming, method.name == "ModelInfer")
        methods[b"/grpc.health.v1.Health/Check"] = _Method(
            health_pb2.HealthCheckRequest.FromString, self.servicer.Check, False)
        return methods

    # -- lifecycle (hub thread) -----------------------------------------------------------------
    def start(self) -> int:
        """Bind and start serving; returns the bound port (``port`` 0 picks a free one)."""
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.address, self.port))
            sock.listen(1024)
        except OSError as e:
            sock.close()
            raise OSError(f"failed to bind gRPC to {self.address}:{self.port}: {e.strerror or e}") from None
        self._server = StreamServer(sock, self._handle)
        self._server.start()
        self.server_port = sock.getsockname()[1]
        return self.server_port

    def stop(self, grace: float) -> None:
        """Refuse new calls (GOAWAY), give running ones ``grace`` seconds, then cancel them."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            gevent.spawn(conn.go_away)  # a client that stopped reading must not hold the shutdown
        self.idle.wait(grace)
        for conn in list(self.connections):
            conn.close()

    def _handle(self, sock: socket.socket, address: Any) -> None:
        conn = _Connection(self, sock)
        self.connections.add(conn)
        try:
            conn.serve()
        finally:
            self.connections.discard(conn)
            conn.close()


class _Connection:
    """One client connection: a reader greenlet (this one) and a greenlet per call."""

    def __init__(self, server: GrpcH2Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.streams: dict[int, _Stream] = {}
        self.calls = 0  # calls whose handler has not finished
        self.decoder = h2.HeaderDecoder(MAX_HEADER_LIST)
        self.send_window = h2.DEFAULT_WINDOW  # the peer's connection-level window for our DATA
        self.peer_initial_window = h2.DEFAULT_WINDOW
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.recv_unacked = 0
        self.last_stream_id = 0
        self.going_away = False
        self.closed = False
        self._write_lock = gevent.lock.Semaphore()
        self._window_open: gevent.event.Event | None = None  # what senders out of window wait on
        self._continuation: tuple[int, int, list[bytes], list[int]] | None = None  # sid, flags, parts, size
        self._ping_ok = True  # a ping is welcome (we sent headers or data since the last one)
        self._last_ping = 0.0
        self._ping_strikes = 0
        self._ping_acked = True
        self._keepalive: gevent.Greenlet | None = None

    # -- writing (any greenlet) -----------------------------------------------------------------
    def write(self, data: bytes) -> bool:
        if self.closed:
            return False
        with self._write_lock:
            try:
                send_all(self.sock, data)
            except OSError:
                self._lost()
                return False
        return True

    def _wait_window(self, stream: _Stream) -> int:
        """Bytes this stream may send now (waits for the peer's WINDOW_UPDATE); 0 once the stream is gone."""
        while True:
            if stream.cancelled or self.closed:
                return 0
            room = min(stream.send_window, self.send_window)
            if room > 0:
                return room
            if self._window_open is None:
                self._window_open = gevent.event.Event()
            self._window_open.wait()

    def _send_data(self, stream: _Stream, data: bytes) -> bool:
        """DATA frames for ``data`` within flow control and the peer's frame size."""
        view, sid = memoryview(data), stream.id
        while view:
            room = self._wait_window(stream)
            if not room or stream.answered:
                return False
            chunk = view[:min(room, self.peer_max_frame)]
            n = len(chunk)
            stream.send_window -= n
            self.send_window -= n
            if not self.write(h2.frame(h2.DATA, 0, sid, bytes(chunk))):
                return False
            view = view[n:]
        return True

    def _fits(self, stream: _Stream, n: int) -> bool:
        """Whether ``n`` bytes of DATA go out in one frame within both windows now."""
        return n <= stream.send_window and n <= self.send_window and n <= self.peer_max_frame

    def send_message(self, stream: _Stream, payload: bytes, final: bool) -> bool:
        """One gRPC message on ``stream`` (the response head first if not sent yet); with ``final``,
        the OK trailers too (a unary answer: one ``sendall`` when it fits the windows)."""
        if stream.cancelled:
            return False
        if len(payload) > self.server.max_send:
            raise _Refused(RESOURCE_EXHAUSTED,
                           f"Sent message larger than max ({len(payload)} vs. {self.server.max_send})")
        msg = h2.grpc_message(payload)
        sid, n = stream.id, len(msg)
        head = b"" if stream.headers_sent else h2.frame(h2.HEADERS, h2.END_HEADERS, sid, _RESPONSE_HEAD)
        stream.headers_sent = True
        self._ping_ok, self._ping_strikes = True, 0
        if self._fits(stream, n):
            stream.send_window -= n
            self.send_window -= n
            out = head + h2.frame(h2.DATA, 0, sid, msg)
            if final:
                out += h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, _OK_TRAILERS)
                stream.answered = True
            return self.write(out)
        if head and not self.write(head):
            return False
        if not self._send_data(stream, msg):
            return False
        return self.send_status(stream, OK, "") if final else True

    def send_status(self, stream: _Stream, status: int, message: str) -> bool:
        """The call's trailers (a trailers-only response if nothing was sent yet); ends the stream."""
        if stream.cancelled or stream.answered:
            return False
        stream.answered = True
        fields = [(b"grpc-status", b"%d" % status)]
        if message:
            fields.append((b"grpc-message", h2.percent_encode(message)))
        if not stream.headers_sent:
            stream.headers_sent = True
            fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), *fields]
        out = h2.headers_frames(stream.id, h2.encode_headers(fields), True, self.peer_max_frame)
        if not stream.input_done:
            out += h2.rst_stream(stream.id, h2.NO_ERROR)  # answered early: the client may stop sending
        return self.write(out)

    # -- reading (this greenlet) ----------------------------------------------------------------
    def serve(self) -> None:
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.write(h2.settings_frame({
                h2.MAX_CONCURRENT_STREAMS: MAX_STREAMS, h2.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.MAX_FRAME_SIZE: MAX_FRAME, h2.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST, h2.ENABLE_PUSH: 0})
                + h2.window_update(0, CONNECTION_WINDOW - h2.DEFAULT_WINDOW)):
            return
        if self.server.keepalive_time > 0:
            self._keepalive = gevent.spawn(self._keepalive_loop)
        buf = bytearray()
        recv, sock = self.sock.recv, self.sock
        try:
            while len(buf) < len(h2.PREFACE):
                chunk = recv(_RECV)
                if not chunk:
                    return
                buf += chunk
                if not h2.PREFACE.startswith(bytes(buf[:len(h2.PREFACE)])):
                    return  # not an HTTP/2 client (an HTTP/1 request on the gRPC port): hang up
            del buf[:len(h2.PREFACE)]
            head, on_frame = h2.FRAME_HEAD, self._on_frame
            while not self.closed:
                pos, end = 0, len(buf)
                while end - pos >= 9 and not self.closed:
                    length_type, flags, sid = head.unpack_from(buf, pos)
                    length = length_type >> 8
                    if length > MAX_FRAME:
                        raise h2.ProtocolError(f"frame of {length} bytes", h2.FRAME_SIZE_ERROR)
                    if end - pos - 9 < length:
                        break
                    on_frame(length_type & 0xFF, flags, sid & 0x7FFF_FFFF, bytes(buf[pos + 9:pos + 9 + length]))
                    pos += 9 + length
                if pos:
                    del buf[:pos]
                if self.going_away and not self.streams:
                    return
                chunk = recv(_RECV) if buf else recv_when_readable(sock, _RECV)
                if not chunk:
                    return
                buf += chunk
        except h2.ProtocolError as e:
            log.debug("gRPC connection: %s", e)
            self.write(h2.goaway(self.last_stream_id, e.code, str(e).encode()[:256]))
        except OSError as e:
            if e.errno not in (errno.ECONNRESET, errno.EBADF, errno.EPIPE, None):
                log.debug("gRPC connection: %s", e)

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._continuation is not None and ftype != h2.CONTINUATION:
            raise h2.ProtocolError("expected CONTINUATION")
        if ftype == h2.DATA:
            self._on_data(flags, sid, payload)
        elif ftype == h2.HEADERS:
            self._on_headers(flags, sid, payload)
        elif ftype == h2.WINDOW_UPDATE:
            self._on_window_update(sid, h2.parse_u32(payload))
        elif ftype == h2.PING:
            self._on_ping(flags, payload)
        elif ftype == h2.SETTINGS:
            if sid:
                raise h2.ProtocolError("SETTINGS on a stream")
            if not flags & h2.ACK:
                self._on_settings(h2.parse_settings(payload))
        elif ftype == h2.RST_STREAM:
            stream = self.streams.get(sid)
            if stream is not None:
                self._cancel(stream)
        elif ftype == h2.CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif ftype == h2.GOAWAY:
            self.going_away = True
        elif ftype == h2.PUSH_PROMISE:
            raise h2.ProtocolError("PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5)

    def _on_settings(self, values: dict[int, int]) -> None:
        if h2.INITIAL_WINDOW_SIZE in values:
            new = values[h2.INITIAL_WINDOW_SIZE]
            if new > h2.MAX_WINDOW:
                raise h2.ProtocolError("INITIAL_WINDOW_SIZE too large", h2.FLOW_CONTROL_ERROR)
            delta, self.peer_initial_window = new - self.peer_initial_window, new
            for stream in self.streams.values():
                stream.send_window += delta
        if h2.MAX_FRAME_SIZE in values:
            size = values[h2.MAX_FRAME_SIZE]
            if not h2.DEFAULT_MAX_FRAME <= size <= 2**24 - 1:
                raise h2.ProtocolError("bad MAX_FRAME_SIZE")
            self.peer_max_frame = size
        self.write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        self._windows_moved()

    def _on_window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            if not increment:
                raise h2.ProtocolError("WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > h2.MAX_WINDOW:
                raise h2.ProtocolError("connection window past 2^31-1", h2.FLOW_CONTROL_ERROR)
        else:
            stream = self.streams.get(sid)
            if stream is None:
                return
            stream.send_window += increment
            if not increment or stream.send_window > h2.MAX_WINDOW:
                self.write(h2.rst_stream(sid, h2.PROTOCOL_ERROR if not increment else h2.FLOW_CONTROL_ERROR))
                self._cancel(stream)
        self._windows_moved()

    def _windows_moved(self) -> None:
        event, self._window_open = self._window_open, None
        if event is not None:
            event.set()

    def _on_ping(self, flags: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise h2.ProtocolError("PING payload must be 8 bytes", h2.FRAME_SIZE_ERROR)
        if flags & h2.ACK:
            self._ping_acked = True
            return
        now = time.monotonic()
        if not self._ping_ok and not self.calls and now - self._last_ping < self.server.min_ping_interval:
            self._ping_strikes += 1
            if self.server.max_ping_strikes and self._ping_strikes > self.server.max_ping_strikes:
                self.write(h2.goaway(self.last_stream_id, h2.ENHANCE_YOUR_CALM, b"too_many_pings"))
                self._lost()
                return
        self._ping_ok, self._last_ping = False, now
        self.write(h2.frame(h2.PING, h2.ACK, 0, payload))

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or sid % 2 == 0:
            raise h2.ProtocolError("HEADERS on a stream a client may not open")
        block = h2.strip_padding(flags, payload)
        if flags & h2.PRIORITY_FLAG:
            block = block[5:]
        if not flags & h2.END_HEADERS:
            self._continuation = (sid, flags, [block], [len(block)])
            return
        self._headers_done(sid, flags, block)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != sid:
            raise h2.ProtocolError("unexpected CONTINUATION")
        _, first_flags, parts, size = self._continuation
        parts.append(payload)
        size[0] += len(payload)
        if size[0] > MAX_HEADER_LIST or len(parts) > MAX_CONTINUATIONS:
            raise h2.ProtocolError("header block too large", h2.ENHANCE_YOUR_CALM)
        if flags & h2.END_HEADERS:
            self._continuation = None
            self._headers_done(sid, first_flags, b"".join(parts))

    def _route(self, headers: h2.HeaderBlock) -> tuple[_Method | None, bytes | None, bool]:
        """(method, grpc-encoding, is a gRPC request) of a header block, kept on the (cached) block."""
        route = headers.route
        if route is None:
            content_type = headers.get(b"content-type", b"")
            is_grpc = headers.get(b":method") == b"POST" and content_type.startswith(b"application/grpc")
            route = headers.route = (self.server.methods.get(headers.get(b":path", b"")),
                                     headers.get(b"grpc-encoding"), is_grpc)
        return route

    def _headers_done(self, sid: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always decoded: the HPACK table must follow the client
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: only END_STREAM matters
            if flags & h2.END_STREAM:
                self._input_done(stream)
            return
        if sid <= self.last_stream_id or self.closed:
            return  # trailers of a stream we answered or reset already (RFC 9113 §5.1): ignored
        self.last_stream_id = sid
        if self.going_away or len(self.streams) >= MAX_STREAMS:
            self.write(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        method, encoding, is_grpc = self._route(headers)
        stream = _Stream(sid, method, encoding, self.peer_initial_window)
        self.streams[sid] = stream
        if flags & h2.END_STREAM:
            stream.input_done = True
        if not is_grpc:
            fields = [(b":status", b"415"), (b"content-type", b"text/plain")]
            stream.answered = stream.headers_sent = True
            out = h2.headers_frames(sid, h2.encode_headers(fields), True, self.peer_max_frame)
            self.write(out if stream.input_done else out + h2.rst_stream(sid, h2.NO_ERROR))
            self._forget(stream)
            return
        if method is None:
            path = headers.get(b":path", b"").decode("latin-1")
            self.send_status(stream, UNIMPLEMENTED, f"Method not found: {path}")
            self._forget(stream)
            return
        self.calls += 1
        self.server.calls += 1
        if self.server.calls == 1:
            self.server.idle.clear()
        if method.streaming:
            stream.inbox = gevent.queue.SimpleQueue()
            stream.send_lock = gevent.lock.Semaphore()
            stream.started = True
            gevent.spawn(self._run_stream, stream)
            if stream.input_done:
                stream.inbox.put(_END)
        elif stream.input_done:
            self._start_unary(stream)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        n = len(payload)
        self.recv_unacked += n
        if self.recv_unacked >= CONNECTION_WINDOW // 2:
            self.write(h2.window_update(0, self.recv_unacked))
            self.recv_unacked = 0
        stream = self.streams.get(sid)
        if stream is None or stream.input_done:
            if sid > self.last_stream_id or sid == 0:
                raise h2.ProtocolError("DATA on an idle stream")
            return  # a stream we answered or reset already: its data is dropped
        data = h2.strip_padding(flags, payload)
        stream.buf += data
        stream.recv_unacked += n
        announced = h2.pending_length(stream.buf)
        refused = None
        if announced > self.server.max_receive:
            refused = _Refused(RESOURCE_EXHAUSTED,
                               f"Received message larger than max ({announced} vs. {self.server.max_receive})")
        elif stream.inbox is None and len(stream.buf) > announced + 5 >= 5:
            refused = _Refused(INTERNAL, "a unary call takes one request message, got more")
        if refused is not None:
            stream.input_done = True  # what else comes on this stream is dropped
            stream.buf = bytearray()
            if stream.inbox is not None:
                stream.inbox.put(refused)  # its greenlet answers once its senders are done
            else:
                self.send_status(stream, refused.status, refused.message)
                self._cancel(stream)
            return
        if stream.inbox is not None:
            for message in h2.split_messages(stream.buf):
                stream.inbox.put(message)
        if flags & h2.END_STREAM:
            self._input_done(stream)
        elif stream.recv_unacked >= STREAM_WINDOW // 2:
            self.write(h2.window_update(sid, stream.recv_unacked))
            stream.recv_unacked = 0

    def _input_done(self, stream: _Stream) -> None:
        if stream.input_done:
            return
        stream.input_done = True
        if stream.inbox is not None:
            stream.inbox.put(_END)
        elif not stream.answered:
            self._start_unary(stream)

    def _start_unary(self, stream: _Stream) -> None:
        stream.started = True
        if stream.method.infer:
            self._start_infer(stream)
        else:
            gevent.spawn(self._run_unary, stream)

    # -- calls (a greenlet each) ------------------------------------------------------------------
    def _decode(self, stream: _Stream, flag: int, data: bytes) -> Any:
        if flag:
            encoding = stream.encoding or b"identity"
            try:
                data = h2.decompress(encoding, data, self.server.max_receive)
            except OverflowError as e:
                raise _Refused(RESOURCE_EXHAUSTED, f"Received message larger than max ({e.args[0]} vs. "
                                                   f"{self.server.max_receive})") from None
            except ValueError as e:
                raise _Refused(UNIMPLEMENTED, str(e)) from None
            except zlib.error as e:
                raise _Refused(INTERNAL, f"could not decompress the message: {e}") from None
        try:
            return stream.method.parse(data)
        except DecodeError:
            # Triton answers INTERNAL "Unable to parse request" (checked against 2.51)
            raise _Refused(INTERNAL, "Unable to parse request") from None

    def _one_request(self, stream: _Stream) -> Any:
        """A unary call's request message, decoded."""
        messages = h2.split_messages(stream.buf)
        if len(messages) != 1 or stream.buf:
            raise _Refused(INTERNAL, f"a unary call takes one request message, got {len(messages)}")
        return self._decode(stream, *messages[0])

    def _answer(self, stream: _Stream, payload: Callable[[], bytes]) -> None:
        """Send a unary call's answer (or its error as the status); the call is over after."""
        try:
            self.send_message(stream, payload(), final=True)
        except Exception as e:  # noqa: BLE001 - every failure is answered as the call's status
            self._unary_failed(stream, e)
        finally:
            self._finish(stream)

    def _run_unary(self, stream: _Stream) -> None:
        self._answer(stream, lambda: stream.method.call(self._one_request(stream)).SerializeToString())

    def _start_infer(self, stream: _Stream) -> None:
        """ModelInfer, in the reader: decode and queue the request here; when the model answered at
        once (a quick model runs inline, :class:`ModelInstance`) and the answer fits the windows,
        answer here too. Otherwise a greenlet waits for the answer, so the reader never waits for a
        model's thread or on flow control. Saves a greenlet per call on the hot path. The one case
        the reader is held: a model promoted to run inline that then yields in ``execute`` (a patched
        sleep, a BLS call) holds this connection's other streams for that one run; the instance is
        demoted back to its thread right after it (``ModelInstance``, DEMOTE_WALL_NS)."""
        servicer = self.server.servicer
        try:
            request, pending = servicer.start_infer(self._one_request(stream))
            if pending.reply.ready():
                payload = servicer.finish_infer(request, pending).SerializeToString()
        except Exception as e:  # noqa: BLE001 - every failure is answered as the call's status
            self._unary_failed(stream, e)
            self._finish(stream)
            return
        if not pending.reply.ready():
            gevent.spawn(self._answer, stream, lambda: servicer.finish_infer(request, pending).SerializeToString())
        elif self._fits(stream, len(payload) + 5):
            self._answer(stream, lambda: payload)
        else:
            gevent.spawn(self._answer, stream, lambda: payload)

    def _unary_failed(self, stream: _Stream, error: Exception) -> None:
        """A unary call's error as its status (Triton's code for a TritonError)."""
        if isinstance(error, _Refused):
            self.send_status(stream, error.status, error.message)
        elif isinstance(error, TritonError):
            self.send_status(stream, GRPC_STATUS[error.code], error.message)
        else:
            log.error("unexpected error in gRPC %s", getattr(stream.method.call, "__name__", "call"),
                      exc_info=error)
            self.send_status(stream, INTERNAL, f"internal error: {error!r}")

    def _run_stream(self, stream: _Stream) -> None:
        """``ModelStreamInfer``: a greenlet per request writes that request's responses as they come;
        the call ends (OK trailers) once the client has closed its side and every request is answered."""
        group = gevent.pool.Group()
        refused: _Refused | None = None
        try:
            while True:
                item = stream.inbox.get()
                if item is _END:
                    break
                if item is _GONE:
                    self._stop_waiting(group)
                    break
                if isinstance(item, _Refused):
                    refused = item
                    self._stop_waiting(group)
                    break
                try:
                    request = self._decode(stream, *item)
                except _Refused as e:
                    self._stream_send(stream, pb.ModelStreamInferResponse(error_message=e.message))
                    continue
                group.spawn(self._stream_one, stream, request)
            group.join()
            if refused is not None:  # its senders are done: the status can go out
                self.send_status(stream, refused.status, refused.message)
            else:
                self.send_status(stream, OK, "")
        except Exception as e:
            log.exception("ModelStreamInfer failed")
            self.send_status(stream, INTERNAL, f"internal error: {e!r}")
        finally:
            self._finish(stream)

    def _stream_one(self, stream: _Stream, request: pb.ModelInferRequest) -> None:
        """The responses of one request on a stream; once the client has gone, closing the generator
        cancels the request (a decoupled model sees ``is_cancelled()``)."""
        responses = stream.method.call(request)
        try:
            for response in responses:
                if not self._stream_send(stream, response):
                    break
        finally:
            responses.close()

    @staticmethod
    def _stop_waiting(group: gevent.pool.Group) -> None:
        """The stream is over: its request greenlets that wait for a model's next response stop now
        (GreenletExit closes their generators, which cancels the requests); one that is writing is
        never interrupted mid-frame: it sees the stream cancelled after its write."""
        for greenlet in list(group):
            if not getattr(greenlet, "writing", False):
                greenlet.kill(block=False)

    def _stream_send(self, stream: _Stream, response: Any) -> bool:
        current = gevent.getcurrent()
        current.writing = True
        try:
            return self._stream_write(stream, response)
        finally:
            current.writing = False

    def _stream_write(self, stream: _Stream, response: Any) -> bool:
        with stream.send_lock:  # one message's frames stay together on the stream
            try:
                return self.send_message(stream, response.SerializeToString(), final=False)
            except _Refused as e:
                return self.send_message(stream, pb.ModelStreamInferResponse(error_message=e.message)
                                         .SerializeToString(), final=False)

    # -- ends -----------------------------------------------------------------------------------
    def _finish(self, stream: _Stream) -> None:
        """A call's handler is done: forget the stream (and wake a drain waiting for it)."""
        if self.streams.pop(stream.id, None) is not None:
            self.calls -= 1
            self.server.calls -= 1
            if not self.server.calls:
                self.server.idle.set()

    def _forget(self, stream: _Stream) -> None:
        self.streams.pop(stream.id, None)

    def _cancel(self, stream: _Stream) -> None:
        """The client reset the stream (or went away, or overran a limit): its call stops."""
        stream.cancelled = True
        stream.input_done = True
        if stream.inbox is not None:
            stream.inbox.put(_GONE)
        if not stream.started:
            self._finish(stream)  # no handler will
        self._windows_moved()

    def _lost(self) -> None:
        """The connection is unusable: every call on it is cancelled."""
        if self.closed:
            return
        self.closed = True
        for stream in list(self.streams.values()):
            self._cancel(stream)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def go_away(self) -> None:
        """Shutdown: no new calls on this connection; running ones go on."""
        if not self.going_away:
            self.going_away = True
            self.write(h2.goaway(self.last_stream_id, h2.NO_ERROR))
            if not self.streams:
                self._lost()

    def close(self) -> None:
        self._lost()
        for stream in list(self.streams.values()):
            self._cancel(stream)  # streams opened after the loss (frames of the same read) too
        if self._keepalive is not None:
            self._keepalive.kill(block=False)
        self.sock.close()

    def _keepalive_loop(self) -> None:
        """Ping the client every ``keepalive_time``; no answer within ``keepalive_timeout`` ends the
        connection (``grpc.keepalive_*``)."""
        server = self.server
        while not self.closed:
            gevent.sleep(server.keepalive_time)
            if self.closed or (not self.calls and not server.permit_without_calls):
                continue
            self._ping_acked = False
            self.write(h2.frame(h2.PING, 0, 0, b"\0" * 8))
            gevent.sleep(server.keepalive_timeout)
            if not self._ping_acked:
                log.info("gRPC client did not answer a keepalive ping within %.0f s: closing", server.keepalive_timeout)
                self._lost()

