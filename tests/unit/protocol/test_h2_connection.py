"""The HTTP/2 state machine (protocol/h2_connection.py) byte for byte, as python-hyper tests h2:
every frame type in and out, flow control both ways, stream state errors, CONTINUATION, padding,
PING and SETTINGS ACKs, the GOAWAY code of each violation, and the limits a hostile client meets."""

from __future__ import annotations

import struct

import hpack
import pytest

from triton_actor.protocol import http2 as h2
from triton_actor.protocol.h2_connection import H2Connection
from triton_actor.protocol.h2_events import (
    ConnectionTerminated,
    DataReceived,
    Limits,
    RequestReceived,
    StreamClosedError,
    StreamEnded,
    StreamReset,
    StreamTooSlow,
    WindowUpdated,
)
from triton_actor.runtime import fastpath

REQUEST = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
           (":path", "/inference.GRPCInferenceService/ModelInfer"), ("content-type", "application/grpc")]


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload


def settings(**values: int) -> bytes:
    ids = {"window": h2.INITIAL_WINDOW_SIZE, "frame": h2.MAX_FRAME_SIZE, "push": h2.ENABLE_PUSH}
    return frame(h2.SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


def goaway(code: int, last: int = 0, debug: bytes = b"") -> bytes:
    return frame(h2.GOAWAY, 0, 0, struct.pack(">II", last, code) + debug)


def rst(sid: int, code: int) -> bytes:
    return frame(h2.RST_STREAM, 0, sid, struct.pack(">I", code))


def wu(sid: int, increment: int) -> bytes:
    return frame(h2.WINDOW_UPDATE, 0, sid, struct.pack(">I", increment))


def connected(limits: Limits | None = None, peer: bytes = b"") -> H2Connection:
    """A connection past the handshake (the peer's SETTINGS acknowledged), nothing left to send."""
    conn = H2Connection(limits or Limits())
    conn.initiate_connection()
    conn.receive_data(h2.PREFACE + frame(h2.SETTINGS, 0, 0, peer))
    conn.data_to_send()
    return conn


def request(conn: H2Connection, sid: int, end_stream: bool = False, encoder: hpack.Encoder | None = None) -> list:
    block = (encoder or hpack.Encoder()).encode(REQUEST)
    return conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end_stream else 0), sid, block))


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        length_type, flags, sid = struct.unpack_from(">IBI", data, pos)
        out.append((length_type & 0xFF, flags, sid, data[pos + 9:pos + 9 + (length_type >> 8)]))
        pos += 9 + (length_type >> 8)
    return out


def terminated(conn: H2Connection, data: bytes, code: int, now: float = 0.0) -> None:
    """``data`` is a connection error: GOAWAY with ``code`` is the last thing sent, and nothing more is read."""
    events = conn.receive_data(data, now)
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == code, events
    last = frames(conn.data_to_send())[-1]
    assert last == (h2.GOAWAY, 0, 0, struct.pack(">II", conn.last_stream_id, code) + events[-1].additional_data)
    assert conn.closed and conn.receive_data(frame(h2.PING, 0, 0, b"x" * 8)) == []


# -- handshake ------------------------------------------------------------------------------------
def test_our_settings_and_connection_window_first() -> None:
    conn = H2Connection()
    conn.initiate_connection()
    assert conn.data_to_send() == (
        frame(h2.SETTINGS, 0, 0, struct.pack(">HIHIHIHIHI", 3, 128, 4, 16 << 20, 5, 1 << 20, 6, 65536, 2, 0))
        + wu(0, (64 << 20) - 65535))
    assert conn.data_to_send() == b""


def test_preface_in_pieces_then_settings_ack() -> None:
    conn = H2Connection()
    assert conn.receive_data(h2.PREFACE[:10]) == []
    assert conn.receive_data(h2.PREFACE[10:] + settings(frame=1 << 20)[:5]) == []
    assert conn.receive_data(settings(frame=1 << 20)[5:]) == []
    assert conn.data_to_send() == frame(h2.SETTINGS, h2.ACK, 0)
    assert conn.peer_max_frame == 1 << 20
    assert conn.receive_data(frame(h2.SETTINGS, h2.ACK, 0)) == [] and conn.data_to_send() == b""


def test_http1_is_hung_up_without_goaway() -> None:
    conn = H2Connection()
    events = conn.receive_data(b"GET / HTTP/1.1\r\n")
    assert isinstance(events[0], ConnectionTerminated) and conn.closed and conn.data_to_send() == b""


# -- a unary call ---------------------------------------------------------------------------------
def test_unary_call_in_and_out() -> None:
    conn = connected()
    events = request(conn, 1) + conn.receive_data(frame(h2.DATA, h2.END_STREAM, 1, b"\0\0\0\0\2hi"))
    assert [type(e) for e in events] == [RequestReceived, DataReceived]
    assert events[0].headers[b":path"] == b"/inference.GRPCInferenceService/ModelInfer"
    assert (events[0].stream_id, events[0].end_stream) == (1, False)
    assert (events[1].data, events[1].end_stream) == (b"\0\0\0\0\2hi", True)
    assert conn.send_response(1, b"\x88", b"\0\0\0\0\1x", b"\x00\x0bgrpc-status\x010")
    assert conn.data_to_send() == (frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x88")
                                   + frame(h2.DATA, 0, 1, b"\0\0\0\0\1x")
                                   + frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1,
                                           b"\x00\x0bgrpc-status\x010"))
    assert conn.streams == {}
    with pytest.raises(StreamClosedError):
        conn.send_data(1, b"more")


