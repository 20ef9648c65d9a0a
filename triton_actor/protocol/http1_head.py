"""An HTTP/1.1 request head, parsed (RFC 9112 §2-§6): :func:`parse_head` turns the bytes before the
blank line into a :class:`Head`, or raises :class:`ProtocolError` with the status to answer.

It owns the connection :class:`Limits` (nginx's defaults), the strict framing rules (one ``Content-Length``
of digits only, ``Transfer-Encoding: chunked`` only and not on HTTP/1.0, never both) and the cache of parsed heads that a
repeating client hits. :mod:`.http1` drives it from its state machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from ..runtime import fastpath

CHUNKED = -1  # Head.length of a chunked body
_MAX_SIZE_DIGITS = 18  # a Content-Length this long is over any body limit
_HUGE = 1 << 62  # what a longer one is taken as; said as "more than 10^18 - 1" (not as this number)

# one header line: a token, a colon, a value of visible characters, blanks and obs-text; no CR,
# NUL or other controls inside (a bare CR is a request-smuggling vector, RFC 9112 §2.2). The regex
# runs in C over the whole head: ~3x faster than splitting each line in Python.
_HEADER = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*\r?$", re.M)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VERSION = re.compile(r"HTTP/[0-9]\.[0-9]")
# fields a request may send once (nginx: "client sent duplicate header line", or "... host header")
_UNIQUE = {"host": "Host", "content-length": "Content-Length"}
_TARGET = re.compile(r"[\x21-\x7e]+")  # visible ASCII (RFC 3986; anything else arrives percent-encoded)

@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may send (nginx's defaults) and how long it may take. (Slots, not a
    NamedTuple: CPython 3.11 specializes slot reads, not a NamedTuple's field getters.)"""

    max_line: int = 8 * 1024  # request line or one header line (nginx: one 8k buffer)
    max_head: int = 32 * 1024  # request line + headers (nginx: 4 x 8k)
    max_headers: int = 100
    max_body: int = 64 * 1024 * 1024  # --http-max-input-size
    max_chunk_line: int = 1024  # chunk size + extensions
    header_timeout: float = 60.0  # the whole head, from its first byte (client_header_timeout)
    body_timeout: float = 60.0  # between two reads of the body (client_body_timeout)
    keepalive_timeout: float = 75.0  # idle between requests (keepalive_timeout)
    send_timeout: float = 60.0  # between two writes of an answer to a client that stopped reading (send_timeout)
    # a body must arrive at this average rate once it is being read, after ``body_grace`` seconds: its deadline is
    # start + body_grace + bytes received / min_rate (Apache mod_reqtimeout's MinRate); 0 = no minimum
    min_rate: float = 1024 * 1024  # --request-body-min-rate
    body_grace: float = 10.0  # --request-body-grace-secs


DEFAULT_LIMITS = Limits()

class ProtocolError(Exception):
    """The request breaks HTTP/1.1 or a limit: answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Head(NamedTuple):
    """A request head. ``headers``: lower-case names; repeated fields joined with ``,`` (RFC 9110
    §5.3). Shared by the head cache: read-only. ``length``: Content-Length, or :data:`CHUNKED`."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    keep_alive: bool
    expect_continue: bool
    length: int

# A client repeating a request sends the same head bytes every time (perf_analyzer, a tritonclient
# loop): parsed heads are kept by their bytes, so the steady state parses nothing. Fast path; the
# slow path is parse_head, which fills it.
_HEADS = fastpath.cache("http1.heads", 256)
_HEAD_CACHED_MAX = 2048

def parse_head(head: bytes, limits: Limits = DEFAULT_LIMITS) -> Head:
    """Parse request line and header fields (``head`` without its blank line)."""
    text = head.decode("latin-1")
    request_line, _, header_text = text.partition("\r\n")
    if len(request_line) > limits.max_line:
        raise ProtocolError(414, "request line too long")
    method, target, version = _request_line(request_line)
    if len(head) > limits.max_line and any(len(line) > limits.max_line for line in header_text.split("\n")):
        raise ProtocolError(431, "request header line too long")
    pairs = _HEADER.findall(header_text)
    lines = header_text.count("\n") + (1 if header_text else 0)
    if len(pairs) != lines:
        raise ProtocolError(400, "malformed header line")
    if lines > limits.max_headers:
        raise ProtocolError(431, "too many request header fields")
    headers = {k.lower(): v for k, v in pairs}
    if len(headers) != len(pairs):
        headers = {}
        for k, v in pairs:
            key = k.lower()
            if key in _UNIQUE and key in headers:
                raise ProtocolError(400, f"more than one {_UNIQUE[key]} header field")
            headers[key] = f"{headers[key]},{v}" if key in headers else v
    connection = headers.get("connection", "").lower()
    keep_alive = ("close" not in connection) if version == "HTTP/1.1" else ("keep-alive" in connection)
    length = _framing(headers, version)
    expect = version == "HTTP/1.1" and length != 0 and headers.get("expect", "").lower() == "100-continue"
    info = Head(method, target, version, headers, keep_alive, expect, length)
    if len(head) <= _HEAD_CACHED_MAX:
        _HEADS.put(head, info)
    return info


def _request_line(line: str) -> tuple[str, str, str]:
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise ProtocolError(400, "malformed request line")
    version = parts[2]
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if _VERSION.fullmatch(version):
            raise ProtocolError(505, "HTTP version not supported")
        raise ProtocolError(400, "malformed request line")
    return parts[0], parts[1], version


def _framing(headers: dict[str, str], version: str) -> int:
    """Content-Length, :data:`CHUNKED`, or 0 (RFC 9112 §6), as strictly as nginx reads them
    (``ngx_http_process_request_header``): one Content-Length of digits only, not a list of equal
    values (RFC 9110 §8.6 lets a recipient accept one; a proxy in front may have read the first), and
    no Transfer-Encoding from an HTTP/1.0 client, which cannot send a chunked body (RFC 9112 §6.1)."""
    te = headers.get("transfer-encoding")
    cl = headers.get("content-length")
    if te is not None:
        if version == "HTTP/1.0":
            raise ProtocolError(400, "Transfer-Encoding in an HTTP/1.0 request")
        if cl is not None:  # both: a request-smuggling attempt or a broken proxy (RFC 9112 §6.3)
            raise ProtocolError(400, "both Content-Length and Transfer-Encoding")
        if te.strip(" \t").lower() != "chunked":
            raise ProtocolError(501, f"unsupported Transfer-Encoding '{te[:64]}'")
        return CHUNKED
    if cl is None:
        return 0
    value = cl.strip(" \t")
    if not value or not value.isascii() or not value.isdigit():  # no sign, blank, '_' or non-ASCII digit
        raise ProtocolError(400, "invalid Content-Length")
    digits = value.lstrip("0")
    return int(digits or "0") if len(digits) <= _MAX_SIZE_DIGITS else _HUGE
