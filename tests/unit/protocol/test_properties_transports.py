"""Properties of the sans-I/O transports and the other wire codecs: the HTTP/1.1 parser (http1.py),
the HTTP/2 state machine (h2_connection.py + http2.py), the workers' control frames (control.py) and
the generate extension's JSON (generate.py).

* HTTP/1: any byte stream, split at any points, gives the events and the error the unsplit stream
  gives, and raises nothing but :class:`http1.ProtocolError`;
* HTTP/2: a preface and any sequence of frames (well-formed or not, in any pieces), with the driver
  answering the requests it sees, raise nothing (violations are GOAWAY/RST_STREAM events) but
  :class:`StreamClosedError` on a send to a closed stream; the events and bytes out do not depend
  on how the input was split;
* control frames round trip, and any bytes raise only :class:`control.ProtocolError`;
* any generate body is a request or a :class:`TritonError`.
"""

from __future__ import annotations

import struct
from typing import Any

import hpack
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scripts.fuzz import drive_http1
from tests.unit.codec_strategies import WIRES, text
from tests.unit.protocol.test_h2_connection import frames as sent_frames
from triton_actor.errors import TritonError
from triton_actor.protocol import control, generate, http1
from triton_actor.protocol import h2_connection as hc
from triton_actor.protocol import h2_events as he
from triton_actor.protocol import http2 as h2
from triton_actor.protocol.dtypes import BY_WIRE


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts``; no empty pieces (b"" is the peer's close)."""
    points = sorted(set(cuts))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if b > a]


def pieces(data: bytes, draw: st.DataObject) -> list[bytes]:
    return split(data, draw.draw(st.lists(st.integers(0, len(data)), max_size=8), label="cuts"))


# -- HTTP/1.1 ---------------------------------------------------------------------------------------
SMALL = http1.Limits(max_line=80, max_head=300, max_headers=6, max_body=120, max_chunk_line=40)


def run_http1(pieces: list[bytes], limits: http1.Limits = SMALL) -> list[Any]:
    return drive_http1(pieces, limits)


_NAMES = st.sampled_from(["Host", "Content-Type", "Connection", "Expect", "Content-Length", "Transfer-Encoding",
                          "Inference-Header-Content-Length", "X-A", "x-a"])
_VALUES = st.one_of(st.sampled_from(["x", "close", "keep-alive", "100-continue", "chunked", "5", "0", " 7 ",
                                     "1,1", "+3", "gzip, chunked"]), st.text("abc 01\t", max_size=6))


@st.composite
def http1_request(draw: st.DrawFn) -> bytes:
    """One request, mostly well formed: a request line, a few fields, and a body framed by
    Content-Length, chunked encoding (with extensions and trailers), or nothing."""
    method = draw(st.sampled_from(["GET", "POST", "PUT", "G@T"]))
    target = draw(st.sampled_from(["/", "/v2/models/m/infer", "/a b", "*"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTX"]))
    lines = [f"{method} {target} {version}"]
    lines += [f"{n}: {v}" for n, v in draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=4))]
    body = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["length", "chunked", "none"]))
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}")
    elif framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if framing == "length":
        return head + body
    if framing == "none":
        return head
    chunks = b""
    for part in [body[i:i + 7] for i in range(0, len(body), 7)]:
        ext = draw(st.sampled_from([b"", b";a=b", b" ;x"]))
        chunks += b"%x%s\r\n%s\r\n" % (len(part), ext, part)
    trailer = draw(st.sampled_from([b"", b"X-T: 1\r\n"]))
    return head + chunks + b"0\r\n" + trailer + b"\r\n"


@st.composite
def http1_streams(draw: st.DrawFn) -> bytes:
    """Requests back to back (keep-alive), with empty lines between them, sometimes mutated."""
    data = b""
    for _ in range(draw(st.integers(1, 3))):
        data += draw(st.sampled_from([b"", b"\r\n", b"\n", b"\r\n\r\n", b"\r"])) + draw(http1_request())
    if draw(st.booleans()):
        pos = draw(st.integers(0, len(data)))
        data = data[:pos] + draw(st.binary(max_size=4)) + data[pos + draw(st.integers(0, 4)):]
    return data


