"""The one HTTP router: every request, ``/infer`` included, goes through the Flask app's url map.

Flask is where routes are declared (:mod:`.http_routes`); :class:`HttpFrontend` matches a request with
that url map's adapter (no WSGI environ, no request context: Flask's per-request machinery cost
~80 µs against our ~100 µs /infer) and calls the view with an :class:`HttpRequest`. A view returns a
:data:`Reply`. Unknown paths (404) and wrong methods (405 with ``Allow``) come from the url map too.
The router is a plain callable, ``(method, path, query, headers, body) -> Reply``, so our HTTP/1.1
driver (:mod:`.http_server`) and a gunicorn worker can both serve it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import gevent.event
import orjson
from flask import Flask
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from ..errors import TritonError, answered
from ..observability.wire_trace import WireTrace
from ..protocol import codings, restricted
from ..protocol.restricted import Restrictions
from ..runtime import fastpath
from . import compression
from .compression import Hold
from .drain import wait_until_idle
from .http_status import HTTP_STATUS, status_line

log = logging.getLogger(__name__)

# (status line, headers without Content-Length, body: bytes, or an iterable of chunks with close())
Reply = tuple[str, list[tuple[str, str]], bytes | Iterable[bytes]]
View = Callable[..., Reply]
V = TypeVar("V", bound=View)
T = TypeVar("T")
JSON_HEADERS = [("Content-Type", "application/json")]
TEXT_HEADERS = [("Content-Type", "text/plain")]

# (method, path) → (endpoint, url arguments): the url map's own answers, kept for the paths a client
# repeats: werkzeug's matcher costs ~7 µs of Python, a hit ~0.1. Fast path; the url map is the slow
# path. One cache per kind of router (``"http"``: every :func:`.http_routes.create_app` has the same
# routes; ``"metrics"``: the metrics port's), so one router never answers with another's endpoints.
_ROUTE_CACHE_SIZE = 512
_ROUTE_CACHED_MAX = 512


@dataclass(slots=True)
class HttpRequest:
    """What a view gets: the request line's parts, lower-case headers (read-only), the raw body."""

    method: str
    path: str  # percent-decoded
    query: str
    headers: dict[str, str]
    body: bytes
    max_size: int  # --http-max-input-size, also after decompression
    # the driver's "client went away" event, started on demand by a view that waits (None: not watched)
    peer_gone: Callable[[], gevent.event.Event] | None = None
    # the driver's: hold more of the request memory budget for this request (None: no budget)
    hold: Hold | None = None
    # the driver's stamps of this request on the wire, made only in OpenTelemetry mode (observability/wire_trace.py)
    wire: WireTrace | None = None

    def parse_payload(self, parse: Callable[[bytes], T]) -> T:
        """``parse(payload())``, then a body taken over from the driver (a ``bytearray``: a view marked
        :func:`takes_body`, a large body) is emptied: nothing holds it while the view goes on, however
        many frames still refer to it (issue 23: a load's body was held through the whole load)."""
        try:
            return parse(self.payload())
        finally:
            if type(self.body) is bytearray:
                self.body.clear()

    def payload(self) -> bytes:
        """The body with ``Content-Encoding: gzip|deflate`` undone, never over ``max_size`` bytes; the
        inflated bytes are held in the request memory budget until the request is answered (call it
        once per request)."""
        encoding = self.headers.get("content-encoding")
        if encoding is None:
            return self.body
        encoding = encoding.strip().lower()
        if encoding in ("", "identity") or not self.body:  # nothing to inflate: an empty body as it was
            return self.body
        if not codings.known(encoding):
            raise TritonError.unsupported(f"unsupported Content-Encoding '{encoding}'")
        try:
            return compression.inflate(encoding, self.body, self.max_size, self.hold or _unbounded)
        except zlib.error as e:
            raise TritonError.invalid_arg(f"failed to decompress the {encoding} request body: {e}") from None
        except OverflowError as e:
            raise too_large(e.args[0], self.max_size, "inflated") from None


def takes_body(view: V) -> V:
    """Mark a view that reads its body once, with :meth:`HttpRequest.parse_payload`: the driver hands it
    a large body without copying it (``http_server.py`` ``_read_taken``), which the parse then empties."""
    view.takes_body = True  # type: ignore[attr-defined]
    return view


def _unbounded(n: int) -> None:
    """No budget to hold (a request built without a driver's)."""


