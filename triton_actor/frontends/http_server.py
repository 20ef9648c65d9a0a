"""The HTTP/1.1 driver: gevent's StreamServer, one greenlet per connection, feeding the sans-I/O
:mod:`..protocol.http1` state machine and answering through the router (:class:`.http.HttpFrontend`).

Why not gevent.pywsgi: at the request rates Triton reaches here (~3000/s per connection), pywsgi's
per-request machinery (environ building, header objects, several sends) was most of our latency.
A request here is a few ``recv`` calls and one ``sendall`` per answer (so Nagle never stalls it;
TCP_NODELAY is set anyway).

Connections are bounded as nginx bounds them: at most ``max_connections``, and a slot of the
process's :class:`~.descriptors.ConnectionSlots` each (every port draws on the one descriptor table);
when either runs out, the ones waiting longest for a request head are closed (nginx drains its
"reusable" connections the same way), and if none is waiting the new connection is closed. One reaper greenlet closes connections past the deadline their state
machine gives (header, body between reads, keep-alive idle): a timer per read would cost ~3 µs a
request, a deadline is two attribute writes. Closing a socket wakes its greenlet with an error at
its ``recv``; a connection has a deadline only while it waits for bytes, never while it is answered.
A body past its deadline (``--http-body-timeout-secs`` between reads, or under ``--request-body-min-rate``)
is answered 408 as nginx and Apache do: the reaper wakes the greenlet's read (``socket_io.wake_reader``) as
an end of file that its state machine, past the deadline, turns into the 408. While requests wait
in line for the request memory budget, the bodies that hold it are pressed (their grace shrinks to
``http1.PRESSED_GRACE``) and the reaper ticks every 0.1 s: a reservation nobody uses goes to the line
within about a second.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from time import monotonic, perf_counter_ns
from typing import Any
from urllib.parse import unquote

import gevent
import gevent.event
import orjson
from gevent.socket import wait_read

from ..errors import TritonError
from ..observability.tracing import Tracer
from ..observability.wire_trace import WireTrace
from ..protocol import http1
from ..runtime import fastpath
from ..runtime.socket_io import PeerWatch, Woken, recv_when_readable, send_all, send_now, wake_reader
from .budget import FIRST_INSTALLMENT, ByteBudget, with_room
from .descriptors import ConnectionSlots, Listener, Reusable, bind, close_longest_waiting, descriptor_cap
from .http import JSON_HEADERS, HttpFrontend, Reply, body_kind, error_response, too_large
from .http_status import status_line
from .slow_requests import SlowRequestLog

log = logging.getLogger(__name__)

_RECV = 256 * 1024
# a body at least this big, for a view that takes it over (the load route), is handed over, not copied
# (_read_taken); smaller ones are read as any other: their copy is a few microseconds and KiB
_TAKEN_MIN = 64 * 1024
_LINGER_S = 5.0  # a 408'd client's bytes are read and dropped until it closes, at most this (nginx's lingering_timeout)
_PRESSED_TICK = 0.1  # the reaper's tick while requests wait in line for the budget (pressed bodies' deadlines)
_OUR_SIDE_CLOSING = frozenset({1, 4, 5})  # TCP_ESTABLISHED, FIN_WAIT1, FIN_WAIT2: the peer has not closed yet


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the client closed its side (Linux: the connection's TCP state); True where it cannot be told."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] not in _OUR_SIDE_CLOSING
    except (OSError, AttributeError):
        return True


def _recv_body(sock: socket.socket, size: int) -> bytes:
    """A read of a request's bytes; woken by the reaper (the body's deadline passed), an end of file."""
    try:
        return sock.recv(size)
    except Woken:
        return b""


_ABSENT = object()


class _Connection:
    __slots__ = ("sock", "http", "budget", "watcher", "peer", "gone", "held", "woken")

    def __init__(self, sock: socket.socket, http: http1.ServerConnection, budget: ByteBudget) -> None:
        self.sock = sock
        self.http = http
        self.budget = budget
        self.watcher: gevent.Greenlet | PeerWatch | None = None  # watching for the client to go away
        self.peer: PeerWatch | None = None  # (fast paths on) reused by every waiting request
        self.gone: gevent.event.Event | None = None
        self.held = 0  # bytes of the request memory budget its request holds (budget.py)
        self.woken = 0.0  # when the reaper woke its reader (a body past its deadline: 408); 0.0 never

    def hold(self, n: int) -> None:
        """Hold ``n`` more bytes of the budget for the request being answered (its body as it is
        inflated, :func:`.compression.inflate`; n < 0 gives some back), released with the rest once it
        is answered. As a chunked body grows, it never waits: 503 (UNAVAILABLE) when they do not fit."""
        if n > 0 and not self.budget.try_reserve(n, barge=True):
            raise TritonError.unavailable(self.budget.refusal())
        if n < 0:
            self.budget.release(-n)
        self.held += n

    def peer_gone(self) -> gevent.event.Event:
        """An event set if the client closes the connection while its request waits (an answer that
        cannot be delivered any more: the request is cancelled). Started only by a request that waits,
        so quick answers pay nothing; a client that sends more (pipelining) ends the watch."""
        if self.gone is None:
            self.gone = gevent.event.Event()
            if fastpath.enabled and hasattr(self.sock, "_sock"):
                if self.peer is None:
                    self.peer = PeerWatch(self.sock)
                self.peer.start(self.gone)
                self.watcher = self.peer
            else:
                self.watcher = gevent.spawn(self._watch, self.gone)
        return self.gone

    def _watch(self, gone: gevent.event.Event) -> None:
        try:
            wait_read(self.sock.fileno())
            if not self.sock.recv(1, socket.MSG_PEEK):
                gone.set()
        except OSError:
            gone.set()

    def end_watch(self) -> None:
        if self.watcher is not None:
            if self.watcher is self.peer:
                self.peer.stop()
            else:
                self.watcher.kill(block=False)
            self.watcher = self.gone = None


class HttpServer:
    """Serves one :class:`HttpFrontend` on ``(address, port)``; port 0 picks a free one."""

    def __init__(self, address: str, port: int, frontend: HttpFrontend, limits: http1.Limits = http1.DEFAULT_LIMITS,
                 max_connections: int = 1024, listener: socket.socket | None = None,
                 budget: ByteBudget | None = None, slots: ConnectionSlots | None = None, name: str = "HTTP",
                 reuse_port: bool = False, tracer: Tracer | None = None) -> None:
        self.frontend = frontend
        # the server's tracer: while it traces (its ``wired`` set) each request gets a WireTrace
        self.tracer = tracer
        self.limits = limits
        self.name = name
        self.budget = budget or ByteBudget(0)  # request bytes held by all connections (budget.py)
        self.slots = slots or ConnectionSlots()  # descriptors of all ports (descriptors.py)
        self.max_connections = descriptor_cap(max_connections)
        # ``listener``: a socket bound by someone else (gunicorn's arbiter hands its listeners down)
        if listener is None and reuse_port:  # --reuse-http-port
            listener = bind(address, port, True, name)
        self._server = Listener(listener if listener is not None else (address, port), self._handle)
        self._connections: dict[_Connection, None] = {}  # insertion-ordered set; each holds a slot
        self._reaper: gevent.Greenlet | None = None
        self._closing = False
        self._warned_at = -1e9
        self.slow_log = SlowRequestLog("HTTP")

    @property
    def server_port(self) -> int:
        return self._server.server_port

    def start(self) -> None:
        self._server.start()
        self.slots.register(self._reusable)
        self._reaper = gevent.spawn(self._reap)

    def close(self) -> None:
        """Stop accepting; connections finish the request they are in and then close."""
        self._closing = True
        self._server.close()

    def wait_closed(self, timeout: float) -> None:
        """After :meth:`close`: wait until the clients closed or were answered, at most ``timeout`` s."""
        deadline = monotonic() + timeout
        while self._connections and monotonic() < deadline:
            gevent.sleep(0.01)

    def stop(self, timeout: float | None = 1.0) -> None:
        self._closing = True
        self.slots.unregister(self._reusable)
        self._server.stop(timeout=timeout)
        if self._reaper is not None:
            self._reaper.kill(block=False)
        for conn in list(self._connections):
            self._drop(conn)

    # -- bounds -----------------------------------------------------------------------------------
    def _reap(self) -> None:
        """Close connections past their deadline (hub greenlet; a tick of a quarter of the shortest
        timeout, at most 1 s, as coarse as nginx's timers)."""
        lim = self.limits
        tick = min(1.0, max(0.01, min(lim.header_timeout, lim.body_timeout, lim.keepalive_timeout,
                                      lim.send_timeout, lim.body_grace if lim.min_rate else 1.0) / 4))
        budget = self.budget
        while True:
            if budget.line_formed.wait(min(tick, _PRESSED_TICK) if budget.pressed else tick):
                budget.line_formed.clear()
            if budget.pressed:  # bodies that hold what others wait for lose their grace (http1 press)
                for conn in self._connections:
                    if conn.held:
                        conn.http.press()
            now = monotonic()
            for conn in [c for c in self._connections if c.http.deadline <= now]:
                if conn.http.reading_body and not conn.woken:
                    self._wake(conn, now)  # its greenlet answers 408
                elif not conn.woken or now - conn.woken >= _LINGER_S + 1.0:
                    self._drop(conn)
                # else its greenlet has yet to answer the 408 and start lingering (which moves the
                # deadline): dropped now, the client's next bytes would get a reset that destroys the 408

    @staticmethod
    def _wake(conn: _Connection, now: float) -> None:
        """Wake the greenlet reading a body past its deadline: its read ends as an end of file, which
        the state machine answers with 408 (the reaper drops the connection if it has not answered and
        lingered within :data:`_LINGER_S` and a second)."""
        conn.woken = now
        wake_reader(conn.sock)

    def _make_room(self) -> bool:
        """Close the connections waiting longest for a request head; False when none is waiting."""
        waiting = self._reusable()
        closed = close_longest_waiting(waiting)
        now = monotonic()
        if now - self._warned_at > 60:
            self._warned_at = now
            log.warning("%d %s connections (--http-max-connections): closed %d waiting for a request",
                        self.max_connections, self.name, closed)
        return bool(waiting)

    def _reusable(self) -> list[Reusable]:
        """The connections waiting for a request head, for the process's slots to drain."""
        return [(c.http.since, lambda c=c: self._drop(c)) for c in self._connections if c.http.waiting]

    def _drop(self, conn: _Connection) -> None:
        """Close ``conn`` from outside its greenlet, which wakes at its ``recv`` with an error."""
        self._forget(conn)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _forget(self, conn: _Connection) -> None:
        """``conn`` is closed, or about to be: its slot is free."""
        if self._connections.pop(conn, _ABSENT) is not _ABSENT:
            self.slots.give()

    # -- one connection ---------------------------------------------------------------------------
    def _handle(self, sock: socket.socket, address: Any) -> None:
        if (len(self._connections) >= self.max_connections and not self._make_room()) or not self.slots.take(self.name):
            sock.close()
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        conn = _Connection(sock, http1.ServerConnection(self.limits, monotonic()), self.budget)
        self._connections[conn] = None
        try:
            self._serve(conn)
        except http1.ProtocolError as e:
            if isinstance(e, http1.BodyTimeout):
                self.slow_log.report(address, e.message)
            self._refuse(conn, e)
        except OSError:
            pass  # the client went away, or a deadline closed the socket
        finally:
            self._forget(conn)
            if conn.peer is not None:
                conn.peer.close()
            sock.close()

    def _serve(self, conn: _Connection) -> None:
        sock, http, frontend, tracer = conn.sock, conn.http, self.frontend, self.tracer
        while True:  # closing: the answer says Connection: close, and the loop ends after it is sent
            head, body = self._next_request(sock, http)
            if head is http1.CLOSED:
                return
            # unpacked, not read by name: a NamedTuple's field getters are CPython 3.11's slow path
            method, target, _version, headers, keep_alive, expect_continue, length = head
            wire = None
            if tracer is not None and tracer.wired:  # Triton's HTTP_RECV_START: the head is in
                wire = WireTrace("HTTP", headers.get("traceparent"), perf_counter_ns())
            conn.held = self._reserve(conn, length)
            frontend.in_flight += 1  # (the shutdown drain's count: HttpFrontend.wait_idle)
            try:
                if expect_continue:
                    send_all(sock, http1.CONTINUE)
                if body is not None:
                    pass  # it came whole with its head (receive_whole)
                elif length >= _TAKEN_MIN and frontend.takes_body(method, unquote(target.partition("?")[0], "latin-1")):
                    (body,) = self._read_taken(conn)
                else:
                    event = http.next_event()
                    if event is http1.NEED_DATA:
                        event = self._read_event(sock, http) if length != http1.CHUNKED else self._read_chunked(conn)
                    (body,) = event
                path, _, query = target.partition("?")
                if "%" in path:  # (unquote's own test, without its call)
                    path = unquote(path, "latin-1")
                if wire is None:
                    reply = frontend(method, path, query, headers, body, conn.peer_gone, conn.hold)
                else:
                    wire.recv_end = perf_counter_ns()
                    reply = frontend(method, path, query, headers, body, conn.peer_gone, conn.hold, wire)
                    wire.sending()
                if conn.watcher is not None:
                    conn.end_watch()
                keep_alive = keep_alive and not self._closing
                if not self._send(conn, method, reply, keep_alive):
                    return
            finally:
                if wire is not None:
                    wire.sent()  # the request's InferRequest span ends here, sent or not
                frontend.in_flight -= 1
                if frontend.idle_waiter is not None and not frontend.in_flight:
                    frontend.idle_waiter.set()
                self.budget.release(conn.held)
                conn.held = 0
            http.start_next_cycle(monotonic())

    def _reserve(self, conn: _Connection, length: int) -> int:
        """Reserve the body's bytes before reading it (a chunked one: its first installment); while the
        budget is spent the body stays in the client's socket, and the body's clocks start once it is
        reserved. A 503 when the wait outlasts the body timeout. Returns the bytes reserved (released
        once the request is answered)."""
        n = min(self.limits.max_body, FIRST_INSTALLMENT) if length == http1.CHUNKED else length
        if n <= 0 or self.budget.try_reserve(n):
            return max(n, 0)
        conn.http.deadline = float("inf")  # our wait has its own timeout
        if not self.budget.reserve(n, self.limits.body_timeout):
            raise self._busy()
        conn.http.begin_body(monotonic())
        if self.budget.pressed:  # granted while others still wait: pressed from the start
            conn.http.press()
        return n

    def _busy(self) -> http1.ProtocolError:
        return http1.ProtocolError(503, self.budget.refusal())

    def _read_chunked(self, conn: _Connection) -> Any:
        """Read a chunked body, reserving the budget as its bytes arrive (``budget.with_room``): its
        size is unknown, and reserving the most it may be (``--http-max-input-size``) let a few slow
        chunked uploads hold the whole budget. Growing never waits: a request that holds part of the
        budget and waits for more, beside others doing the same, is a deadlock (each holds what the
        others wait for) that only timeouts would end. It takes what fits, even past the bodies waiting
        in line (which hold nothing while they wait, so the line cannot deadlock), or is answered 503."""
        sock, http, budget = conn.sock, conn.http, self.budget
        read = len(http.buf)  # what came with the head
        while True:
            data = _recv_body(sock, max(_RECV, http.want))
            read += len(data)
            if read > conn.held:
                more = with_room(read) - conn.held
                if not budget.try_reserve(more, barge=True):
                    raise self._busy()
                conn.held += more
            http.receive_data(data, monotonic())
            event = http.next_event()
            if event is not http1.NEED_DATA:
                return event

    @staticmethod
    def _read_taken(conn: _Connection) -> Any:
        """Read a body its view takes over (:func:`.http.takes_body`): the state machine's buffer is
        handed to the view without a copy, and the view empties it once parsed, so the body is not held
        by this loop (nor copied) while the request goes on. Issue 23: a load request's 4 MiB config
        override was held here for the whole load, one more copy at its peak."""
        sock, http = conn.sock, conn.http
        event = http.take_body()
        while event is http1.NEED_DATA:
            http.receive_data(_recv_body(sock, max(_RECV, http.want)), monotonic())
            event = http.take_body()
        return event

    @classmethod
    def _next_request(cls, sock: socket.socket, http: http1.ServerConnection) -> tuple[Any, bytes | None]:
        """The next request's head (or ``CLOSED``), and its body when it came whole with the head in one
        read (``receive_whole``: a repeating client's request, a fast path); None: read the body after."""
        if http.buf:  # pipelined, or the rest of a head
            head = http.next_event()
            if head is not http1.NEED_DATA:
                return head, None
        elif fastpath.enabled:
            try:
                data = recv_when_readable(sock, _RECV)
            except Woken:  # (the reaper wakes body reads only: as _read_event, to be safe)
                data = b""
            now = monotonic()
            whole = http.receive_whole(data, now)
            if whole is not None:
                return whole
            http.receive_data(data, now)
            head = http.next_event()
            if head is not http1.NEED_DATA:
                return head, None
        return cls._read_event(sock, http), None

    @staticmethod
    def _read_event(sock: socket.socket, http: http1.ServerConnection) -> Any:
        """Read until the state machine (which said NEED_DATA) has its next event."""
        while True:
            try:
                if http.buf:
                    data = sock.recv(max(_RECV, http.want))
                else:  # between requests (or a body's next bytes): nothing to read yet, wait first
                    data = recv_when_readable(sock, _RECV)
            except Woken:  # the reaper: the body's deadline passed
                data = b""
            http.receive_data(data, monotonic())
            event = http.next_event()
            if event is not http1.NEED_DATA:
                return event

    # -- answers ----------------------------------------------------------------------------------
    def _refuse(self, conn: _Connection, error: http1.ProtocolError) -> None:
        """Answer a request the state machine refused, then the connection closes."""
        if isinstance(error, http1.BodyTooLarge):
            reply = error_response(too_large(error.size, error.limit, body_kind(error.head)))  # Triton's text, status
        else:
            reply = (status_line(error.status), JSON_HEADERS, orjson.dumps({"error": error.message}))
        try:
            self._send(conn, "POST", reply, keep_alive=False)
            if isinstance(error, http1.BodyTimeout):
                conn.http.deadline = monotonic() + _LINGER_S + 1.0  # the reaper leaves it to linger
                self._linger(conn.sock)
        except OSError:
            pass

    @staticmethod
    def _linger(sock: socket.socket) -> None:
        """A client cut while it sends (408) goes on sending until it reads the answer, and closing a
        socket with unread bytes sends a reset that destroys the answer in the client's buffers before
        it reads it. So, as nginx's lingering close: end our side (FIN after the answer), then read and
        drop what the client still sends until it closes its side too, at most :data:`_LINGER_S`."""
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        sock.settimeout(0.0)
        deadline = monotonic() + _LINGER_S
        while True:
            for _ in range(64):  # what is there now (the read side may be shut: b"" when it is empty)
                try:
                    if not sock.recv(_RECV):
                        break
                except BlockingIOError:
                    break  # nothing more for now
                except OSError:
                    return
            if monotonic() >= deadline or _peer_closed(sock):
                return
            gevent.sleep(0.05)
    def _send(self, conn: _Connection, method: str, reply: Reply, keep_alive: bool) -> bool:
        """Send one answer; False when the connection must close afterwards."""
        status, headers, body = reply
        if not isinstance(body, bytes):
            return self._send_stream(conn, status, headers, body, keep_alive)
        head = http1.response_head(status, headers, len(body), keep_alive)
        self._send_all(conn, head if method == "HEAD" else head + body)
        return keep_alive

    def _send_all(self, conn: _Connection, data: bytes) -> None:
        """``send_all``, and when the kernel does not take it all at once, the rest with a deadline
        of ``send_timeout`` per write (nginx's send_timeout): a client that stops reading is dropped
        by the reaper, and its answer and request freed, instead of holding them for ever."""
        sock = conn.sock
        sent = send_now(sock, data)  # the usual case: the kernel takes it all
        if sent == len(data):
            return
        view, http, timeout = memoryview(data)[sent:], conn.http, self.limits.send_timeout
        try:
            while view:
                http.deadline = monotonic() + timeout
                view = view[sock.send(view):]
        finally:
            http.deadline = float("inf")

    def _send_stream(self, conn: _Connection, status: str, headers: list[tuple[str, str]], chunks: Iterable[bytes],
                     keep_alive: bool) -> bool:
        """Send ``chunks`` with chunked transfer coding; a client that goes away closes the iterator
        (which cancels the request behind it) and the connection."""
        try:
            self._send_all(conn, http1.response_head(status, [*headers, ("Cache-Control", "no-cache")], None,
                                                     keep_alive))
            for data in chunks:
                if data:
                    self._send_all(conn, http1.chunk(data))
            self._send_all(conn, http1.LAST_CHUNK)
        except OSError:
            return False
        except Exception:  # the stream's producer failed mid-way: the body is cut, so is the connection
            log.exception("event stream failed")
            return False
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return keep_alive
