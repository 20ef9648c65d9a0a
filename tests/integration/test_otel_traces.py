"""OpenTelemetry traces (``--trace-config mode=opentelemetry``, observability/otel.py) sent to an OTLP/HTTP
receiver in this test process, which decodes each export (``ExportTraceServiceRequest``, protobuf) into spans.

Checked: Triton's span tree for an ensemble (``InferRequest`` → the ensemble's model span → a model span per
step → its ``compute`` span), Triton's attributes and events, the W3C ``traceparent`` the client sent (HTTP
header, gRPC metadata) as the spans' trace and parent, the resource from the flags, and ``rate`` sampling with
a propagated context traced whatever the rate says.
"""

from __future__ import annotations

import gzip
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import gevent
import gevent.event
import gevent.pywsgi
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .server import ServerProcess
from .test_ensemble import _arith_config, pipeline

pytestmark = pytest.mark.timeout(120)


class Receiver:
    """An OTLP/HTTP traces endpoint: every span posted, flattened to a dict, and an event per export."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.resources: list[dict[str, str]] = []
        self.arrived = gevent.event.Event()
        self.server = gevent.pywsgi.WSGIServer(("127.0.0.1", 0), self._app, log=None)
        self.server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1/traces"

    def _app(self, environ: dict, start_response: Callable) -> list[bytes]:
        body = environ["wsgi.input"].read()
        if environ.get("HTTP_CONTENT_ENCODING") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for rs in export.resource_spans:
            self.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                self.spans += [_flat(s, ss.scope.name) for s in ss.spans]
        self.arrived.set()
        start_response("200 OK", [("Content-Type", "application/x-protobuf"), ("Content-Length", "0")])
        return [b""]

    def of(self, trace_id: str) -> list[dict]:
        """The spans of one trace (by its W3C trace id)."""
        return [s for s in self.spans if s["trace_id"] == trace_id]

    def wait_for(self, condition: Callable[[], bool], timeout: float = 30) -> None:
        """Wait on exports (each sets ``arrived``) until ``condition`` holds."""
        with gevent.Timeout(timeout, AssertionError(f"spans never arrived; have {self.spans}")):
            while not condition():
                self.arrived.wait()
                self.arrived.clear()


def _flat(span, scope: str) -> dict:
    def value(v):
        return v.string_value if v.HasField("string_value") else v.int_value
    return {"name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
            "parent": span.parent_span_id.hex(), "kind": span.kind, "scope": scope,
            "attrs": {a.key: value(a.value) for a in span.attributes}, "events": [e.name for e in span.events],
            "event_ns": [e.time_unix_nano for e in span.events],
            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano, "flags": span.flags}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.stop()


def _flags(receiver: Receiver, rate: int) -> tuple[str, ...]:
    return ("--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", f"rate={rate}", "--trace-config", f"opentelemetry,url={receiver.url}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=50",
            "--trace-config", "opentelemetry,resource=service.name=otel-test",
            "--trace-config", "opentelemetry,resource=deployment=ci")


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _http_infer(server: ServerProcess, model: str, headers: dict[str, str] | None = None) -> None:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    x = httpclient.InferInput("IN" if model == "ens" else "X", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    try:
        client.infer(model, [x], headers=headers, request_id="r-1")
    finally:
        client.close()


def _grpc_infer(server: ServerProcess, *headers: dict[str, str]) -> None:
    """``inc`` over gRPC, once per ``headers``."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    try:
        for h in headers:
            client.infer("inc", [x], headers=h)
    finally:
        client.close()