def too_large(size: int | str, limit: int, body: str = "json") -> TritonError:
    """Triton's answer to a body over ``--http-max-input-size`` (400, INVALID_ARG), in the words of its
    current server (PR #8676 and after; its L0_http http_input_size_limit_test looks for each): ``body``
    is "json" (an inference header, any other body), "raw" (``Inference-Header-Content-Length: 0``: the
    body is the input) or "inflated" (a compressed body, inflated past the limit). Triton 2.51 said
    "Request JSON size of N exceeds the maximum allowed value of M." for all three."""
    use = "Use --http-max-input-size to increase the limit."
    if body == "raw":
        return TritonError.invalid_arg(
            f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {limit} bytes. {use}")
    if body == "inflated":
        return TritonError.invalid_arg(f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. {use}")
    return TritonError.invalid_arg(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. {use}")


def body_kind(head: Any) -> str:
    """What the body of the request with ``head`` (an ``http1.Head``, or None) is, for :func:`too_large`:
    "raw", "inflated" (compressed) or "json"."""
    headers: Mapping[str, str] = head.headers if head is not None else {}
    if headers.get("inference-header-content-length", "").strip() == "0":
        return "raw"
    encoding = headers.get("content-encoding", "").strip().lower()
    return "inflated" if encoding not in ("", "identity") else "json"


def json_reply(body: Any, status: int = 200) -> Reply:
    return status_line(status), JSON_HEADERS, orjson.dumps(body)


def error_response(error: TritonError) -> Reply:
    return status_line(HTTP_STATUS[error.code]), JSON_HEADERS, orjson.dumps({"error": error.message})


def _routing_error(e: HTTPException) -> Reply:
    # Triton's router answers unknown routes and wrong methods in text/plain, with "405 Not Allowed"
    body = orjson.dumps({"error": e.name})
    if isinstance(e, MethodNotAllowed):
        return "405 Not Allowed", [*TEXT_HEADERS, ("Allow", ", ".join(sorted(e.valid_methods or ())))], body
    return status_line(e.code or 404), TEXT_HEADERS, body


class HttpFrontend:
    """The router over the url map of ``app`` (:func:`.http_routes.create_app`), and the count of
    requests in flight that shutdown drains. Runs in the connection's greenlet."""

    def __init__(self, app: Flask, max_input_size: int = 64 * 1024 * 1024,
                 restrictions: Restrictions | None = None, name: str = "http") -> None:
        self._routes = fastpath.cache(f"{name}.routes", _ROUTE_CACHE_SIZE)  # keyed by the routes' kind
        self.max_input_size = max_input_size
        self.restrictions = restrictions or None  # --http-restricted-api; None: no check at all
        self.app = app
        self._adapter = self.app.url_map.bind("triton")
        self._views: dict[str, View] = self.app.view_functions
        self.in_flight = 0
        self.idle_waiter: gevent.event.Event | None = None  # created by wait_idle (shutdown) only

    def __call__(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes,
                 peer_gone: Callable[[], gevent.event.Event] | None = None, hold: Hold | None = None,
                 wire: WireTrace | None = None) -> Reply:
        """Route and answer one request; ``path`` is percent-decoded."""
        try:
            route = self._routes.get((method, path))
            if route is None:
                route = self.match(method, path)
            endpoint, args = route
            if self.restrictions is not None:
                refusal = self._refusal(endpoint, headers)
                if refusal is not None:
                    return status_line(403), JSON_HEADERS, orjson.dumps({"error": refusal})
            req = HttpRequest(method, path, query, headers, body, self.max_input_size, peer_gone, hold, wire)
            return self._views[endpoint](req, **args)
        except TritonError as e:
            return error_response(answered(e))
        except HTTPException as e:
            return _routing_error(e)
        except Exception as e:
            log.exception("unexpected error on %s %s", method, path)
            return error_response(TritonError.internal(f"internal error: {answered(e)!r}"))

    def takes_body(self, method: str, path: str) -> bool:
        """Whether the view of ``method path`` takes its body over (:func:`takes_body`): asked by the
        driver for large bodies only, before the body is read."""
        try:
            endpoint = (self._routes.get((method, path)) or self.match(method, path))[0]
        except HTTPException:
            return False
        return getattr(self._views[endpoint], "takes_body", False)

    def _refusal(self, endpoint: str, headers: dict[str, str]) -> str | None:
        assert self.restrictions is not None
        for category in restricted.http_categories(endpoint):
            header = self.restrictions.header_for(category)
            refusal = self.restrictions.refusal(category, headers.get(header) if header else None)
            if refusal is not None:
                return refusal
        return None

    def match(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        """(endpoint, url arguments) from the url map; raises NotFound or MethodNotAllowed."""
        route = self._adapter.match(path, method)
        if len(path) <= _ROUTE_CACHED_MAX:
            self._routes.put((method, path), route)
        return route

    # -- request accounting (shutdown drains these) ------------------------------------------------
    # The driver (http_server.py) counts a request in ``in_flight`` and out again in line (two calls a
    # request less), and sets ``idle_waiter`` when the count it left is 0.
    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no request is being handled (shutdown drain). True when idle in time."""
        return wait_until_idle(self, self.in_flight, timeout)
