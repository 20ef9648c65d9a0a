"""The server side of an HTTP/2 connection (RFC 9113) as a sans-I/O state machine.

Shaped like python-hyper's ``h2``: bytes go in through :meth:`H2Connection.receive_data`, which
returns the events they carry; the send methods queue frames whose bytes :meth:`data_to_send`
hands back. No sockets, no gevent and no clock of its own: the driver passes ``now`` (monotonic
seconds) where time matters. :mod:`..frontends.grpc_h2` drives it for gRPC.

It owns the whole protocol state: stream states, flow-control windows both ways (connection and
stream), SETTINGS (ours, the peer's, the ACKs), PING and keepalive, CONTINUATION assembly, padding,
HPACK (through :class:`.http2.HeaderDecoder` and its cache), GOAWAY and RST_STREAM with the error
code each violation calls for, and every limit a hostile client meets (each is described on
:class:`~.h2_events.Limits`); the frame handlers are :mod:`.h2_frames`'s.

Events (:mod:`.h2_events`) name the stream by ``stream_id`` and carry its :class:`~.h2_events.H2Stream`,
whose ``call`` slot is the driver's own. Unlike ``h2``, the end of a request is the ``end_stream``
attribute of ``RequestReceived`` / ``DataReceived`` (``StreamEnded`` only follows
trailers), and received data is acknowledged (WINDOW_UPDATE) as it arrives: what the driver has
not consumed yet (:meth:`H2Connection.consumed`; a stream that ends gives its share back) is bounded
by ``max_unconsumed`` per connection — past it the stream that brought the DATA is reset
(ENHANCE_YOUR_CALM) — and the driver bounds each message by size.
"""

from __future__ import annotations

from . import http2 as h2
from .h2_events import (
    ConnectionTerminated,
    Event,
    H2Stream,
    Limits,
    StreamClosedError,
    StreamReset,
    StreamTooSlow,
)
from .h2_frames import _MASK, H2FrameHandlers
from .http1 import slow_body_message
from .http2 import ProtocolError

_NEVER = float("inf")


_FRAME_HEAD_FROM, _PACK_HEAD = h2.FRAME_HEAD.unpack_from, h2.FRAME_HEAD.pack
_CONTINUATION, _DATA, _HEADERS, _END_HEADERS = h2.CONTINUATION, h2.DATA, h2.HEADERS, h2.END_HEADERS
_TOKENS_PER_DATA = 4  # control frames a client may send in answer to one DATA frame of ours
_TRAILERS_FLAGS = h2.END_HEADERS | h2.END_STREAM


