"""gRPC on our own HTTP/2, in hub greenlets: the gevent driver of :mod:`..protocol.h2_connection`.

Why our own HTTP/2: grpcio's Python server cost ~450-490 us per unary call before our code ran (a
handler thread woken per call, round trips to its polling thread), holding gRPC to ~0.45x Triton's
rate; python-hyper's ``h2`` costs ~110 us of Python per unary call. A unary call is one HEADERS
block (identical on every call once the client's HPACK table holds it) and one DATA frame in,
HEADERS + DATA + trailers out: the state machine decodes the block through a cache, and this driver
reads with one ``recv`` per batch of frames and writes each batch's answers with one ``sendall``.

Per connection: a reader greenlet (accept → read → feed the state machine → hand the events to the
calls of :mod:`.grpc_calls` → write ``data_to_send()``), a timer greenlet (the state machine's
keepalive pings and header/idle timeouts), and the calls' greenlets, which wait here for send
windows. TLS (Triton's ``--grpc-use-ssl*`` flags) wraps accepted sockets with ALPN ``h2``; at most
``max_connections`` are served at once (more wait in the listen backlog).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import socket
import ssl
import time
from collections.abc import Iterable
from dataclasses import replace
from functools import partial
from typing import Any

import gevent
import gevent.event
import gevent.lock
import gevent.pool

from ..config.settings import Settings, default_grpc_max_connections
from ..errors import TritonError
from ..observability.wire_trace import WireTrace
from ..protocol import codings, header_forward, restricted
from ..protocol import h2_connection as h2c
from ..protocol import h2_events as h2e
from ..protocol.http2 import CANCEL, parse_timeout
from ..protocol.restricted import Restrictions
from ..runtime.socket_io import plain_recv, plain_send_all, recv_when_readable, send_all
from . import tls
from .budget import ByteBudget
from .compression import inflation_limit
from .descriptors import ConnectionSlots, Listener, Reusable, bind, descriptor_cap
from .drain import wait_until_idle
from .grpc import GrpcServicer
from .grpc_calls import Call
from .grpc_methods import DEADLINE_EXCEEDED, GRPC_STATUS, UNAVAILABLE, UNIMPLEMENTED, Refused, method_table, route
from .slow_requests import SlowRequestLog

log = logging.getLogger(__name__)

MAX_MESSAGE = 2**31 - 1  # Triton sets INT32_MAX for both directions
_RECV = 256 * 1024
_NOT_GRPC = [(b":status", b"415"), (b"content-type", b"text/plain")]


def body_max_time(s: Settings) -> float:
    """The most a gRPC message may take to arrive: what an HTTP body of the largest size may take at the
    minimum rate (grace + --http-max-input-size / rate, 74 s by default). It binds only messages larger
    than that (a 2 GiB one must come at 28 MiB/s): holding X bytes of the budget then costs X bytes per
    74 s, as on HTTP, however large one message may be. 0 (no cap) without a minimum rate."""
    if not s.request_body_min_rate:
        return 0.0
    return s.request_body_grace_secs + s.http_max_input_size / s.request_body_min_rate


class GrpcH2Server:
    """``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` over our HTTP/2; create,
    ``start`` and ``stop`` it from the hub thread. ``options`` are grpc channel arguments (the
    keepalive flags); ``limits`` the HTTP/2 limits; ``max_connections`` 0 derives the cap from the
    open-file limit; ``ssl_context`` turns on TLS."""

    def __init__(self, servicer: GrpcServicer, address: str, port: int, options: dict[str, Any] | None = None,
                 limits: h2e.Limits | None = None, max_connections: int = 0,
                 ssl_context: ssl.SSLContext | None = None, restrictions: Restrictions | None = None,
                 budget: ByteBudget | None = None, slots: ConnectionSlots | None = None,
                 response_compression: str = "none", forward: re.Pattern[str] | None = None,
                 max_inflated: int = 0) -> None:
        """``max_inflated``: the most bytes a compressed message may inflate to (0: the message limit)."""
        opts = dict(options or {})
        self.forward = forward  # --grpc-header-forward-pattern: metadata an inference call passes to the model
        self.response_compression = response_compression  # --grpc-infer-response-compression-level
        self.budget = budget or ByteBudget(0)  # request bytes held by all calls (budget.py)
        self.slots = slots or ConnectionSlots()  # descriptors of all ports (descriptors.py)
        self.restrictions = restrictions or None  # --grpc-restricted-protocol; None: no check at all
        self.servicer = servicer
        # the server's tracer: in OpenTelemetry mode (its ``otel`` set at start) inference calls carry the
        # client's W3C traceparent to the plane; a servicer without a plane (a benchmark's stub) has none
        self.tracer = getattr(getattr(servicer, "plane", None), "tracer", None)
        self.address = address
        self.port = port
        self.max_receive = int(opts.get("grpc.max_receive_message_length", MAX_MESSAGE))
        self.max_send = int(opts.get("grpc.max_send_message_length", MAX_MESSAGE))
        # compression.inflation_limit: HTTP's body limit, so a gzip message is bounded as a gzip body is
        self.max_inflated = min(self.max_receive, max_inflated or self.max_receive)
        self.reuse_port = bool(opts.get("grpc.so_reuseport", 0))
        self.limits = replace(
            limits or h2e.Limits(),
            keepalive_time=int(opts.get("grpc.keepalive_time_ms", 7_200_000)) / 1000,
            keepalive_timeout=int(opts.get("grpc.keepalive_timeout_ms", 20_000)) / 1000,
            keepalive_permit_without_calls=bool(opts.get("grpc.keepalive_permit_without_calls", 0)),
            min_ping_interval=int(opts.get("grpc.http2.min_recv_ping_interval_without_data_ms", 300_000)) / 1000,
            max_ping_strikes=int(opts.get("grpc.http2.max_ping_strikes", 2)))
        # one message of the largest size must fit what a connection may hold unconsumed
        self.limits = replace(self.limits, max_unconsumed=max(self.limits.max_unconsumed, self.max_receive + 5))
        self.max_connections = descriptor_cap(max_connections or default_grpc_max_connections())
        self.ssl_context = ssl_context
        self.methods = method_table(servicer)
        self.slow_log = SlowRequestLog("gRPC")
        self.connections: set[Connection] = set()  # each holds a slot
        self.calls = 0  # calls running on all connections
        # what wait_idle waits on, made only when something waits (drain.py): an Event cleared and set
        # around every call was two calls into gevent per call for a wait that happens once
        self.idle_waiter: gevent.event.Event | None = None
        self._server: Listener | None = None
        self.server_port = 0

    @classmethod
    def from_settings(cls, servicer: GrpcServicer, s: Settings, budget: ByteBudget | None = None,
                      slots: ConnectionSlots | None = None) -> GrpcH2Server:
        limits = h2e.Limits(max_concurrent_streams=s.grpc_max_concurrent_streams,
                            header_timeout=s.grpc_header_timeout_secs, idle_timeout=s.grpc_idle_timeout_secs,
                            min_rate=s.request_body_min_rate, body_grace=s.request_body_grace_secs,
                            body_max_time=body_max_time(s), max_connection_age=s.grpc_max_connection_age_secs,
                            max_connection_age_grace=s.grpc_max_connection_age_grace_secs)
        context = tls.server_context(s.grpc_server_cert, s.grpc_server_key, s.grpc_root_cert,
                                     s.grpc_use_ssl_mutual) if s.grpc_use_ssl else None
        restrictions = Restrictions(s.grpc_restricted_protocol, "--grpc-restricted-protocol")
        return cls(servicer, s.grpc_address, s.grpc_port, dict(s.grpc_options), limits, s.grpc_max_connections,
                   context, restrictions, budget, slots, s.grpc_infer_response_compression_level,
                   header_forward.compile_pattern(s.grpc_header_forward_pattern), inflation_limit(s))

    def start(self, listener: socket.socket | None = None) -> int:
        """Bind and start serving; returns the bound port (``port`` 0 picks a free one). ``listener``: a
        socket bound and listening already (gunicorn's arbiter hands its listeners down to workers)."""
        sock = listener if listener is not None else bind(self.address, self.port, self.reuse_port, "gRPC")
        self._server = Listener(sock, self._handle, spawn=gevent.pool.Pool(self.max_connections))
        self._server.start()
        self.slots.register(self._reusable)
        self.server_port = sock.getsockname()[1]
        return self.server_port

    def stop(self, grace: float) -> None:
        """Refuse new calls (GOAWAY), give running ones ``grace`` seconds, then cancel them."""
        if self._server is not None:
            self._server.close()
        self.slots.unregister(self._reusable)
        for conn in list(self.connections):
            gevent.spawn(conn.go_away)  # a client that stopped reading must not hold the shutdown
        deadline = time.monotonic() + grace
        self.wait_idle(grace)
        # then each connection lingers (Connection._linger) and closes; whatever is left is closed here
        end = min(deadline, time.monotonic() + _GOAWAY_LINGER + 0.5)
        while self.connections and time.monotonic() < end:
            gevent.sleep(0.05)
        for conn in list(self.connections):
            conn.close()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no call runs on any connection; True when idle in time."""
        return wait_until_idle(self, self.calls, timeout)

    def _handle(self, sock: socket.socket, address: Any) -> None:
        if not self.slots.take("gRPC"):
            sock.close()
            return
        conn = Connection(self, sock, address)
        self.connections.add(conn)
        try:
            if self.ssl_context is None or conn.handshake(self.ssl_context):
                conn.serve()
        finally:
            self._forget(conn)
            conn.close()

    def _reusable(self) -> Iterable[Reusable]:
        """Connections with no stream open (or no preface yet), for the process's slots to drain."""
        return [(since, partial(self._evict, conn)) for conn in self.connections
                if (since := conn.h2.idle_since) is not None and not conn.calls]

    def _evict(self, conn: Connection) -> None:
        self._forget(conn)
        conn.close()

    def _forget(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.slots.give()


_DATA_RECEIVED, _REQUEST_RECEIVED = h2e.DataReceived, h2e.RequestReceived  # the events of every call
_GOAWAY_LINGER = 1.0  # seconds a connection is still read after GOAWAY, once its calls are done


class Connection:
    """One client connection: the state machine, its socket, the reader (``serve``) and its calls."""

    def __init__(self, server: GrpcH2Server, sock: socket.socket, peer: Any = None) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.h2 = h2c.H2Connection(server.limits, time.monotonic())
        self.calls = 0  # calls whose handler has not finished
        self.writer: gevent.Greenlet | None = None  # the greenlet inside sendall (never killed there)
        self.lost = False
        self._write_lock = gevent.lock.Semaphore()
        self._window_open: gevent.event.Event | None = None  # what senders out of window wait on
        self._timer: gevent.Greenlet | None = None
        self._lingering = False  # going away: closed once the calls are done (_linger)
        self._send, self._recv = send_all, recv_when_readable  # plain socket calls under TLS

    def handshake(self, context: ssl.SSLContext) -> bool:
        """TLS, within the header timeout; a TLS socket is read and written with gevent's own calls."""
        wrapped = tls.accept(self.sock, context, self.server.limits.header_timeout)
        if wrapped is not None:
            self.sock, self._send, self._recv = wrapped, plain_send_all, plain_recv
        return wrapped is not None

    # -- writing (any greenlet) -----------------------------------------------------------------
    def flush(self) -> bool:
        """Write what the state machine queued (in order: the bytes are taken under the lock). A
        write stuck longer than ``write_timeout`` loses the connection (the timer sees it)."""
        if self.lost:
            return False
        with self._write_lock:
            if self.lost:  # lost while this greenlet waited for the lock
                return False
            conn = self.h2
            data = conn.data_to_send()
            if data:
                self.writer = gevent.getcurrent()
                conn.writing_since = time.monotonic()
                try:
                    self._send(self.sock, data)
                except OSError:
                    self._lose()
                    return False
                finally:
                    self.writer = conn.writing_since = None
                if self._window_open is not None:
                    self._windows_moved()  # senders held by max_send_buffer may go on
        return True

    def wait_window(self, stream: h2e.H2Stream) -> int:
        """Bytes ``stream`` may send now (waits for the peer's WINDOW_UPDATE); 0 once it is gone.
        A peer that keeps the window shut for ``window_timeout`` gets the stream reset (CANCEL)."""
        deadline = None
        while not (stream.local_closed or self.lost):
            room = self.h2.local_flow_control_window(stream.id)
            if room > 0:
                return room
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.server.limits.window_timeout
            elif now >= deadline:
                self.h2.reset_stream(stream.id)  # CANCEL
                self.flush()
                if stream.call is not None:
                    stream.call.cancel()
                return 0
            if self._window_open is None:
                self._window_open = gevent.event.Event()
            self._window_open.wait(deadline - now)
        return 0

    def _windows_moved(self) -> None:
        event, self._window_open = self._window_open, None
        if event is not None:
            event.set()

    # -- reading (this greenlet) ----------------------------------------------------------------
    def serve(self) -> None:
        conn, sock = self.h2, self.sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.initiate_connection()
        self._timer = gevent.spawn(self._tick)
        recv, on_event, on_request, monotonic = self._recv, self._on_event, self._on_request, time.monotonic
        try:
            while self.flush() and not conn.closed:  # going away: read on until _linger closes
                chunk = recv(sock, _RECV)
                if not chunk:
                    return
                for event in conn.receive_data(chunk, monotonic()):
                    kind = event.__class__
                    if kind is _DATA_RECEIVED:  # a call's request, the most frequent event: here
                        call = event.stream.call
                        if call is not None and not call.input_done and not conn.closed:
                            call.on_data(event.data, event.end_stream)
                    elif kind is _REQUEST_RECEIVED:  # one a call: here too (_on_event's rule for it)
                        if not conn.closed:
                            on_request(event)
                    else:
                        on_event(event)
            self.flush()
        except OSError as e:
            if e.errno not in (errno.ECONNRESET, errno.EBADF, errno.EPIPE, None):
                log.debug("gRPC connection: %s", e)

    def _on_event(self, event: h2e.Event) -> None:
        """One event of the state machine's (serve() takes DataReceived and RequestReceived itself, as this
        does)."""
        kind = event.__class__
        if self.h2.closed and kind is not h2e.StreamReset and kind is not h2e.ConnectionTerminated:
            return  # a connection error later in the same read: no new work, no answer behind the GOAWAY
        if kind is _REQUEST_RECEIVED:
            self._on_request(event)
        elif kind is _DATA_RECEIVED:
            call = event.stream.call
            if call is not None and not call.input_done:
                call.on_data(event.data, event.end_stream)
        elif kind is h2e.StreamReset:
            self._windows_moved()
            if event.stream.call is not None:
                event.stream.call.cancel()
        elif kind is h2e.StreamEnded:
            if event.stream.call is not None:
                event.stream.call.end_input()
        elif kind is h2e.WindowUpdated:
            self._windows_moved()
        elif kind is h2e.StreamTooSlow:
            self._too_slow(event)
        elif kind is h2e.ConnectionTerminated:
            log.debug("gRPC connection ends: code %d %r", event.error_code, event.additional_data)

    def _too_slow(self, event: h2e.StreamTooSlow) -> None:
        """A request body under the minimum rate: its call ends with DEADLINE_EXCEEDED and what it held of
        the request memory budget is freed (a stream without a call is reset)."""
        self.server.slow_log.report(self.peer, event.message)
        call = event.stream.call
        if call is not None and not call.input_done:
            call.refuse(Refused(DEADLINE_EXCEEDED, event.message))
        else:
            self.h2.reset_stream(event.stream_id, CANCEL)

    def _on_request(self, event: h2e.RequestReceived) -> None:
        server, headers = self.server, event.headers
        method, encoding, is_grpc = headers.route or route(server.methods, headers)  # kept on a cached block
        if not is_grpc:
            with contextlib.suppress(h2e.StreamClosedError):  # reset in the same read
                self.h2.send_headers(event.stream_id, _NOT_GRPC, end_stream=True)
            return
        call = event.stream.call = Call(self, event.stream, method, encoding)
        if method is None:
            path = headers.get(b":path", b"").decode("latin-1")
            call.refuse_at_start(UNIMPLEMENTED, f"Method not found: {path}")
            return
        if server.restrictions is not None:
            refusal = self._refusal(headers)
            if refusal is not None:
                call.refuse_at_start(UNAVAILABLE, refusal)
                return
        infers = method.start is not None or method.streaming  # it carries requests for a model
        if server.forward is not None and infers:
            try:
                call.forwarded = header_forward.forwarded(server.forward, (
                    (k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.items()))
            except TritonError as e:  # a reserved parameter name
                call.refuse_at_start(GRPC_STATUS[e.code], e.message)
                return
        tracer = server.tracer
        if tracer is not None and infers and tracer.wired:
            traceparent = headers.get(b"traceparent")  # OpenTelemetry mode: the W3C context, as Triton reads it
            context = None if traceparent is None else traceparent.decode("latin-1")
            if method.infer:  # Triton's GRPC_WAITREAD_START: the call's headers are in
                call.wire = WireTrace("GRPC", context, time.perf_counter_ns())
                call.forwarded = header_forward.with_trace(call.forwarded, call.wire)
            else:  # a stream: a WireTrace per request message (grpc_stream_call.py)
                call.stream_context = context or ""
        self.calls += 1
        server.calls += 1  # the server's running calls: idle while none (Connection.call_finished)
        timeout = headers.get(b"grpc-timeout")
        if timeout is not None:
            call.set_deadline(parse_timeout(timeout))
        level = server.response_compression
        if level != "none" and infers:
            call.out_coding = codings.grpc_response_coding(level, headers.get(b"grpc-accept-encoding"))
        if method.streaming:
            call.errors_end_stream = headers.get(b"triton_grpc_error", b"").lower() == b"true"
            call.begin(event.end_stream)
        elif event.end_stream:  # (a unary call's begin() does only this)
            call.end_input()

    def _refusal(self, headers: Any) -> str | None:
        """--grpc-restricted-protocol: the refusal for this call's category, or None."""
        restrictions = self.server.restrictions
        assert restrictions is not None
        category = restricted.grpc_category(headers.get(b":path", b"").rsplit(b"/", 1)[-1].decode("latin-1"))
        header = restrictions.header_for(category)
        value = headers.get(header.encode("latin-1")) if header else None
        return restrictions.refusal(category, value.decode("latin-1") if value is not None else None)

    def call_finished(self) -> None:
        """A call of this connection is over (counted in at _on_request): the server is idle once none runs."""
        self.calls -= 1
        server = self.server
        server.calls -= 1
        if not server.calls and server.idle_waiter is not None:
            server.idle_waiter.set()

    def _tick(self) -> None:
        """Keepalive pings and timeouts: the state machine decides, this greenlet keeps its time."""
        conn = self.h2
        while not self.lost:
            deadline = conn.tick(time.monotonic())
            expired, conn.expired = conn.expired, []
            for event in expired:  # streams without progress: their calls are cancelled
                self._on_event(event)
            if self.writer is None:  # never wait behind a stuck write: the tick times it out
                self.flush()
            if conn.closed:
                self._lose()
                return
            if conn.aged and not self._lingering:  # --grpc-max-connection-age: GOAWAY went out with the flush
                self._lingering = True
                gevent.spawn(self._linger)
            gevent.sleep(max(0.0, deadline - time.monotonic()))

    # -- ends -----------------------------------------------------------------------------------
    def _lose(self) -> None:
        """The connection is unusable: every call on it is cancelled."""
        if not self.lost:
            self.lost = True
            self._cancel_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def go_away(self) -> None:
        """Shutdown: no new calls on this connection; running ones go on. The connection stays open
        (and read) until its calls finished and then ``_GOAWAY_LINGER`` seconds, or until the client
        closes it: closing at once would reset the socket under the GOAWAY while the client still sends,
        and it could not tell which of its new calls were never run (grpc-go drains likewise)."""
        self.h2.go_away()
        self.flush()
        if not self._lingering:
            self._lingering = True
            gevent.spawn(self._linger)

    def _linger(self) -> None:
        while self.calls and not self.lost:
            gevent.sleep(0.05)
        gevent.sleep(_GOAWAY_LINGER)
        self._lose()

    def _cancel_all(self) -> None:
        for stream in list(self.h2.streams.values()):
            if stream.call is not None:
                stream.call.cancel()
        self._windows_moved()

    def close(self) -> None:
        self._lose()
        self._cancel_all()  # calls opened by the frames read after the loss too
        timer, self._timer = self._timer, None  # its GreenletExit's traceback holds _tick's frame, and it self
        if timer is not None:
            timer.kill(block=False)
        self.sock.close()

