"""Traces in Triton's trace-file format (observability/tracing.py): known traffic, then the file read back.

The server writes traces off the hot path; a test either stops the server (which writes everything
left) or waits until the file holds what it expects, then checks counts, stage order and settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_actor.protocol.trace_json import STAGES

from .server import IDENTITY_PY, ServerProcess, add_model

pytestmark = pytest.mark.timeout(90)

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 3 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 3 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


def _repo(tmp_path: Path, *names: str) -> Path:
    repo = tmp_path / "models"
    for name in names:
        add_model(repo, name, CONFIG.format(name=name), IDENTITY_PY)
    return repo


def _infer(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, model: str,
           request_id: str = "") -> None:
    mod = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    inp = mod.InferInput("INPUT0", [3], "FP32")
    inp.set_data_from_numpy(np.arange(3, dtype=np.float32))
    result = client.infer(model, [inp], request_id=request_id)
    assert result.as_numpy("OUTPUT0").tolist() == [0.0, 1.0, 2.0]


def _traces(path: Path) -> dict[int, dict]:
    """id → {"model_name", "model_version", "request_id"?, "stamps": [(name, ns)], "tensors": [...]}."""
    traces: dict[int, dict] = {}
    for entry in json.loads(path.read_text()):
        t = traces.setdefault(entry["id"], {"stamps": [], "tensors": []})
        if "timestamps" in entry:
            t["stamps"] += [(s["name"], s["ns"]) for s in entry["timestamps"]]
        elif "activity" in entry:
            t["tensors"].append((entry["activity"], entry["tensor"]))
        else:
            t.update({k: v for k, v in entry.items() if k != "id"})
    return traces


def _wait_for(condition: Callable[[], bool], timeout: float = 20) -> None:
    with gevent.Timeout(timeout, AssertionError("condition not met in time")):
        while not condition():
            gevent.sleep(0.02)  # a wait-for helper's poll, under its deadline


def _by_model(traces: dict[int, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in traces.values():
        counts[t["model_name"]] = counts.get(t["model_name"], 0) + 1
    return counts


def test_every_request_traced_with_wire_and_ordered_stages(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(_repo(tmp_path, "ident"), flags=(
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1", "--trace-config", f"triton,file={trace_file}"))
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for i in range(5):
        _infer(http, "ident", f"h{i}")
    for i in range(3):
        _infer(grpc, "ident", f"g{i}")
    assert server.stop() == 0  # shutdown writes what is left
    traces = _traces(trace_file)
    assert len(traces) == 8
    assert sorted(t["request_id"] for t in traces.values()) == ["g0", "g1", "g2", "h0", "h1", "h2", "h3", "h4"]
    for t in traces.values():
        assert (t["model_name"], t["model_version"]) == ("ident", 1)
        # the front end's stamps around the core's, as Triton's trace file has them (server src/tracer.cc)
        recv, front = ("HTTP_RECV", "HTTP") if t["request_id"].startswith("h") else ("GRPC_WAITREAD", "GRPC")
        names = [name for name, _ in t["stamps"]]
        assert names == [f"{recv}_START", f"{recv}_END", *STAGES, f"{front}_SEND_START", f"{front}_SEND_END"]
        ns = [n for _, n in t["stamps"]]
        assert ns == sorted(ns) and ns[-1] > ns[0] > 0


def test_rate_count_and_per_model_settings(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(_repo(tmp_path, "a", "b", "c"), flags=(
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1", "--trace-config", f"triton,file={trace_file}"))
    http = httpclient.InferenceServerClient(server.url)
    http.update_trace_settings("a", {"trace_count": "2"})
    http.update_trace_settings("b", {"trace_rate": "3"})
    http.update_trace_settings("c", {"trace_level": ["OFF"]})
    for _ in range(7):
        for model in ("a", "b", "c"):
            _infer(http, model)
    assert http.get_trace_settings("a")["trace_count"] == "0"  # what is left, as Triton reports it
    assert http.get_trace_settings()["trace_count"] == "-1"
    _wait_for(lambda: trace_file.exists() and _by_model(_traces(trace_file)) == {"a": 2, "b": 2})  # b: requests 3 and 6
    # a setting changed again starts counting afresh; the global setting traces a model without override
    http.update_trace_settings("a", {"trace_count": None})
    _infer(http, "a")
    assert server.stop() == 0
    assert _by_model(_traces(trace_file)) == {"a": 3, "b": 2}


def test_log_frequency_writes_indexed_files_and_tensors(tmp_path: Path,
                                                        start_server: Callable[..., ServerProcess]) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(_repo(tmp_path, "ident"), flags=(
        "--trace-level", "TIMESTAMPS", "--trace-level", "TENSORS", "--trace-rate", "1", "--trace-file", str(trace_file),
        "--trace-log-frequency", "2"))
    http = httpclient.InferenceServerClient(server.url)
    for _ in range(5):
        _infer(http, "ident")
    first, second, last = (Path(f"{trace_file}.{i}") for i in range(3))
    _wait_for(lambda: second.exists())
    assert len(_traces(first)) == 2 and len(_traces(second)) == 2 and not last.exists()
    assert server.stop() == 0
    assert len(_traces(last)) == 1 and not trace_file.exists()
    (trace,) = _traces(last).values()
    assert [a for a, _ in trace["tensors"]] == ["TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT"]
    assert trace["tensors"][0][1] == {"name": "INPUT0", "data": "0.0,1.0,2.0", "shape": "3", "dtype": "FP32"}


def test_no_traces_while_off(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    trace_file = tmp_path / "trace.json"
    server = start_server(_repo(tmp_path, "ident"), flags=("--trace-config", f"triton,file={trace_file}",
                                                           "--trace-config", "rate=1"))
    http = httpclient.InferenceServerClient(server.url)
    for _ in range(3):
        _infer(http, "ident")
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    _infer(http, "ident")
    assert server.stop() == 0
    assert len(_traces(trace_file)) == 1



def test_stream_requests_carry_their_read_and_send_stamps(tmp_path: Path, start_server: Callable[..., ServerProcess]) -> None:
    """ModelStreamInfer: each request of a stream has Triton's stream stamps around the core's (its read's
    GRPC_WAITREAD_START/_END, a GRPC_SEND_START/_END pair per response: three for the decoupled model),
    written once its last response is sent, whether the model's batch completes before or after that."""
    import queue

    from .test_ensemble import _arith_config
    from .test_otel_traces import REPEAT_PY

    trace_file = tmp_path / "trace.json"
    repo = _repo(tmp_path, "ident")
    add_model(repo, "repeat", _arith_config({}, "model_transaction_policy { decoupled: true }"), REPEAT_PY)
    server = start_server(repo, flags=(
        "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1", "--trace-config", f"triton,file={trace_file}"))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error or result))
    for model, answers, request_id in (("ident", 1, "s0"), ("ident", 1, "s1"), ("repeat", 3, "d0")):
        inp = grpcclient.InferInput(*(("INPUT0", [3]) if model == "ident" else ("X", [1, 2])), "FP32")
        inp.set_data_from_numpy(np.zeros(inp.shape(), np.float32))
        client.async_stream_infer(model, [inp], request_id=request_id)
        for _ in range(answers):
            assert not isinstance(got.get(timeout=30), Exception)
    client.stop_stream()
    assert server.stop() == 0
    traces = {t["request_id"]: t for t in _traces(trace_file).values()}
    assert sorted(traces) == ["d0", "s0", "s1"]
    for request_id, sends in (("s0", 1), ("s1", 1), ("d0", 3)):
        names = [name for name, _ in traces[request_id]["stamps"]]
        assert names == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *STAGES] + ["GRPC_SEND_START", "GRPC_SEND_END"] * sends
        ns = [n for name, n in traces[request_id]["stamps"] if name.startswith("GRPC_")]
        assert ns == sorted(ns)
    s0, s1 = (dict(traces[i]["stamps"]) for i in ("s0", "s1"))
    assert s0["GRPC_WAITREAD_END"] <= s1["GRPC_WAITREAD_START"] <= s1["GRPC_WAITREAD_END"]