def test_ensemble_span_tree_follows_the_clients_traceparent(tmp_path: Path, start_server, receiver: Receiver) -> None:
    pipeline(tmp_path)
    server = start_server(tmp_path, flags=_flags(receiver, rate=1000))
    header, trace_id, client_span = _traceparent()
    _http_infer(server, "ens", {"traceparent": header})

    def mine() -> list[dict]:
        return [s for s in receiver.spans if s["trace_id"] == trace_id]
    receiver.wait_for(lambda: len(mine()) == 8)  # InferRequest, ens, 3 steps, 3 compute spans
    spans = mine()
    (root,) = [s for s in spans if s["name"] == "InferRequest"]
    (ens,) = [s for s in spans if s["name"] == "ens"]
    steps = [s for s in spans if s["name"] in ("inc", "dbl")]
    computes = [s for s in spans if s["name"] == "compute"]
    assert root["parent"] == client_span and root["scope"] == "triton-server" and root["kind"] == 2  # SERVER
    assert ens["parent"] == root["span_id"]
    assert ens["attrs"] == {"triton.model_name": "ens", "triton.model_version": 1, "triton.trace_id": ens["attrs"]["triton.trace_id"],
                            "triton.trace_parent_id": 0, "triton.request_id": "r-1"}
    assert ens["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert sorted(s["name"] for s in steps) == ["dbl", "dbl", "inc"]
    for step in steps:
        assert step["parent"] == ens["span_id"]
        assert step["attrs"]["triton.trace_parent_id"] == ens["attrs"]["triton.trace_id"]
        assert step["attrs"]["triton.model_name"] == step["name"] and step["attrs"]["triton.request_id"] == "r-1"
        assert step["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert ens["start"] <= step["start"] <= step["end"] <= ens["end"]
    assert len({s["attrs"]["triton.trace_id"] for s in (ens, *steps)}) == 4  # a trace id of its own each
    assert sorted(c["parent"] for c in computes) == sorted(s["span_id"] for s in steps)
    for compute in computes:
        assert compute["events"] == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    assert {"service.name": "otel-test", "deployment": "ci"}.items() <= receiver.resources[0].items()

    # gRPC: the context comes as call metadata
    header, trace_id, client_span = _traceparent()
    _grpc_infer(server, {"traceparent": header})
    receiver.wait_for(lambda: len(mine()) == 3)
    by_name = {s["name"]: s for s in mine()}
    assert by_name["InferRequest"]["parent"] == client_span
    assert by_name["inc"]["parent"] == by_name["InferRequest"]["span_id"]
    assert by_name["compute"]["parent"] == by_name["inc"]["span_id"]


def test_ids_and_timestamps_hold_across_an_ensemble_end_to_end(tmp_path: Path, start_server,
                                                              receiver: Receiver) -> None:
    """The ids drawn on the hub and the stamps converted off it (observability/otel.py): one W3C trace id
    per request (the client's, or a fresh one), unique non-zero span ids, each span within its parent's
    time and its events within its own, wall-clock times inside the request's, and the OTLP flag that
    says the root's parent is remote (the client's) and no other span's is."""
    import time

    pipeline(tmp_path)
    server = start_server(tmp_path, flags=_flags(receiver, rate=1))
    header, trace_id, client_span = _traceparent()
    before = time.time_ns()
    _http_infer(server, "ens", {"traceparent": header})
    _http_infer(server, "ens")  # no context: a trace id of its own
    receiver.wait_for(lambda: len(receiver.spans) == 16)  # 8 a request
    after = time.time_ns()  # the root spans end after the send, perhaps after the client has its answer
    traces = {s["trace_id"] for s in receiver.spans}
    assert len(traces) == 2 and trace_id in traces and "0" * 32 not in traces
    assert len({s["span_id"] for s in receiver.spans}) == 16 and "0" * 16 not in {s["span_id"] for s in receiver.spans}
    for tid in traces:
        spans = {s["span_id"]: s for s in receiver.of(tid)}
        (root,) = [s for s in spans.values() if s["name"] == "InferRequest"]
        assert root["parent"] == (client_span if tid == trace_id else "")
        assert root["flags"] == (0x300 if tid == trace_id else 0x100)  # HAS_IS_REMOTE, and IS_REMOTE for the client's
        for span in spans.values():
            assert before <= span["start"] <= span["end"] <= after
            assert span["event_ns"] == sorted(span["event_ns"]) and before <= span["event_ns"][0]
            # the root's receive events come before it starts (it starts when the request is sampled)
            events = span["event_ns"][2:] if span is root else span["event_ns"]
            assert all(span["start"] <= ns <= span["end"] for ns in events), span
            if span is not root:
                parent = spans[span["parent"]]  # every parent is a span of the same trace
                assert span["flags"] == 0x100
                assert parent["start"] <= span["start"] <= span["end"] <= parent["end"], (parent, span)
        depth = {"InferRequest": 0, "ens": 1, "inc": 2, "dbl": 2, "compute": 3}
        for span in spans.values():
            if span is not root:
                assert depth[spans[span["parent"]]["name"]] == depth[span["name"]] - 1


def test_a_trace_settings_change_posts_the_spans_recorded_before_it(tmp_path: Path, start_server,
                                                                    receiver: Receiver) -> None:
    """The export thread posts every ``bsp_schedule_delay`` ms (here an hour), and at once when the trace
    settings change: the spans recorded under the old settings arrive without waiting for the delay."""
    pipeline(tmp_path)
    hour = "opentelemetry,bsp_schedule_delay=3600000"
    flags = tuple(hour if f == "opentelemetry,bsp_schedule_delay=50" else f for f in _flags(receiver, rate=1))
    server = start_server(tmp_path, flags=flags)
    _http_infer(server, "inc")
    client = httpclient.InferenceServerClient(server.url)
    try:
        client.update_trace_settings(settings={"trace_rate": "2"})
    finally:
        client.close()
    receiver.wait_for(lambda: len(receiver.spans) == 3)  # InferRequest, inc, compute
    assert sorted(s["name"] for s in receiver.spans) == ["InferRequest", "compute", "inc"]


def _root_events_as_triton_names_them(spans: list[dict], front: str) -> None:
    """The root span's events are the front end's five, in Triton's order and in time order, around the
    model span's; the model and compute spans keep theirs (Triton's QA opentelemetry_unittest.py)."""
    by_name = {s["name"]: s for s in spans}
    root, model = by_name["InferRequest"], by_name["inc"]
    recv = "HTTP_RECV" if front == "HTTP" else "GRPC_WAITREAD"
    assert root["events"] == [f"{recv}_START", f"{recv}_END", "INFER_RESPONSE_COMPLETE",
                              f"{front}_SEND_START", f"{front}_SEND_END"]
    assert model["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert by_name["compute"]["events"] == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    recv_start, recv_end, complete, send_start, send_end = root["event_ns"]
    assert recv_start <= recv_end <= model["start"] <= model["end"] <= complete <= send_start <= send_end
    assert root["start"] <= model["start"] and send_end == root["end"]  # the root ends with its send


def test_the_request_span_has_the_front_ends_recv_and_send_events(tmp_path: Path, start_server,
                                                                  receiver: Receiver) -> None:
    """As Triton's front ends stamp them (``Trace::CaptureTimestamp`` on the root span): HTTP_RECV_*/GRPC_WAITREAD_*,
    INFER_RESPONSE_COMPLETE and HTTP_SEND_*/GRPC_SEND_*, for an HTTP and a gRPC request."""
    pipeline(tmp_path)
    server = start_server(tmp_path, flags=_flags(receiver, rate=1))
    header, http_trace, client_span = _traceparent()
    _http_infer(server, "inc", {"traceparent": header})
    receiver.wait_for(lambda: len(receiver.of(http_trace)) == 3)  # InferRequest, inc, compute
    _root_events_as_triton_names_them(receiver.of(http_trace), "HTTP")
    assert [s["parent"] for s in receiver.of(http_trace) if s["name"] == "InferRequest"] == [client_span]

    header, grpc_trace, _ = _traceparent()
    _grpc_infer(server, {"traceparent": header}, {})  # the second: no context, a trace of its own
    receiver.wait_for(lambda: len(receiver.spans) == 9)
    _root_events_as_triton_names_them(receiver.of(grpc_trace), "GRPC")
    (other,) = {s["trace_id"] for s in receiver.spans} - {http_trace, grpc_trace}
    _root_events_as_triton_names_them(receiver.of(other), "GRPC")


def test_rate_samples_and_a_propagated_context_is_always_traced(tmp_path: Path, start_server,
                                                                 receiver: Receiver) -> None:
    pipeline(tmp_path)
    server = start_server(tmp_path, flags=_flags(receiver, rate=3))
    settings = httpclient.InferenceServerClient(server.url).get_trace_settings()
    assert settings["trace_mode"] == "opentelemetry" and settings["trace_rate"] == "3"
    for _ in range(6):  # requests 3 and 6 are sampled
        _http_infer(server, "inc")
    header, trace_id, _ = _traceparent()
    _http_infer(server, "inc", {"traceparent": header})  # the 7th: not on the rate, traced for its context
    assert server.stop() == 0  # shutdown exports every span still held
    roots = [s for s in receiver.spans if s["name"] == "InferRequest"]
    assert len(roots) == 3
    assert sum(s["trace_id"] == trace_id for s in roots) == 1
    assert sum(s["name"] == "inc" for s in receiver.spans) == 3


CALLER_PY = """
import triton_python_backend_utils as pb_utils

def bls(request, model, **trace):
    x = pb_utils.get_input_tensor_by_name(request, "X")
    return pb_utils.InferenceRequest(model_name=model, inputs=[x], requested_output_names=["Y"], **trace).exec()

class TritonPythonModel:
    def execute(self, requests):
        answers = [(bls(r, "inc", trace=r.trace()), bls(r, "dbl")) for r in requests]  # dbl: not traced
        return [pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(a, "Y")]) for a, _ in answers]
"""


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_bls_calls_given_the_trace_are_children_of_the_callers_compute_span(tmp_path: Path, start_server,
                                                                           receiver: Receiver, isolated: bool) -> None:
    """As Triton: a BLS request built with ``trace=request.trace()`` is a child trace whose model span
    hangs from the caller's compute span; one built without it is not traced. The same from a model in a
    process of its own (the trace crosses as a token its BLS request brings back)."""
    from .server import add_model

    pipeline(tmp_path)
    add_model(tmp_path, "caller", _arith_config({"role": "caller"}), CALLER_PY)
    isolation = ("--backend-config=python,isolation=process",) if isolated else ()
    server = start_server(tmp_path, flags=(*_flags(receiver, rate=1), *isolation))
    header, trace_id, client_span = _traceparent()
    _http_infer(server, "caller", {"traceparent": header})

    def mine() -> list[dict]:
        return [s for s in receiver.spans if s["trace_id"] == trace_id]
    receiver.wait_for(lambda: len(mine()) == 5)  # InferRequest, caller, its compute, inc, inc's compute
    by_name: dict[str, list[dict]] = {}
    for s in mine():
        by_name.setdefault(s["name"], []).append(s)
    (root,), (caller,), (inc,) = by_name["InferRequest"], by_name["caller"], by_name["inc"]
    computes = {c["parent"]: c for c in by_name["compute"]}
    assert set(by_name) == {"InferRequest", "caller", "inc", "compute"} and root["parent"] == client_span
    assert caller["parent"] == root["span_id"] and set(computes) == {caller["span_id"], inc["span_id"]}
    caller_compute = computes[caller["span_id"]]
    assert inc["parent"] == caller_compute["span_id"]
    assert caller_compute["start"] <= inc["start"] <= inc["end"] <= caller_compute["end"]
    assert inc["attrs"]["triton.trace_parent_id"] == caller["attrs"]["triton.trace_id"] != inc["attrs"]["triton.trace_id"]
    assert "triton.request_id" not in inc["attrs"]  # the BLS request has no id
    assert server.stop() == 0  # every span exported: the untraced call made none
    assert not [s for s in receiver.spans if s["name"] == "dbl"]


REPEAT_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            sender = r.get_response_sender()
            for i in range(3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + i)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def _stream(server: ServerProcess, model: str, count: int, answers: int, headers: dict[str, str]) -> None:
    """``count`` requests for ``model`` on one ModelStreamInfer stream, each answered ``answers`` times."""
    import queue

    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error or result), headers=headers)
    try:
        for _ in range(count):
            x = grpcclient.InferInput("X", [1, 2], "FP32")
            x.set_data_from_numpy(np.ones((1, 2), np.float32))
            client.async_stream_infer(model, [x])
            for _ in range(answers):
                assert not isinstance(got.get(timeout=30), Exception)
    finally:
        client.stop_stream()
        client.close()


def test_stream_requests_have_the_wire_events_triton_stamps_on_streams(tmp_path: Path, start_server,
                                                                       receiver: Receiver) -> None:
    """ModelStreamInfer, as Triton's ModelStreamInferHandler stamps each request of a stream: its read's
    GRPC_WAITREAD_START/_END, INFER_RESPONSE_COMPLETE at its first response and a GRPC_SEND_START/_END
    pair per response sent (three for the decoupled model); the span ends with its last send."""
    from .server import add_model

    pipeline(tmp_path)
    add_model(tmp_path, "repeat", _arith_config({}, "model_transaction_policy { decoupled: true }"), REPEAT_PY)
    server = start_server(tmp_path, flags=_flags(receiver, rate=1))
    header, trace_id, client_span = _traceparent()
    _stream(server, "inc", 2, 1, {"traceparent": header})
    _stream(server, "repeat", 1, 3, {})
    receiver.wait_for(lambda: len(receiver.spans) == 9)  # three requests: InferRequest, model, compute each
    roots = sorted((s for s in receiver.spans if s["name"] == "InferRequest"), key=lambda s: s["start"])
    first, second, decoupled = roots
    assert first["trace_id"] == second["trace_id"] == trace_id and first["parent"] == second["parent"] == client_span
    read = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE"]
    for root, sends in ((first, 1), (second, 1), (decoupled, 3)):
        assert root["events"] == read + ["GRPC_SEND_START", "GRPC_SEND_END"] * sends
        assert root["event_ns"] == sorted(root["event_ns"]) and root["end"] == root["event_ns"][-1]
        (model,) = [s for s in receiver.spans if s["parent"] == root["span_id"]]
        assert root["event_ns"][1] <= model["start"] and model["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    # the second request's read began once the first was taken off the stream
    assert first["event_ns"][1] <= second["event_ns"][0] <= second["event_ns"][1]
