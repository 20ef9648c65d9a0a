"""A gRPC ModelInfer the client cancels while it waits in the queue is never run (a reset must
stop the work it cancels). The model runs one request at a time and holds the first until a gate file
appears; every execution is logged to a file the test reads. No sleeps: the test waits on the log.
Every test runs twice: the Python model in-process, and in a process of its own (``isolation=process``:
Triton runs every Python model in a stub process, and cancellation reaches it there too)."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .model_control import wait_for
from .server import add_gated_model, add_model

# the server's flags: the Python models in-process, or each in a process of its own
ISOLATION = pytest.mark.parametrize("flags", [(), ("--backend-config=python,isolation=process",)],
                                    ids=["in_process", "isolated"])


def _input(value: float) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], dtype=np.float32))
    return [x]


def _gated_server(tmp_path: Path, start_server, flags: tuple[str, ...]) -> tuple[Path, Path, Any, Any]:
    """A server with the one-at-a-time ``gated`` model: its executions log, its gate, the server, a gRPC client."""
    log, gate = tmp_path / "executions.log", tmp_path / "gate"
    repo = tmp_path / "repo"
    add_gated_model(repo, "gated", log, gate)
    server = start_server(repo, flags=flags)
    return log, gate, server, grpcclient.InferenceServerClient(server.grpc_url)


@ISOLATION
def test_a_cancelled_queued_call_is_never_run(tmp_path: Path, start_server, flags: tuple[str, ...]) -> None:
    log, gate, _server, client = _gated_server(tmp_path, start_server, flags)
    answers: queue.Queue = queue.Queue()
    try:
        client.async_infer("gated", _input(1.0), callback=lambda result, error: answers.put(("first", result, error)))
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        second = client.async_infer("gated", _input(2.0), callback=lambda result, error: answers.put(("second", result, error)))
        assert client.is_server_live()  # the second call's HEADERS went first on this connection: it is queued
        second.cancel()  # RST_STREAM
        assert client.is_server_live()  # the server read the RST_STREAM before answering this
        gate.write_text("open")
        got = dict((name, (result, error)) for name, result, error in (answers.get(timeout=10) for _ in range(2)))
        assert got["second"][1] is not None, "the cancelled call was answered"
        result, error = got["first"]
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [1.0]
        third = client.infer("gated", _input(3.0))  # runs after anything still queued
        assert third.as_numpy("OUTPUT0").tolist() == [3.0]
        assert log.read_text() == "1.0\n3.0\n", "the cancelled request ran"
    finally:
        gate.write_text("open")
        client.close()


@ISOLATION
def test_an_http_client_that_disconnects_cancels_its_queued_request(tmp_path: Path, start_server, flags: tuple[str, ...]) -> None:
    """The HTTP side of the same rule: a client that closes its connection while its /infer waits in the
    queue cancels it, whether the server read the request before or after the close."""
    import socket

    import orjson
    import tritonclient.http as httpclient

    log, gate = tmp_path / "executions.log", tmp_path / "gate"
    repo = tmp_path / "repo"
    add_gated_model(repo, "gated", log, gate)
    server = start_server(repo, flags=flags)
    client = httpclient.InferenceServerClient(server.url, concurrency=2)
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    try:
        first = client.async_infer("gated", [x])
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [2.0]}]})
        host, port = server.url.split(":")
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(b"POST /v2/models/gated/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            for _ in range(5):  # round trips through the server's hub: it has read and queued the request
                assert client.is_server_live()
        # closed while queued: the answer could not be delivered any more
        for _ in range(5):
            assert client.is_server_live()
        gate.write_text("open")
        assert first.get_result().as_numpy("OUTPUT0").tolist() == [1.0]
        x.set_data_from_numpy(np.array([3.0], dtype=np.float32))
        assert client.infer("gated", [x]).as_numpy("OUTPUT0").tolist() == [3.0]
        assert log.read_text() == "1.0\n3.0\n", "the request of the client that left ran"
    finally:
        gate.write_text("open")
        client.close()


WATCHER_CONFIG = """
name: "watcher"
backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