def test_headers_split_over_continuation_with_padding_and_priority() -> None:
    conn = connected()
    block = hpack.Encoder().encode(REQUEST)
    first = bytes([2]) + b"\0\0\0\0\x10" + block[:4] + b"\0\0"  # pad length 2, priority fields
    events = conn.receive_data(frame(h2.HEADERS, h2.PADDED | h2.PRIORITY_FLAG | h2.END_STREAM, 1, first)
                               + frame(h2.CONTINUATION, 0, 1, block[4:8]))
    assert events == []
    events = conn.receive_data(frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[8:]))
    assert [type(e) for e in events] == [RequestReceived] and events[0].end_stream
    assert events[0].headers[b"content-type"] == b"application/grpc"


def test_padded_data() -> None:
    conn = connected()
    request(conn, 1)
    events = conn.receive_data(frame(h2.DATA, h2.PADDED | h2.END_STREAM, 1, b"\x03abc\0\0\0"))
    assert events[0].data == b"abc"


@pytest.mark.parametrize(("data", "code"), [
    (frame(h2.DATA, h2.PADDED, 1, b"\x09abc"), h2.PROTOCOL_ERROR),  # padding longer than the frame
    (frame(h2.HEADERS, h2.END_HEADERS | h2.PRIORITY_FLAG, 3, b"\0\0"), h2.FRAME_SIZE_ERROR),
    (frame(h2.HEADERS, 0, 3, b"\x82") + frame(h2.PING, 0, 0, b"\0" * 8), h2.PROTOCOL_ERROR),  # CONTINUATION owed
    (frame(h2.HEADERS, 0, 3, b"\x82") + frame(h2.CONTINUATION, 4, 5, b""), h2.PROTOCOL_ERROR),  # another stream
    (frame(h2.CONTINUATION, 4, 1, b""), h2.PROTOCOL_ERROR),  # nothing to continue
    (frame(h2.HEADERS, 0, 3, b"\x82") + frame(h2.CONTINUATION, 0, 3) * 65, h2.ENHANCE_YOUR_CALM),
    (frame(h2.HEADERS, 0, 3, b"\x82") + frame(h2.CONTINUATION, 0, 3, b"a" * 40000) * 2, h2.ENHANCE_YOUR_CALM),
    (frame(h2.HEADERS, 4, 2, b"\x82"), h2.PROTOCOL_ERROR),  # a client may not open even streams
    (frame(h2.HEADERS, 4, 0, b"\x82"), h2.PROTOCOL_ERROR),
    (frame(h2.HEADERS, 4, 3, b"\xff\xff\xff\xff"), h2.COMPRESSION_ERROR),
    (frame(h2.DATA, 0, 9, b"x"), h2.PROTOCOL_ERROR),  # DATA on an idle stream
    (frame(h2.DATA, 0, 0, b"x"), h2.PROTOCOL_ERROR),
    (frame(h2.PUSH_PROMISE, 4, 1, b"\0\0\0\2"), h2.PROTOCOL_ERROR),
    (b"\xff" * 16, h2.FRAME_SIZE_ERROR),  # a frame longer than we accept
])
def test_frame_errors_are_connection_errors(data: bytes, code: int) -> None:
    conn = connected()
    request(conn, 1)
    terminated(conn, data, code)


def test_trailers_end_the_stream_and_trailers_without_end_stream_reset_it() -> None:
    conn = connected()
    enc = hpack.Encoder()
    request(conn, 1, encoder=enc)
    block = enc.encode([("x-trailer", "1")])
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, block))
    assert [type(e) for e in events] == [StreamEnded]
    request(conn, 3, encoder=enc)
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS, 3, enc.encode([("x-trailer", "1")])))
    assert [(type(e), e.error_code, e.remote) for e in events] == [(StreamReset, h2.PROTOCOL_ERROR, False)]
    assert conn.data_to_send() == rst(3, h2.PROTOCOL_ERROR)


MALFORMED = [
    pytest.param([("Content-Type", "application/grpc")], id="uppercase-name"),
    pytest.param([("connection", "keep-alive")], id="connection"),
    pytest.param([("transfer-encoding", "chunked")], id="transfer-encoding"),
    pytest.param([("keep-alive", "5")], id="keep-alive"),
    pytest.param([("upgrade", "h2c")], id="upgrade"),
    pytest.param([("te", "gzip")], id="te-not-trailers"),
    pytest.param([("x-a", "b\r\nx-injected: 1")], id="crlf-in-value"),
    pytest.param([("x-a", "nul\x00")], id="nul-in-value"),
    pytest.param([("x a", "b")], id="space-in-name"),
    pytest.param([("x:a", "b")], id="colon-in-name"),
    pytest.param([(":status", "200")], id="response-pseudo-header"),
    pytest.param([(":path", "/again")], id="repeated-pseudo-header"),
]