@pytest.mark.usefixtures("fast_paths")
@given(st.one_of(http1_streams(), st.binary(max_size=200)), st.data())
def test_http1_split_anywhere_same_result(data: bytes, draw: st.DataObject) -> None:
    whole = run_http1([data])
    assert run_http1(pieces(data, draw)) == whole
    assert run_http1([data[i:i + 1] for i in range(len(data))]) == whole



@pytest.mark.usefixtures("fast_paths")
@pytest.mark.parametrize("data, first", [
    # what the property above found: a first line of exactly max_line bytes (a bare LF inside), read up to
    # the CR of its CRLF, was refused as too long (414), where read at once it was a bad request line
    (b"POST /v2/models/m/infer HTTP/1.\x00\x00\nInference-Header-Content-Length: gzip, chunked\r\n"
     b"Content-Length: 0\r\n\r\nGET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", ("error", 400)),
    (b"GET /" + b"a" * 66 + b" HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "a request"),  # a line of 80 bytes
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"0" * 39 + b"1\r\nx\r\n0\r\n\r\n", "a request"),
])
def test_http1_a_line_of_exactly_its_limit_read_a_byte_at_a_time(data: bytes, first: object) -> None:
    whole = run_http1([data])
    assert run_http1([data[i:i + 1] for i in range(len(data))]) == whole
    assert whole[0] == first if first != "a request" else whole[0][0] != "error", whole
@pytest.mark.usefixtures("fast_paths")
@given(st.lists(st.sampled_from([b"\r\n", b"\n", b"\r"]), max_size=5).map(b"".join), st.data())
def test_http1_empty_lines_before_a_request_split_anywhere(prefix: bytes, draw: st.DataObject) -> None:
    data = prefix + b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    assert run_http1(pieces(data, draw)) == run_http1([data])


