"""The HTTP/1.1 state machine (``protocol/http1.py``), byte for byte: bytes in, events out."""

from __future__ import annotations

import dataclasses
import math

import pytest

from triton_actor.protocol import http1
from triton_actor.protocol.http1 import CLOSED, NEED_DATA, Body, BodyTooLarge, Head, Limits, ProtocolError

SMALL = Limits(max_body=100, header_timeout=10, body_timeout=5, keepalive_timeout=75)


pytestmark = pytest.mark.usefixtures("fast_paths")  # every test with the parsed-head cache and without it


def events(data: bytes, limits: Limits = SMALL, step: int = 0) -> list[object]:
    """Feed ``data`` (in ``step``-byte pieces; 0 = at once) and collect events up to NEED_DATA/CLOSED,
    starting the next cycle after each body."""
    conn = http1.ServerConnection(limits, now=0.0)
    pieces = [data[i:i + step] for i in range(0, len(data), step)] if step else [data]
    out: list[object] = []
    for piece in pieces:
        conn.receive_data(piece, 1.0)
        while (event := conn.next_event()) is not NEED_DATA:
            out.append(event)
            if isinstance(event, Body):
                conn.start_next_cycle(2.0)
            if event is CLOSED:
                return out
    return out


def refused(data: bytes, limits: Limits = SMALL) -> ProtocolError:
    with pytest.raises(ProtocolError) as e:
        events(data, limits)
    return e.value