def test_a_value_with_whitespace_at_its_ends_is_taken_as_it_is() -> None:
    """As grpc-go and nginx take it (they check a value for controls only); Triton's L0_parameters forwards
    the header 'This is a "quoted" string with a backslash\\ ', trailing space included."""
    conn = connected()
    value = 'This is a "quoted" string with a backslash\\ '
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1,
                                     hpack.Encoder().encode(REQUEST + [("my_header_3", value), ("x-a", " padded")])))
    assert [type(e) for e in events] == [RequestReceived]
    assert events[0].headers[b"my_header_3"] == value.encode() and events[0].headers[b"x-a"] == b" padded"


@pytest.mark.parametrize("extra", MALFORMED)
def test_malformed_requests_are_stream_errors(extra: list) -> None:
    """RFC 9113 §8.1.1: a malformed request is reset PROTOCOL_ERROR (as grpc-go and nginx do); the connection,
    its HPACK table and the next request go on, and the reset counts toward rapid reset."""
    conn = connected()
    enc = hpack.Encoder()
    debt = conn._reset_debt
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, enc.encode(REQUEST + extra)))
    assert events == [] and conn.data_to_send() == rst(1, h2.PROTOCOL_ERROR)
    assert conn._reset_debt == debt + 1 and not conn.closed and 1 not in conn.streams
    events = request(conn, 3, end_stream=True, encoder=enc)  # the same encoder: its table went on
    assert [type(e) for e in events] == [RequestReceived] and events[0].headers[b":method"] == b"POST"


@pytest.mark.parametrize("fields", [
    pytest.param([(":method", "POST"), (":path", "/p")], id="no-scheme"),
    pytest.param([(":method", "POST"), (":scheme", "http"), (":path", "")], id="empty-path"),
    pytest.param([("content-type", "application/grpc"), (":method", "POST"), (":scheme", "http"), (":path", "/p")],
                 id="pseudo-after-regular"),
])
def test_requests_without_their_pseudo_headers_in_order_are_reset(fields: list) -> None:
    conn = connected()
    assert conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS, 1, hpack.Encoder().encode(fields))) == []
    assert conn.data_to_send() == rst(1, h2.PROTOCOL_ERROR)


def test_a_valid_block_cached_then_sent_as_trailers_is_still_checked() -> None:
    """The decoder caches valid blocks; what a block must hold depends on where it comes, so a cached
    request block that comes back as trailers (pseudo-headers) is refused all the same."""
    conn = connected()
    block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in REQUEST])  # moves no table
    assert [type(e) for e in conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS, 1, block))] == [RequestReceived]
    if fastpath.enabled:  # the cache is a fast path (TRITON_ACTOR_FAST_PATHS=0 decodes every block)
        assert conn.decoder.decode(block) is conn.decoder.decode(block)
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, block))
    assert [(type(e), e.error_code) for e in events] == [(StreamReset, h2.PROTOCOL_ERROR)]


def test_te_trailers_and_lowercase_grpc_headers_pass() -> None:
    conn = connected()
    extra = [("te", "trailers"), ("grpc-timeout", "1S"), ("user-agent", "grpc-c++/1.60 (linux; chttp2)")]
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS, 1, hpack.Encoder().encode(REQUEST + extra)))
    assert [type(e) for e in events] == [RequestReceived] and events[0].headers[b"te"] == b"trailers"


def test_data_after_the_peer_ended_the_stream_is_stream_closed() -> None:
    conn = connected()
    request(conn, 1, end_stream=True)
    events = conn.receive_data(frame(h2.DATA, 0, 1, b"x"))
    assert [(type(e), e.error_code) for e in events] == [(StreamReset, h2.STREAM_CLOSED)]
    assert conn.data_to_send() == rst(1, h2.STREAM_CLOSED)
    assert conn.receive_data(frame(h2.DATA, 0, 1, b"x")) == []  # a closed stream: dropped


def test_answering_before_the_request_ended_resets_with_no_error() -> None:
    conn = connected()
    request(conn, 1)
    conn.send_headers(1, [(b":status", b"415")], end_stream=True)
    assert conn.data_to_send() == frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, b"\x08\x03415") + rst(1, 0)
    assert conn.receive_data(frame(h2.DATA, h2.END_STREAM, 1, b"late")) == []


# -- PING, SETTINGS, GOAWAY, RST_STREAM, PRIORITY, unknown ----------------------------------------
def test_ping_is_acknowledged_with_its_payload() -> None:
    conn = connected()
    assert conn.receive_data(frame(h2.PING, 0, 0, b"12345678")) == []
    assert conn.data_to_send() == frame(h2.PING, h2.ACK, 0, b"12345678")
    assert conn.receive_data(frame(h2.PING, h2.ACK, 0, b"87654321")) == [] and conn.data_to_send() == b""


