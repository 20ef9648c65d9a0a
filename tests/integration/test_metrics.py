"""Prometheus ``/metrics`` on a real server: exact counts and labels after known traffic (tritonclient over
HTTP and gRPC), failures by reason, pending requests while a gated model holds them, Triton's custom-metrics
example, and the StatsD push read back from a real carbon's whisper files."""

from __future__ import annotations

import queue
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .graphite import Graphite
from .model_control import wait_for
from .server import add_gated_model, add_model
from .test_batching import GATED_PY, _call, _config, _hold_one
from .test_grpc_cancel import _input

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

ECHO_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""
ECHO_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 2 ] } ]
"""


def scrape(server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        out[(m.group(1), frozenset(_LABEL.findall(m.group(2) or "")))] = float(m.group(3))
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset(labels.items()))]


def _infer(client, mod, rows: int, fill: float = 1.0):
    x = mod.InferInput("INPUT0", [rows, 2], "FP32")
    x.set_data_from_numpy(np.full((rows, 2), fill, np.float32))
    return client.infer("echo", [x])


def test_counts_and_labels_after_known_traffic(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "echo", ECHO_CONFIG, ECHO_PY)
    server = start_server(tmp_path)
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for rows in (1, 1, 1, 4):
            _infer(http, httpclient, rows)
        for _ in range(2):
            _infer(grpc, grpcclient, 1)
        with pytest.raises(InferenceServerException, match="negative input"):
            _infer(http, httpclient, 3, -1.0)
    finally:
        http.close()
        grpc.close()
    text = scrape(server)
    m = {"model": "echo", "version": "1"}
    assert value(text, "nv_inference_request_success", **m) == 6  # requests, not batch elements
    assert value(text, "nv_inference_count", **m) == 9  # elements of the successful requests: 3 + 4 + 2
    assert value(text, "nv_inference_exec_count", **m) == 7  # the failed request executed too
    failures = {r: value(text, "nv_inference_request_failure", **m, reason=r)
                for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert value(text, "nv_inference_pending_request_count", **m) == 0
    assert value(text, "nv_inference_request_duration_us", **m) > 0
    assert value(text, "nv_inference_compute_infer_duration_us", **m) > 0
    assert value(text, "nv_model_load_duration_secs", **m) > 0
    assert 0 <= value(text, "nv_cpu_utilization") <= 1
    assert 0 < value(text, "nv_cpu_memory_used_bytes") < value(text, "nv_cpu_memory_total_bytes")
    # Triton's (prometheus-cpp's) shape: counter families without the _total suffix
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert "# TYPE nv_inference_pending_request_count gauge\n" in text
    assert not re.search(r"_total[ {]", text)


def test_pending_while_a_gated_model_holds_requests_and_rejections(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "gated", _config("default_queue_policy { max_queue_size: 2 }"), GATED_PY)
    server = start_server(tmp_path)
    m = {"model": "gated", "version": "1"}
    first = _hold_one(server, model_dir, "gated")  # executing: not pending
    queued = [gevent.spawn(_call, server.url, "gated", float(i)) for i in range(2)]
    with gevent.Timeout(30, AssertionError("the two requests never showed as pending")):
        while value(scrape(server), "nv_inference_pending_request_count", **m) != 2:
            gevent.sleep(0.05)  # polling the metrics under a deadline
    with pytest.raises(InferenceServerException, match="Exceeds maximum queue size"):
        _call(server.url, "gated", 5.0)
    (model_dir / "gate").touch()
    gevent.joinall([first, *queued], timeout=60, raise_error=True)
    text = scrape(server)
    assert value(text, "nv_inference_pending_request_count", **m) == 0
    assert value(text, "nv_inference_request_success", **m) == 3
    assert value(text, "nv_inference_request_failure", **m, reason="REJECTED") == 1
    assert value(text, "nv_inference_request_failure", **m, reason="BACKEND") == 0


# Triton's python_backend/examples/custom_metrics, reproduced: the same config (3 instances) and the same
# use of the API (a COUNTER family created by every instance, one labelled series, incremented by the
# processing time of each execute(), read back with value()).
CUSTOM_METRICS_CONFIG = """
name: "custom_metrics"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 3 kind: KIND_CPU } ]
"""
CUSTOM_METRICS_PY = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        self.out0_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(model_config, "OUTPUT0")["data_type"])
        self.out1_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(model_config, "OUTPUT1")["data_type"])
        self.metric_family = pb_utils.MetricFamily(
            name="requests_process_latency_ns",
            description="Cumulative time spent processing requests",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.metric = self.metric_family.Metric(labels={"model": "custom_metrics", "version": "1"})

    def execute(self, requests):
        responses = []
        start_ns = time.time_ns()
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = in_0.as_numpy() + in_1.as_numpy(), in_0.as_numpy() - in_1.as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", out_0.astype(self.out0_dtype)),
                pb_utils.Tensor("OUTPUT1", out_1.astype(self.out1_dtype)),
            ]))
        end_ns = time.time_ns()
        self.metric.increment(end_ns - start_ns)
        pb_utils.Logger.log_info("Cumulative requests processing latency: {}".format(self.metric.value()))
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

SHAPES_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.gauge = pb_utils.MetricFamily("demo_queue_depth", "a gauge", pb_utils.MetricFamily.GAUGE).Metric(
            labels={"stage": "pre"})
        self.hist = pb_utils.MetricFamily("demo_size", "a histogram", pb_utils.MetricFamily.HISTOGRAM).Metric(
            buckets=[1.0, 10.0])

    def execute(self, requests):
        self.gauge.set(7)
        for v in (0.5, 5, 50):
            self.hist.observe(v)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
"""


