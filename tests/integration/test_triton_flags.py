"""tritonserver flags with real behaviour here, through a real server: logging, metrics, load retries,
header forwarding, SO_REUSEPORT on the HTTP port, gRPC connection age; and a refused flag at start."""

from __future__ import annotations

import json
import queue
import re
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import hpack
import numpy as np
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .server import IDENTITY_CONFIG, ROOT, ServerProcess, add_model
from .test_grpc_transport import _PREFACE, _add_sub, _connect, _frame, _read_frames

Start = Callable[..., ServerProcess]

ECHO_PARAMS_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "PARAMS", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""

ECHO_PARAMS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", np.array([r.parameters()], dtype=object))])
                for r in requests]
"""

FAILS_ONCE_PY = """
import os
import triton_python_backend_utils as pb_utils

MARKER = {marker!r}

class TritonPythonModel:
    def initialize(self, args):
        if not os.path.exists(MARKER):
            open(MARKER, "w").close()
            raise RuntimeError("first load fails")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
"""

def _wait_for(path: Path, pattern: str, timeout: float = 60) -> re.Match[str]:
    """The log file's first match of ``pattern`` (the server writes no stderr with --log-file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, path.read_text() if path.exists() else "")
        if m:
            return m
        time.sleep(0.05)  # a file has no event to wait on
    raise AssertionError(f"'{pattern}' never logged:\n" + (path.read_text() if path.exists() else "(no file)"))


def test_log_file_format_and_switches_seed_v2_logging(start_server: Start, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    (tmp_path / "empty").mkdir()
    server = start_server(tmp_path / "empty", wait=False, flags=(
        f"--log-file={log}", "--log-format=ISO8601", "--log-warning=false", "--pinned-memory-pool-byte-size=0",
        "--backend-directory", "/opt/tritonserver/backends"))
    port = _wait_for(log, r"Started HTTPService at [^ ]+:(\d+)\n").group(1)
    _wait_for(log, "server is ready")
    settings = requests.get(f"http://127.0.0.1:{port}/v2/logging", timeout=10).json()
    assert settings == {"log_file": str(log), "log_info": True, "log_warning": False, "log_error": True,
                        "log_verbose_level": 0, "log_format": "ISO8601"}
    lines = log.read_text().splitlines()
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWEV] \d+ ", line) for line in lines if line[:1].isdigit())
    assert any(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ triton_actor\.server\] Started HTTPService", line)
               for line in lines)
    assert "--pinned-memory-pool-byte-size accepted for compatibility, no effect" in log.read_text()
    assert "--backend-directory accepted for compatibility, no effect: backends are built in" in log.read_text()
    assert "Started HTTPService" not in server.log()  # the log went to the file, not to stderr
    # the format changes at run time, through the same owner
    requests.post(f"http://127.0.0.1:{port}/v2/logging", json={"log_format": "default"}, timeout=10).raise_for_status()
    assert server.stop() == 0  # logs its shutdown, now in the default format
    assert re.search(r"\nI\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ triton_actor\.server\] shutting down", log.read_text())


def test_default_format_on_stderr(start_server: Start, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    server = start_server(tmp_path / "empty")
    assert re.search(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ triton_actor\.server\] Started HTTPService", server.log(), re.M)


def test_metrics_retry_headers_and_reuse_port(start_server: Start, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "echo_params", ECHO_PARAMS_CONFIG, ECHO_PARAMS_PY)
    add_model(repo, "fails_once", IDENTITY_CONFIG, FAILS_ONCE_PY.format(marker=str(tmp_path / "tried")))
    server = start_server(repo, flags=("--allow-cpu-metrics=false", "--model-load-retry-count=1",
                                       "--reuse-http-port=true", "--http-header-forward-pattern", "my_.*",
                                       "--grpc-header-forward-pattern", "(?-i)my_.*"))
    # --allow-cpu-metrics=false: no nv_cpu_* family; the model families are there
    text = requests.get(server.metrics_url, timeout=10).text
    assert "nv_inference_request_success" in text and "nv_cpu_" not in text
    # --model-load-retry-count=1: the first load failed, the retry loaded it
    assert (tmp_path / "tried").exists() and "retrying the load of 'fails_once' version 1" in server.log()
    with httpclient.InferenceServerClient(server.url) as c:
        assert c.is_model_ready("fails_once")
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([1.0], np.float32))
        result = c.infer("echo_params", [inp], parameters={"my_a": "body", "b": 2},
                         headers={"My_A": "header", "my_z": "z", "other": "o"})
        # case-insensitive on HTTP; the header wins over the body's parameter of the same name
        assert json.loads(result.as_numpy("PARAMS")[0]) == {"my_a": "header", "b": 2, "my_z": "z"}
    with grpcclient.InferenceServerClient(server.grpc_url) as g:
        inp = grpcclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([1.0], np.float32))
        result = g.infer("echo_params", [inp], headers={"my_x": "gx", "other": "o"})
        assert json.loads(result.as_numpy("PARAMS")[0]) == {"my_x": "gx"}
        streamed: queue.Queue = queue.Queue()
        g.start_stream(callback=lambda result, error: streamed.put(error or result), headers={"my_s": "s"})
        g.async_stream_infer("echo_params", [inp])
        item = streamed.get(timeout=30)
        g.stop_stream()
        assert json.loads(item.as_numpy("PARAMS")[0]) == {"my_s": "s"}  # ModelStreamInfer too
    # --reuse-http-port: a second socket with SO_REUSEPORT binds the same port
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", server.port))


def test_the_http_port_is_not_shared_without_the_flag(start_server: Start, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    server = start_server(tmp_path / "empty")
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            other.bind(("127.0.0.1", server.port))
            raise AssertionError("bound the HTTP port of a server started without --reuse-http-port")
        except OSError:
            pass


def test_an_old_grpc_connection_gets_goaway_and_is_closed(start_server: Start) -> None:
    server = start_server(ROOT / "model_repository", flags=("--grpc-max-connection-age=1500",
                                                            "--grpc-max-connection-age-grace=500"))
    with _connect(server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0))
        opened = time.monotonic()
        block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                        (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                        ("content-type", "application/grpc"), ("te", "trailers")])
        body = _add_sub().SerializeToString()
        sock.sendall(_frame(1, 4, 1, block) + _frame(0, 1, 1, struct.pack(">BI", 0, len(body)) + body))
        frames = _read_frames(sock, until=7, timeout=10)  # served, then GOAWAY at the age
        assert any(t == 1 and sid == 1 and f & 1 for t, f, sid, _ in frames)  # the call's trailers came first
        goaway = next(p for t, _, _, p in frames if t == 7)
        assert struct.unpack(">II", goaway[:8]) == (1, 0) and b"max_age" in goaway[8:]  # NO_ERROR, last stream 1
        assert time.monotonic() - opened >= 1.3
        sock.settimeout(10)
        while sock.recv(65536):  # then closed: no call runs, and the grace bounds it anyway
            pass
        assert time.monotonic() - opened < 5


def test_a_refused_flag_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    server = ServerProcess(tmp_path / "empty", flags=("--allow-sagemaker=true",))
    assert server.wait_exit(60) != 0
    assert "--allow-sagemaker=true is not supported" in server.log()