@pytest.mark.parametrize(("data", "code"), [
    (frame(h2.PING, 0, 0, b"1234567"), h2.FRAME_SIZE_ERROR),
    (frame(h2.PING, 0, 1, b"12345678"), h2.PROTOCOL_ERROR),
    (frame(h2.SETTINGS, h2.ACK, 0, b"\0" * 6), h2.FRAME_SIZE_ERROR),
    (frame(h2.SETTINGS, 0, 0, b"\0" * 7), h2.FRAME_SIZE_ERROR),
    (frame(h2.SETTINGS, 0, 1), h2.PROTOCOL_ERROR),
    (settings(window=2**31), h2.FLOW_CONTROL_ERROR),
    (settings(frame=16383), h2.PROTOCOL_ERROR),
    (settings(frame=2**24), h2.PROTOCOL_ERROR),
    (settings(push=2), h2.PROTOCOL_ERROR),
    (frame(h2.GOAWAY, 0, 0, b"\0" * 7), h2.FRAME_SIZE_ERROR),
    (frame(h2.GOAWAY, 0, 1, b"\0" * 8), h2.PROTOCOL_ERROR),
    (rst(0, 8), h2.PROTOCOL_ERROR),
    (rst(5, 8), h2.PROTOCOL_ERROR),  # an idle stream
    (frame(h2.RST_STREAM, 0, 1, b"\0\0\0"), h2.FRAME_SIZE_ERROR),
    (frame(h2.PRIORITY, 0, 0, b"\0" * 5), h2.PROTOCOL_ERROR),
    (wu(0, 0), h2.PROTOCOL_ERROR),
    (wu(0, 2**31 - 1), h2.FLOW_CONTROL_ERROR),  # 65535 + that is past 2^31-1
    (wu(7, 1), h2.PROTOCOL_ERROR),  # an idle stream
    (frame(h2.WINDOW_UPDATE, 0, 0, b"\0\0\1"), h2.FRAME_SIZE_ERROR),
])
def test_control_frame_errors(data: bytes, code: int) -> None:
    conn = connected()
    request(conn, 1)
    terminated(conn, data, code)


def test_settings_ack_and_initial_window_change_moves_open_streams() -> None:
    conn = connected()
    request(conn, 1)
    events = conn.receive_data(settings(window=100_000))
    assert events == [WindowUpdated(0)] and conn.data_to_send() == frame(h2.SETTINGS, h2.ACK, 0)
    assert conn.streams[1].send_window == 100_000
    conn.receive_data(settings(window=10))
    assert conn.streams[1].send_window == 10 and conn.local_flow_control_window(1) == 10


def test_peer_goaway_refuses_new_streams() -> None:
    conn = connected()
    request(conn, 1)
    events = conn.receive_data(goaway(0, 1, b"bye"))
    assert events == [ConnectionTerminated(0, 1, b"bye", True)] and conn.going_away and not conn.closed
    assert request(conn, 3) == [] and conn.data_to_send() == rst(3, h2.REFUSED_STREAM)
    assert 1 in conn.streams


def test_peer_reset_and_priority_and_unknown_frames() -> None:
    conn = connected()
    request(conn, 1)
    events = conn.receive_data(frame(h2.PRIORITY, 0, 1, b"\0" * 5) + frame(0x42, 0xFF, 1, b"?") + rst(1, h2.CANCEL))
    assert [(type(e), e.stream_id, e.error_code, e.remote) for e in events] == [(StreamReset, 1, h2.CANCEL, True)]
    assert conn.streams == {} and conn.data_to_send() == b""
    assert conn.receive_data(rst(1, h2.CANCEL)) == []  # a closed stream: ignored


def test_our_goaway_and_reset() -> None:
    conn = connected()
    request(conn, 1)
    conn.reset_stream(1, h2.CANCEL)
    conn.go_away()
    assert conn.data_to_send() == rst(1, h2.CANCEL) + goaway(0, 1)
    conn.go_away()  # once is enough
    assert conn.data_to_send() == b"" and not conn.closed
    conn.go_away(h2.INTERNAL_ERROR, b"x")
    assert conn.data_to_send() == goaway(h2.INTERNAL_ERROR, 1, b"x") and conn.closed


# -- flow control ---------------------------------------------------------------------------------
def test_send_data_within_both_windows_and_the_peer_frame_size() -> None:
    conn = connected(peer=struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 40_000))
    request(conn, 1)
    conn.send_headers(1, b"\x88")
    conn.data_to_send()
    assert conn.send_data(1, b"a" * 50_000) == 40_000  # the stream window
    assert conn.data_to_send() == frame(h2.DATA, 0, 1, b"a" * 16384) * 2 + frame(h2.DATA, 0, 1, b"a" * 7232)
    assert conn.local_flow_control_window(1) == 0 and conn.send_data(1, b"b") == 0
    assert conn.receive_data(wu(1, 50_000)) == [WindowUpdated(0)]
    assert conn.local_flow_control_window(1) == 65_535 - 40_000  # now the connection window
    assert conn.receive_data(wu(0, 100_000)) == []  # the connection window was open: nobody waited on it
    assert conn.send_data(1, b"c" * 10, end_stream=True) == 10
    assert conn.data_to_send() == frame(h2.DATA, h2.END_STREAM, 1, b"c" * 10) + rst(1, 0)