@pytest.mark.usefixtures("fast_paths")
@pytest.mark.parametrize(("data", "cut"), [(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n", 3), (b"\r\n\nGET / HTTP/1.1\r\n\r\n", 2)])
def test_http1_empty_lines_split_inside_a_crlf(data: bytes, cut: int) -> None:
    """Found by the split property: leading CRs and LFs were all stripped at once, so a read ending
    inside an empty line's CRLF left its LF before the request line (400), which the same bytes read
    at once did not."""
    whole = run_http1([data])
    assert isinstance(whole[0], http1.Head) and whole[-1] is http1.CLOSED
    assert run_http1([data[:cut], data[cut:]]) == whole


# -- HTTP/2 -----------------------------------------------------------------------------------------
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
           (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")]
H2_LIMITS = he.Limits(max_concurrent_streams=3, initial_window=100, connection_window=300, max_frame=16_384,
                   max_header_list=400, max_continuations=3, control_frame_burst=40, max_reset_debt=4,
                   max_send_buffer=2000, max_unconsumed=250)


def frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload


_SIDS = st.sampled_from([0, 1, 1, 3, 3, 5, 7, 2, 2**31 - 1, 2**31 + 1])
_FLAGS = st.sampled_from([0, h2.END_STREAM, h2.END_HEADERS, h2.END_HEADERS | h2.END_STREAM, h2.PADDED,
                          h2.PRIORITY_FLAG | h2.END_HEADERS, 0xFF])


@st.composite
def h2_frames(draw: st.DrawFn, encoder: hpack.Encoder) -> bytes:
    """One frame: a well-formed one of each type, or any type, flags, stream and payload."""
    sid, flags = draw(_SIDS), draw(_FLAGS)
    kind = draw(st.sampled_from(["headers", "data", "settings", "window", "rst", "ping", "goaway", "priority",
                                 "continuation", "any"]))
    if kind == "headers":
        block = encoder.encode(draw(st.sampled_from([REQUEST, REQUEST[:2], [*REQUEST, ("x-big", "v" * 300)]])))
        return frame(h2.HEADERS, flags, sid, block)
    if kind == "data":
        return frame(h2.DATA, flags, sid, draw(st.binary(max_size=120)))
    if kind == "settings":
        values = draw(st.lists(st.tuples(st.integers(0, 8), st.sampled_from([0, 1, 100, 16_384, 2**24, 2**31])),
                               max_size=3))
        return frame(h2.SETTINGS, flags & h2.ACK, 0, b"".join(struct.pack(">HI", k, v) for k, v in values))
    if kind == "window":
        return frame(h2.WINDOW_UPDATE, 0, sid, struct.pack(">I", draw(st.sampled_from([0, 1, 1000, 2**31 - 1]))))
    if kind == "rst":
        return frame(h2.RST_STREAM, 0, sid, struct.pack(">I", draw(st.integers(0, 20))))
    if kind == "ping":
        return frame(h2.PING, flags & h2.ACK, 0, draw(st.binary(min_size=8, max_size=8)))
    if kind == "goaway":
        return frame(h2.GOAWAY, 0, 0, struct.pack(">II", draw(st.integers(0, 9)), draw(st.integers(0, 13))))
    if kind == "priority":
        return frame(h2.PRIORITY, 0, sid, draw(st.binary(min_size=5, max_size=5)))
    if kind == "continuation":
        return frame(h2.CONTINUATION, flags, sid, encoder.encode([("x-c", draw(text))]))
    return frame(draw(st.integers(0, 12)), draw(st.integers(0, 255)), sid, draw(st.binary(max_size=40)))


class Driver:
    """What frontends/grpc_h2.py does with the events: consume what arrives and, when ``answering``,
    answer each request once its body ended (no new work once the connection is closed). The outcome
    is the events (less WindowUpdated, whose count depends on how reads fall) and every byte sent."""

    def __init__(self, answering: bool) -> None:
        self.conn = hc.H2Connection(H2_LIMITS)
        self.conn.initiate_connection()
        self.answering = answering
        self.log: list[Any] = []
        self.sent = bytearray()
        self.answers = 0

    def feed(self, data: bytes) -> None:
        for event in self.conn.receive_data(data, 1.0):
            assert isinstance(event, (he.RequestReceived, he.DataReceived, he.StreamEnded, he.StreamReset,
                                      he.WindowUpdated, he.ConnectionTerminated))
            if type(event) is not he.WindowUpdated:
                self.log.append(event)
            if isinstance(event, he.ConnectionTerminated):
                assert self.conn.going_away or self.conn.closed
            elif self.conn.closed:
                continue
            if isinstance(event, he.DataReceived):
                self.conn.consumed(event.stream)
            if self.answering and isinstance(event, (he.RequestReceived, he.DataReceived)) and event.end_stream:
                self._answer(event.stream_id)
        self.sent += self.conn.data_to_send()

    def _answer(self, sid: int) -> None:
        """Answer in the three ways the server does, in turn; a send to a closed stream raises its error."""
        self.answers += 1
        try:
            if self.answers % 3 == 0:
                self.conn.send_response(sid, b"\x88", b"\0\0\0\0\1x", b"\x00\x0bgrpc-status\x010")
            elif self.answers % 3 == 1:
                self.conn.send_headers(sid, [(b":status", b"200")])
                self.conn.send_data(sid, b"y" * 150, end_stream=False)
                self.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
            else:
                self.conn.reset_stream(sid)
        except he.StreamClosedError:
            self.log.append(("closed", sid))


def run_h2(pieces: list[bytes], answering: bool = False) -> Driver:
    driver = Driver(answering)
    for piece in pieces:
        driver.feed(piece)
    driver.conn.tick(2.0)
    driver.sent += driver.conn.data_to_send()
    return driver


def nothing_after_an_error_goaway(data: bytes) -> bool:
    kinds = [(t, struct.unpack(">I", p[4:8])[0] if t == h2.GOAWAY else 0) for t, _, _, p in sent_frames(data)]
    errors = [i for i, (t, code) in enumerate(kinds) if t == h2.GOAWAY and code]
    return not errors or errors[0] == len(kinds) - 1


@st.composite
def h2_streams(draw: st.DrawFn) -> bytes:
    encoder = hpack.Encoder()
    body = b"".join(draw(st.lists(h2_frames(encoder), max_size=12)))
    start = h2.PREFACE + frame(h2.SETTINGS, 0, 0, b"")
    return draw(st.sampled_from([start + body, start[:10] + body, body, start + body[:-3]]))


@settings(max_examples=200)
@given(h2_streams(), st.data())
def test_h2_any_frames_in_any_pieces(data: bytes, draw: st.DataObject) -> None:
    """The state machine alone: the same events and bytes out however the input is split. (With a
    driver answering between reads, what it sends depends on when it could answer: not compared.)"""
    whole = run_h2([data])
    split_run = run_h2(pieces(data, draw))
    assert split_run.log == whole.log
    assert bytes(split_run.sent) == bytes(whole.sent)


@settings(max_examples=200)
@given(h2_streams(), st.data())
def test_h2_any_frames_answered(data: bytes, draw: st.DataObject) -> None:
    """Answering the requests as they come: only StreamClosedError from a send, and nothing sent
    after a GOAWAY for a connection error."""
    for run in (run_h2([data], answering=True), run_h2(pieces(data, draw), answering=True)):
        assert nothing_after_an_error_goaway(bytes(run.sent))


def test_h2_no_answer_behind_an_error_goaway() -> None:
    """Found by scripts/fuzz.py (h2): a request and a connection error in one read gave the
    RequestReceived after the GOAWAY was queued, and the answer went out behind the GOAWAY. Sends
    on a closed connection raise StreamClosedError now."""
    block = hpack.Encoder().encode(REQUEST)
    data = h2.PREFACE + frame(h2.SETTINGS, 0, 0, b"") + frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, block) \
        + frame(h2.DATA, 0, 0, b"x")
    conn = hc.H2Connection()
    events = conn.receive_data(data, 1.0)
    assert [type(e) for e in events] == [he.RequestReceived, he.ConnectionTerminated] and conn.closed
    with pytest.raises(he.StreamClosedError):
        conn.send_response(1, b"\x88", b"\0\0\0\0\1x", b"\x00\x0bgrpc-status\x010")
    with pytest.raises(he.StreamClosedError):
        conn.send_headers(1, [(b":status", b"200")])
    conn.reset_stream(1)
    assert sent_frames(conn.data_to_send())[-1][0] == h2.GOAWAY


@pytest.mark.parametrize("block", [b"\x3f" + b"\xff" * 12, b"\x7f"])
def test_h2_bad_header_block_goaway_holds_no_address(block: bytes) -> None:
    """Found by scripts/fuzz.py (h2): hpack's error text for an over-long integer holds the repr of a
    memoryview ('<memory at 0x7f...>'), which went to the client in the GOAWAY's debug data."""
    conn = hc.H2Connection()
    events = conn.receive_data(h2.PREFACE + frame(h2.SETTINGS, 0, 0, b"") + frame(h2.HEADERS, h2.END_HEADERS, 1, block))
    assert events[-1].error_code == h2.COMPRESSION_ERROR
    assert b"0x" not in events[-1].additional_data and b"0x" not in conn.data_to_send()


@given(st.binary(max_size=200))
def test_h2_any_bytes_after_the_preface(data: bytes) -> None:
    run_h2([h2.PREFACE + data], answering=True)


# -- control frames ---------------------------------------------------------------------------------
json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), text, st.binary(max_size=8))
control_keys = st.one_of(text, st.sampled_from(["__b64__", "__dict__"]))
messages = st.dictionaries(control_keys, st.recursive(json_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(control_keys, inner, max_size=3)), max_leaves=8), max_size=4)


