"""One request memory budget for all connections (docs/security.md: a thousand connections each within its
own bounds still add up). The model holds the first request (value 1) until a gate file appears and logs
what it runs; two instances, so without the budget a second request would run beside the first."""

from __future__ import annotations

import http.client
import queue
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from .model_control import wait_for
from .server import add_gated_model

N = 100_000  # 400 KB of FP32 per request; the budget below holds one such request, not two
BUDGET = ("--request-memory-budget", str(600_000))


def _server(tmp_path: Path, start_server, *flags: str):
    log, gate = tmp_path / "executions.log", tmp_path / "gate"
    add_gated_model(tmp_path / "repo", "held", log, gate, dims="-1", count=2)
    return start_server(tmp_path / "repo", flags=flags), log, gate


def _binary_body(value: float) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [N], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 4 * N}}]})
    data = np.full(N, value, dtype=np.float32).tobytes()
    return header + data, {"Inference-Header-Content-Length": str(len(header)),
                           "Content-Type": "application/octet-stream"}


def _start_post(url: str, value: float) -> http.client.HTTPConnection:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body, headers = _binary_body(value)
    conn.request("POST", "/v2/models/held/infer", body, headers)
    return conn


def test_an_http_body_waits_while_the_budget_is_spent(tmp_path: Path, start_server) -> None:
    server, log, gate = _server(tmp_path, start_server, *BUDGET)
    try:
        first = _start_post(server.url, 1.0)
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        second = _start_post(server.url, 2.0)  # sent whole; the server leaves it in the socket
        probe = grpcclient.InferenceServerClient(server.grpc_url)
        for _ in range(20):  # round trips through the server's hub: it has seen the second request's head
            assert probe.is_server_live()
        probe.close()
        assert log.read_text() == "1.0\n", "the second request ran while the first held the budget"
        gate.write_text("open")
        answers = [conn.getresponse() for conn in (first, second)]
        assert [a.status for a in answers] == [200, 200]
        assert [orjson.loads(a.read())["outputs"][0]["data"][-1] for a in answers] == [1.0, 2.0]
        assert log.read_text() == "1.0\n2.0\n"
    finally:
        gate.write_text("open")


def test_an_http_body_that_waits_past_the_body_timeout_is_503(tmp_path: Path, start_server) -> None:
    server, log, gate = _server(tmp_path, start_server, *BUDGET, "--http-body-timeout-secs", "1")
    try:
        first = _start_post(server.url, 1.0)
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        second = _start_post(server.url, 2.0).getresponse()
        assert second.status == 503
        assert "request memory budget 600000" in orjson.loads(second.read())["error"]
        gate.write_text("open")
        assert first.getresponse().status == 200
    finally:
        gate.write_text("open")


def test_a_grpc_message_past_the_spent_budget_is_resource_exhausted(tmp_path: Path, start_server) -> None:
    server, log, gate = _server(tmp_path, start_server, *BUDGET)
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def inputs(value: float) -> list[grpcclient.InferInput]:
        x = grpcclient.InferInput("INPUT0", [N], "FP32")
        x.set_data_from_numpy(np.full(N, value, dtype=np.float32))
        return [x]

    try:
        first = _start_post(server.url, 1.0)  # HTTP and gRPC draw on one budget
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        with pytest.raises(InferenceServerException) as refused:
            client.infer("held", inputs(2.0))
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "request memory budget 600000" in refused.value.message()
        gate.write_text("open")
        assert first.getresponse().status == 200
        result = client.infer("held", inputs(3.0))  # the budget is free again
        assert result.as_numpy("OUTPUT0")[-1] == 3.0
        assert log.read_text() == "1.0\n3.0\n"
    finally:
        gate.write_text("open")
        client.close()


def test_a_stream_request_holds_the_budget_until_it_is_answered(tmp_path: Path, start_server) -> None:
    """A ModelStreamInfer request gave its bytes back once the stream's greenlet took it from the inbox,
    while it still waited for the model: a stream sending faster than the model answers took all the
    memory it wanted (200 requests of 400 KB: +131 MB of RSS with a 2 MB budget). Now a stream's
    request holds them until answered, as an HTTP or unary one does: the second request does not fit
    beside the first, and the stream ends RESOURCE_EXHAUSTED; once the first is over, a new stream fits."""
    server, log, gate = _server(tmp_path, start_server, *BUDGET)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()

    def inputs(value: float) -> list[grpcclient.InferInput]:
        x = grpcclient.InferInput("INPUT0", [N], "FP32")
        x.set_data_from_numpy(np.full(N, value, dtype=np.float32))
        return [x]

    try:
        client.start_stream(lambda result, error: results.put((result, error)))
        client.async_stream_infer("held", inputs(1.0))
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        client.async_stream_infer("held", inputs(2.0))  # before: it ran beside the first (two instances)
        result, error = results.get(timeout=30)
        assert result is None and error.status() == "StatusCode.RESOURCE_EXHAUSTED", (result, error)
        assert "request memory budget 600000" in error.message()
        client.stop_stream()
        gate.write_text("open")
        client.start_stream(lambda result, error: results.put((result, error)))
        client.async_stream_infer("held", inputs(3.0))
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0")[-1] == 3.0
        client.stop_stream()
        assert log.read_text() == "1.0\n3.0\n"
    finally:
        gate.write_text("open")
        client.close()


def test_a_client_that_never_reads_its_answer_is_dropped_and_frees_what_it_held(tmp_path: Path, start_server) -> None:
    """A client that never reads held its answer (and, now, its request's budget) for ever;
    a write that makes no progress for --http-send-timeout-secs drops the connection, as nginx does."""
    import socket

    big = 4 * 1024 * 1024  # 16 MB of FP32 each way: more than the socket buffers hold
    server, log, gate = _server(tmp_path, start_server, "--request-memory-budget", str(20_000_000),
                                "--http-send-timeout-secs", "1", "--http-body-timeout-secs", "30",
                                "--http-max-input-size", str(32_000_000))
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [big], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 4 * big}}],
                           "parameters": {"binary_data_output": True}})
    host, port = server.url.split(":")
    gate.write_text("open")
    with socket.socket() as stuck:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect((host, int(port)))
        stuck.sendall(b"POST /v2/models/held/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                      b"Inference-Header-Content-Length: " + str(len(header)).encode() + b"\r\n"
                      b"Content-Length: " + str(len(header) + 4 * big).encode() + b"\r\n\r\n" + header
                      + np.full(big, 2.0, dtype=np.float32).tobytes())  # and never reads
        wait_for(lambda: log.exists() and log.read_text() == "2.0\n", what="the stuck client's request to run")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v2/models/held/infer", header + np.full(big, 3.0, dtype=np.float32).tobytes(),
                     {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
        answer = conn.getresponse()  # waits for the budget the stuck client held until it was dropped
        assert answer.status == 200, answer.read()[:300]
        answer.read()
        assert log.read_text() == "2.0\n3.0\n"