def test_window_update_tells_the_driver_only_when_a_window_was_shut() -> None:
    """A sender waits only while its stream's or the connection's window is shut: an update of an open
    window wakes nobody, and grpc-c++ sends two of those per unary call (no event, no dispatch)."""
    conn = connected()
    request(conn, 1)
    request(conn, 3)
    assert conn.receive_data(wu(1, 5) + wu(0, 5)) == []  # both open: the windows grow, no event
    assert conn.streams[1].send_window == 65_540 and conn.send_window == 65_540
    conn.send_headers(3, b"\x88")
    conn.send_headers(1, b"\x88")
    assert conn.send_data(3, b"a" * 65_535) + conn.send_data(1, b"b" * 5) == 65_540  # the connection's window shut
    assert conn.local_flow_control_window(1) == 0
    assert conn.receive_data(wu(1, 10)) == []  # stream 1's own window was open: still held by the connection's
    assert conn.receive_data(wu(0, 10)) == [WindowUpdated(0)]  # a sender on stream 1 may go on
    assert conn.local_flow_control_window(1) == 10


def test_send_response_waits_for_window_when_it_does_not_fit() -> None:
    conn = connected(peer=struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 4))
    request(conn, 1, end_stream=True)
    assert not conn.send_response(1, b"\x88", b"12345", b"")
    assert conn.data_to_send() == b"" and conn.streams[1].send_window == 4


def test_stream_window_update_errors_reset_the_stream() -> None:
    conn = connected()
    request(conn, 1)
    request(conn, 3)
    events = conn.receive_data(wu(1, 0) + wu(3, 2**31 - 1))
    assert [(type(e), e.stream_id, e.error_code) for e in events] == [
        (StreamReset, 1, h2.PROTOCOL_ERROR), (StreamReset, 3, h2.FLOW_CONTROL_ERROR)]
    assert conn.data_to_send() == rst(1, h2.PROTOCOL_ERROR) + rst(3, h2.FLOW_CONTROL_ERROR)
    assert not conn.closed


def test_received_data_is_acknowledged_at_half_windows_and_overruns_are_errors() -> None:
    limits = Limits(initial_window=100, connection_window=65_535 + 200)
    conn = connected(limits)
    request(conn, 1)
    conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 49))
    assert conn.data_to_send() == b""
    conn.receive_data(frame(h2.DATA, 0, 1, b"x"))
    assert conn.data_to_send() == wu(1, 50)
    events = conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 101))  # past the stream window
    assert [(type(e), e.error_code) for e in events] == [(StreamReset, h2.FLOW_CONTROL_ERROR)]
    assert conn.data_to_send() == rst(1, h2.FLOW_CONTROL_ERROR)
    request(conn, 3)
    terminated(conn, frame(h2.DATA, 0, 3, b"x" * 65_600), h2.FLOW_CONTROL_ERROR)  # past the connection window


def test_connection_window_update_at_half() -> None:
    conn = connected(Limits(connection_window=200))
    request(conn, 1)
    conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 100))
    assert conn.data_to_send() == wu(0, 100)


# -- limits of a hostile client -------------------------------------------------------------------
def test_max_concurrent_streams_refuses_extra_streams() -> None:
    conn = connected(Limits(max_concurrent_streams=2))
    enc = hpack.Encoder()
    assert len(request(conn, 1, encoder=enc)) == len(request(conn, 3, encoder=enc)) == 1
    assert request(conn, 5, encoder=enc) == []
    assert conn.data_to_send() == rst(5, h2.REFUSED_STREAM)
    conn.send_headers(1, b"\x88", end_stream=True)
    conn.data_to_send()
    assert len(request(conn, 7, encoder=enc)) == 1


def test_rapid_reset_is_told_to_calm_down() -> None:
    conn = connected(Limits(max_reset_debt=10))
    enc = hpack.Encoder()
    for sid in range(1, 21, 2):
        request(conn, sid, encoder=enc)
        conn.receive_data(rst(sid, h2.CANCEL))
    assert not conn.closed
    request(conn, 21, encoder=enc)
    assert conn.send_response(21, b"\x88", b"\0" * 5, b"\x40\x01a\x01b")  # a completed answer pays one back
    conn.data_to_send()
    request(conn, 23, encoder=enc)
    conn.receive_data(rst(23, h2.CANCEL))
    request(conn, 25, encoder=enc)
    terminated(conn, rst(25, h2.CANCEL), h2.ENHANCE_YOUR_CALM)


@pytest.mark.parametrize("flood", [
    settings(window=70_000), frame(h2.PING, 0, 0, b"\0" * 8), wu(0, 1), frame(h2.PRIORITY, 0, 1, b"\0" * 5),
    frame(h2.DATA, 0, 1, b""),
    # frames that do no work: ACKs, unknown types, empty DATA on a closed stream
    frame(h2.SETTINGS, h2.ACK, 0), frame(h2.PING, h2.ACK, 0, b"\0" * 8), frame(0x20, 0, 0, b"x"),
    frame(h2.DATA, 0, 3, b""),
])
def test_control_frame_flood_is_told_to_calm_down(flood: bytes) -> None:
    conn = connected(Limits(control_frame_burst=50, control_frame_rate=10.0, max_ping_strikes=0))
    enc = hpack.Encoder()
    request(conn, 1, encoder=enc)
    request(conn, 3, end_stream=True, encoder=enc)
    conn.reset_stream(3)  # closed: its empty DATA is dropped
    conn.receive_data(flood * 49, now=0.0)  # the handshake's SETTINGS took one token
    assert not conn.closed
    conn.receive_data(flood * 10, now=1.0)  # ten more tokens a second
    assert not conn.closed
    terminated(conn, flood, h2.ENHANCE_YOUR_CALM, now=1.0)


