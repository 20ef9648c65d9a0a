"""The frames an :class:`~.h2_connection.H2Connection` receives, one handler per frame type (RFC 9113
§6): DATA (flow control, the unconsumed bound), HEADERS and CONTINUATION (assembly, HPACK, new
streams and the stream limit), PRIORITY, RST_STREAM (the rapid-reset debt), SETTINGS, PUSH_PROMISE,
PING (keepalive, ping strikes), GOAWAY and WINDOW_UPDATE, each answering a violation with the error
code it calls for. :class:`H2FrameHandlers` is a base of :class:`~.h2_connection.H2Connection`, whose
``receive_data`` dispatches to it and whose state (set in its ``__init__``) it reads and changes.
"""

from __future__ import annotations

from . import http2 as h2
from .h2_events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    H2Stream,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from .http2 import ProtocolError

_MASK = 0x7FFF_FFFF
_END_STREAM, _PADDED, _END_HEADERS, _PRIORITY_FLAG = h2.END_STREAM, h2.PADDED, h2.END_HEADERS, h2.PRIORITY_FLAG
_SETTINGS_ACK = h2.frame(h2.SETTINGS, h2.ACK, 0)
_WINDOW_UPDATED = WindowUpdated(0)


class H2FrameHandlers:
    """The receiving half of :class:`~.h2_connection.H2Connection`: its ``_on_<frame type>`` methods."""

    # -- frames ---------------------------------------------------------------------------------
    def _on_data(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        if sid == 0:
            raise ProtocolError("DATA on stream 0")
        n = len(payload)
        window = self.recv_window - n
        if window < 0:
            raise ProtocolError("DATA beyond the connection window", h2.FLOW_CONTROL_ERROR)
        limits = self.limits
        if window <= limits.connection_window // 2:
            self._out.append(h2.window_update(0, limits.connection_window - window))
            window = limits.connection_window
        self.recv_window = window
        stream = self.streams.get(sid)
        end = flags & _END_STREAM
        if stream is None or stream.remote_closed:
            if sid > self.last_stream_id:
                raise ProtocolError("DATA on an idle stream")
            if stream is not None:  # half-closed (remote): a stream error
                self._reset(stream, h2.STREAM_CLOSED, events)
            elif not n:
                self._spend()
            return  # a stream we answered or reset already: its data is dropped
        if n > stream.recv_window:
            self._reset(stream, h2.FLOW_CONTROL_ERROR, events)
            return
        data = h2.strip_padding(flags, payload) if flags & _PADDED else payload
        if not n and not end:
            self._spend()
        if data:
            size = len(data)
            self.unconsumed += size
            stream.unconsumed += size
            if self.unconsumed > limits.max_unconsumed:  # the windows are opened as DATA arrives
                self._reset(stream, h2.ENHANCE_YOUR_CALM, events)
                return
        if end:  # the request is complete: its progress and rate clocks stop (they read open streams only)
            stream.remote_closed = True
            events.append(DataReceived(stream, data, True))
            if stream.local_closed:
                self._forget(stream)
            return
        stream.progress_at = now
        if stream.rate_since is None and not stream.too_slow:
            stream.rate_since, stream.rate_bytes = now, 0
        stream.rate_bytes += n
        stream.recv_window -= n
        if stream.recv_window <= limits.initial_window // 2:
            self._out.append(h2.window_update(sid, limits.initial_window - stream.recv_window))
            stream.recv_window = limits.initial_window
        events.append(DataReceived(stream, data, False))

    def _on_headers(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        if sid == 0 or not sid & 1:
            raise ProtocolError("HEADERS on a stream a client may not open")
        block = h2.strip_padding(flags, payload) if flags & _PADDED else payload
        if flags & _PRIORITY_FLAG:
            if len(block) < 5:
                raise ProtocolError("HEADERS too short for its priority", h2.FRAME_SIZE_ERROR)
            block = block[5:]
        if len(block) > self.limits.max_header_list:  # before hpack: a frame of size updates costs time, no size
            raise ProtocolError("header block too large", h2.ENHANCE_YOUR_CALM)
        if not flags & _END_HEADERS:
            self._continuation = (sid, flags, [block], len(block))
            self._header_since = now
            return
        # the block is complete: decode it (the end of _on_continuation too)
        try:
            headers: h2.HeaderBlock | None = self.decoder.decode(block)  # always: the table follows the peer
        except h2.MalformedHeaders:
            headers = None
        end = flags & _END_STREAM == _END_STREAM
        streams = self.streams
        stream = streams.get(sid)
        if stream is not None:  # trailers
            if stream.remote_closed or not end or headers is None or headers.has_pseudo():
                closed = end and stream.remote_closed
                self._reset(stream, h2.STREAM_CLOSED if closed else h2.PROTOCOL_ERROR, events)
                return
            stream.remote_closed = True
            events.append(StreamEnded(stream))
            if stream.local_closed:
                self._forget(stream)
            return
        if sid <= self.last_stream_id:
            self._spend()  # trailers of a stream we answered or reset already (RFC 9113 §5.1): ignored
            return
        self.last_stream_id = sid
        limits = self.limits
        if self.going_away or len(streams) >= limits.max_concurrent_streams:
            self._spend()
            self._out.append(h2.rst_stream(sid, h2.REFUSED_STREAM))
            if not self.going_away:
                self._add_reset_debt()  # past the limit we advertised
            return
        if headers is None or not headers.is_request():
            self._spend()  # a malformed request (RFC 9113 §8.1.1): a stream error, counted as a reset
            self._out.append(h2.rst_stream(sid, h2.PROTOCOL_ERROR))
            self._add_reset_debt()
            return
        stream = streams[sid] = H2Stream(sid, self.peer_initial_window, limits.initial_window, now)
        if end:
            stream.remote_closed = True
        self._idle_since = None
        events.append(RequestReceived(stream, headers, end))

    def _on_continuation(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        if self._continuation is None or self._continuation[0] != sid:
            raise ProtocolError("unexpected CONTINUATION")
        _, first_flags, parts, size = self._continuation
        parts.append(payload)
        size += len(payload)
        if size > self.limits.max_header_list or len(parts) > self.limits.max_continuations:
            raise ProtocolError("header block too large", h2.ENHANCE_YOUR_CALM)
        self._continuation = (sid, first_flags, parts, size)
        if flags & h2.END_HEADERS:
            self._continuation = None
            self._header_since = None
            # as one HEADERS frame of the block: its padding and priority were taken off the first
            flags = first_flags & ~(_PADDED | _PRIORITY_FLAG) | _END_HEADERS
            self._on_headers(flags, sid, b"".join(parts), events, now)

    def _on_priority(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        if sid == 0:
            raise ProtocolError("PRIORITY on stream 0")
        self._spend()  # priorities are advisory (RFC 9113 §5.3.2): ignored

    def _on_rst_stream(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        code = h2.parse_u32(payload)
        if sid == 0 or sid > self.last_stream_id:
            raise ProtocolError("RST_STREAM on an idle stream")
        self._spend()
        stream = self.streams.get(sid)
        if stream is None:
            return
        self._forget(stream)
        stream.local_closed = stream.remote_closed = True
        events.append(StreamReset(stream, code, True))
        self._add_reset_debt()

    def _add_reset_debt(self) -> None:
        """A stream reset by either side for the peer's doing (CVE-2023-44487 and its variants)."""
        self._reset_debt += 1
        if self._reset_debt > self.limits.max_reset_debt:
            raise ProtocolError("too_many_resets", h2.ENHANCE_YOUR_CALM)

    def _on_settings(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        if sid:
            raise ProtocolError("SETTINGS on a stream")
        if flags & h2.ACK:
            if payload:
                raise ProtocolError("SETTINGS ACK with a payload", h2.FRAME_SIZE_ERROR)
            self._spend()
            return
        self._spend()
        values = h2.parse_settings(payload)
        if values.get(h2.ENABLE_PUSH, 0) > 1:
            raise ProtocolError("bad ENABLE_PUSH")
        if h2.MAX_FRAME_SIZE in values:
            size = values[h2.MAX_FRAME_SIZE]
            if not h2.DEFAULT_MAX_FRAME <= size <= 2**24 - 1:
                raise ProtocolError("bad MAX_FRAME_SIZE")
            self.peer_max_frame = size
        if h2.INITIAL_WINDOW_SIZE in values:
            new = values[h2.INITIAL_WINDOW_SIZE]
            if new > h2.MAX_WINDOW:
                raise ProtocolError("INITIAL_WINDOW_SIZE too large", h2.FLOW_CONTROL_ERROR)
            delta, self.peer_initial_window = new - self.peer_initial_window, new
            if delta:
                for stream in self.streams.values():  # at most max_concurrent_streams
                    stream.send_window += delta
                    if stream.send_window > h2.MAX_WINDOW:
                        raise ProtocolError("a stream window past 2^31-1", h2.FLOW_CONTROL_ERROR)
                self._window_event(events)
        self._out.append(_SETTINGS_ACK)
        if not self._settings_seen:  # the handshake is complete
            self._settings_seen = True
            self._header_since = None

    def _on_push_promise(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        raise ProtocolError("PUSH_PROMISE from a client")

    def _on_ping(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        if sid:
            raise ProtocolError("PING on a stream")
        if len(payload) != 8:
            raise ProtocolError("PING payload must be 8 bytes", h2.FRAME_SIZE_ERROR)
        if flags & h2.ACK:
            self._spend()
            self._ping_sent_at = None
            return
        self._spend()
        lim = self.limits
        if not self._ping_ok and not self.streams and now - self._last_ping < lim.min_ping_interval:
            self._ping_strikes += 1
            if lim.max_ping_strikes and self._ping_strikes > lim.max_ping_strikes:
                raise ProtocolError("too_many_pings", h2.ENHANCE_YOUR_CALM)
        self._ping_ok, self._last_ping = False, now
        self._out.append(h2.frame(h2.PING, h2.ACK, 0, payload))

    def _on_goaway(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        if sid:
            raise ProtocolError("GOAWAY on a stream")
        if len(payload) < 8:
            raise ProtocolError("GOAWAY shorter than 8 bytes", h2.FRAME_SIZE_ERROR)
        last, code = h2.GOAWAY_HEAD.unpack_from(payload)
        self.going_away = True
        events.append(ConnectionTerminated(code, last & _MASK, payload[8:], True))

    def _on_window_update(self, flags: int, sid: int, payload: bytes, events: list[Event], now: float) -> None:
        # WindowUpdated only for a window that was shut (not positive): a sender waits only while its
        # stream's or the connection's window is (the send buffer's room is the driver's own). grpc-c++
        # sends two WINDOW_UPDATEs per unary call on open windows (the stream's, the connection's):
        # each was an event the driver dispatched to wake nobody, about 40 bytecodes a request.
        if len(payload) != 4:
            raise ProtocolError("frame payload must be 4 bytes", h2.FRAME_SIZE_ERROR)
        increment = int.from_bytes(payload, "big") & _MASK  # parse_u32 in line
        self._tokens -= 1  # _spend in line (two a unary call)
        if self._tokens < 0:
            raise ProtocolError("too_many_control_frames", h2.ENHANCE_YOUR_CALM)
        if sid == 0:
            if not increment:
                raise ProtocolError("WINDOW_UPDATE of 0")
            shut = self.send_window <= 0
            self.send_window += increment
            if self.send_window > h2.MAX_WINDOW:
                raise ProtocolError("connection window past 2^31-1", h2.FLOW_CONTROL_ERROR)
            if shut:
                self._window_event(events)
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_stream_id:
                raise ProtocolError("WINDOW_UPDATE on an idle stream")
            return
        shut = stream.send_window <= 0
        stream.send_window += increment
        if not increment or stream.send_window > h2.MAX_WINDOW:
            self._reset(stream, h2.PROTOCOL_ERROR if not increment else h2.FLOW_CONTROL_ERROR, events)
            return
        if shut:
            self._window_event(events)

    def _window_event(self, events: list[Event]) -> None:
        if not events or type(events[-1]) is not WindowUpdated:
            events.append(_WINDOW_UPDATED)
