"""The dynamic batcher on a real server, seen from the official client and the statistics API.

The model is held at a gate (a file in its directory) so the tests decide when an instance is busy:
requests then queue, and the scheduler's decisions (batch sizes, timeouts, queue size, priorities)
show in the answers and in ``batch_stats`` without any timing assumptions beyond generous windows.
"""

from __future__ import annotations

from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .model_control import wait_queued
from .server import add_model

GATED_PY = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]
        self.executions = 0

    def execute(self, requests):
        open(os.path.join(self.dir, "running"), "w").close()
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(self.dir, "gate")) and time.time() < deadline:
            time.sleep(0.005)  # model code polling the test's gate file
        self.executions += 1
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            rows = (x.shape[0], 1)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x),
                pb_utils.Tensor("ORDER", np.full(rows, self.executions, np.int32)),
                pb_utils.Tensor("BATCH", np.full(rows, len(requests), np.int32)),
            ]))
        return responses
"""


def _config(batching: str) -> str:
    return f"""
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 2 ] }},
         {{ name: "ORDER", data_type: TYPE_INT32, dims: [ 1 ] }},
         {{ name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
dynamic_batching {{ {batching} }}
"""


def _call(url: str, model: str, value: float = 0.0, **kw: object) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    x = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.full((1, 2), value, np.float32))
    try:
        return client.infer(model, [x], **kw)
    finally:
        client.close()


def _wait_for(path: Path, timeout: float = 30) -> None:
    with gevent.Timeout(timeout, AssertionError(f"{path.name} never appeared")):
        while not path.exists():
            gevent.sleep(0.01)  # a file a model writes: polled under a deadline


def _stats(url: str, model: str) -> dict:
    client = httpclient.InferenceServerClient(url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def _hold_one(server, model_dir: Path, model: str) -> gevent.Greenlet:
    """Send one request and return once the (only) instance is inside execute, held at the gate."""
    first = gevent.spawn(_call, server.url, model, 9.0)
    _wait_for(model_dir / "running")
    return first


def test_preferred_size_goes_at_once_and_a_smaller_batch_after_the_delay(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "gated", _config("preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1000000"),
                          GATED_PY)
    (model_dir / "gate").touch()
    server = start_server(tmp_path)
    four = [gevent.spawn(_call, server.url, "gated", float(i)) for i in range(4)]
    gevent.joinall(four, timeout=60, raise_error=True)
    assert [int(g.value.as_numpy("BATCH")[0, 0]) for g in four] == [4, 4, 4, 4]  # one execution of the preferred 4
    for i, g in enumerate(four):  # each request got its own rows back
        np.testing.assert_array_equal(g.value.as_numpy("OUTPUT0"), np.full((1, 2), i, np.float32))
    two = [gevent.spawn(_call, server.url, "gated") for _ in range(2)]
    gevent.joinall(two, timeout=60, raise_error=True)  # below the preferred size: sent when the 1 s delay expires
    assert [int(g.value.as_numpy("BATCH")[0, 0]) for g in two] == [2, 2]
    stats = _stats(server.url, "gated")
    assert stats["inference_count"] == 6 and stats["execution_count"] == 2
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {2: 1, 4: 1}


def test_full_queue_is_refused_with_503_and_the_others_are_served(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "gated", _config("default_queue_policy { max_queue_size: 1 }"), GATED_PY)
    server = start_server(tmp_path)
    first = _hold_one(server, model_dir, "gated")
    queued = gevent.spawn(_call, server.url, "gated", 1.0)
    wait_queued(server.url, "gated", 1)  # the queue is full
    with pytest.raises(InferenceServerException) as e:
        _call(server.url, "gated", 2.0, request_id="too-many")
    assert e.value.status() == "503"
    assert "[request id: too-many] Exceeds maximum queue size" in e.value.message()
    (model_dir / "gate").touch()
    gevent.joinall([first, queued], timeout=60, raise_error=True)
    assert first.value.as_numpy("OUTPUT0")[0, 0] == 9.0 and queued.value.as_numpy("OUTPUT0")[0, 0] == 1.0


def test_queued_request_times_out_with_its_error_and_its_slot_is_freed(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "gated", _config(
        "default_queue_policy { default_timeout_microseconds: 200000 max_queue_size: 1 }"), GATED_PY)
    server = start_server(tmp_path)
    first = _hold_one(server, model_dir, "gated")
    with pytest.raises(InferenceServerException) as e:
        _call(server.url, "gated", 1.0)  # waits behind the held request until its 200 ms are up
    assert e.value.status() == "503" and "Request timeout expired" in e.value.message()
    late = gevent.spawn(_call, server.url, "gated", 2.0)  # the slot is free again
    wait_queued(server.url, "gated", 1)  # taken while the first request still holds the instance
    (model_dir / "gate").touch()
    gevent.joinall([first, late], timeout=60, raise_error=True)
    assert late.value.as_numpy("OUTPUT0")[0, 0] == 2.0
    stats = _stats(server.url, "gated")
    assert stats["inference_stats"]["fail"]["count"] == 1 and stats["inference_stats"]["success"]["count"] == 2


def test_request_priority_and_timeout_parameters(tmp_path: Path, start_server) -> None:
    model_dir = add_model(tmp_path, "gated", _config(
        "preferred_batch_size: [ 1 ] priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { allow_timeout_override: true default_timeout_microseconds: 60000000 }"),
        GATED_PY)  # preferred 1: one request per run; a request's timeout may shorten the 60 s default
    server = start_server(tmp_path)
    first = _hold_one(server, model_dir, "gated")
    normal = gevent.spawn(_call, server.url, "gated", 1.0)
    wait_queued(server.url, "gated", 1)  # normal came first
    urgent = gevent.spawn(_call, server.url, "gated", 2.0, priority=1)
    beyond = gevent.spawn(_call, server.url, "gated", 3.0, priority=7)  # outside the levels: the default, 2
    wait_queued(server.url, "gated", 3)
    with pytest.raises(InferenceServerException) as e:
        _call(server.url, "gated", 4.0, timeout=100_000)  # its own timeout: 100 ms
    assert "Request timeout expired" in e.value.message()
    (model_dir / "gate").touch()
    gevent.joinall([first, normal, urgent, beyond], timeout=60, raise_error=True)
    order = {name: int(g.value.as_numpy("ORDER")[0, 0]) for name, g in
             (("first", first), ("normal", normal), ("urgent", urgent), ("beyond", beyond))}
    assert order["first"] == 1
    assert order["urgent"] == 2  # the only level-1 request runs before level 2, however late it came
    assert (order["normal"], order["beyond"]) == (3, 4)  # then level 2, first come first served


def test_concurrent_load_is_batched(tmp_path: Path, start_server) -> None:
    """Without a delay the batcher takes whatever queued while the instance was busy."""
    model_dir = add_model(tmp_path, "gated", _config(""), GATED_PY)
    server = start_server(tmp_path)
    first = _hold_one(server, model_dir, "gated")
    rest = [gevent.spawn(_call, server.url, "gated", float(i)) for i in range(6)]
    wait_queued(server.url, "gated", 6)  # all six wait while the instance is held
    (model_dir / "gate").touch()
    gevent.joinall([first, *rest], timeout=60, raise_error=True)
    stats = _stats(server.url, "gated")
    assert stats["inference_count"] == 7
    assert stats["execution_count"] < stats["inference_count"]
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1
