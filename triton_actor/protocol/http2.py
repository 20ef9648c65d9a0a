"""HTTP/2 framing (RFC 9113), HPACK for the server side (RFC 7541) and gRPC's message framing.

Bytes in, bytes out: no sockets and no gevent here (the connection state machine is
:mod:`.h2_connection`, driven by :mod:`..frontends.grpc_h2`). What a gRPC server needs and nothing more:

* frames: :func:`frame` builds one; :data:`FRAME_HEAD` parses the 9-byte head.
* headers we send are literals *without indexing* (static-table names where there is one), so our
  side never keeps an HPACK dynamic table and a response head can be built once and reused.
* headers we receive go through :class:`HeaderDecoder`: ``hpack``'s decoder (Huffman, the dynamic
  table) behind a cache keyed by the block's bytes. gRPC clients send the same block on every call
  once their headers are indexed, so the steady state decodes nothing.
* gRPC messages: a 5-byte prefix (compressed flag, big-endian length) then the message.
"""

from __future__ import annotations

import logging
import re
import struct
from typing import Any

import hpack
from hpack.table import HeaderTable

from ..runtime.fastpath import BoundedCache

# hpack logs every header it codes at DEBUG, values included: with --log-verbose (or a client's
# log_verbose_level) that wrote other clients' credentials (authorization, restricted-API keys) to the
# log, a line per header. Our verbose lines say what a request did, never its header values.
logging.getLogger("hpack").setLevel(logging.WARNING)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# settings
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = \
    range(1, 7)
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

# length (24 bits) and type share the first 32-bit word; then flags, then the stream id (31 bits)
FRAME_HEAD = struct.Struct(">IBI")
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
GOAWAY_HEAD = struct.Struct(">II")  # last stream id, error code
_GRPC_PREFIX = struct.Struct(">BI")


class ProtocolError(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY carrying ``code``."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class MalformedHeaders(Exception):
    """A header block that decodes but is malformed (RFC 9113 §8.1.1, §8.2, §8.3): a stream error, answered
    RST_STREAM(PROTOCOL_ERROR); the connection and its HPACK state go on."""


# -- frames ---------------------------------------------------------------------------------------
def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME_HEAD.pack((len(payload) << 8) | ftype, flags, stream_id) + payload


def settings_frame(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in values.items()))


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ProtocolError("SETTINGS payload is not a multiple of 6 bytes", FRAME_SIZE_ERROR)
    return {k: v for k, v in _SETTING.iter_unpack(payload)}


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def parse_u32(payload: bytes) -> int:
    if len(payload) != 4:
        raise ProtocolError("frame payload must be 4 bytes", FRAME_SIZE_ERROR)
    return _U32.unpack(payload)[0] & 0x7FFF_FFFF


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, GOAWAY_HEAD.pack(last_stream_id, code) + debug)