def test_settings_flood_walks_no_more_streams_than_the_limit() -> None:
    conn = connected(Limits(max_concurrent_streams=3))
    enc = hpack.Encoder()
    for sid in range(1, 100, 2):
        request(conn, sid, encoder=enc)
    assert len(conn.streams) == 3


def test_oversized_header_list_is_told_to_calm_down() -> None:
    conn = connected(Limits(max_header_list=100))
    block = hpack.Encoder().encode([*REQUEST, ("x-big", "v" * 200)])
    terminated(conn, frame(h2.HEADERS, h2.END_HEADERS, 1, block), h2.ENHANCE_YOUR_CALM)


def test_ping_strikes() -> None:
    conn = connected(Limits(max_ping_strikes=2, min_ping_interval=10.0))
    for i in range(3):
        conn.receive_data(frame(h2.PING, 0, 0, b"%08d" % i), now=1.0)
    assert conn.data_to_send() == b"".join(frame(h2.PING, h2.ACK, 0, b"%08d" % i) for i in range(3))
    terminated(conn, frame(h2.PING, 0, 0, b"3" * 8), h2.ENHANCE_YOUR_CALM, now=1.0)


def test_pings_after_data_or_far_apart_are_no_strikes() -> None:
    conn = connected(Limits(max_ping_strikes=1, min_ping_interval=10.0))
    request(conn, 1)
    for now in (0.0, 20.0, 40.0):  # far apart
        conn.receive_data(frame(h2.PING, 0, 0, b"\0" * 8), now=now)
    conn.send_headers(1, b"\x88")
    conn.receive_data(frame(h2.PING, 0, 0, b"\0" * 8), now=40.5)  # we sent something since
    assert not conn.closed


# -- time -----------------------------------------------------------------------------------------
def test_no_preface_within_the_header_timeout() -> None:
    conn = H2Connection(Limits(header_timeout=5.0), now=100.0)
    conn.receive_data(h2.PREFACE[:5], now=101.0)
    assert conn.tick(104.0) <= 105.0 and not conn.closed
    conn.tick(105.0)
    assert conn.closed and conn.data_to_send() == goaway(0, 0, b"header_timeout")


def test_half_sent_header_block_within_the_header_timeout() -> None:
    conn = connected(Limits(header_timeout=5.0, idle_timeout=0))
    conn.tick(50.0)
    assert not conn.closed  # the handshake is done: no header timeout while nothing is owed
    conn.receive_data(frame(h2.HEADERS, 0, 1, b"\x82"), now=60.0)
    conn.tick(64.0)
    assert not conn.closed
    conn.tick(65.0)
    assert conn.closed and conn.data_to_send() == goaway(0, 0, b"header_timeout")


def test_idle_timeout_counts_from_the_last_stream() -> None:
    conn = connected(Limits(idle_timeout=30.0))
    request(conn, 1, end_stream=True)
    conn.tick(100.0)
    assert not conn.closed
    conn.send_headers(1, b"\x88", end_stream=True)
    conn.data_to_send()
    conn.tick(110.0)  # idle from here
    conn.tick(139.0)
    assert not conn.closed
    conn.tick(140.0)
    assert conn.closed and conn.data_to_send() == goaway(0, 1, b"idle_timeout")


def test_keepalive_ping_and_its_timeout() -> None:
    conn = connected(Limits(keepalive_time=10.0, keepalive_timeout=2.0, idle_timeout=0))
    conn.tick(10.0)  # no call: no ping (keepalive_permit_without_calls is off)
    assert conn.data_to_send() == b""
    request(conn, 1)
    conn.tick(20.0)
    assert conn.data_to_send() == frame(h2.PING, 0, 0, b"\0" * 8)
    conn.receive_data(frame(h2.PING, h2.ACK, 0, b"\0" * 8))
    conn.tick(25.0)
    assert not conn.closed
    conn.tick(30.0)
    conn.data_to_send()
    assert conn.tick(31.0) <= 32.0 and not conn.closed
    conn.tick(32.0)  # not answered within the timeout: closed, nothing sent
    assert conn.closed and conn.data_to_send() == b""