def test_get_then_post_pipelined() -> None:
    data = (b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /v2/models/m/infer?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    for step in (0, 1, 7):
        assert events(data, step=step) == [
            Head("GET", "/v2/health/ready", "HTTP/1.1", {"host": "x"}, True, False, 0), Body(b""),
            Head("POST", "/v2/models/m/infer?a=1", "HTTP/1.1", {"host": "x", "content-length": "5"}, True, False, 5),
            Body(b"hello"),
        ]


def test_a_taken_body_is_the_buffer_itself_and_a_pipelined_request_stays() -> None:
    """take_body (the load route's large bodies, issue 23) hands the buffer over instead of copying
    it; what follows the body (a pipelined request) goes on in a new buffer."""
    conn = http1.ServerConnection(SMALL, now=0.0)
    conn.receive_data(b"POST /load HTTP/1.1\r\nContent-Length: 10\r\n\r\nhello", 1.0)
    assert isinstance(conn.take_body(), Head)  # not in a body yet: next_event's answer
    buf = conn.buf
    assert conn.take_body() is NEED_DATA and conn.want == 5
    conn.receive_data(b"worldGET / HTTP/1.1\r\n\r\n", 1.0)
    (data,) = conn.take_body()
    assert data is buf and data == bytearray(b"helloworld")  # the same object: no copy
    assert conn.buf == b"GET / HTTP/1.1\r\n\r\n" and conn.buf is not buf and conn.deadline == math.inf
    conn.start_next_cycle(2.0)
    assert conn.next_event() == Head("GET", "/", "HTTP/1.1", {}, True, False, 0)


def test_keep_alive_expect_and_repeated_fields() -> None:
    (head, _), = [events(b"GET / HTTP/1.0\r\n\r\n")]
    assert head.keep_alive is False
    assert events(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")[0].keep_alive is True
    assert events(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")[0].keep_alive is False
    head = events(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")[0]
    assert head.expect_continue and head.length == 2
    head = events(b"GET / HTTP/1.1\r\nA: 1\r\nB:\t x \t\r\na: 2\r\n\r\n")[0]
    assert head.headers == {"a": "1,2", "b": "x"}


def test_empty_lines_before_a_request_are_ignored() -> None:
    assert [type(e) for e in events(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n")] == [Head, Body]


def test_clean_close_and_truncation() -> None:
    conn = http1.ServerConnection(SMALL)
    conn.receive_data(b"", 1.0)
    assert conn.next_event() is CLOSED
    for partial in (b"GET / HTTP/1.1\r\nHo", b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc",
                    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"):
        conn = http1.ServerConnection(SMALL)
        conn.receive_data(partial, 1.0)
        while conn.next_event() is not NEED_DATA:
            pass
        with pytest.raises(ProtocolError) as e:
            conn.receive_data(b"", 2.0)
        assert e.value.status == 400


@pytest.mark.parametrize("value", ["1_0", "+5", "-1", "5 5", "0x5", "1e1", "\uff15", "", "5,6", "five"])
def test_content_length_digits_only(value: str) -> None:
    data = f"POST /cl HTTP/1.1\r\nContent-Length: {value}\r\n\r\n".encode()
    assert refused(data).status == 400


@pytest.mark.parametrize("fields", [b"Content-Length: 3\r\nContent-Length: 3", b"Content-Length: 3, 3",
                                    b"Content-Length: 3\r\ncontent-length: 4", b"Content-Length: 3,3"])
def test_content_length_once_and_not_a_list(fields: bytes) -> None:
    """As nginx (Content-Length is a unique header line, its value digits only): equal duplicates or a
    list of equal values are 400 too, since a proxy in front may have framed the body by another rule."""
    e = refused(b"POST / HTTP/1.1\r\n" + fields + b"\r\n\r\nabc")
    assert e.status == 400


def test_content_length_blanks() -> None:
    # blanks around a field value are not part of it (RFC 9110 §5.5)
    assert events(b"POST / HTTP/1.1\r\nContent-Length:  3 \r\n\r\nabc")[1] == Body(b"abc")


def test_body_limit_on_declared_length() -> None:
    e = refused(b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n")
    assert isinstance(e, BodyTooLarge) and (e.size, e.limit) == (101, 100)
    e = refused(b"POST / HTTP/1.1\r\nContent-Length: " + b"9" * 400 + b"\r\n\r\n")
    assert isinstance(e, BodyTooLarge) and e.size == "more than 999999999999999999"  # not 2**62, which it is taken as
    assert events(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n" + b"x" * 100)[1] == Body(b"x" * 100)


def test_transfer_encoding_on_http_1_0_is_refused() -> None:
    """nginx: "client sent HTTP/1.0 request with Transfer-Encoding header" (400); HTTP/1.0 has no
    chunked coding, so a 1.0 proxy in front would frame the body by its end instead."""
    e = refused(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n")
    assert e.status == 400 and "HTTP/1.0" in e.message


def test_a_space_after_a_chunk_size_is_read_as_nginx_reads_it() -> None:
    """nginx's ngx_http_parse_chunked takes a blank after the size as the start of a chunk extension
    (to the line's end), so it does not refuse it; neither do we (the size itself is hex digits only)."""
    data = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4 \r\nabcd\r\n0\t\r\n\r\n"
    assert events(data)[1] == Body(b"abcd")


def test_transfer_encoding_with_content_length_is_refused() -> None:
    data = b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    assert refused(data).status == 400
    assert refused(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").status == 501


def test_chunked_body() -> None:
    data = (b"POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"
            b"5;name=value\r\nhello\r\n1 \r\n \r\nA\r\n0123456789\r\n0\r\nTrailer-A: 1\r\n\r\n"
            b"GET /next HTTP/1.1\r\n\r\n")
    for step in (0, 1, 3):
        got = events(data, step=step)
        assert got[0].length == http1.CHUNKED
        assert got[1:] == [Body(b"hello 0123456789"), got[2], Body(b"")]
        assert got[2].target == "/next"


@pytest.mark.parametrize("size", [b"-7FFFFFFFFFFFFFFF", b"-1", b"+5", b"0x5", b"zz", b"", b" 5", b"5_0",
                                  b"1" * 17, b"1" * 60_000, b"5\x00", b"5\rx"])
def test_chunk_size_hex_digits_only(size: bytes) -> None:
    data = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n"
    e = refused(data, dataclasses.replace(SMALL, max_body=1 << 62))
    assert e.status == 400 and not isinstance(e, BodyTooLarge)


def test_chunk_limits() -> None:
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    # the limit applies before the chunk's data arrives: nothing of a too-large chunk is buffered
    e = refused(head + b"40\r\n" + b"x" * 64 + b"\r\n40\r\n")
    assert isinstance(e, BodyTooLarge) and (e.size, e.limit) == (128, 100)
    assert refused(head + b"5;" + b"e" * 2000 + b"\r\n").message == "chunk size line too long"
    assert refused(head + b"5\r\nhelloXX").message == "chunk data not followed by CRLF"
    assert refused(head + b"0\r\nBad Trailer\r\n\r\n").status == 400
    many = b"".join(b"T%d: %s\r\n" % (i, b"v" * 1000) for i in range(40))
    assert refused(head + b"0\r\n" + many + b"\r\n").status == 431



def test_a_chunked_body_has_at_most_triton_s_number_of_non_empty_chunks() -> None:
    """Triton's kMaxChunkedChunks and its words: 65536 non-empty chunks are a body, one more is a 400 as
    soon as its size line is read (the last chunk, empty, does not count)."""
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    at_most = head + b"1\r\nA\r\n" * http1.MAX_CHUNKS + b"0\r\n\r\n"
    assert http1.MAX_CHUNKS == 65536
    assert events(at_most, limits=Limits(max_body=1 << 20))[1] == Body(b"A" * http1.MAX_CHUNKS)
    e = refused(head + b"1\r\nA\r\n" * (http1.MAX_CHUNKS + 1), Limits(max_body=1 << 20))
    assert e.status == 400 and e.message == (
        "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger HTTP chunks.")



def test_a_chunked_body_costs_its_bytes_not_an_object_per_chunk() -> None:
    """A body of one-byte chunks held a bytes object per chunk until the end (33 bytes of object per byte
    of body, a list slot and the parse's leftovers): 60000 chunks peaked at 7.4 MB traced; now the data goes to
    one buffer, and the peak is the wire bytes and the body (under 1.1 MB)."""
    import tracemalloc

    data = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\nA\r\n" * 60000 + b"0\r\n\r\n"
    conn = http1.ServerConnection(Limits(max_body=1 << 20), now=0.0)
    tracemalloc.start()
    try:
        conn.receive_data(data, 1.0)
        assert isinstance(conn.next_event(), Head)
        body = conn.next_event()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body == Body(b"A" * 60000)
    assert peak < 3 * len(data), peak  # the received bytes (360 kB), the body and the buffer's growth


@pytest.mark.parametrize("head", [b"GET / HTTP/1.1\nHost: x\n\n", b"GET / HTTP/1.1\r\nHost: x\n\n",
                                  b"GET / HTTP/1.1\nHost: x\r\n\r\n"[:-4] + b"\n\r\n"])
def test_a_head_ended_by_bare_lfs_is_400_not_a_wait_for_the_header_timeout(head: bytes) -> None:
    e = refused(head)
    assert e.status == 400 and "bare LF" in e.message


def test_head_limits() -> None:
    assert refused(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n").status == 414
    assert refused(b"GET /" + b"a" * 9000).status == 414  # before the line ends
    assert refused(b"GET /a HTTP/1.1\r\nX: " + b"v" * 9000 + b"\r\n\r\n").status == 431
    fields = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 4000) for i in range(9))
    assert refused(b"GET /b HTTP/1.1\r\n" + fields + b"\r\n").status == 431
    assert refused(b"GET /c HTTP/1.1\r\n" + b"X: " + b"v" * 40_000).status == 431  # before the head ends
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(101))
    assert refused(b"GET /d HTTP/1.1\r\n" + fields + b"\r\n").status == 431


@pytest.mark.parametrize(("head", "status"), [
    (b"GET / HTTP/2.0", 505), (b"GET / FOO", 400), (b"GET  / HTTP/1.1", 400), (b"GET / HTTP/1.1 x", 400),
    (b"G(T / HTTP/1.1", 400), (b"GET /\x7f HTTP/1.1", 400), (b"GET", 400),
    (b"GET / HTTP/1.1\r\nNo-Colon", 400), (b"GET / HTTP/1.1\r\nName : v", 400),
    (b"GET / HTTP/1.1\r\nA: 1\r\n folded", 400), (b"GET / HTTP/1.1\r\nA: x\ry", 400),
    (b"GET / HTTP/1.1\r\nA: x\x00y", 400),
])
def test_malformed_heads(head: bytes, status: int) -> None:
    assert refused(head + b"\r\n\r\n").status == status


def test_deadlines() -> None:
    conn = http1.ServerConnection(SMALL, now=100.0)
    assert (conn.deadline, conn.since, conn.waiting) == (175.0, 100.0, True)  # keep-alive idle
    conn.receive_data(b"POST / HTTP/1.1\r\n", 101.0)
    assert conn.next_event() is NEED_DATA and conn.deadline == 111.0  # the head: 10 s in all
    conn.receive_data(b"Content-Length: 4\r\n", 105.0)
    assert conn.next_event() is NEED_DATA and conn.deadline == 111.0
    conn.receive_data(b"\r\nab", 106.0)
    assert isinstance(conn.next_event(), Head) and not conn.waiting
    assert conn.next_event() is NEED_DATA and (conn.deadline, conn.want) == (111.0, 2)  # 5 s after the last read
    conn.receive_data(b"c", 108.0)
    assert conn.next_event() is NEED_DATA and conn.deadline == 113.0
    conn.receive_data(b"dGET", 109.0)
    assert conn.next_event() == Body(b"abcd") and conn.deadline == math.inf  # being answered
    conn.start_next_cycle(120.0)
    assert conn.deadline == 130.0  # a pipelined head has begun: header timeout
    conn.receive_data(b" / HTTP/1.1\r\n\r\n", 121.0)
    assert isinstance(conn.next_event(), Head) and conn.next_event() == Body(b"")
    conn.start_next_cycle(122.0)
    assert (conn.deadline, conn.since) == (197.0, 122.0)


def test_answers() -> None:
    assert http1.response_head("200 OK", [("Content-Type", "application/json")], 2, True) == (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n")
    for _ in range(2):  # built, then (fast paths on) from the cache
        assert http1.response_head("405 Not Allowed", [("Allow", "POST")], 0, False) == (
            b"HTTP/1.1 405 Not Allowed\r\nAllow: POST\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert http1.response_head("200 OK", [], None, True) == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert http1.chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    assert http1.CONTINUE == b"HTTP/1.1 100 Continue\r\n\r\n" and http1.LAST_CHUNK == b"0\r\n\r\n"


RATED = Limits(max_body=10_000, header_timeout=10, body_timeout=30, keepalive_timeout=75, min_rate=100, body_grace=5)
HEAD_1000 = b"POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n"


def _reading(limits: Limits = RATED, head: bytes = HEAD_1000, body: bytes = b"", now: float = 100.0) -> http1.ServerConnection:
    conn = http1.ServerConnection(limits, now=now)
    conn.receive_data(head + body, now)
    assert isinstance(conn.next_event(), Head) and conn.next_event() is NEED_DATA and conn.reading_body
    return conn


def test_the_minimum_rate_deadline_is_start_plus_grace_plus_bytes_over_rate() -> None:
    """mod_reqtimeout's MinRate: each byte buys 1/min_rate s beyond the grace; body_timeout still
    bounds the time between two reads."""
    conn = _reading(body=b"x" * 100)  # 100 bytes with the head, at 100
    assert conn.deadline == 100 + 5 + 100 / 100
    conn.receive_data(b"x" * 400, 103.0)
    assert conn.deadline == 100 + 5 + 500 / 100  # 110: the rate's, before 103 + 30
    conn.receive_data(b"x" * 400, 109.0)
    assert conn.deadline == 100 + 5 + 900 / 100  # 114
    conn.receive_data(b"x" * 100, 113.0)
    assert conn.next_event() == Body(b"x" * 1000) and conn.deadline == math.inf


def test_body_timeout_bounds_the_rate_deadline_of_a_fast_start() -> None:
    conn = _reading(body=b"x" * 999)  # nearly all of it at once: the rate allows 105 + 9.99 s ...
    assert conn.deadline == 100 + 5 + 999 / 100
    fast = _reading(dataclasses.replace(RATED, body_timeout=3), body=b"x" * 999)
    assert fast.deadline == 103.0  # ... but not more than body_timeout without a byte


def test_a_read_past_the_deadline_is_408_too_slow() -> None:
    conn = _reading(body=b"x")
    conn.receive_data(b"x", 104.0)  # in time: 2 bytes, deadline 105.02
    with pytest.raises(http1.BodyTimeout) as e:
        conn.receive_data(b"x", 105.5)  # the byte that would have bought more came too late
    assert (e.value.status, e.value.received, e.value.seconds, e.value.too_slow) == (408, 2, 5.5, True)
    assert e.value.message == "request body too slow: 2 bytes in 5.5 s, under the minimum of 100 bytes/s after 5 s"
    assert not conn.reading_body  # the connection is over


def test_the_end_of_file_the_driver_causes_at_the_deadline_is_408() -> None:
    """The reaper shuts the read side of a connection past its deadline; the end of file it reads
    then is the 408, not the 400 of a client that closed inside its request."""
    conn = _reading(body=b"x")
    with pytest.raises(http1.BodyTimeout):
        conn.receive_data(b"", 106.0)
    early = _reading(body=b"x")
    with pytest.raises(ProtocolError) as e:
        early.receive_data(b"", 101.0)  # the client closed before its deadline
    assert e.value.status == 400


def test_without_a_minimum_rate_only_the_body_timeout_applies() -> None:
    conn = _reading(dataclasses.replace(RATED, min_rate=0), body=b"x")
    assert conn.deadline == 130.0
    with pytest.raises(http1.BodyTimeout) as e:
        conn.receive_data(b"x", 130.0)
    assert (e.value.too_slow, e.value.message) == (False, "no request body data for 30 s")


def test_begin_body_restarts_the_clocks_after_a_wait_for_the_budget() -> None:
    """The driver kept the body in the client's socket while it waited for the request memory
    budget: that time is not the client's."""
    conn = _reading(body=b"x" * 50)
    conn.deadline = math.inf  # the driver's wait
    conn.begin_body(160.0)
    assert conn.deadline == 160 + 5 + 50 / 100  # the bytes that came with the head count
    conn.receive_data(b"x" * 950, 164.0)
    assert conn.next_event() == Body(b"x" * 1000)


def test_a_pressed_body_keeps_one_second_of_grace() -> None:
    """Others wait for the budget this body holds: its grace shrinks to PRESSED_GRACE (the deadline
    moves closer, and the 408 says so); a body ahead of the rate is not affected, and the next
    request gets the whole grace again."""
    conn = _reading(body=b"x" * 50)
    conn.press()
    assert conn.deadline == 100 + http1.PRESSED_GRACE + 50 / 100
    conn.press()  # idempotent
    assert conn.deadline == 100 + http1.PRESSED_GRACE + 50 / 100
    with pytest.raises(http1.BodyTimeout) as e:
        conn.receive_data(b"x", 102.0)
    assert e.value.message.endswith("after 1 s")
    ahead = _reading(body=b"x" * 999)
    ahead.press()
    assert ahead.deadline == 100 + http1.PRESSED_GRACE + 999 / 100  # 110.99: still its body's own pace
    ahead.receive_data(b"x", 101.0)
    assert ahead.next_event() == Body(b"x" * 1000)
    ahead.start_next_cycle(101.0)
    ahead.receive_data(HEAD_1000, 101.0)
    assert isinstance(ahead.next_event(), Head) and ahead.next_event() is NEED_DATA
    assert ahead.deadline == 101 + 5  # the whole grace again
    idle = http1.ServerConnection(RATED, now=100.0)
    idle.press()  # no body: nothing to press
    assert idle.deadline == 100 + 75


def test_a_chunked_body_has_the_same_minimum_rate() -> None:
    conn = _reading(head=b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", body=b"a\r\n0123456789\r\n")
    assert conn.deadline == 100 + 5 + 15 / 100  # framing counts: it is what the client sent
    conn.receive_data(b"0\r\n\r\n", 105.0)
    assert conn.next_event() == Body(b"0123456789")
    with pytest.raises(http1.BodyTimeout):
        _reading(head=b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").receive_data(b"1\r\n", 105.0)


def test_a_second_host_field_is_refused() -> None:
    """RFC 9112 §3.2 (and nginx): two Host lines are a 400 (a proxy and we could each pick another)."""
    e = refused(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n")
    assert e.status == 400 and "Host" in e.message
    assert events(b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\nX: 2\r\n\r\n")[0].headers["x"] == "1,2"


def test_a_head_ended_by_bare_lfs_is_refused_alike_however_it_is_read() -> None:
    """Found by the split-anywhere property (a fresh-clone run): read whole, the bare LF ending went unseen
    and the request line's HTTP/2.0 gave 505; read a byte at a time, the bare LF gave 400 first."""
    data = b"GET / HTTP/2.0\r\nTransfer-Encoding: chun\n\r\n1\r\n\x00\r\n0\r\n\r\n"
    whole = refused(data)
    assert (whole.status, type(whole)) == (400, ProtocolError) and "bare LF" in whole.message
    conn = http1.ServerConnection(SMALL)
    with pytest.raises(ProtocolError) as e:
        for i in range(len(data)):
            conn.receive_data(data[i:i + 1], 0.0)
            while conn.next_event() is not NEED_DATA:
                pass
    assert e.value.status == 400 and e.value.message == whole.message
