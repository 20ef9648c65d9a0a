"""A gRPC ModelInfer the client cancels while it waits in the queue is never run (issue 14: a reset must
stop the work it cancels). The model runs one request at a time and holds the first until a gate file
appears; every execution is logged to a file the test reads. No sleeps: the test waits on the log."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from .model_control import wait_for
from .server import add_model

CONFIG = """
name: "gated"
backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

MODEL = """
import os
import time
import triton_python_backend_utils as pb_utils

LOG, GATE = {log!r}, {gate!r}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            with open(LOG, "a") as f:
                f.write(f"{{x[0]}}\\n")
            while x[0] == 1.0 and not os.path.exists(GATE):
                time.sleep(0.01)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def _input(value: float) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], dtype=np.float32))
    return [x]


def test_a_cancelled_queued_call_is_never_run(tmp_path: Path, start_server) -> None:
    log, gate = tmp_path / "executions.log", tmp_path / "gate"
    repo = tmp_path / "repo"
    add_model(repo, "gated", CONFIG, MODEL.format(log=str(log), gate=str(gate)))
    server = start_server(repo)
    client = grpcclient.InferenceServerClient(server.grpc_url)
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