def strip_padding(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding (the PADDED flag)."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("padding longer than the frame")
    return payload[1:len(payload) - payload[0]]


def headers_frames(stream_id: int, block: bytes, end_stream: bool, max_frame: int) -> bytes:
    """HEADERS (plus CONTINUATION frames when ``block`` is longer than the peer's frame size)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    parts = [block[i:i + max_frame] for i in range(0, len(block), max_frame)]
    out = [frame(HEADERS, flags, stream_id, parts[0])]
    out += [frame(CONTINUATION, 0, stream_id, p) for p in parts[1:-1]]
    out.append(frame(CONTINUATION, END_HEADERS, stream_id, parts[-1]))
    return b"".join(out)


# -- HPACK, sending side --------------------------------------------------------------------------
_STATIC_NAME = {b":status": 8, b"content-type": 31}  # RFC 7541 Appendix A indices


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literals without indexing (plain strings, no Huffman): valid whatever the
    peer's decoder table holds, so blocks can be cached and reused."""
    out = []
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(b"\x88")  # indexed: static entry 8 is ":status: 200"
            continue
        index = _STATIC_NAME.get(name)
        if index is not None:
            out.append(_hpack_int(index, 4, 0x00))
        else:
            out.append(b"\x00" + _hpack_int(len(name), 7, 0x00) + name)
        out.append(_hpack_int(len(value), 7, 0x00) + value)
    return b"".join(out)


# -- HPACK, receiving side ------------------------------------------------------------------------
class _WatchedTable(HeaderTable):
    """hpack's table, counting every change so cached decodes can be dropped when it moves."""

    changes = 0

    def add(self, name: bytes, value: bytes) -> Any:
        self.changes += 1
        return super().add(name, value)

    @HeaderTable.maxsize.setter  # type: ignore[attr-defined,untyped-decorator]
    def maxsize(self, value: int) -> None:
        self.changes += 1
        HeaderTable.maxsize.fset(self, value)  # type: ignore[attr-defined]


class HeaderBlock(dict[bytes, bytes]):
    """A decoded header block, ``{name: value}`` (bytes; a repeated name keeps its last value).
    ``route`` is free for the connection to keep what it derived from the block: a cached block
    comes back as the same object, so that work is done once."""

    __slots__ = ("route", "_request", "_pseudo")

    def __init__(self, fields: Any) -> None:
        super().__init__(fields)
        self.route: Any = None
        self._request: bool | None = None  # what the checks below found, kept with a cached block
        self._pseudo: bool | None = None

    def is_request(self) -> bool:
        """A request's block: ``:method``, ``:scheme`` and a non-empty ``:path`` (RFC 9113 §8.3.1; we do
        not take CONNECT, whose block differs: it gets 405 / UNIMPLEMENTED from the routes)."""
        ok = self._request
        if ok is None:
            ok = self._request = bool(self.get(b":method") and self.get(b":scheme") and self.get(b":path"))
        return ok

    def has_pseudo(self) -> bool:
        """Any pseudo-header (trailers carry none, §8.1)."""
        found = self._pseudo
        if found is None:
            found = self._pseudo = any(name[:1] == b":" for name in self)
        return found


class HeaderDecoder:
    """Header blocks → :class:`HeaderBlock`. The cache holds at most ``CACHE_SIZE`` blocks and
    ``CACHE_BYTES`` of blocks and decoded values per connection (it is emptied when full)."""

    CACHE_SIZE = 256
    CACHE_BYTES = 64 * 1024
    CACHED_BLOCK_MAX = 1024  # only small blocks that decode to little are kept
    CACHED_VALUES_MAX = 8192

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._table = self._decoder.header_table = _WatchedTable()
        self._cache: BoundedCache[bytes, HeaderBlock] = BoundedCache("http2.header_blocks", self.CACHE_SIZE)
        self._cached_bytes = 0  # put since the last clear (evicted entries too: an upper bound)

    def decode(self, block: bytes) -> HeaderBlock:
        hit = self._cache.get(block)
        if hit is not None:
            return hit
        if block and block[0] & 0xE0 == 0x20:
            _check_size_updates(block)
        before = self._table.changes
        try:
            fields = self._decoder.decode(block, raw=True)
        except hpack.OversizedHeaderListError as e:
            raise ProtocolError(f"header list too large: {e}", ENHANCE_YOUR_CALM) from None  # as h2
        except hpack.HPACKError as e:
            # the class name, not hpack's text: some texts hold the repr of a memoryview, which put a
            # server heap address into the GOAWAY's debug data (and made it differ run to run)
            raise ProtocolError(f"bad header block ({type(e).__name__})", COMPRESSION_ERROR) from None
        fields = [(bytes(name), bytes(value)) for name, value in fields]
        moved = self._table.changes != before
        if moved:
            self._clear()  # blocks decoded earlier may point at entries that moved (a malformed block's too)
        check_fields(fields)  # after decoding (the table moved with it), before caching: only valid blocks are kept
        headers = HeaderBlock(fields)
        if moved:
            return headers
        size = len(block) + sum(map(len, headers)) + sum(map(len, headers.values()))
        if len(block) <= self.CACHED_BLOCK_MAX and size <= self.CACHED_VALUES_MAX:
            if self._cached_bytes + size > self.CACHE_BYTES:
                self._clear()
            self._cached_bytes += size
            self._cache.put(block, headers)
        return headers

    def _clear(self) -> None:
        self._cache.clear()
        self._cached_bytes = 0


# RFC 9113 §8.2.1: a name holds no controls, space, DEL, bytes over 0x7F or uppercase letters, and no colon
# but a pseudo-header's first; a value no NUL, CR or LF. grpc-go and nginx refuse such requests (uppercase
# names reached our routes as headers the lookups never found). A value with whitespace at an end, which
# §8.2.1 also calls malformed, both take (grpc-go's httpguts.ValidHeaderFieldValue and nginx's
# ngx_http_v2_validate_header check controls only), and so do we: Triton's L0_parameters forwards one
# ending in a space, and we answered it with RST_STREAM.
_BAD_NAME = re.compile(rb"[\x00-\x20A-Z\x7f-\xff]|.:")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")
# §8.2.2: connection-specific fields; ``te`` may only say "trailers"
_CONNECTION_SPECIFIC = frozenset((b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"))
REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":authority", b":path"))


def check_fields(fields: list[tuple[bytes, bytes]]) -> None:
    """Raise :class:`MalformedHeaders` for a field list no request (or trailer) block may hold: bad names
    or values, connection-specific fields, pseudo-headers unknown, repeated or after a regular field
    (§8.3). Which pseudo-headers a block must have depends on what it is: :meth:`HeaderBlock.is_request`,
    :meth:`HeaderBlock.has_pseudo`."""
    regular = False
    seen: set[bytes] = set()
    for name, value in fields:
        if not name or _BAD_NAME.search(name) or _BAD_VALUE.search(value):
            raise MalformedHeaders(f"invalid header field {name[:64]!r}")
        if name[0] == 0x3A:  # ":"
            if regular or name not in REQUEST_PSEUDO or name in seen:
                raise MalformedHeaders(f"misplaced, unknown or repeated pseudo-header {name[:64]!r}")
            seen.add(name)
        else:
            regular = True
            if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                raise MalformedHeaders(f"connection-specific header field {name!r}")


def _check_size_updates(block: bytes) -> None:
    """At most two dynamic-table size updates, at the start of a block (RFC 7541 §4.2): hpack takes
    any number, and a block of them costs decoding time and adds nothing to the decoded size."""
    pos, count, end = 0, 0, len(block)
    while pos < end and block[pos] & 0xE0 == 0x20:
        count += 1
        if count > 2:
            raise ProtocolError("more than two dynamic table size updates", COMPRESSION_ERROR)
        if block[pos] & 0x1F == 0x1F:  # a multi-byte integer follows
            pos += 1
            while pos < end and block[pos] & 0x80:
                pos += 1
        pos += 1


# -- gRPC -----------------------------------------------------------------------------------------
def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    """One length-prefixed gRPC message (``compressed``: in the call's ``grpc-encoding``)."""
    return _GRPC_PREFIX.pack(compressed, len(payload)) + payload


def split_messages(buf: bytearray) -> list[tuple[int, bytes]]:
    """Take every complete ``(compressed flag, message)`` off the front of ``buf``.

    Each message is copied once, through a view (``bytes(buf[5:5 + n])`` copied it twice: the slice
    is a bytearray of its own, then its bytes); the view is released before ``buf`` is cut, as a
    bytearray with a view on it cannot be resized (issue 23)."""
    out = []
    while len(buf) >= 5:
        flag, n = _GRPC_PREFIX.unpack_from(buf)
        if len(buf) < 5 + n:
            break
        with memoryview(buf) as view:
            out.append((flag, bytes(view[5:5 + n])))
        del buf[:5 + n]
    return out


def take_message(buf: bytearray) -> tuple[int, bytearray] | None:
    """The one ``(compressed flag, message)`` that fills ``buf`` exactly, as ``buf`` itself with its
    prefix cut (no copy: a bytearray drops its front in place); the caller gives its stream a new
    buffer. None (``buf`` untouched) when it holds anything else. For a large unary request
    (``frontends/grpc_calls.py``): :func:`split_messages` copies a message twice (a slice, then its
    bytes), which held a 4 MiB config override three times over at once (issue 23)."""
    if len(buf) < 5:
        return None
    flag, n = _GRPC_PREFIX.unpack_from(buf)
    if len(buf) != 5 + n:
        return None
    del buf[:5]
    return flag, buf


def pending_length(buf: bytearray) -> int:
    """The announced length of the message at the front of ``buf`` (0 if its prefix is incomplete)."""
    return _GRPC_PREFIX.unpack_from(buf)[1] if len(buf) >= 5 else 0


_TIMEOUT_UNITS = {0x48: 3600.0, 0x4D: 60.0, 0x53: 1.0, 0x6D: 1e-3, 0x75: 1e-6, 0x6E: 1e-9}  # H M S m u n


def parse_timeout(value: bytes | None) -> float | None:
    """``grpc-timeout`` (1 to 8 digits, then a unit: H M S m u n) in seconds; None when absent or not of
    that form, which grpc-core (Triton's runtime) ignores as we do."""
    if not value or not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(value[:-1]) * unit


def percent_encode(text: str) -> bytes:
    """``grpc-message``'s encoding: printable ASCII but '%' as is, everything else %XX of UTF-8."""
    out = bytearray()
    for b in text.encode("utf-8"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)