@settings(max_examples=100)
@given(st.lists(messages, max_size=3), st.data())
def test_control_frames_round_trip(sent: list[dict[str, Any]], draw: st.DataObject) -> None:
    reader = control.FrameReader()
    got = [m for piece in pieces(b"".join(map(control.encode, sent)), draw) for m in reader.feed(piece)]
    assert got == sent


def _control_feed(data: bytes) -> None:
    try:
        control.FrameReader(max_frame=1000).feed(data)
    except control.ProtocolError:
        pass


@given(st.binary(max_size=100))
def test_control_any_bytes(data: bytes) -> None:
    _control_feed(data)


@settings(max_examples=100)
@given(st.recursive(st.one_of(json_leaves.filter(lambda v: not isinstance(v, bytes)),
                              st.fixed_dictionaries({"__b64__": st.one_of(text, st.integers(-(2**63), 2**63 - 1), st.none())})),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
                    max_leaves=8))
def test_control_any_json(value: Any) -> None:
    body = orjson.dumps({"id": 1, "ok": value})
    _control_feed(struct.pack(">I", len(body)) + body)


@pytest.mark.parametrize("message", [{"__b64__": ""}, {"args": {"__b64__": "aGk="}}, {"a": {"__dict__": {"x": 1}}},
                                     {"a": {"__dict__": 5}}])
