"""HTTP/REST front end: KServe V2 plus Triton's extensions (spec §1).

``POST .../infer`` takes a thin raw-WSGI path (Flask's per-request machinery costs ~80 µs,
feasibility §6); every other route is a Flask view. Each handler is decode → data-plane call →
encode; errors are ``{"error": "..."}`` with the status of :mod:`.status`.
"""

from __future__ import annotations

import gzip
import logging
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gevent.event
import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from ..dataplane import DataPlane
from ..errors import TritonError
from ..inference import InferRequest
from ..protocol import generate, payloads, repository_http, v2_http
from .status import HTTP_STATUS, status_line

log = logging.getLogger(__name__)

_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
_JSON = "application/json"
_TEXT = "text/plain"
StartResponse = Callable[..., Any]


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, content_type=_JSON)


def _error(error: TritonError) -> Response:
    return _json({"error": error.message}, HTTP_STATUS[error.code])


def _version(v: str | None) -> int:
    return int(v) if v is not None else -1


class HttpFrontend:
    """The HTTP application: a sans-WSGI fast ``/infer`` handler plus the Flask app for the rest.

    Our own server (:mod:`.http_server`) calls :meth:`infer` directly; any WSGI server (gunicorn)
    uses :meth:`__call__`, which routes ``POST .../infer`` to the same handler.
    """

    def __init__(self, plane: DataPlane, max_input_size: int = 64 * 1024 * 1024) -> None:
        self.plane = plane
        self.max_input_size = max_input_size
        self.flask = create_app(plane, self)
        self.wsgi_fallback = self.flask.wsgi_app
        self.in_flight = 0
        self._idle: gevent.event.Event | None = None  # created by wait_idle (shutdown) only

    # -- request accounting (shutdown drains these) ------------------------------------------------
    def begin(self) -> None:
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self._idle is not None:
            self._idle.set()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no request is being handled (shutdown drain). True when idle in time."""
        if not self.in_flight:
            return True
        self._idle = gevent.event.Event()
        return self._idle.wait(timeout)

    @staticmethod
    def match_infer(method: str, path: str) -> tuple[str, int] | None:
        if method != "POST":
            return None
        m = _INFER.match(path)
        return None if m is None else (m.group(1), _version(m.group(2)))

    # -- WSGI -------------------------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        self.begin()
        try:
            target = self.match_infer(environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""))
            if target is None:
                return self.wsgi_fallback(environ, start_response)
            try:
                body = self.read_wsgi_body(environ)
            except TritonError as e:
                status, headers, out = error_response(e)
            else:
                status, headers, out = self.infer(
                    target[0], target[1], body, environ.get("HTTP_INFERENCE_HEADER_CONTENT_LENGTH"),
                    environ.get("HTTP_CONTENT_ENCODING"), environ.get("HTTP_ACCEPT_ENCODING"),
                )
            start_response(status, [*headers, ("Content-Length", str(len(out)))])
            return [out]
        finally:
            self.end()

    def read_wsgi_body(self, environ: dict[str, Any]) -> bytes:
        limit = self.max_input_size
        length = environ.get("CONTENT_LENGTH")
        if length:
            n = int(length)
            if n > limit:
                raise too_large(n, limit)
            return environ["wsgi.input"].read(n)
        body = environ["wsgi.input"].read(limit + 1)
        if len(body) > limit:
            raise too_large(len(body), limit)
        return body

    # -- /infer -----------------------------------------------------------------------------------
    def infer(
        self,
        model: str,
        version: int,
        body: bytes,
        header_length: str | None,
        content_encoding: str | None,
        accept_encoding: str | None,
    ) -> tuple[str, list[tuple[str, str]], bytes]:
        """Decode → data plane → encode; returns (status line, headers without Content-Length, body)."""
        try:
            self.plane.reject_decoupled(model)
            body = self.decompress(body, content_encoding)
            hl = v2_http.parse_header_length(header_length)
            if hl == 0 or (hl is None and not body):
                req = v2_http.decode_raw_request(body, self.plane.raw_input_spec(model, version), model, version)
            else:
                req = v2_http.decode_infer_request(body, hl, model, version, self.plane.shm)
            served = self.plane.infer(req)
            chunks, json_length = v2_http.encode_infer_response(
                req, served.response, served.version, served.labels, served.batching, self.plane.shm
            )
        except TritonError as e:
            return error_response(e)
        except Exception as e:
            log.exception("unexpected error serving /infer for '%s'", model)
            return error_response(TritonError.internal(f"internal error: {e!r}"))
        out = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if json_length is None:
            headers = [("Content-Type", _JSON)]
        else:
            headers = [("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", str(json_length))]
        encoding = _accepted_encoding(accept_encoding)
        if encoding is not None:
            out = gzip.compress(out, 1) if encoding == "gzip" else zlib.compress(out, 1)
            headers.append(("Content-Encoding", encoding))
        return "200 OK", headers, out

    def decompress(self, body: bytes, encoding: str | None) -> bytes:
        """Undo ``Content-Encoding: gzip|deflate``, never producing more than ``max_input_size`` bytes."""
        encoding = (encoding or "").strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding not in ("gzip", "deflate"):
            raise TritonError.unsupported(f"unsupported Content-Encoding '{encoding}'")
        limit = self.max_input_size
        inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as e:
            raise TritonError.invalid_arg(f"failed to decompress the {encoding} request body: {e}") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise too_large(len(out), limit)
        return out


def too_large(size: int, limit: int) -> TritonError:
    return TritonError.invalid_arg(
        f"Request JSON size of {size} exceeds the maximum allowed value of {limit}. "
        "Use --http-max-input-size to increase the limit."
    )


def _accepted_encoding(header: str | None) -> str | None:
    if not header:
        return None
    offered = [p.split(";")[0].strip().lower() for p in header.split(",")]
    for enc in ("gzip", "deflate"):
        if enc in offered:
            return enc
    return None


def _shm_routes(app: Flask, kind: str, status: Callable[[str], Any], register: Callable[[str, dict[str, Any]], None],
                unregister: Callable[[str], None], json_body: Callable[[], dict[str, Any]],
                empty: Callable[[int], Response]) -> None:
    base = f"/v2/{kind}sharedmemory"

    def status_route(region: str = "") -> Response:
        return _json(status(region))

    def register_route(region: str) -> Response:
        register(region, json_body())
        return empty(200)

    def unregister_route(region: str = "") -> Response:
        unregister(region)
        return empty(200)

    for path in (f"{base}/status", f"{base}/region/<region>/status"):
        app.add_url_rule(path, f"{kind}_shm_status_{path.count('/')}", status_route, methods=["GET"])
    app.add_url_rule(f"{base}/region/<region>/register", f"{kind}_shm_register", register_route, methods=["POST"])
    for path in (f"{base}/unregister", f"{base}/region/<region>/unregister"):
        app.add_url_rule(path, f"{kind}_shm_unregister_{path.count('/')}", unregister_route, methods=["POST"])


def error_response(error: TritonError) -> tuple[str, list[tuple[str, str]], bytes]:
    return status_line(HTTP_STATUS[error.code]), [("Content-Type", _JSON)], orjson.dumps({"error": error.message})


def create_app(plane: DataPlane, frontend: HttpFrontend) -> Flask:
    """The Flask app with every route except the ``/infer`` fast path."""
    app = Flask("triton_actor")
    app.url_map.strict_slashes = False

    @app.errorhandler(TritonError)
    def _triton_error(e: TritonError) -> Response:
        return _error(e)

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException) -> Response:
        # Triton's router answers unknown routes and wrong methods in text/plain, with "405 Not Allowed".
        status = "405 Not Allowed" if e.code == 405 else (e.code or 500)
        return Response(orjson.dumps({"error": e.name}), status=status, content_type=_TEXT)

    @app.errorhandler(Exception)
    def _unexpected(e: Exception) -> Response:
        log.exception("unexpected error on %s", request.path)
        return _error(TritonError.internal(f"internal error: {e!r}"))

    def empty(status: int) -> Response:
        return Response(b"", status=status, content_type=_TEXT)

    @app.get("/v2/health/live")
    def health_live() -> Response:
        return empty(200 if plane.is_live() else 400)

    @app.get("/v2/health/ready")
    def health_ready() -> Response:
        return empty(200 if plane.is_ready() else 400)

    @app.get("/v2")
    def server_metadata() -> Response:
        return _json(plane.server_metadata())

    @app.get("/v2/models/<model>")
    @app.get("/v2/models/<model>/versions/<int:version>")
    def model_metadata(model: str, version: int = -1) -> Response:
        return _json(plane.model_metadata(model, version))

    @app.get("/v2/models/<model>/ready")
    @app.get("/v2/models/<model>/versions/<int:version>/ready")
    def model_ready(model: str, version: int = -1) -> Response:
        try:
            ready = plane.model_ready(model, version)
        except TritonError:
            ready = False  # Triton answers every lookup failure here with this 400
        if ready:
            return empty(200)
        return Response(orjson.dumps({"error": "Model version not ready"}), status=400, content_type=_TEXT)

    @app.get("/v2/models/<model>/config")
    @app.get("/v2/models/<model>/versions/<int:version>/config")
    def model_config(model: str, version: int = -1) -> Response:
        return _json(plane.model_config(model, version))

    @app.get("/v2/models/stats")
    @app.get("/v2/models/<model>/stats")
    @app.get("/v2/models/<model>/versions/<int:version>/stats")
    def model_stats(model: str = "", version: int = -1) -> Response:
        return _json(plane.statistics(model, version))

    @app.post("/v2/models/<model>/infer")
    @app.post("/v2/models/<model>/versions/<int:version>/infer")
    def infer_route(model: str, version: int = -1) -> Response:
        # POST never gets here (the raw WSGI path serves it); the route makes other methods a 405.
        raise TritonError.internal("the /infer route is served by the raw WSGI path")

    def body() -> bytes:
        return frontend.decompress(frontend.read_wsgi_body(request.environ), request.headers.get("Content-Encoding"))

    def generate_request(model: str, version: int) -> InferRequest:
        inputs, max_batch_size = plane.input_specs(model, version)
        return generate.decode_request(body(), model, version, inputs, max_batch_size)

    @app.post("/v2/models/<model>/generate")
    @app.post("/v2/models/<model>/versions/<int:version>/generate")
    def generate_route(model: str, version: int = -1) -> Response:
        req = generate_request(model, version)
        streamed = plane.infer_stream(req)
        responses = streamed.responses
        try:  # one answer: the first response (a decoupled model's later ones are cancelled)
            for item, _final in responses:
                if isinstance(item, TritonError):
                    raise item
                if item is not None:
                    payload = generate.encode_response(model, streamed.version, req.id, item)
                    return Response(payload, status=200, mimetype="application/json")
        finally:
            responses.close()
        raise TritonError.internal(f"model '{model}' finished without a response")

    @app.post("/v2/models/<model>/generate_stream")
    @app.post("/v2/models/<model>/versions/<int:version>/generate_stream")
    def generate_stream_route(model: str, version: int = -1) -> Response:
        req = generate_request(model, version)
        streamed = plane.infer_stream(req)

        def events() -> Iterator[bytes]:
            responses = streamed.responses
            try:
                for item, _final in responses:
                    if isinstance(item, TritonError):
                        yield generate.sse_error(item)
                    elif item is not None:
                        yield generate.sse_event(generate.encode_response(model, streamed.version, req.id, item))
            finally:
                responses.close()

        response = Response(events(), status=200, content_type="text/event-stream; charset=utf-8")
        response.call_on_close(streamed.responses.close)  # also when the stream never started (head not sent)
        return response

    def json_body() -> dict[str, Any]:
        return payloads.json_object(body())

    shm = plane.shm
    # system and CUDA shared memory: the same three routes each, over the one registry
    for kind, status, register, unregister in (
        ("system", shm.system_status, lambda r, d: shm.register_system(r, d.get("key"), d.get("offset", 0),
                                                                        d.get("byte_size")), shm.unregister_system),
        ("cuda", shm.cuda_status, lambda r, d: shm.register_cuda(r, d.get("raw_handle"), d.get("device_id", 0),
                                                                  d.get("byte_size")), shm.unregister_cuda),
    ):
        _shm_routes(app, kind, status, register, unregister, json_body, empty)

    @app.post("/v2/repository/index")
    def repository_index() -> Response:
        raw = body()
        ready = False
        if raw.strip():
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise TritonError.invalid_arg(f"failed to parse the request JSON buffer: {e}") from None
            ready = data.get("ready", False) if isinstance(data, dict) else None
            if not isinstance(ready, bool):
                raise TritonError.invalid_arg("Expected 'ready' to be a boolean")
        return _json(plane.repository_index(ready))

    @app.post("/v2/repository/models/<model>/load")
    def repository_load(model: str) -> Response:
        plane.load_model(model, repository_http.decode_load(body()))
        return Response(b"", status=200, content_type=_JSON)  # Triton: 200, empty body

    @app.post("/v2/repository/models/<model>/unload")
    def repository_unload(model: str) -> Response:
        plane.unload_model(model, repository_http.decode_unload(body()))
        return Response(b"", status=200, content_type=_JSON)

    _settings_routes(app, plane, frontend)
    return app


def _json_object(frontend: HttpFrontend) -> dict[str, Any]:
    body = frontend.decompress(frontend.read_wsgi_body(request.environ), request.headers.get("Content-Encoding"))
    return payloads.json_object(body)


def _settings_routes(app: Flask, plane: DataPlane, frontend: HttpFrontend) -> None:
    """Logging and trace extensions (spec §1.12, §1.13) on the settings gRPC serves too."""
    runtime = plane.runtime

    @app.get("/v2/logging")
    @app.post("/v2/logging")
    def logging_settings() -> Response:
        if request.method == "GET":
            return _json(runtime.log)
        changes = {k: v for k, v in _json_object(frontend).items() if v is not None}
        return _json(runtime.update_log(changes))

    @app.get("/v2/trace/setting")
    @app.post("/v2/trace/setting")
    @app.get("/v2/models/<model>/trace/setting")
    @app.post("/v2/models/<model>/trace/setting")
    def trace_settings(model: str = "") -> Response:
        if model and not plane.is_known(model):
            raise TritonError.invalid_arg(f"Request for unknown model : {model}")
        if request.method == "GET":
            current = runtime.trace_settings(model)
        else:
            changes = {k: [] if v is None else [str(x) for x in v] if isinstance(v, list) else [str(v)]
                       for k, v in _json_object(frontend).items()}
            current = runtime.update_trace(changes, model)
        # Triton's JSON: trace_level is an array, every other setting one string
        return _json({k: v if k == "trace_level" else (v[0] if v else "") for k, v in current.items()})