class H2Connection(H2FrameHandlers):
    """One server-side connection. Single owner (the driver's reader and the calls it runs, never
    two threads): every method is synchronous and only queues bytes."""

    def __init__(self, limits: Limits | None = None, now: float = 0.0) -> None:
        self.limits = limits = limits or Limits()
        self.streams: dict[int, H2Stream] = {}
        self.decoder = h2.HeaderDecoder(limits.max_header_list)
        self.send_window = h2.DEFAULT_WINDOW  # the peer's connection window for our DATA
        self.recv_window = limits.connection_window
        self.peer_initial_window = h2.DEFAULT_WINDOW
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.last_stream_id = 0
        self.going_away = False  # GOAWAY sent or received: no new streams
        self.closed = False  # nothing more to read or send: close the transport
        self.expired: list[Event] = []  # StreamReset of the streams tick() cancelled; the driver's to take
        self.writing_since: float | None = None  # the driver's: a write to the transport started then
        self.unconsumed = 0  # DATA bytes delivered on open streams and not consumed (max_unconsumed)
        self._out: list[bytes] = []
        self._buf = bytearray()
        self._preface = False
        self._settings_seen = False
        self._continuation: tuple[int, int, list[bytes], int] | None = None  # sid, flags, parts, size
        self._header_since = now  # waiting for preface/SETTINGS or a header block since (None: not)
        self._idle_since = now
        self._born = now
        self.aged = False  # GOAWAY sent for max_connection_age: the driver closes once the calls are done
        self._tokens = float(limits.control_frame_burst)
        self._tokens_at = now
        self._reset_debt = 0
        self._ping_ok = True  # a ping is welcome (we sent headers or data since the last one)
        self._last_ping = -1e18
        self._ping_strikes = 0
        self._ping_sent_at: float | None = None  # our keepalive ping awaiting its ACK
        self._keepalive_at = now + limits.keepalive_time
        self._tick_step = min(5.0, _tick_step_of(limits))

    # -- output ---------------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        """Every byte queued since the last call."""
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def initiate_connection(self) -> None:
        """Our SETTINGS and the connection window beyond the default: the first bytes we send."""
        lim = self.limits
        self._out.append(h2.settings_frame({
            h2.MAX_CONCURRENT_STREAMS: lim.max_concurrent_streams, h2.INITIAL_WINDOW_SIZE: lim.initial_window,
            h2.MAX_FRAME_SIZE: lim.max_frame, h2.MAX_HEADER_LIST_SIZE: lim.max_header_list, h2.ENABLE_PUSH: 0}))
        if lim.connection_window > h2.DEFAULT_WINDOW:
            self._out.append(h2.window_update(0, lim.connection_window - h2.DEFAULT_WINDOW))

    # -- input ----------------------------------------------------------------------------------
    def receive_data(self, data: bytes, now: float = 0.0) -> list[Event]:
        """Feed bytes read from the peer; returns the events they complete (frames may span calls)."""
        events: list[Event] = []
        if self.closed:
            return events
        buf = self._buf
        buf += data
        if not self._preface and not self._check_preface(buf, events):
            return events
        lim = self.limits
        if now > self._tokens_at:  # the control-frame budget's refill for the time since the last read
            self._tokens = min(lim.control_frame_burst, self._tokens + (now - self._tokens_at) * lim.control_frame_rate)
            self._tokens_at = now
        pos, end, unpack, handlers, max_frame = 0, len(buf), _FRAME_HEAD_FROM, _HANDLERS, lim.max_frame
        try:
            while end - pos >= 9:
                length_type, flags, sid = unpack(buf, pos)
                length = length_type >> 8
                if length > max_frame:
                    raise ProtocolError(f"frame of {length} bytes", h2.FRAME_SIZE_ERROR)
                start = pos + 9
                pos = start + length
                if pos > end:
                    pos = start - 9
                    break
                ftype = length_type & 0xFF
                if self._continuation is not None and ftype != _CONTINUATION:
                    raise ProtocolError("expected CONTINUATION")
                # (a handler ends the connection by raising ProtocolError: nothing in the loop sets closed)
                if ftype < 10:
                    handlers[ftype](self, flags, sid & _MASK, bytes(buf[start:pos]), events, now)
                else:
                    self._spend()  # unknown frame types are ignored (RFC 9113 §4.1), not for free
        except ProtocolError as e:
            self._terminate(e.code, str(e), events)
        del buf[:pos]
        return events

    def _check_preface(self, buf: bytearray, events: list[Event]) -> bool:
        n = len(h2.PREFACE)
        if not h2.PREFACE.startswith(bytes(buf[:n])):
            self.closed = True  # not an HTTP/2 client (HTTP/1 on the gRPC port): hang up, no GOAWAY
            events.append(ConnectionTerminated(h2.PROTOCOL_ERROR, 0, b"no HTTP/2 preface", False))
            return False
        if len(buf) < n:
            return False
        del buf[:n]
        self._preface = True
        return True

    def _terminate(self, code: int, message: str, events: list[Event]) -> None:
        """A connection error: GOAWAY with ``code``, then nothing more is read."""
        debug = message.encode()[:256]
        self._out.append(h2.goaway(self.last_stream_id, code, debug))
        self.going_away = self.closed = True
        self._continuation = None
        events.append(ConnectionTerminated(code, self.last_stream_id, debug, False))

    # -- control-frame budget -------------------------------------------------------------------
    def _spend(self) -> None:
        """One control frame (or other frame that does no work): past the budget the peer floods."""
        self._tokens -= 1
        if self._tokens < 0:
            raise ProtocolError("too_many_control_frames", h2.ENHANCE_YOUR_CALM)

    # -- sending --------------------------------------------------------------------------------
    def _open(self, sid: int) -> H2Stream:
        """The stream to send on. After a connection error (``closed``) every stream is over: a
        send would queue frames behind our GOAWAY. (A request and a bad frame in one read: the
        driver saw RequestReceived after the GOAWAY was queued, and its answer followed it.)"""
        stream = self.streams.get(sid)
        if stream is None or stream.local_closed or self.closed:
            raise StreamClosedError(sid)
        return stream

    def send_headers(self, sid: int, headers: bytes | list[tuple[bytes, bytes]], end_stream: bool = False) -> None:
        """A header block (pre-encoded bytes, or fields to encode) on ``sid``; trailers with ``end_stream``."""
        stream = self._open(sid)
        block = headers if isinstance(headers, bytes) else h2.encode_headers(headers)
        stream.headers_sent = True
        self._ping_ok, self._ping_strikes = True, 0  # no token back: a refusal costs the peer nothing
        self._out.append(h2.headers_frames(sid, block, end_stream, self.peer_max_frame))
        if end_stream:
            self._end_local(stream)

    def local_flow_control_window(self, sid: int) -> int:
        """Bytes of DATA ``sid`` may send now (both windows, and what ``max_send_buffer`` leaves)."""
        return max(0, min(self._open(sid).send_window, self.send_window, self._buffer_room()))

    def _buffer_room(self) -> int:
        out = self._out
        return self.limits.max_send_buffer - sum(map(len, out)) if out else self.limits.max_send_buffer

    def send_data(self, sid: int, data: bytes | memoryview, end_stream: bool = False) -> int:
        """As much of ``data`` as both windows let through, in frames of the peer's size; returns
        the bytes sent. ``end_stream`` applies when all of ``data`` went."""
        stream = self._open(sid)
        room = max(0, min(stream.send_window, self.send_window, len(data), self._buffer_room()))
        view, step, out = memoryview(data)[:room], self.peer_max_frame, self._out
        end = end_stream and room == len(data)
        for i in range(0, room or end, step):  # an empty DATA frame only to end the stream
            last = i + step >= room
            out.append(h2.frame(h2.DATA, h2.END_STREAM if end and last else 0, sid, bytes(view[i:i + step])))
        stream.send_window -= room
        self.send_window -= room
        if room:
            stream.answered = True
            self._sent_something()
        if end:
            self._end_local(stream)
        return room

    def send_response(self, sid: int, head: bytes, data: bytes, trailers: bytes) -> bool:
        """The hot unary answer in one go — HEADERS (unless sent), one DATA frame, trailers — when
        ``data`` fits both windows and one frame; False (nothing queued) when it does not."""
        stream = self.streams.get(sid)
        if stream is None or stream.local_closed or self.closed:
            raise StreamClosedError(sid)
        n = len(data)
        out = self._out
        if n > stream.send_window or n > self.send_window or n > self.peer_max_frame or \
                (out and n > self._buffer_room()):
            return False
        self.send_window -= n  # (the stream's own window ends with it, below)
        # the frames as one bytes object (one join instead of a frame() call and a concatenation each)
        pack = _PACK_HEAD
        tail = (pack(n << 8 | _DATA, 0, sid), data, pack(len(trailers) << 8 | _HEADERS, _TRAILERS_FLAGS, sid),
                trailers)
        if stream.headers_sent:
            out.append(b"".join(tail))
        else:
            out.append(b"".join((pack(len(head) << 8 | _HEADERS, _END_HEADERS, sid), head, *tail)))
        # _sent_something's and _end_local's (for a stream answered with DATA) in line: the one answer of
        # every unary call, where those two calls and _forget's ran 35 more bytecodes of 186 per answer
        self._ping_ok, self._ping_strikes = True, 0
        self._tokens = min(self.limits.control_frame_burst, self._tokens + _TOKENS_PER_DATA)
        stream.headers_sent = stream.answered = stream.local_closed = True
        if self._reset_debt:
            self._reset_debt -= 1
        if not stream.remote_closed:
            out.append(h2.rst_stream(sid, h2.NO_ERROR))  # answered early: the peer may stop sending
            stream.remote_closed = True
        del self.streams[sid]
        if stream.unconsumed:
            self.consumed(stream)
        return True

    def _sent_something(self) -> None:
        """We sent DATA: pings are welcome, and the control frames a well-behaved client sends in
        answer (a stream and a connection WINDOW_UPDATE, a BDP PING: grpc-c++ sends about two per
        unary call, measured with perf_analyzer) get their tokens back, so a busy client never runs
        dry; a flood still has to be paid for with requests that do work."""
        self._ping_ok, self._ping_strikes = True, 0
        self._tokens = min(self.limits.control_frame_burst, self._tokens + _TOKENS_PER_DATA)

    def _end_local(self, stream: H2Stream) -> None:
        """We sent END_STREAM: a stream we answered with DATA completed (it pays back one reset;
        a refusal or a trailers-only status pays nothing back)."""
        stream.local_closed = True
        if self._reset_debt and stream.answered:
            self._reset_debt -= 1
        if not stream.remote_closed:
            self._out.append(h2.rst_stream(stream.id, h2.NO_ERROR))  # answered early: the peer may stop sending
            stream.remote_closed = True
        self._forget(stream)

    def reset_stream(self, sid: int, error_code: int = h2.CANCEL) -> None:
        """RST_STREAM on ``sid`` (a no-op for a stream that is closed already)."""
        stream = self.streams.get(sid)
        if stream is not None:
            stream.local_closed = stream.remote_closed = True
            self._forget(stream)
            if not self.closed:  # nothing follows our GOAWAY
                self._out.append(h2.rst_stream(sid, error_code))

    def _reset(self, stream: H2Stream, code: int, events: list[Event]) -> None:
        """A stream error of the peer's: RST_STREAM with ``code``; the driver cancels its call. It
        costs a token and counts as a reset (else streams ended by errors are free rapid resets)."""
        self.reset_stream(stream.id, code)
        events.append(StreamReset(stream, code, False))
        self._spend()
        self._add_reset_debt()

    def body_idle(self, stream: H2Stream) -> None:
        """A message of ``stream``'s request is complete (a bidirectional call's): the minimum-rate clock
        stops, and starts again with the next DATA."""
        stream.rate_since = None

    def consumed(self, stream: H2Stream, n: int | None = None) -> None:
        """The driver took ``n`` (None: all) of the bytes ``stream`` delivered off its buffers."""
        n = stream.unconsumed if n is None else min(n, stream.unconsumed)
        stream.unconsumed -= n
        self.unconsumed -= n

    def _forget(self, stream: H2Stream) -> None:
        self.streams.pop(stream.id, None)  # idle time starts at the next tick()
        if stream.unconsumed:
            self.consumed(stream)

    def ping(self, payload: bytes = b"\0" * 8) -> None:
        self._out.append(h2.frame(h2.PING, 0, 0, payload))

    def go_away(self, error_code: int = h2.NO_ERROR, debug: bytes = b"") -> None:
        """GOAWAY: no new streams; with an error code, the connection is over now."""
        if not self.going_away or error_code:
            self._out.append(h2.goaway(self.last_stream_id, error_code, debug))
        self.going_away = True
        if error_code:
            self.closed = True

    @property
    def idle_since(self) -> float | None:
        """Since when no stream has been open (a preface not yet read counts), as ``tick`` samples it;
        None while a stream is open."""
        return None if self.streams else self._idle_since

    # -- time -----------------------------------------------------------------------------------
    def tick(self, now: float) -> float:
        """Timeouts and keepalive at ``now``: may queue a PING or a GOAWAY, or set ``closed``.
        Returns when to call again (at most a few seconds on: idle time is sampled here)."""
        lim = self.limits
        if self.closed:
            return now + 3600
        if self.streams:
            self._idle_since = None
            if lim.stream_timeout:
                self._expire_streams(now)
            if lim.min_rate:
                self._expire_slow(now)
        elif self._idle_since is None:
            self._idle_since = now
        if lim.max_connection_age and not self.aged and now - self._born >= lim.max_connection_age:
            self.aged = True
            self.go_away(h2.NO_ERROR, b"max_age")  # the streams open go on; new ones are refused
        if self.writing_since is not None and now - self.writing_since >= lim.write_timeout:
            self.closed = True  # the peer stopped reading: nothing more can be sent
        elif self._header_since is not None and now - self._header_since >= lim.header_timeout:
            self.go_away(h2.NO_ERROR, b"header_timeout")  # a slow or half-sent preface or header block
            self.closed = True
        elif self._idle_since is not None and lim.idle_timeout and now - self._idle_since >= lim.idle_timeout:
            self.go_away(h2.NO_ERROR, b"idle_timeout")
            self.closed = True
        elif self.aged and lim.max_connection_age_grace and \
                now - self._born >= lim.max_connection_age + lim.max_connection_age_grace:
            self.closed = True  # the grace is over: what still runs is cut off (grpc-core)
        elif self._ping_sent_at is not None:
            if now - self._ping_sent_at >= lim.keepalive_timeout:
                self.closed = True  # the peer is gone: nothing more is sent (grpc's keepalive)
        elif lim.keepalive_time and now >= self._keepalive_at:
            self._keepalive_at = now + lim.keepalive_time
            if self.streams or lim.keepalive_permit_without_calls:
                self._ping_sent_at = now
                self.ping()
        return self._next_deadline(now)

    def _expire_streams(self, now: float) -> None:
        """Streams whose request made no progress for ``stream_timeout``: RST_STREAM(CANCEL), and a
        :class:`StreamReset` in ``expired`` for the driver to cancel the call."""
        limit = now - self.limits.stream_timeout
        for stream in [s for s in self.streams.values() if s.progress_at <= limit]:
            if not stream.remote_closed and not stream.long_lived:
                self.reset_stream(stream.id, h2.CANCEL)
                self.expired.append(StreamReset(stream, h2.CANCEL, False))

    def _rate_deadline(self, stream: H2Stream) -> float:
        """When ``stream``'s body falls under ``min_rate``: start + grace + bytes / rate, at most start +
        ``body_max_time`` (mod_reqtimeout's body=grace-max,MinRate=rate)."""
        if stream.rate_since is None or stream.remote_closed:
            return _NEVER
        lim = self.limits
        allowed = lim.body_grace + stream.rate_bytes / lim.min_rate
        return stream.rate_since + (min(allowed, lim.body_max_time) if lim.body_max_time else allowed)

    def _expire_slow(self, now: float) -> None:
        """Streams whose request body came too slowly: a :class:`StreamTooSlow` each in ``expired``."""
        for stream in [s for s in self.streams.values() if self._rate_deadline(s) <= now]:
            lim = self.limits
            seconds = now - stream.rate_since
            if lim.body_max_time and seconds >= lim.body_max_time:
                message = f"request body too slow: {stream.rate_bytes} bytes in {seconds:.1f} s, past the most a " \
                          f"body may take ({lim.body_max_time:g} s)"
            else:
                message = slow_body_message(stream.rate_bytes, seconds, lim.min_rate, lim.body_grace)
            self.expired.append(StreamTooSlow(stream, message))
            stream.rate_since, stream.too_slow = None, True

    def _next_deadline(self, now: float) -> float:
        lim = self.limits
        times = [now + self._tick_step]
        if lim.min_rate:
            times += [self._rate_deadline(s) for s in self.streams.values()]
        if lim.stream_timeout:
            times += [s.progress_at + lim.stream_timeout for s in self.streams.values()
                      if not s.remote_closed and not s.long_lived]
        if lim.keepalive_time:
            times.append(self._keepalive_at)
        if self._ping_sent_at is not None:
            times.append(self._ping_sent_at + lim.keepalive_timeout)
        if self.writing_since is not None:
            times.append(self.writing_since + lim.write_timeout)
        if self._header_since is not None:
            times.append(self._header_since + lim.header_timeout)
        if self._idle_since is not None and lim.idle_timeout:
            times.append(self._idle_since + lim.idle_timeout)
        if lim.max_connection_age and not self.aged:
            times.append(self._born + lim.max_connection_age)
        elif self.aged and lim.max_connection_age_grace:  # (no grace: nothing more is due, the driver closes)
            times.append(self._born + lim.max_connection_age + lim.max_connection_age_grace)
        return min(times)


def _tick_step_of(limits: Limits) -> float:
    """How often :meth:`H2Connection.tick` must run to honour the timeouts within a quarter of them."""
    times = (limits.header_timeout, limits.idle_timeout or 20.0, limits.stream_timeout, limits.write_timeout, 20.0,
             limits.body_grace if limits.min_rate else 0.0)
    return min(t / 4 for t in times if t > 0)


# each frame type's handler by its number, functions of the class: a tuple of the connection's bound methods
# on the connection made every connection (its decoder, header table and streams) a cycle for the collector
_HANDLERS = (H2Connection._on_data, H2Connection._on_headers, H2Connection._on_priority, H2Connection._on_rst_stream,
             H2Connection._on_settings, H2Connection._on_push_promise, H2Connection._on_ping, H2Connection._on_goaway,
             H2Connection._on_window_update, H2Connection._on_continuation)