def test_control_dicts_that_look_like_markers_round_trip(message: dict[str, Any]) -> None:
    """Found by test_control_frames_round_trip: a dict whose one key was ``__b64__`` (a client's
    parameters may hold any key) came back as bytes."""
    assert control.FrameReader().feed(control.encode(message)) == [message]


@pytest.mark.parametrize("value", ["0", "\x80", None, 5, "a=b="])
def test_control_invalid_base64_is_a_protocol_error(value: Any) -> None:
    """Found by test_control_any_json: binascii.Error, TypeError and ValueError escaped the reader."""
    body = orjson.dumps({"id": 1, "ok": {"__b64__": value}})
    with pytest.raises(control.ProtocolError, match="base64"):
        control.FrameReader().feed(struct.pack(">I", len(body)) + body)


def test_control_deep_nesting_is_a_protocol_error() -> None:
    """Found by reading what test_control_any_json could not reach: orjson reads 1024 levels, the
    decoder recursed into them and hit Python's recursion limit (RecursionError)."""
    body = b'{"a":' + b"[" * 1000 + b"]" * 1000 + b"}"
    with pytest.raises(control.ProtocolError):
        control.FrameReader().feed(struct.pack(">I", len(body)) + body)


# -- generate ---------------------------------------------------------------------------------------
generate_specs = st.lists(st.tuples(st.sampled_from(["a", "b", "text_input"]), st.sampled_from(WIRES),
                                    st.lists(st.sampled_from([-1, 1, 2]), max_size=2)),
                          max_size=2, unique_by=lambda s: s[0])
generate_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=2)), max_leaves=6)


@settings(max_examples=100)
@given(generate_specs, st.integers(0, 2), st.dictionaries(st.sampled_from(["a", "b", "text_input", "id", "parameters",
                                                                             "triton_x", "other"]), generate_values))
def test_generate_any_json(specs: list[Any], max_batch: int, body: dict[str, Any]) -> None:
    inputs = [(name, BY_WIRE[wire], tuple(dims)) for name, wire, dims in specs]
    try:
        generate.decode_request(orjson.dumps(body), "m", 1, inputs, max_batch)
    except TritonError:
        pass


@given(st.binary(max_size=64))
def test_generate_any_bytes(body: bytes) -> None:
    try:
        generate.decode_request(body, "m", 1, [("a", BY_WIRE["FP32"], (-1,))], 0)
    except TritonError:
        pass
