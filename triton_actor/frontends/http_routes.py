"""Where the HTTP/REST routes are declared: KServe V2 (https://github.com/kserve/kserve/blob/master/docs/predict-api/v2/required_api.md) plus Triton's extensions (https://github.com/triton-inference-server/server/blob/main/docs/protocol/README.md).

:func:`create_app` builds the Flask app whose url map :class:`.http.HttpFrontend` routes every request
with. A view takes an :class:`.http.HttpRequest` and the url arguments and returns a
:data:`.http.Reply`: decode → data-plane call → encode; a :class:`TritonError` it raises becomes
``{"error": "..."}`` with the status of :mod:`.http_status`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import orjson
from flask import Flask

from ..errors import Code, TritonError
from ..inference import InferRequest, InferResponse
from ..plane import cache_front
from ..plane.dataplane import DataPlane, Streamed
from ..plane.route import Route
from ..protocol import codings, generate, header_forward, payloads, repository_http, v2_http, v2_http_response
from ..protocol.shm_windows import SharedMemoryAccess, http_raw_handle
from ..runtime import fastpath
from ..runtime.kernel import Reply as Reply_
from . import cached_answers, compression
from .http import JSON_HEADERS, TEXT_HEADERS, HttpRequest, Reply, View, json_reply, takes_body
from .offload import WORK_ON_HUB, Offload, json_work
from .openai_routes import OpenAIOptions, openai_routes
from .status_page import status_routes

_OK_EMPTY: Reply = ("200 OK", TEXT_HEADERS, b"")
_OK_EMPTY_JSON: Reply = ("200 OK", JSON_HEADERS, b"")  # Triton: load/unload answer 200, empty body
_NOT_READY: Reply = ("400 Bad Request", TEXT_HEADERS, b"")
_BINARY = "application/octet-stream"
# an /infer answer's fields by its JSON header's length (None: all JSON): a repeating client gets the same
# few; shared and read-only (the driver copies fields it adds). Fast path; _infer_headers is the slow path.
_INFER_HEADERS = fastpath.cache("http.infer_headers", 256)


def create_app(plane: DataPlane, forward: re.Pattern[str] | None = None, offload: Offload | None = None,
               openai: OpenAIOptions | None = None, caching: bool = True) -> Flask:
    """The Flask app holding every route (the url map is all the router uses of it); ``forward``: the
    request headers /infer passes to the model as parameters (--http-header-forward-pattern);
    ``offload``: the rule for big conversions, shared with the gRPC front end (a new one if None);
    ``openai``: the OpenAI-compatible routes' options (:mod:`.openai_routes`, always served); ``caching``:
    whether the server has a response cache (its answers looked up by a request's bytes)."""
    app = empty_app()
    for group in (_health_routes, _model_routes, partial(_infer_routes, forward=forward, offload=offload or Offload(),
                                                         caching=caching),
                  _generate_routes, _shm_routes, _repository_routes, _settings_routes, status_routes,
                  partial(openai_routes, options=openai or OpenAIOptions())):
        group(app, plane)
    return app


def openai_app(plane: DataPlane, options: OpenAIOptions) -> Flask:
    """The app of ``--openai-port``: the OpenAI routes, as Triton's frontend serves on its port, and its
    readiness probe ``/health/ready`` (a deployment moved from that frontend probes it there)."""
    app = empty_app()
    openai_routes(app, plane, options)

    @app.get("/health/ready")
    def openai_health_ready(req: HttpRequest) -> Reply:
        return _OK_EMPTY if plane.is_ready() else _NOT_READY

    return app


def empty_app() -> Flask:
    """A Flask app with no routes yet, matching paths as Triton's router does."""
    app = Flask("triton_actor", static_folder=None)  # no /static/<path>: it is not Triton's (and it failed 500)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False  # no implicit OPTIONS answers: 405 as Triton
    app.url_map.strict_slashes = False
    app.url_map.merge_slashes = False  # '//' is a 404, not a redirect
    return app


def versioned(app: Flask, suffix: str, method: str = "GET") -> Callable[[View], View]:
    """Declare a view at ``/v2/models/<model>[/versions/<int:version>]<suffix>`` (no version: -1, the
    highest ready one)."""

    def register(view: View) -> View:
        for rule in (f"/v2/models/<model>{suffix}", f"/v2/models/<model>/versions/<int:version>{suffix}"):
            app.add_url_rule(rule, view.__name__, view, methods=[method])
        return view

    return register


def _health_routes(app: Flask, plane: DataPlane) -> None:
    @app.get("/v2/health/live")
    def health_live(req: HttpRequest) -> Reply:
        return _OK_EMPTY if plane.is_live() else _NOT_READY

    @app.get("/v2/health/ready")
    def health_ready(req: HttpRequest) -> Reply:
        return _OK_EMPTY if plane.is_ready() else _NOT_READY

    @app.get("/v2")
    def server_metadata(req: HttpRequest) -> Reply:
        return json_reply(plane.server_metadata())


def _model_routes(app: Flask, plane: DataPlane) -> None:
    @versioned(app, "")
    def model_metadata(req: HttpRequest, model: str, version: int = -1) -> Reply:
        return json_reply(plane.model_metadata(model, version))

    @versioned(app, "/ready")
    def model_ready(req: HttpRequest, model: str, version: int = -1) -> Reply:
        try:
            ready = plane.model_ready(model, version)
        except TritonError:
            ready = False  # Triton answers every lookup failure here with this 400
        return _OK_EMPTY if ready else ("400 Bad Request", TEXT_HEADERS, b'{"error":"Model version not ready"}')

    @versioned(app, "/config")
    def model_config(req: HttpRequest, model: str, version: int = -1) -> Reply:
        return json_reply(plane.model_config(model, version))

    @app.get("/v2/models/stats")
    @versioned(app, "/stats")
    def model_stats(req: HttpRequest, model: str = "", version: int = -1) -> Reply:
        return json_reply(plane.statistics(model, version))


def _infer_routes(app: Flask, plane: DataPlane, forward: re.Pattern[str] | None, offload: Offload,
                  caching: bool) -> None:
    """``caching``: the server has a response cache (--cache-config): only then is a request body looked
    up by its bytes (``cached_answers.http_again``), which costs a call and a lookup on every /infer."""

    @versioned(app, "/infer", "POST")
    def infer(req: HttpRequest, model: str, version: int = -1) -> Reply:
        route = plane.route(model, version)
        headers = req.headers
        body = _same_bytes_same_request(req, forward) if caching else None
        if body is not None:  # a body answered from the response cache before (a fast path)
            again = cached_answers.http_again(plane, route, body)
            if again is not None:
                return _infer_reply(*again, headers.get("accept-encoding"))
        route.refuse_decoupled("HTTP end point doesn't support models with decoupled transaction policy")
        request = None if "content-encoding" in headers else v2_http.decode_planned(
            req.body, headers.get("inference-header-content-length"), route.name, route.requested)
        if request is None:
            request = _decode_infer(route, req, plane.shm, offload)
        if forward is not None:
            request = header_forward.with_forwarded(request, header_forward.forwarded(forward, req.headers.items()))
        pending = cache_front.start(plane, request, route, req.wire or req.headers.get("traceparent"))
        if pending.hit is not None:  # answered from the response cache (a fast path)
            chunks, json_length = cached_answers.http_body(pending, request, encode, body)
        else:
            response = _answer(pending.reply, req)
            # an all-binary answer planned before (no work to weigh), else the encoder by the offload rule
            chunks, json_length = v2_http_response.encode_planned(request, response, pending.route.version) \
                or encode(request, response, pending.route)
        return _infer_reply(chunks, json_length, req.headers.get("accept-encoding"))

    def encode(request: InferRequest, response: InferResponse, route: Route) -> tuple[list[bytes], int | None]:
        work = 0 if _elements(response) <= WORK_ON_HUB else \
            v2_http_response.json_output_elements(request, response, route.labels, route.batching)
        return offload.run(work, v2_http_response.encode_infer_response, request, response,
                           route.version, route.labels, route.batching, plane.shm)


def _same_bytes_same_request(req: HttpRequest, forward: re.Pattern[str] | None) -> tuple[str | None, bytes] | None:
    """The request's header length and body when they alone decide the request (no headers forwarded to
    the model, no content coding): what a response-cache hit may be remembered by."""
    if forward is not None or "content-encoding" in req.headers:
        return None
    return req.headers.get("inference-header-content-length"), req.body


def _elements(response: InferResponse) -> int:
    """The elements of every output (a loop: no generator per request)."""
    n = 0
    for _, array in response.outputs:
        n += array.size
    return n


def _answer(reply: Reply_[InferResponse], req: HttpRequest) -> InferResponse:
    """Wait for the model's answer; a client that closes its connection meanwhile cancels the
    request (still queued: never run, as Triton does; counted as a failure), like gRPC's RST_STREAM."""
    if reply.ready() or req.peer_gone is None:
        return reply.get()
    if not reply.wait_or(req.peer_gone()):
        reply.fail(TritonError(Code.CANCELLED, "request cancelled by the client"))
    return reply.get()


def _decode_infer(route: Route, req: HttpRequest, shm: SharedMemoryAccess, offload: Offload) -> InferRequest:
    body = req.payload()
    hl = v2_http.parse_header_length(req.headers.get("inference-header-content-length"))
    if hl == 0 or (hl is None and not body):
        return v2_http.decode_raw_request(body, route.raw_input_spec(), route.name, route.requested)
    # the JSON part: megabytes of it take ~20 ms a MiB and 4-5 times the text's size in Python objects
    work = json_work(len(body) if hl is None else hl)
    return offload.run(work, v2_http.decode_infer_request, body, hl, route.name, route.requested, shm, route.inputs)


def _infer_reply(chunks: list[bytes], json_length: int | None, accept_encoding: str | None) -> Reply:
    if accept_encoding is None:  # the usual answer: its fields by the JSON header's length (a fast path)
        headers = _INFER_HEADERS.get(json_length)
        if headers is None:
            headers = _infer_headers(json_length)
            _INFER_HEADERS.put(json_length, headers)
        return "200 OK", headers, chunks[0] if len(chunks) == 1 else b"".join(chunks)
    headers = _infer_headers(json_length)
    coding = codings.response_coding(accept_encoding)
    if coding is None:
        return "200 OK", headers, chunks[0] if len(chunks) == 1 else b"".join(chunks)
    headers.append(("Content-Encoding", coding))
    return "200 OK", headers, compression.compress(coding, chunks)  # a big one off the hub


def _infer_headers(json_length: int | None) -> list[tuple[str, str]]:
    if json_length is None:
        return [("Content-Type", "application/json")]
    return [("Content-Type", _BINARY), ("Inference-Header-Content-Length", str(json_length))]


def _generate_routes(app: Flask, plane: DataPlane) -> None:
    def start(req: HttpRequest, model: str, version: int) -> tuple[InferRequest, Streamed]:
        route = plane.loaded(plane.route(model, version))  # a model loading on demand: wait for it here
        inputs, max_batch_size = route.input_specs()
        # the body as sent: Triton's generate endpoints take identity only (a compressed body is not JSON);
        # (it was inflated here, so a gzip body worked where Triton refuses it)
        request = generate.decode_request(req.body, model, version, inputs, max_batch_size)
        return request, plane.infer_stream(request, route=route)

    @versioned(app, "/generate", "POST")
    def generate_one(req: HttpRequest, model: str, version: int = -1) -> Reply:
        request, streamed = start(req, model, version)
        responses = streamed.responses
        try:  # one answer: the first response (a decoupled model's later ones are cancelled)
            for item, _final in responses:
                if isinstance(item, TritonError):
                    raise item
                if item is not None:
                    return "200 OK", JSON_HEADERS, generate.encode_response(model, streamed.route.version, request.id, item)
        finally:
            responses.close()
        raise TritonError.internal(f"model '{model}' finished without a response")

    @versioned(app, "/generate_stream", "POST")
    def generate_stream(req: HttpRequest, model: str, version: int = -1) -> Reply:
        request, streamed = start(req, model, version)
        return "200 OK", [("Content-Type", "text/event-stream; charset=utf-8")], _Events(model, request, streamed)


class _Events:
    """A generate_stream body: one SSE event per response. The driver calls :meth:`close` when the
    stream ends or the client leaves (also when it never started), which cancels the request."""

    def __init__(self, model: str, request: InferRequest, streamed: Streamed) -> None:
        self.model, self.request, self.streamed = model, request, streamed

    def __iter__(self) -> Iterator[bytes]:
        for item, _final in self.streamed.responses:
            if isinstance(item, TritonError):
                yield generate.sse_error(item)
            elif item is not None:
                yield generate.sse_event(generate.encode_response(self.model, self.streamed.route.version,
                                                                  self.request.id, item))

    def close(self) -> None:
        self.streamed.responses.close()


def _shm_routes(app: Flask, plane: DataPlane) -> None:
    """System and CUDA shared memory: the same three routes each, over the one registry."""
    shm = plane.shm
    for kind, status, register, unregister in (
        ("system", shm.system_status, lambda r, d: shm.register_system(r, d.get("key"), d.get("offset", 0),
                                                                        d.get("byte_size")), shm.unregister_system),
        ("cuda", shm.cuda_status, lambda r, d: shm.register_cuda(r, http_raw_handle(d.get("raw_handle")),
                                                                  d.get("device_id", 0), d.get("byte_size")),
         shm.unregister_cuda),
    ):
        _shm_kind(app, kind, status, register, unregister)


def _shm_kind(app: Flask, kind: str, status: Callable[[str], Any], register: Callable[[str, dict[str, Any]], None],
              unregister: Callable[[str], None]) -> None:
    base = f"/v2/{kind}sharedmemory"

    def status_route(req: HttpRequest, region: str = "") -> Reply:
        return json_reply(status(region))

    def register_route(req: HttpRequest, region: str) -> Reply:
        register(region, payloads.json_object(req.payload()))
        return _OK_EMPTY

    def unregister_route(req: HttpRequest, region: str = "") -> Reply:
        unregister(region)
        return _OK_EMPTY

    app.add_url_rule(f"{base}/status", f"{kind}_shm_status", status_route, methods=["GET"])
    app.add_url_rule(f"{base}/region/<region>/status", f"{kind}_shm_status", status_route, methods=["GET"])
    app.add_url_rule(f"{base}/region/<region>/register", f"{kind}_shm_register", register_route, methods=["POST"])
    app.add_url_rule(f"{base}/unregister", f"{kind}_shm_unregister", unregister_route, methods=["POST"])
    app.add_url_rule(f"{base}/region/<region>/unregister", f"{kind}_shm_unregister", unregister_route,
                     methods=["POST"])


def _repository_routes(app: Flask, plane: DataPlane) -> None:
    @app.post("/v2/repository/index")
    def repository_index(req: HttpRequest) -> Reply:
        return json_reply(plane.repository_index(_index_ready(req.payload())))

    @app.post("/v2/repository/models/<model>/load")
    @takes_body  # a config override is up to 4 MiB: its body goes once parsed, not after the load (issue 23)
    def repository_load(req: HttpRequest, model: str) -> Reply:
        plane.load_model(model, req.parse_payload(repository_http.decode_load))
        return _OK_EMPTY_JSON

    @app.post("/v2/repository/models/<model>/unload")
    def repository_unload(req: HttpRequest, model: str) -> Reply:
        plane.unload_model(model, repository_http.decode_unload(req.payload()))
        return _OK_EMPTY_JSON


def _index_ready(raw: bytes) -> bool:
    if not raw.strip():
        return False
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise TritonError.invalid_arg(f"failed to parse the request JSON buffer: {e}") from None
    ready = data.get("ready", False) if isinstance(data, dict) else None
    if not isinstance(ready, bool):
        raise TritonError.invalid_arg("Invalid value for 'ready': expected a boolean")  # Triton's words
    return ready


def _settings_routes(app: Flask, plane: DataPlane) -> None:
    """Logging and trace extensions (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_logging.md, https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_trace.md) on the settings gRPC serves too."""
    runtime = plane.runtime

    @app.route("/v2/logging", methods=["GET", "POST"])
    def logging_settings(req: HttpRequest) -> Reply:
        if req.method != "POST":
            return json_reply(runtime.log)
        changes = {k: v for k, v in payloads.json_object(req.payload()).items() if v is not None}
        return json_reply(runtime.update_log(changes))

    @app.route("/v2/trace/setting", methods=["GET", "POST"])
    @app.route("/v2/models/<model>/trace/setting", methods=["GET", "POST"])
    def trace_settings(req: HttpRequest, model: str = "") -> Reply:
        if model and not plane.is_known(model):
            raise TritonError.invalid_arg(f"Request for unknown model : {model}")
        if req.method != "POST":
            current = runtime.trace_settings(model)
        else:
            changes = {k: [] if v is None else [str(x) for x in v] if isinstance(v, list) else [str(v)]
                       for k, v in payloads.json_object(req.payload()).items()}
            current = runtime.update_trace(changes, model)
        # Triton's JSON: trace_level is an array, every other setting one string
        return json_reply({k: v if k == "trace_level" else (v[0] if v else "") for k, v in current.items()})
