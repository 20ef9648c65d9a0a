"""What :class:`~.h2_connection.H2Connection` hands its driver and is configured with: the events
:meth:`~.h2_connection.H2Connection.receive_data` returns (each names its stream by ``stream_id`` and
carries its :class:`H2Stream`), the per-stream state :class:`H2Stream` (whose ``call`` slot is the
driver's), :class:`StreamClosedError`, and the connection :class:`Limits` (each limit is described
there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import http2 as h2


@dataclass(frozen=True, slots=True)
class Limits:
    """What we advertise and enforce on one connection (defaults: grpc-go's and nginx's choices).

    * ``max_concurrent_streams`` is advertised and enforced (REFUSED_STREAM past it), which also bounds
      the streams an INITIAL_WINDOW_SIZE change walks;
    * control frames and frames that do no work (SETTINGS and PING, ACKs too, RST_STREAM,
      WINDOW_UPDATE, PRIORITY, unknown types, empty DATA, HEADERS on closed streams, the frames our
      stream errors answer) spend a token bucket (``control_frame_burst`` refilled at
      ``control_frame_rate`` per second and by each DATA frame we send, as nghttp2's "glitch" limit); a
      flood ends the connection with GOAWAY(ENHANCE_YOUR_CALM);
    * rapid reset (CVE-2023-44487): each stream reset before we answered it — by the peer, or by us
      for its stream error or past the stream limit — adds one to a debt that each stream we complete
      with DATA pays back (refusals and trailers-only statuses pay nothing back); past
      ``max_reset_debt`` → GOAWAY(ENHANCE_YOUR_CALM);
    * header blocks past ``max_header_list`` (compressed: one HEADERS frame or CONTINUATION-assembled,
      checked before HPACK; or decoded) → GOAWAY(ENHANCE_YOUR_CALM); a block that starts with more
      than two dynamic-table size updates (RFC 7541 §4.2) → GOAWAY(COMPRESSION_ERROR);
    * a preface, first SETTINGS or header block not complete within ``header_timeout``, and a connection
      without streams for ``idle_timeout``, are closed by :meth:`tick`; a stream whose request makes no
      progress (HEADERS or DATA) for ``stream_timeout`` is reset (CANCEL) there, its :class:`StreamReset`
      left in ``expired`` for the driver (unless the driver marked it ``long_lived``);
    * a request body that arrives under ``min_rate`` on average (its clock starts at its first DATA, and
      it must have ``min_rate`` x (elapsed - ``body_grace``) bytes at any time, Apache mod_reqtimeout's
      MinRate), or that takes more than ``body_max_time`` in all (mod_reqtimeout's maxtimeout: without it,
      a message of X bytes sent at once bought X / ``min_rate`` seconds of trickling, so one stream held
      a gigabyte for a megabyte a second), gets a :class:`StreamTooSlow` in ``expired`` from :meth:`tick`;
      the driver answers it (a gRPC status) and closes the stream. The driver stops the clock with
      :meth:`H2Connection.body_idle` at the end of each message of a bidirectional call (the next DATA
      starts it again);
    * ping strikes (grpc's policy: pings without data closer than ``min_ping_interval``);
    * a connection older than ``max_connection_age`` gets GOAWAY (NO_ERROR, ``max_age``: its open streams run
      on, new ones are refused) and ``aged`` is set for the driver to close it once its calls are done; it is
      closed at ``max_connection_age_grace`` after that whatever runs (grpc-core's channel arguments, without
      their jitter);
    * a peer that stops reading: the driver marks its writes (``writing_since``) and :meth:`tick` closes
      the connection when one takes ``write_timeout``; DATA waits (:meth:`local_flow_control_window`
      is 0, :meth:`send_response` declines) while ``max_send_buffer`` bytes are queued unwritten;
      ``window_timeout`` is how long the driver lets a stream wait for the peer's window.
    """

    max_concurrent_streams: int = 128  # nginx's http2_max_concurrent_streams
    initial_window: int = 16 * 1024 * 1024  # a 16 MiB tensor needs no WINDOW_UPDATE round trip
    connection_window: int = 64 * 1024 * 1024
    max_frame: int = 1024 * 1024
    max_header_list: int = 64 * 1024
    max_continuations: int = 64  # CONTINUATION frames in one header block
    control_frame_burst: int = 1000  # nghttp2's glitch burst
    control_frame_rate: float = 100.0  # tokens per second
    max_reset_debt: int = 256  # streams reset by the peer and not made up for by completed ones
    header_timeout: float = 60.0  # nginx's client_header_timeout: preface, SETTINGS, a header block
    idle_timeout: float = 180.0  # nginx's http2_idle_timeout: no stream open; 0 = never
    stream_timeout: float = 60.0  # nginx's client_body_timeout: a request's HEADERS/DATA apart; 0 = never
    min_rate: float = 1024 * 1024  # bytes/s a request body must average after body_grace; 0 = no minimum
    body_grace: float = 10.0
    body_max_time: float = 0.0  # with min_rate: the most a body may take in all; 0 = no cap
    window_timeout: float = 60.0  # a stream waits this long for the peer to open its send window
    write_timeout: float = 60.0  # nginx's send_timeout: one write to a peer that stopped reading
    max_send_buffer: int = 4 * 1024 * 1024  # bytes queued and not written yet, past which DATA waits
    max_unconsumed: int = 64 * 1024 * 1024  # DATA received and not taken by the driver (all streams)
    keepalive_time: float = 7200.0  # grpc.keepalive_time_ms; 0 = no keepalive pings
    keepalive_timeout: float = 20.0  # grpc.keepalive_timeout_ms
    keepalive_permit_without_calls: bool = False
    min_ping_interval: float = 300.0  # grpc.http2.min_recv_ping_interval_without_data_ms
    max_ping_strikes: int = 2  # grpc.http2.max_ping_strikes; 0 = unlimited
    max_connection_age: float = 0.0  # grpc.max_connection_age_ms; 0 = no limit
    max_connection_age_grace: float = 0.0  # grpc.max_connection_age_grace_ms; 0 = no limit


# -- events ---------------------------------------------------------------------------------------
class Event:
    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__ if k != "stream")
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__ if k != "stream")

    __hash__ = None  # type: ignore[assignment]


class RequestReceived(Event):
    """A new stream's header block (decoded, possibly a cached :class:`.http2.HeaderBlock`)."""

    __slots__ = ("stream_id", "stream", "headers", "end_stream")

    def __init__(self, stream: H2Stream, headers: h2.HeaderBlock, end_stream: bool) -> None:
        self.stream_id, self.stream, self.headers, self.end_stream = stream.id, stream, headers, end_stream


class DataReceived(Event):
    """DATA on an open stream (padding removed; its bytes are acknowledged already)."""

    __slots__ = ("stream_id", "stream", "data", "end_stream")

    def __init__(self, stream: H2Stream, data: bytes, end_stream: bool) -> None:
        self.stream_id, self.stream, self.data, self.end_stream = stream.id, stream, data, end_stream


class StreamEnded(Event):
    """The peer closed its side with trailers (a HEADERS block with END_STREAM)."""

    __slots__ = ("stream_id", "stream")

    def __init__(self, stream: H2Stream) -> None:
        self.stream_id, self.stream = stream.id, stream


class StreamReset(Event):
    """The stream is over before its end: the peer reset it (``remote``) or we did for a violation."""

    __slots__ = ("stream_id", "stream", "error_code", "remote")

    def __init__(self, stream: H2Stream, error_code: int, remote: bool) -> None:
        self.stream_id, self.stream, self.error_code, self.remote = stream.id, stream, error_code, remote


class StreamTooSlow(Event):
    """:meth:`H2Connection.tick` found the stream's request body under ``min_rate`` (``message`` says how).
    Nothing is sent yet: the driver answers (a status) and closes the stream."""

    __slots__ = ("stream_id", "stream", "message")

    def __init__(self, stream: H2Stream, message: str) -> None:
        self.stream_id, self.stream, self.message = stream.id, stream, message


class WindowUpdated(Event):
    """Send windows opened (SETTINGS, or a WINDOW_UPDATE on a window that was shut: one still open held no
    sender back); at most one per :meth:`receive_data`."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int = 0) -> None:
        self.stream_id = stream_id


class ConnectionTerminated(Event):
    """The connection ends: the peer's GOAWAY (``remote``; running streams may finish), or ours
    for a violation (``data_to_send`` holds the GOAWAY; close once it is written)."""

    __slots__ = ("error_code", "last_stream_id", "additional_data", "remote")

    def __init__(self, error_code: int, last_stream_id: int, additional_data: bytes, remote: bool) -> None:
        self.error_code, self.last_stream_id = error_code, last_stream_id
        self.additional_data, self.remote = additional_data, remote


# -- streams --------------------------------------------------------------------------------------
class H2Stream:
    """One open stream: its windows and half-close states; ``call`` belongs to the driver."""

    # The state a stream starts in, as class attributes (an assignment shadows one): a stream is made per
    # call, and setting them all in ``__init__`` ran 44 bytecodes per unary call, a class attribute none.
    remote_closed = False
    local_closed = False
    headers_sent = False
    answered = False  # we sent DATA: a completed answer, not a refusal
    long_lived = False  # the driver's: no stream_timeout (a bidirectional call may idle)
    unconsumed = 0  # DATA bytes delivered and not yet consumed (H2Connection.consumed)
    rate_since: float | None = None  # the body's rate clock started then (None: not running)
    rate_bytes = 0  # DATA bytes since rate_since
    too_slow = False  # StreamTooSlow was reported: the clock stays off
    call: Any = None

    def __init__(self, stream_id: int, send_window: int, recv_window: int, now: float = 0.0) -> None:
        self.id = stream_id
        self.send_window = send_window  # what the peer lets us send
        self.recv_window = recv_window  # what we let the peer send before our next WINDOW_UPDATE
        self.progress_at = now  # the peer's last HEADERS or DATA on it


class StreamClosedError(Exception):
    """A send on a stream that is closed on our side (answered or reset)."""
