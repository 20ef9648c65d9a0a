"""Content codings: gzip and deflate bodies and gRPC messages, both ways, and ``Accept-Encoding``.

Sans-I/O: :class:`Inflation` and :class:`Deflation` take one slice at a time and leave it to their
driver (:mod:`..frontends.compression`) to decide where each slice runs and to reserve its bytes first;
a gzip body inflates to up to ~1000 times its size, so how much is produced must be known before it
is. ``gzip`` is RFC 1952, ``deflate`` the zlib format (RFC 1950), as HTTP and gRPC both name them.
"""

from __future__ import annotations

import io
import zlib

CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # name → zlib's wbits for it
_WINDOW = 256 * 1024  # compressed bytes handed to zlib per call (what it leaves unconsumed is copied)
LEVEL = 1  # answers are compressed for the wire, at zlib's fastest level


def known(coding: str) -> bool:
    return coding in CODINGS


class Inflation:
    """One compressed body, inflated at most ``n`` bytes per :meth:`step`, never past ``limit``.

    :meth:`step` never raises: it may run on a native thread, whose error (and its traceback, which
    holds this object and all it inflated) gevent's pool keeps until its next task; what went wrong is
    kept and raised by :meth:`check`: OverflowError (with the size reached) past ``limit``,
    ``zlib.error`` for data that is not of the coding or ends early. :attr:`done` once the compressed
    stream ended (bytes after its end are ignored, as they were). One thread at a time may step it."""

    __slots__ = ("_d", "_data", "_pos", "_tail", "_first", "_out", "size", "limit", "_error")

    def __init__(self, coding: str, data: bytes, limit: int) -> None:
        self._d = zlib.decompressobj(CODINGS[coding])  # KeyError for a coding we do not know
        self._data = memoryview(data)  # the compressed input, fed a window at a time from _pos:
        self._pos = 0  # zlib copies what a call leaves unconsumed, so the whole rest each call was quadratic
        self._tail = b""  # what zlib left of the last window
        self._first = b""  # the first slice; most bodies are one
        self._out: io.BytesIO | None = None  # the slices, once there are more (getvalue() does not copy)
        self.size = 0
        self.limit = limit
        self._error = ""

    @property
    def done(self) -> bool:
        return self._d.eof

    def step(self, n: int) -> None:
        """Inflate up to ``n`` more bytes (``n`` >= 1), then :meth:`check`."""
        chunks: list[bytes] = []
        want = n
        try:
            while want > 0 and not self._d.eof:
                data: bytes | memoryview = self._tail
                if not data:
                    if self._pos >= len(self._data):
                        break
                    data = self._data[self._pos:self._pos + _WINDOW]
                    self._pos += len(data)
                piece = self._d.decompress(data, want)
                self._tail = self._d.unconsumed_tail
                chunks.append(piece)
                want -= len(piece)
        except zlib.error as e:
            self._error = str(e)
            return
        chunk = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self._out is not None:
            self._out.write(chunk)
        elif self.size:
            self._out = io.BytesIO()
            self._out.write(self._first)
            self._out.write(chunk)
            self._first = b""
        else:
            self._first = chunk
        self.size += len(chunk)
        if len(chunk) < n and not self._d.eof and not self._tail and self._pos >= len(self._data) \
                and self.size <= self.limit:
            self._error = "truncated compressed data"  # zlib wanted more input than there is

    def check(self) -> None:
        """Raise what the last :meth:`step` found wrong, if anything."""
        if self.size > self.limit:
            raise OverflowError(self.size)
        if self._error:
            raise zlib.error(self._error)

    def result(self) -> bytes:
        """The inflated bytes (once :attr:`done`)."""
        return self._first if self._out is None else self._out.getvalue()


class Deflation:
    """An answer compressed a slice at a time: :meth:`step` each piece, then :meth:`finish`."""

    __slots__ = ("_c", "_out")

    def __init__(self, coding: str) -> None:
        self._c = zlib.compressobj(LEVEL, zlib.DEFLATED, CODINGS[coding])
        self._out = io.BytesIO()

    def step(self, piece: bytes | memoryview) -> None:
        self._out.write(self._c.compress(piece))

    def finish(self) -> bytes:
        self._out.write(self._c.flush())
        return self._out.getvalue()


def response_coding(accept_encoding: str | None) -> str | None:
    """The coding of an answer to a request with this ``Accept-Encoding`` (None: identity), chosen as
    Triton does (http_server.cc ``CompressionTypeUsed``): of ``gzip``, ``deflate`` and ``identity``, the
    one with the highest ``q`` (1 when not given), the first of equals; ``q=0`` means "not acceptable"
    (RFC 9110 §12.5.3) and is never chosen; other codings and ``*`` are ignored, as is an entry whose
    ``q`` is not a number. Names are compared without case (RFC 9110 §8.4.1; Triton compares them as
    sent)."""
    if not accept_encoding:
        return None
    best, weight = None, 0.0
    for entry in accept_encoding.split(","):
        name, _, params = entry.partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "deflate", "identity"):
            continue
        q = _quality(params)
        if q is not None and q > weight:
            best, weight = name, q
    return None if best == "identity" else best


GRPC_LEVELS = ("none", "low", "medium", "high")  # Triton's --grpc-infer-response-compression-level
_GRPC_RANKING = ("gzip", "deflate")  # grpc-core's ranking, in increasing order of compression


def grpc_response_coding(level: str, accept_encoding: bytes | None) -> str | None:
    """The coding of a gRPC call's answers at this compression ``level`` (None: identity), as grpc-core
    picks it (``grpc_compression_algorithm_for_level``, which Triton's level flag drives): of gzip and
    deflate, those the client lists in ``grpc-accept-encoding``, in that rank; ``low`` takes the first,
    ``medium`` the middle one, ``high`` the last."""
    if level == "none" or not accept_encoding:
        return None
    accepted = {name.strip().lower() for name in accept_encoding.decode("latin-1").split(",")}
    supported = [name for name in _GRPC_RANKING if name in accepted]
    if not supported:
        return None
    index = {"low": 0, "medium": len(supported) // 2}.get(level, len(supported) - 1)
    return supported[index]


def _quality(params: str) -> float | None:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return None
    return 1.0
