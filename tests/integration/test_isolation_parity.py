"""What an isolated Python model (``isolation=process``) does through ``pb_utils`` reaches the server as an
in-process model's does: custom metrics on ``/metrics`` with the same values, ``pb_utils.Logger`` lines in
the server log at the levels the server logs (runtime log settings included), a silent decoupled model
seeing its client leave. Each test runs on both; the other cancellation tests are in test_grpc_cancel.py. Real servers, the official tritonclient."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .bls_models import SQUARE_CONFIG
from .model_control import wait_for
from .server import add_model
from .test_metrics import scrape, value

ISOLATION = pytest.mark.parametrize("flags", [(), ("--backend-config=python,isolation=process",)],
                                    ids=["in_process", "isolated"])

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
"""

# every series kind; two instances share each series (as in-process threads do)
COUNTING_PY = """
import threading
import triton_python_backend_utils as pb_utils

MARK = {mark!r}

class TritonPythonModel:
    def initialize(self, args):
        self.total = pb_utils.MetricFamily("parity_total", "a counter", pb_utils.MetricFamily.COUNTER).Metric(
            labels={{"model": "counting"}})
        self.level = pb_utils.MetricFamily("parity_level", "a gauge set", pb_utils.MetricFamily.GAUGE).Metric()
        self.depth = pb_utils.MetricFamily("parity_depth", "a gauge added to", pb_utils.MetricFamily.GAUGE).Metric()
        self.size = pb_utils.MetricFamily("parity_size", "a histogram", pb_utils.MetricFamily.HISTOGRAM).Metric(
            buckets=[1.0, 10.0])
        self.late = pb_utils.MetricFamily("parity_late", "after execute", pb_utils.MetricFamily.COUNTER).Metric()

    def execute(self, requests):
        out = []
        for r in requests:
            x = float(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0])
            if x < 0:  # updated by a thread once execute returned: only a flush at the scrape carries it
                threading.Thread(target=self._late, args=(-x,)).start()
            else:
                self.total.increment(x)
                self.level.set(x)
                self.level.increment(0.5)
                self.depth.increment(1)
                self.size.observe(x)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
                r, "INPUT0").as_numpy())]))
        return out

    def _late(self, amount):
        self.late.increment(amount)
        with open(MARK, "w") as f:
            f.write("done")
"""

LOGGING_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        x = int(pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()[0])
        pb_utils.Logger.log_info(f"parity info {x}")
        pb_utils.Logger.log_warn(f"parity warning {x}")
        pb_utils.Logger.log_error(f"parity error {x}")
        pb_utils.Logger.log_verbose(f"parity verbose {x}")
        pb_utils.Logger.log(f"parity leveled {x}", pb_utils.Logger.WARNING)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
"""


def _infer(client: httpclient.InferenceServerClient, model: str, x: float) -> None:
    i = httpclient.InferInput("INPUT0", [1], "FP32")
    i.set_data_from_numpy(np.array([x], np.float32))
    assert client.infer(model, [i]).as_numpy("OUTPUT0").tolist() == [x]


@ISOLATION
def test_custom_metrics_reach_the_metrics_endpoint(tmp_path: Path, start_server: Any, flags: tuple[str, ...]) -> None:
    mark = tmp_path / "late.done"
    repo = tmp_path / "repo"
    add_model(repo, "counting", CONFIG.format(name="counting", count=2), COUNTING_PY.format(mark=str(mark)))
    server = start_server(repo, flags=flags)
    values = [0.5, 2.0, 3.0, 20.0, 4.0]
    with httpclient.InferenceServerClient(server.url, concurrency=4) as client:
        for x in values:
            _infer(client, "counting", x)
        text = scrape(server)
        assert "# TYPE parity_total counter" in text and "# HELP parity_total a counter" in text
        assert value(text, "parity_total", model="counting") == sum(values)
        assert value(text, "parity_level") == 4.5  # the last request's set(4.0), then +0.5
        assert value(text, "parity_depth") == len(values)  # both instances' increments add up
        assert [value(text, "parity_size_bucket", le=le) for le in ("1.0", "10.0", "+Inf")] == [1, 4, 5]
        assert value(text, "parity_size_count") == 5 and value(text, "parity_size_sum") == sum(values)
        assert value(text, "parity_late") == 0
        _infer(client, "counting", -7.0)
        wait_for(mark.exists, what="the model's thread to update its counter")
        assert value(scrape(server), "parity_late") == 7.0


@ISOLATION
def test_logger_lines_reach_the_server_log(tmp_path: Path, start_server: Any, flags: tuple[str, ...]) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "logging", CONFIG.format(name="logging", count=1), LOGGING_PY)
    server = start_server(repo, flags=flags)
    with httpclient.InferenceServerClient(server.url) as client:
        _infer(client, "logging", 1)
        wait_for(lambda: "parity leveled 1" in server.log(), what="the model's log lines")
        log = server.log()
        for line in ("I", "parity info 1"), ("W", "parity warning 1"), ("E", "parity error 1"), ("W", "parity leveled 1"):
            assert any(t.startswith(line[0]) and t.endswith(line[1]) for t in log.splitlines()), line
        assert "parity verbose 1" not in log  # verbose is off
        client.update_log_settings({"log_verbose_level": 1})  # at run time: the model's process follows
        _infer(client, "logging", 2)
        wait_for(lambda: "parity leveled 2" in server.log(), what="the model's log lines")
        assert "parity verbose 2" in server.log()
        client.update_log_settings({"log_verbose_level": 0, "log_info": False})
        _infer(client, "logging", 3)
        wait_for(lambda: "parity leveled 3" in server.log(), what="the model's log lines")
        assert "parity info 3" not in server.log() and "parity verbose 3" not in server.log()


# decoupled, silent: waits (bounded) until its client goes away, without sending anything meanwhile
SILENT_PY = """
import time
import triton_python_backend_utils as pb_utils

LOG = {log!r}

class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        with open(LOG, "a") as f:
            f.write("running\\n")
        deadline = time.monotonic() + 30
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)  # model code polling is_cancelled()
        with open(LOG, "a") as f:
            f.write("cancelled\\n" if request.is_cancelled() else "not cancelled\\n")
        request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


@ISOLATION
def test_a_silent_decoupled_model_sees_its_client_leave(tmp_path: Path, start_server: Any,
                                                        flags: tuple[str, ...]) -> None:
    """In-process, a decoupled request's ``is_cancelled()`` turns true when its stream is cancelled, whether or
    not the model sends anything; an isolated model's too (the server tells its process at once)."""
    log = tmp_path / "model.log"
    repo = tmp_path / "repo"
    add_model(repo, "square", SQUARE_CONFIG, SILENT_PY.format(log=str(log)))
    server = start_server(repo, flags=flags)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    try:
        i = grpcclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([1], np.int32))
        client.async_stream_infer("square", [i])
        wait_for(lambda: log.exists() and log.read_text() == "running\n", what="the request to run")
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    wait_for(lambda: log.read_text().count("\n") == 2, what="the model to finish", timeout=40)
    assert log.read_text() == "running\ncancelled\n", "the model never saw is_cancelled()"
