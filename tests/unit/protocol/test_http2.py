"""HTTP/2 framing, server-side HPACK and gRPC message framing (protocol/http2.py)."""

from __future__ import annotations

import tracemalloc

import hpack
import pytest

from triton_actor.protocol import http2 as h2
from triton_actor.runtime import fastpath


def test_frame_head_round_trip() -> None:
    data = h2.frame(h2.DATA, h2.END_STREAM, 7, b"abc")
    length_type, flags, sid = h2.FRAME_HEAD.unpack_from(data)
    assert (length_type >> 8, length_type & 0xFF, flags, sid, data[9:]) == (3, h2.DATA, h2.END_STREAM, 7, b"abc")
    assert len(h2.frame(h2.PING, 0, 0, b"\0" * 8)) == 17


def test_settings_round_trip_and_bad_length() -> None:
    payload = h2.settings_frame({h2.INITIAL_WINDOW_SIZE: 1 << 20, h2.MAX_FRAME_SIZE: 16384})[9:]
    assert h2.parse_settings(payload) == {h2.INITIAL_WINDOW_SIZE: 1 << 20, h2.MAX_FRAME_SIZE: 16384}
    with pytest.raises(h2.ProtocolError) as e:
        h2.parse_settings(b"\0" * 7)
    assert e.value.code == h2.FRAME_SIZE_ERROR


def test_window_update_ignores_reserved_bit() -> None:
    assert h2.parse_u32(h2.window_update(3, 1000)[9:]) == 1000
    assert h2.parse_u32(b"\x80\x00\x00\x05") == 5
    with pytest.raises(h2.ProtocolError):
        h2.parse_u32(b"\0\0\0")


def test_padding() -> None:
    assert h2.strip_padding(0, b"xyz") == b"xyz"
    assert h2.strip_padding(h2.PADDED, b"\x02abc\0\0") == b"abc"
    with pytest.raises(h2.ProtocolError):
        h2.strip_padding(h2.PADDED, b"\x09abc")


@pytest.mark.parametrize("value", [b"0", b"x" * 200, "détail %".encode()])
def test_encoded_headers_decode_with_a_stock_decoder(value: bytes) -> None:
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-message", value),
              (b"a-long-name-" + b"n" * 300, b"v")]
    decoded = hpack.Decoder().decode(h2.encode_headers(fields), raw=True)
    assert [(bytes(n), bytes(v)) for n, v in decoded] == fields


def test_headers_split_into_continuation_frames() -> None:
    block = bytes(range(256)) * 100
    out = h2.headers_frames(1, block, True, 16384)
    frames, pos = [], 0
    while pos < len(out):
        length_type, flags, _sid = h2.FRAME_HEAD.unpack_from(out, pos)
        frames.append((length_type & 0xFF, flags, out[pos + 9:pos + 9 + (length_type >> 8)]))
        pos += 9 + (length_type >> 8)
    assert [t for t, _, _ in frames] == [h2.HEADERS, h2.CONTINUATION]
    assert frames[0][1] == h2.END_STREAM and frames[1][1] == h2.END_HEADERS
    assert b"".join(p for _, _, p in frames) == block


def test_header_decoder_caches_only_while_the_table_stands_still() -> None:
    enc, dec = hpack.Encoder(), h2.HeaderDecoder(65536)
    fields = [(":method", "POST"), (":path", "/inference.GRPCInferenceService/ModelInfer"), ("x-id", "1")]
    first = enc.encode(fields)  # inserts into the dynamic table
    assert dec.decode(first)[b"x-id"] == b"1"
    assert first not in dec._cache
    second = enc.encode(fields)  # only references now
    assert dec.decode(second) == dec.decode(second)
    assert (second in dec._cache) is fastpath.enabled  # nothing is kept with fast paths off
    # the same bytes after the table moved point at other entries: the cache must not answer
    dec.decode(enc.encode([("x-id", "2"), ("x-other", "y")]))
    assert second not in dec._cache
    assert dec.decode(second)[b"x-id"] != b"1"  # index 62 is now the newer entry
    assert dec.decode(enc.encode([("x-id", "2")]))[b"x-id"] == b"2"


def test_header_decoder_rejects_garbage() -> None:
    with pytest.raises(h2.ProtocolError) as e:
        h2.HeaderDecoder(65536).decode(b"\xff\xff\xff\xff\xff\xff")
    assert e.value.code == h2.COMPRESSION_ERROR


def test_grpc_messages_split_across_reads() -> None:
    stream = h2.grpc_message(b"one") + h2.grpc_message(b"") + h2.grpc_message(b"three")
    buf = bytearray(stream[:10])
    assert h2.split_messages(buf) == [(0, b"one")]
    assert h2.pending_length(buf) == 0
    buf += stream[10:]
    assert h2.split_messages(buf) == [(0, b""), (0, b"three")]
    assert buf == bytearray()
    assert h2.pending_length(bytearray(b"\0\0\0\1\0")) == 256


def test_split_messages_copies_a_message_once() -> None:
    """A 4 MiB message taken off a stream's buffer is one copy at a time, not a slice and then its
    bytes (issue 23: every ModelInfer and stream message paid twice its size at the peak)."""
    size = 4 * 1024 * 1024
    buf = bytearray(h2.grpc_message(bytes(size)))
    tracemalloc.start()
    try:
        messages = h2.split_messages(buf)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(flag, len(m)) for flag, m in messages] == [(0, size)]
    assert not buf
    assert peak < size * 1.5, f"the peak was {peak / size:.2f}x the message"


def test_a_whole_message_is_taken_with_its_buffer() -> None:
    """take_message (a large unary request, issue 23): the buffer itself, its prefix cut, when it holds
    exactly one message; anything else leaves it untouched."""
    buf = bytearray(h2.grpc_message(b"payload"))
    flag, data = h2.take_message(buf)  # type: ignore[misc]
    assert (flag, data) == (0, b"payload") and data is buf
    for other in (b"\0\0\0", h2.grpc_message(b"one")[:-1], h2.grpc_message(b"one") + h2.grpc_message(b"two")):
        buf = bytearray(other)
        assert h2.take_message(buf) is None and buf == other


def test_percent_encoding() -> None:
    assert h2.percent_encode("ok: 100% é\n") == b"ok: 100%25 %C3%A9%0A"


@pytest.mark.parametrize(("value", "seconds"), [
    (b"1S", 1.0), (b"300m", 0.3), (b"2H", 7200.0), (b"5M", 300.0), (b"99999999u", 99.999999), (b"7n", 7e-9),
    (b"0S", 0.0), (None, None), (b"", None), (b"S", None), (b"1s", None), (b"123456789S", None), (b"-1S", None),
    (b"1.5S", None), (b" 1S", None),
])
def test_grpc_timeout_is_parsed_as_grpc_core_does(value: bytes | None, seconds: float | None) -> None:
    got = h2.parse_timeout(value)
    assert got == pytest.approx(seconds) if seconds is not None else got is None