def test_single_headers_frame_longer_than_the_header_list_limit_is_told_to_calm_down() -> None:
    # one HEADERS frame (no CONTINUATION) of HPACK size updates: refused before hpack sees it
    conn = connected(Limits(max_header_list=1024))
    terminated(conn, frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x20" * 1025), h2.ENHANCE_YOUR_CALM)


def test_more_than_two_size_updates_are_a_compression_error() -> None:
    conn = connected()
    block = hpack.Encoder().encode(REQUEST)
    assert len(conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x20\x3f\xe1\x1f" + block))) == 1
    terminated(conn, frame(h2.HEADERS, h2.END_HEADERS, 3, b"\x20\x20\x20" + block), h2.COMPRESSION_ERROR)


def test_resets_we_send_for_stream_errors_count_as_rapid_resets() -> None:
    conn = connected(Limits(max_reset_debt=10))
    enc = hpack.Encoder()
    for sid in range(1, 23, 2):  # HEADERS, DATA with END_STREAM, one more DATA: STREAM_CLOSED
        request(conn, sid, encoder=enc)
        data = frame(h2.DATA, h2.END_STREAM, sid, b"x") + frame(h2.DATA, 0, sid, b"y")
        if sid < 21:
            events = conn.receive_data(data)
            assert isinstance(events[-1], StreamReset) and events[-1].error_code == h2.STREAM_CLOSED
            assert not conn.closed
    terminated(conn, data, h2.ENHANCE_YOUR_CALM)


def test_refused_answers_pay_back_no_resets_and_refund_no_tokens() -> None:
    conn = connected(Limits(max_reset_debt=10, control_frame_burst=1000))
    enc = hpack.Encoder()
    tokens = conn._tokens
    for sid in range(1, 44, 4):  # a call the client resets, then one we answer at once without a body
        request(conn, sid, encoder=enc)
        conn.receive_data(rst(sid, h2.CANCEL))
        request(conn, sid + 2, end_stream=True, encoder=enc)
        if conn.closed:
            break
        conn.send_headers(sid + 2, [(b":status", b"415")], end_stream=True)
    assert conn.closed
    assert conn._tokens < tokens - 10  # the answers refunded nothing


def test_a_completed_answer_with_a_body_pays_back_a_reset() -> None:
    conn = connected(Limits(max_reset_debt=1))
    enc = hpack.Encoder()
    for sid in range(1, 41, 4):
        request(conn, sid, encoder=enc)
        conn.receive_data(rst(sid, h2.CANCEL))
        request(conn, sid + 2, end_stream=True, encoder=enc)
        assert conn.send_response(sid + 2, b"\x88", b"\0\0\0\0\0", b"\x40\x01a\x01b")
    assert not conn.closed


def test_a_stream_without_progress_is_cancelled() -> None:
    conn = connected(Limits(stream_timeout=10.0))
    enc = hpack.Encoder()
    request(conn, 1, encoder=enc)  # at 0, then no more: cancelled at 10
    request(conn, 3, end_stream=True, encoder=enc)  # the request is complete: no timeout
    request(conn, 5, encoder=enc)
    conn.streams[5].long_lived = True  # a bidirectional stream the driver runs (ModelStreamInfer)
    conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS, 7, enc.encode(REQUEST)), now=5.0)
    conn.receive_data(frame(h2.DATA, 0, 7, b"x"), now=8.0)  # progress
    assert conn.tick(9.0) <= 10.0 and not conn.expired and conn.data_to_send() == b""
    conn.tick(10.0)
    assert conn.data_to_send() == rst(1, h2.CANCEL) and conn.expired == [StreamReset(conn.expired[0].stream, h2.CANCEL, False)]
    assert conn.expired[0].stream_id == 1 and sorted(conn.streams) == [3, 5, 7]
    conn.expired.clear()
    conn.tick(18.0)
    assert conn.data_to_send() == rst(7, h2.CANCEL) and [e.stream_id for e in conn.expired] == [7]


def test_data_waits_while_the_send_buffer_is_full() -> None:
    conn = connected(Limits(max_send_buffer=100_000), peer=struct.pack(">HI", h2.INITIAL_WINDOW_SIZE, 2**31 - 1))
    conn.receive_data(wu(0, 2**31 - 1 - 65_535))
    request(conn, 1, end_stream=True)
    conn.data_to_send()
    assert conn.send_data(1, b"x" * 150_000) == 100_000  # the rest waits for the writer
    assert conn.local_flow_control_window(1) == 0 and not conn.send_response(1, b"\x88", b"y", b"")
    conn.data_to_send()
    assert conn.local_flow_control_window(1) == 100_000 and conn.send_response(1, b"\x88", b"y", b"")


def test_a_write_stuck_past_the_write_timeout_closes_the_connection() -> None:
    conn = connected(Limits(write_timeout=10.0))
    conn.writing_since = 5.0
    assert conn.tick(14.0) <= 15.0 and not conn.closed
    conn.tick(15.0)
    assert conn.closed


def test_the_header_block_cache_is_bounded_in_bytes() -> None:
    decoder = h2.HeaderDecoder(64 * 1024)
    for i in range(200):  # literals without indexing: the table never moves, every block is cached
        block = h2.encode_headers([(b":path", b"/%d" % i), (b"x-v", b"v" * 400)])
        assert decoder.decode(block)[b":path"] == b"/%d" % i
    assert len(decoder._cache) * 400 * 2 <= h2.HeaderDecoder.CACHE_BYTES


def test_received_bytes_not_consumed_are_bounded_per_connection() -> None:
    conn = connected(Limits(max_unconsumed=1000))
    enc = hpack.Encoder()
    request(conn, 1, encoder=enc)
    request(conn, 3, encoder=enc)
    assert len(conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 600))) == 1
    events = conn.receive_data(frame(h2.DATA, 0, 3, b"y" * 600))  # 1200 held: stream 3 is reset
    assert events == [StreamReset(events[0].stream, h2.ENHANCE_YOUR_CALM, False)]
    assert conn.data_to_send() == rst(3, h2.ENHANCE_YOUR_CALM) and conn.unconsumed == 600
    conn.consumed(conn.streams[1], 500)  # the driver took a message off stream 1's buffer
    request(conn, 5, encoder=enc)
    assert len(conn.receive_data(frame(h2.DATA, 0, 5, b"z" * 850))) == 1
    conn.reset_stream(1)  # a stream that ends gives back what it still held
    assert conn.unconsumed == 850


