"""A lean HTTP/1.1 server on gevent's StreamServer, made for the inference hot path.

Why not gevent.pywsgi: at the request rates Triton reaches here (~3000/s per connection), pywsgi's
per-request machinery (environ building, header objects, several sends) was most of our latency.
This server reads a request with a few ``recv`` calls, parses the head with ``bytes.split``, sends
``POST .../infer`` straight to :meth:`HttpFrontend.infer`, hands every other route to the WSGI
(Flask) app, and writes each response with one ``sendall`` (so Nagle never stalls it; TCP_NODELAY
is set anyway). Keep-alive, ``Expect: 100-continue`` and chunked request bodies are supported.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import sys
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

from gevent.server import StreamServer

from .. import fastpath
from ..errors import TritonError
from .http import HttpFrontend, error_response, too_large
from .socket_io import recv_when_readable, send_all

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
# one header line: name, colon, value without surrounding blanks (the regex runs in C: ~3x faster
# than splitting each line in Python)
_HEADER = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*\r?$", re.M)
_RECV = 256 * 1024


class BadRequest(Exception):
    """The bytes on the connection are not HTTP/1.x we can serve; answer 400 and close."""


# A client repeating a request sends the same head bytes every time (perf_analyzer, a tritonclient
# loop): parsed heads are kept by their bytes, so the steady state parses nothing. Read-only values.
_HeadInfo = tuple[str, str, str, dict[str, str], bool, bool]
_HEADS = fastpath.cache("http_server.heads", 256)
_HEAD_CACHED_MAX = 2048


def _parse_head(head: bytes) -> _HeadInfo:
    """(method, target, version, lower-cased headers, keep-alive, expects 100-continue) of a head."""
    text = head.decode("latin-1")
    request_line, _, header_text = text.partition("\r\n")
    try:
        method, target, version = request_line.split(" ", 2)
    except ValueError:
        raise BadRequest("malformed request line") from None
    pairs = _HEADER.findall(header_text)
    if len(pairs) != header_text.count("\n") + (1 if header_text else 0):
        raise BadRequest("malformed header line")
    headers = {k.lower(): v for k, v in pairs}
    if len(headers) != len(pairs):  # repeated headers: join the values, as RFC 9110 allows
        headers = {}
        for k, v in pairs:
            key = k.lower()
            headers[key] = f"{headers[key]},{v}" if key in headers else v
    connection = headers.get("connection", "").lower()
    keep_alive = ("close" not in connection) if version == "HTTP/1.1" else ("keep-alive" in connection)
    info = (method, target, version, headers, keep_alive, headers.get("expect", "").lower() == "100-continue")
    if len(head) <= _HEAD_CACHED_MAX:
        _HEADS.put(head, info)
    return info


class _Connection:
    """Buffered reads on one client socket."""

    __slots__ = ("sock", "buf")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _read_until(self, delimiter: bytes, what: str) -> bytes | None:
        """Bytes up to ``delimiter`` (excluded, consumed); None at EOF before any byte."""
        while True:
            idx = self.buf.find(delimiter)
            if idx >= 0:
                data = bytes(self.buf[:idx])
                del self.buf[: idx + len(delimiter)]
                return data
            if len(self.buf) > MAX_HEAD:
                raise BadRequest(f"{what} too large")
            chunk = self.sock.recv(_RECV) if self.buf else recv_when_readable(self.sock, _RECV)
            if not chunk:
                if self.buf.strip():
                    raise BadRequest(f"connection closed inside the {what}")
                return None
            self.buf += chunk

    def read_head(self) -> bytes | None:
        """Bytes up to the blank line ending the head (excluded); None at a clean EOF."""
        return self._read_until(b"\r\n\r\n", "request head")

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(max(_RECV, n - len(self.buf)))
            if not chunk:
                raise BadRequest("connection closed inside the request body")
            self.buf += chunk
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def read_line(self) -> bytes:
        line = self._read_until(b"\r\n", "chunked body")
        if line is None:
            raise BadRequest("connection closed inside the chunked body")
        return line

    def read_chunked(self, limit: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            try:
                size = int(self.read_line().split(b";", 1)[0], 16)
            except ValueError:
                raise BadRequest("invalid chunk size") from None
            if size == 0:
                while self.read_line():  # trailers
                    pass
                return b"".join(parts)
            total += size
            if total > limit:
                raise TritonError.invalid_arg(str(too_large(total, limit)))
            parts.append(self.read_exact(size))
            self.read_exact(2)


class HttpServer:
    """Serves one :class:`HttpFrontend` on ``(address, port)``; port 0 picks a free one."""

    def __init__(self, address: str, port: int, frontend: HttpFrontend) -> None:
        self.frontend = frontend
        self._server = StreamServer((address, port), self._handle)
        self._closing = False

    @property
    def server_port(self) -> int:
        return self._server.server_port

    def start(self) -> None:
        self._server.start()

    def close(self) -> None:
        """Stop accepting; connections finish the request they are in and then close."""
        self._closing = True
        self._server.close()

    def stop(self, timeout: float | None = 1.0) -> None:
        self._closing = True
        self._server.stop(timeout=timeout)

    # -- one connection ---------------------------------------------------------------------------
    def _handle(self, sock: socket.socket, address: Any) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        conn = _Connection(sock)
        try:
            while not self._closing:
                head = conn.read_head()
                if head is None:
                    return
                if not self._serve_one(conn, head, address):
                    return
        except BadRequest as e:
            self._send(sock, "400 Bad Request", [("Content-Type", "application/json")],
                       b'{"error":"' + str(e).encode() + b'"}', keep_alive=False)
        except (ConnectionError, OSError):
            pass  # the client went away
        finally:
            try:
                sock.close()
            except OSError:
                pass

    def _serve_one(self, conn: _Connection, head: bytes, address: Any) -> bool:
        """Read the body, answer; False when the connection must close afterwards."""
        parsed = _HEADS.get(head)
        if parsed is None:
            parsed = _parse_head(head)
        method, target, version, headers, keep_alive, expect_continue = parsed
        if expect_continue:
            conn.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        limit = self.frontend.max_input_size
        self.frontend.begin()
        try:
            try:
                body = self._read_body(conn, headers, limit)
            except TritonError as e:
                status, out_headers, out = error_response(e)
                self._send(conn.sock, status, out_headers, out, keep_alive=False)
                return False
            path, _, query = target.partition("?")
            path = unquote(path, "latin-1")
            infer = self.frontend.match_infer(method, path)
            if infer is not None:
                status, out_headers, out = self.frontend.infer(
                    infer[0], infer[1], body, headers.get("inference-header-content-length"),
                    headers.get("content-encoding"), headers.get("accept-encoding"),
                )
            else:
                status, out_headers, out = self._wsgi(method, path, query, version, headers, body, address)
            keep_alive = keep_alive and not self._closing
            if not isinstance(out, bytes):  # an event stream: chunked, each event sent as it comes
                return self._send_stream(conn.sock, status, out_headers, out, keep_alive)
            self._send(conn.sock, status, out_headers, out, keep_alive, head_only=method == "HEAD")
            return keep_alive
        finally:
            self.frontend.end()

    @staticmethod
    def _read_body(conn: _Connection, headers: dict[str, str], limit: int) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return conn.read_chunked(limit)
        length = headers.get("content-length")
        if not length:
            return b""
        try:
            n = int(length)
        except ValueError:
            raise BadRequest("invalid Content-Length") from None
        if n < 0:
            raise BadRequest("invalid Content-Length")
        if n > limit:
            raise too_large(n, limit)
        return conn.read_exact(n)

    def _wsgi(self, method: str, path: str, query: str, version: str, headers: dict[str, str], body: bytes,
              address: Any) -> tuple[str, list[tuple[str, str]], bytes | Iterable[bytes]]:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": query,
            "SERVER_NAME": "triton_actor", "SERVER_PORT": str(self.server_port), "SERVER_PROTOCOL": version,
            "REMOTE_ADDR": address[0] if isinstance(address, tuple) else "",
            "CONTENT_TYPE": headers.get("content-type", ""), "CONTENT_LENGTH": str(len(body)),
            "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr, "wsgi.multithread": False, "wsgi.multiprocess": False, "wsgi.run_once": False,
        }
        for key, value in headers.items():
            if key not in ("content-type", "content-length"):
                environ["HTTP_" + key.upper().replace("-", "_")] = value
        captured: list[Any] = []

        def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured[:] = [status, response_headers]
            return lambda data: None

        result = self.frontend.wsgi_fallback(environ, start_response)
        status, response_headers = captured if captured else (None, None)
        if status is not None and any(k.lower() == "content-type" and v.startswith("text/event-stream")
                                      for k, v in response_headers):
            return status, [(k, v) for k, v in response_headers if k.lower() != "content-length"], result
        try:
            out = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, response_headers = captured
        return status, [(k, v) for k, v in response_headers if k.lower() != "content-length"], out

    @staticmethod
    def _send_stream(sock: socket.socket, status: str, headers: list[tuple[str, str]], chunks: Iterable[bytes],
                     keep_alive: bool) -> bool:
        """Send ``chunks`` with chunked transfer encoding; a client that goes away closes the iterator
        (which cancels the request behind it) and the connection."""
        lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers), "Transfer-Encoding: chunked",
                 "Cache-Control: no-cache"]
        if not keep_alive:
            lines.append("Connection: close")
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            for chunk in chunks:
                if chunk:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            return False
        except Exception:  # the stream's producer failed mid-way: the body is cut, so is the connection
            log.exception("event stream failed")
            return False
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return keep_alive

    @staticmethod
    def _send(sock: socket.socket, status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool,
              head_only: bool = False) -> None:
        lines = [f"HTTP/1.1 {status}"]
        lines.extend(f"{k}: {v}" for k, v in headers)
        lines.append(f"Content-Length: {len(body)}")
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        send_all(sock, head if head_only else head + body)