WATCHER = """
import time
import triton_python_backend_utils as pb_utils

LOG = {log!r}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            with open(LOG, "a") as f:
                f.write("running\\n")
            deadline = time.monotonic() + 30  # bounded: a request never cancelled ends the wait
            while not r.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)  # model code polling is_cancelled()
            with open(LOG, "a") as f:
                f.write("cancelled\\n" if r.is_cancelled() else "not cancelled\\n")
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


@ISOLATION
def test_a_grpc_call_cancelled_while_it_runs_is_cancelled_for_the_model(tmp_path: Path, start_server, flags: tuple[str, ...]) -> None:
    """A gRPC call the client cancels while the model runs makes ``request.is_cancelled()``
    true (the model stops early), and the client sees CANCELLED."""
    import tritonclient.utils

    log = tmp_path / "executions.log"
    repo = tmp_path / "repo"
    add_model(repo, "watcher", WATCHER_CONFIG, WATCHER.format(log=str(log)))
    server = start_server(repo, flags=flags)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    try:
        call = client.async_infer("watcher", _input(1.0), callback=lambda result, error: answers.put((result, error)))
        wait_for(lambda: log.exists() and log.read_text() == "running\n", what="the request to run")
        call.cancel()
        result, error = answers.get(timeout=10)
        assert result is None and isinstance(error, tritonclient.utils.InferenceServerException)
        assert error.status() == "StatusCode.CANCELLED", error
        wait_for(lambda: log.read_text().count("\n") == 2, what="the model to finish", timeout=40)
        assert log.read_text() == "running\ncancelled\n", "the model never saw is_cancelled()"
    finally:
        client.close()


@ISOLATION
def test_an_http_client_that_leaves_while_its_request_runs_cancels_it(tmp_path: Path, start_server, flags: tuple[str, ...]) -> None:
    """The HTTP side: closing the connection while the model runs makes ``request.is_cancelled()`` true."""
    import socket

    import orjson

    log = tmp_path / "executions.log"
    repo = tmp_path / "repo"
    add_model(repo, "watcher", WATCHER_CONFIG, WATCHER.format(log=str(log)))
    server = start_server(repo, flags=flags)
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [2.0]}]})
    host, port = server.url.split(":")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(b"POST /v2/models/watcher/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_for(lambda: log.exists() and log.read_text() == "running\n", what="the request to run")
    wait_for(lambda: log.read_text().count("\n") == 2, what="the model to finish", timeout=40)
    assert log.read_text() == "running\ncancelled\n", "the model never saw is_cancelled()"


@ISOLATION
def test_a_raw_clients_grpc_timeout_cancels_its_call(tmp_path: Path, start_server, flags: tuple[str, ...]) -> None:
    """``grpc-timeout`` from a hand-made client (grpcio's clients cancel on their own deadline; this one
    never does): the queued call ends DEADLINE_EXCEEDED at its deadline, while the model is still busy,
    and is never run (a grpc-core server, Triton's, cancels the call there)."""
    import hpack
    from tritonclient.grpc import service_pb2 as pb

    from .test_grpc_transport import _PREFACE, _connect, _frame, _read_frames

    log, gate, server, client = _gated_server(tmp_path, start_server, flags)
    answers: queue.Queue = queue.Queue()
    request = pb.ModelInferRequest(model_name="gated")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([2.0], np.float32).tobytes())
    message = request.SerializeToString()
    block = hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":authority", "x"),
        (":path", "/inference.GRPCInferenceService/ModelInfer"), ("content-type", "application/grpc"),
        ("te", "trailers"), ("grpc-timeout", "300m")])
    try:
        client.async_infer("gated", _input(1.0), callback=lambda result, error: answers.put((result, error)))
        wait_for(lambda: log.exists() and log.read_text() == "1.0\n", what="the first request to run")
        with _connect(server) as sock:
            sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, block)
                         + _frame(0, 1, 1, b"\0" + len(message).to_bytes(4, "big") + message))
            frames = _read_frames(sock, until=1, flags=1, timeout=20)  # the trailers, with the gate shut
        trailers = [dict(hpack.Decoder().decode(p)) for t, f, sid, p in frames if t == 1 and f & 1 and sid == 1]
        assert trailers and trailers[-1].get("grpc-status") == "4", trailers
        assert log.read_text() == "1.0\n"
        gate.write_text("open")
        result, error = answers.get(timeout=10)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [1.0]
        third = client.infer("gated", _input(3.0))
        assert third.as_numpy("OUTPUT0").tolist() == [3.0]
        assert log.read_text() == "1.0\n3.0\n", "the call past its deadline ran"
    finally:
        gate.write_text("open")
        client.close()