def test_triton_custom_metrics_example(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "custom_metrics", CUSTOM_METRICS_CONFIG, CUSTOM_METRICS_PY)
    add_model(tmp_path, "echo", ECHO_CONFIG, SHAPES_PY)
    server = start_server(tmp_path)
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    with httpclient.InferenceServerClient(server.url) as client:  # what the example's client.py does
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        response = client.infer("custom_metrics", inputs, request_id="1", outputs=[
            httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")])
        np.testing.assert_allclose(response.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_allclose(response.as_numpy("OUTPUT1"), a - b)
        _infer(client, httpclient, 1)
    text = scrape(server)
    for pattern in ("# HELP requests_process_latency_ns Cumulative time spent processing requests",
                    "# TYPE requests_process_latency_ns counter",
                    'requests_process_latency_ns{model="custom_metrics",version="1"}'):
        assert pattern in text
    assert value(text, "requests_process_latency_ns", model="custom_metrics", version="1") > 0
    assert "# TYPE demo_queue_depth gauge" in text and value(text, "demo_queue_depth", stage="pre") == 7
    assert "# TYPE demo_size histogram" in text
    assert [value(text, "demo_size_bucket", le=le) for le in ("1.0", "10.0", "+Inf")] == [1, 2, 3]
    assert value(text, "demo_size_count") == 3 and value(text, "demo_size_sum") == 55.5


def test_metrics_off_and_unknown_paths(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "echo", ECHO_CONFIG, ECHO_PY)
    server = start_server(tmp_path)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.metrics_url.replace("/metrics", "/other"), timeout=30)
    assert e.value.code == 404
    off = start_server(tmp_path, flags=("--allow-metrics=false",))
    assert off.metrics_port is None and "Metrics Service" not in off.log()


@pytest.mark.host_tools
def test_statsd_push_reaches_graphite(tmp_path: Path, start_server) -> None:
    graphite = Graphite(tmp_path / "graphite")
    try:
        repo = tmp_path / "repo"
        add_model(repo, "echo.v2", ECHO_CONFIG, ECHO_PY)  # a dot in the name: sanitised to echo_v2
        server = start_server(repo, flags=("--statsd-host", "127.0.0.1", "--statsd-port", str(graphite.statsd_port),
                                           "--statsd-interval-ms", "200"))
        with httpclient.InferenceServerClient(server.url) as client:
            for rows in (1, 2, 3, 4, 5):
                x = httpclient.InferInput("INPUT0", [rows, 2], "FP32")
                x.set_data_from_numpy(np.ones((rows, 2), np.float32))
                client.infer("echo.v2", [x])
            x = httpclient.InferInput("INPUT0", [1, 2], "FP32")
            x.set_data_from_numpy(-np.ones((1, 2), np.float32))
            with pytest.raises(InferenceServerException):
                client.infer("echo.v2", [x])
        base = "stats.counters.triton.model.echo_v2.1"
        graphite.wait_for(f"{base}.request_success.count", lambda p: sum(p) == 5)
        graphite.wait_for(f"{base}.inference_count.count", lambda p: sum(p) == 15)
        graphite.wait_for(f"{base}.exec_count.count", lambda p: sum(p) == 6)
        graphite.wait_for(f"{base}.request_failure.BACKEND.count", lambda p: sum(p) == 1)
        graphite.wait_for("stats.timers.triton.model.echo_v2.1.request_duration_ms.mean", lambda p: p and max(p) > 0)
        graphite.wait_for("stats.gauges.triton.model.echo_v2.1.pending_request_count", lambda p: p and p[-1] == 0)
        graphite.wait_for("stats.gauges.triton.cpu_memory_total_bytes", lambda p: p and p[-1] > 0)
    finally:
        graphite.stop()


@pytest.mark.host_tools
def test_statsd_push_with_graphite_tags(tmp_path: Path, start_server) -> None:
    graphite = Graphite(tmp_path / "graphite")
    try:
        repo = tmp_path / "repo"
        add_model(repo, "echo.v2", ECHO_CONFIG, ECHO_PY)
        server = start_server(repo, flags=("--statsd-host", "127.0.0.1", "--statsd-port", str(graphite.statsd_port),
                                           "--statsd-interval-ms", "200", "--statsd-tags=true"))
        with httpclient.InferenceServerClient(server.url) as client:
            for fill in (1.0, 1.0, -1.0):
                x = httpclient.InferInput("INPUT0", [1, 2], "FP32")
                x.set_data_from_numpy(np.full((1, 2), fill, np.float32))
                try:
                    client.infer("echo.v2", [x])
                except InferenceServerException:
                    assert fill < 0
        graphite.wait_for("stats.counters.triton.request_success.count;model=echo.v2;version=1", lambda p: sum(p) == 2)
        graphite.wait_for("stats.counters.triton.request_failure.count;model=echo.v2;reason=BACKEND;version=1",
                          lambda p: sum(p) == 1)
    finally:
        graphite.stop()


def test_summaries_and_first_response_histogram_behind_their_switches(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "echo", ECHO_CONFIG, ECHO_PY)
    server = start_server(tmp_path, flags=("--metrics-config", "summary_latencies=true",
                                           "--metrics-config", "histogram_latencies=true",
                                           "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001",
                                           "--metrics-config", "counter_latencies=false"))
    with httpclient.InferenceServerClient(server.url) as client:
        for _ in range(5):
            _infer(client, httpclient, 1)
    text = scrape(server)
    m = {"model": "echo", "version": "1"}
    assert "# TYPE nv_inference_request_summary_us summary" in text
    assert value(text, "nv_inference_request_summary_us_count", **m) == 5
    p50 = value(text, "nv_inference_request_summary_us", **m, quantile="0.5")
    p99 = value(text, "nv_inference_request_summary_us", **m, quantile="0.99")
    assert 0 < p50 <= p99 <= value(text, "nv_inference_request_summary_us_sum", **m)
    assert value(text, "nv_inference_compute_infer_summary_us_count", **m) == 5
    assert "# TYPE nv_inference_first_response_histogram_ms histogram" in text
    assert value(text, "nv_inference_first_response_histogram_ms_bucket", **m, le="+Inf") == 5
    assert value(text, "nv_inference_first_response_histogram_ms_count", **m) == 5
    assert "nv_inference_request_duration_us" not in text  # counter_latencies=false


def test_no_summaries_by_default(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "echo", ECHO_CONFIG, ECHO_PY)
    server = start_server(tmp_path)
    text = scrape(server)
    assert "summary_us" not in text and "histogram_ms" not in text


def test_a_taken_metrics_port_stops_the_server_with_an_error(tmp_path: Path, start_server) -> None:
    add_model(tmp_path, "echo", ECHO_CONFIG, ECHO_PY)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = start_server(tmp_path, flags=("--metrics-port", str(taken.getsockname()[1])), wait=False)
        assert server.wait_exit(60) == 1  # as tritonserver: a port it cannot bind is fatal
    assert "failed to start" in server.log()


@pytest.mark.timeout(240)
def test_one_scrape_returns_the_host_totals_under_several_workers(tmp_path: Path) -> None:
    from .gunicorn_server import PID_CONFIG, PID_PY, Gunicorn, pid_infer, pids_seen

    repo = tmp_path / "repo"
    add_model(repo, "pid", PID_CONFIG, PID_PY.replace(
        "    def execute(self, requests):",
        "    def initialize(self, args):\n"
        "        self.m = pb_utils.MetricFamily('served', 'requests', pb_utils.MetricFamily.COUNTER).Metric()\n\n"
        "    def execute(self, requests):\n"
        "        self.m.increment(len(requests))"))
    g = Gunicorn("--model-repository", str(repo), workers=2)
    try:
        workers = set(g.wait_serving(2))
        assert pids_seen(g.url, workers) == workers  # both workers answered some requests
        for _ in range(20):
            pid_infer(g.url)
        url = f"http://127.0.0.1:{g.metrics_port}/metrics"
        scrapes = []
        for _ in range(6):  # fresh connections: the kernel hands them to either worker
            with urllib.request.urlopen(url, timeout=30) as r:
                scrapes.append(r.read().decode())
        stats = httpclient.InferenceServerClient(g.url).get_inference_statistics("pid")["model_stats"][0]
        total = stats["inference_stats"]["success"]["count"]
        assert total >= 22
        for text in scrapes:
            assert value(text, "nv_inference_request_success", model="pid", version="1") == total
            assert value(text, "served") == total  # the model's own counter, summed over the workers
    finally:
        assert g.stop() == 0


def test_a_call_cancelled_in_the_queue_counts_as_canceled(tmp_path: Path, start_server) -> None:
    log, gate = tmp_path / "executions.log", tmp_path / "gate"
    add_gated_model(tmp_path / "repo", "gated", log, gate)
    server = start_server(tmp_path / "repo")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    try:
        client.async_infer("gated", _input(1.0), callback=lambda result, error: answers.put(error))
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        second = client.async_infer("gated", _input(2.0), callback=lambda result, error: answers.put(error))
        assert client.is_server_live()  # the second call is queued behind the first
        second.cancel()
        assert client.is_server_live()  # the server read the RST_STREAM
        gate.write_text("open")
        [answers.get(timeout=10) for _ in range(2)]
        client.infer("gated", _input(3.0))  # runs after the cancelled one was dropped from the queue
    finally:
        gate.write_text("open")
        client.close()
    text = scrape(server)
    m = {"model": "gated", "version": "1"}
    assert value(text, "nv_inference_request_failure", **m, reason="CANCELED") == 1
    assert value(text, "nv_inference_request_success", **m) == 2


def test_an_http_request_whose_client_goes_away_in_the_queue_counts_as_canceled(tmp_path: Path, start_server) -> None:
    """A client that closes its HTTP connection while its request waits in the queue cancels it (never run):
    the front end watches the socket while a request waits (runtime/socket_io.py's PeerWatch)."""
    log, gate = tmp_path / "executions.log", tmp_path / "gate"
    add_gated_model(tmp_path / "repo", "gated", log, gate)
    server = start_server(tmp_path / "repo")
    client = httpclient.InferenceServerClient(server.url)
    m = {"model": "gated", "version": "1"}
    try:
        first = client.async_infer("gated", _http_input(1.0))
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        body = b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[2.0]}]}'
        host, port = server.url.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v2/models/gated/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_for(lambda: value(scrape(server), "nv_inference_pending_request_count", **m) == 1,
                     what="the second request queued")
        gate.write_text("open")
        assert first.get_result().as_numpy("OUTPUT0").tolist() == [1.0]
        assert client.infer("gated", _http_input(3.0)).as_numpy("OUTPUT0").tolist() == [3.0]
    finally:
        gate.write_text("open")
        client.close()
    assert log.read_text() == "1.0\n3.0\n"  # the second never ran
    text = scrape(server)
    assert value(text, "nv_inference_request_failure", **m, reason="CANCELED") == 1
    assert value(text, "nv_inference_request_success", **m) == 2


def _http_input(value: float) -> list[httpclient.InferInput]:
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], dtype=np.float32))
    return [x]