def test_a_busy_grpc_cpp_client_never_runs_out_of_tokens() -> None:
    """What perf_analyzer (grpc-c++) sends: after every answer a stream and a connection
    WINDOW_UPDATE, and now and then a BDP PING; 20,000 calls at one instant, no GOAWAY."""
    conn = connected()
    enc = hpack.Encoder()
    for i in range(20_000):
        sid = 2 * i + 1
        request(conn, sid, end_stream=True, encoder=enc)
        assert conn.send_response(sid, b"\x88", b"\0\0\0\0\0", b"\x40\x01a\x01b")
        conn.receive_data(wu(sid, 5) + wu(0, 5) + (frame(h2.PING, 0, 0, b"p" * 8) if i % 50 == 0 else b""))
        conn.data_to_send()
    assert not conn.closed


def test_a_request_body_under_the_minimum_rate_is_reported_once() -> None:
    """mod_reqtimeout's MinRate per stream: the clock starts at the first DATA, each byte buys
    1/min_rate s past the grace; tick() reports the stream (nothing sent: the driver answers)."""
    conn = connected(Limits(min_rate=100.0, body_grace=5.0, stream_timeout=0))
    enc = hpack.Encoder()
    request(conn, 1, encoder=enc)  # HEADERS at 0: no clock yet
    request(conn, 3, encoder=enc)
    conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 100), now=2.0)  # clock at 2: deadline 2 + 5 + 1
    conn.receive_data(frame(h2.DATA, 0, 3, b"x" * 100), now=2.0)
    conn.receive_data(frame(h2.DATA, 0, 3, b"x" * 300), now=6.0)  # 400 bytes: deadline 11
    assert conn.tick(7.5) == 8.0 and not conn.expired  # woken for the first deadline
    assert conn.tick(8.0) <= 11.0
    (slow,) = conn.expired
    assert slow.stream_id == 1 and isinstance(slow, StreamTooSlow)
    assert slow.message == "request body too slow: 100 bytes in 6.0 s, under the minimum of 100 bytes/s after 5 s"
    assert conn.data_to_send() == b"" and 1 in conn.streams  # the driver's to answer
    conn.expired.clear()
    conn.receive_data(frame(h2.DATA, 0, 1, b"x"), now=9.0)  # the clock stays off for a reported stream
    conn.receive_data(frame(h2.DATA, h2.END_STREAM, 3, b"x"), now=10.0)  # complete: no clock
    conn.tick(60.0)
    assert not conn.expired


def test_body_idle_stops_the_clock_until_the_next_data() -> None:
    """A bidirectional call between two messages holds nothing: it may idle (the driver says so)."""
    conn = connected(Limits(min_rate=100.0, body_grace=5.0, stream_timeout=0))
    request(conn, 1)
    conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 10), now=1.0)
    conn.body_idle(conn.streams[1])
    conn.tick(100.0)
    assert not conn.expired
    conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 10), now=100.0)  # a new message: a new clock
    conn.tick(105.0)
    assert not conn.expired
    conn.tick(105.1)
    assert [e.stream_id for e in conn.expired] == [1]


def test_no_minimum_rate_when_it_is_zero() -> None:
    conn = connected(Limits(min_rate=0, stream_timeout=0))
    request(conn, 1)
    conn.receive_data(frame(h2.DATA, 0, 1, b"x"), now=1.0)
    conn.tick(1000.0)
    assert not conn.expired


def test_body_max_time_caps_what_a_fast_start_buys() -> None:
    """mod_reqtimeout's maxtimeout: 1000 bytes at once bought 5 + 10 s of trickling; the cap is 8."""
    conn = connected(Limits(min_rate=100.0, body_grace=5.0, body_max_time=8.0, stream_timeout=0))
    request(conn, 1)
    conn.receive_data(frame(h2.DATA, 0, 1, b"x" * 1000), now=1.0)
    assert conn.tick(2.0) <= 9.0 and not conn.expired
    conn.tick(9.0)
    assert [e.stream_id for e in conn.expired] == [1]


def test_a_malformed_block_that_moved_the_table_drops_the_cached_blocks() -> None:
    """Found by review: the check of a malformed block raised before the decoder dropped its cache, so a
    cached block pointing at a dynamic-table entry that the malformed block had moved decoded to the old
    value (x-user: alice where the peer meant bob); the slow path (no cache) was right."""
    conn = connected()
    never = [hpack.NeverIndexedHeaderTuple(n, v) for n, v in REQUEST]
    enc = hpack.Encoder()  # the request's own fields never indexed: only x-user moves the table
    conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 3, enc.encode(never + [("x-user", "alice")])))
    points = b"".join(enc.encode([h]) for h in never) + bytes([0x80 | 62])  # x-user at index 62, adds nothing
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 5, points))
    assert events[0].headers[b"x-user"] == b"alice"
    bad = enc.encode(never + [("x-bad", "nul\x00"), ("x-user", "bob")])  # malformed; index 62 is bob now
    assert conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 7, bad)) == []
    events = conn.receive_data(frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 9, points))
    assert events[0].headers[b"x-user"] == b"bob"
