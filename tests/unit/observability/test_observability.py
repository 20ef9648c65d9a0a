"""Traces and the status page without sockets: trace-config flags, sampling, the trace-file writer, stage
layout, the latency histogram and the host-wide merge of status parts."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from triton_actor.inference import InferInput, InferRequest, InferResponse
from triton_actor.metrics.statistics import (
    LATENCY_BUCKETS,
    VersionStats,
    bucket_upper_ns,
    latency_bucket,
    percentile_ns,
)
from triton_actor.observability.log_trace_settings import RuntimeSettings, trace_config
from triton_actor.observability.tracing import Tracer
from triton_actor.plane import live_status
from triton_actor.protocol import trace_json
from triton_actor.protocol.dtypes import BY_WIRE

pytestmark = pytest.mark.timeout(30)


def test_trace_config_flags() -> None:
    assert trace_config(["level=TIMESTAMPS", "level=TENSORS", "rate=5", "count=3", "triton,file=/t.json",
                         "triton,log-frequency=2", "opentelemetry,url=http://x"]) == {
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["5"], "trace_count": ["3"],
        "trace_file": ["/t.json"], "log_frequency": ["2"], "opentelemetry": ["url=http://x"]}
    assert trace_config(["level=OFF"], {"trace_level": ["TIMESTAMPS"]}) == {"trace_level": ["OFF"]}
    for bad in ("level=MAX", "rate=x", "colour=blue", "rate", "jaeger,rate=1", "opentelemetry,colour=blue",
                "opentelemetry,resource=novalue", "opentelemetry,bsp_max_queue_size=-1"):
        with pytest.raises(ValueError):
            trace_config([bad])


def _item(request_id: str = "", start: int = 100) -> SimpleNamespace:
    data = np.arange(3, dtype=np.float32)
    request = InferRequest("m", -1, request_id, {"IN": InferInput("IN", BY_WIRE["FP32"], (3,), data)})
    return SimpleNamespace(request=request, start_ns=start)


def test_rate_count_and_writer(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tracer = Tracer()
    settings = RuntimeSettings(trace={"trace_level": ["TIMESTAMPS"], "trace_rate": ["3"], "trace_count": ["2"],
                                      "trace_file": [str(path)]}, tracer=tracer)
    trace = tracer.version("m", 1)
    assert trace.on
    response = InferResponse([("OUT", np.ones(3, np.float32))])
    for i in range(10):
        trace.batch([_item(f"r{i}")], [response], 200, 300, (0, 50, 0))
    assert not trace.on  # the count is used up: the scheduler's check is off again
    assert settings.trace_settings()["trace_count"] == ["0"]
    assert tracer.flush(10)
    entries = json.loads(path.read_text())
    assert [e["request_id"] for e in entries if "model_name" in e] == ["r2", "r5"]  # requests 3 and 6 of rate 3
    settings.update_trace({"trace_count": ["1"], "trace_rate": ["1"], "trace_level": ["TIMESTAMPS", "TENSORS"]})
    trace.batch([_item("again")], [response], 200, 300, (0, 50, 0))
    assert tracer.flush(10)
    entries = json.loads(path.read_text())  # appended into the same array
    assert [e["request_id"] for e in entries if "model_name" in e] == ["r2", "r5", "again"]
    assert [e["activity"] for e in entries if "activity" in e] == ["TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT"]


def test_worker_ids_and_files(tmp_path: Path) -> None:
    tracer = Tracer()
    tracer.for_worker(2)
    RuntimeSettings(trace={"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "trace_file": [str(tmp_path / "t.json")]},
                    tracer=tracer)
    tracer.version("m", 1).batch([_item("w")], None, 200, 300, (0, 0, 0))
    assert tracer.flush(10)
    assert not (tmp_path / "t.json").exists()
    assert json.loads((tmp_path / "t.json.worker2").read_text())[0]["id"] == 2 * 10**12 + 1


def test_per_model_override_and_off_by_default(tmp_path: Path) -> None:
    tracer = Tracer()
    settings = RuntimeSettings(trace={"trace_file": [str(tmp_path / "t.json")]}, tracer=tracer)
    a, b = tracer.version("a", 1), tracer.version("b", 1)
    assert not a.on and not b.on
    settings.update_trace({"trace_level": ["TIMESTAMPS"]}, model="a")
    assert a.on and not b.on
    settings.update_trace({"trace_level": []}, model="a")  # cleared: back to the global OFF
    assert not a.on


def test_stage_times_never_go_back() -> None:
    for _ in range(2000):
        start = random.randrange(0, 1000)
        dispatch = start + random.randrange(0, 1000)
        end = dispatch + random.randrange(0, 1000)
        timings = tuple(random.randrange(0, 1500) for _ in range(3))
        stamps = trace_json.stage_times(start, dispatch, end, timings, end + random.randrange(-5, 50))
        assert [name for name, _ in stamps] == list(trace_json.STAGES)
        ns = [n for _, n in stamps]
        assert ns == sorted(ns) and ns[2] == dispatch and ns[5] == end


def test_latency_histogram_buckets_and_percentiles() -> None:
    for _ in range(20000):
        ns = random.randrange(0, 1 << 45)
        i = latency_bucket(ns)
        assert (bucket_upper_ns(i - 1) if i else 0) <= ns < bucket_upper_ns(i)
        assert bucket_upper_ns(i) <= max(1024, ns * 1.25 + 256)
    assert latency_bucket(1 << 60) == LATENCY_BUCKETS - 1
    stats = VersionStats("m", 1)
    for ms in range(1, 101):
        stats.record_success(1, ms * 1_000_000, 0, (0, 0, 0))
    buckets = stats.snapshot()["latency"]
    assert sum(buckets) == 100
    assert 50e6 <= percentile_ns(buckets, 0.5) <= 50e6 * 1.25
    assert 99e6 <= percentile_ns(buckets, 0.99) <= 99e6 * 1.25
    assert percentile_ns([0] * LATENCY_BUCKETS, 0.5) == 0


def _part(worker: int, success: int, latency_ms: int) -> dict:
    latency = [0] * LATENCY_BUCKETS
    latency[latency_bucket(latency_ms * 1_000_000)] = success
    live = {"instances": [f"m_0_{worker}"], "queued": 1, "running": 2, "busy_instances": 1, "success": success,
            "fail": 1, "success_ns": success * latency_ms * 1_000_000, "queue_ns": 0, "compute_ns": 0,
            "inference_count": success, "execution_count": success, "batches": {"1": success}, "latency": latency}
    return {"worker": worker, "live": True, "ready": True, "time_ns": 10 + worker, "versions": [
        {"name": "m", "version": 1, "state": "READY", "reason": "", **live},
        {"name": "x", "version": -1, "state": "UNAVAILABLE", "reason": "boom"}]}


def test_merge_sums_workers_before_percentiles() -> None:
    st = live_status.merge([_part(0, 90, 1), _part(1, 10, 100)])
    m, x = st["versions"]
    assert (st["workers"], st["success"], st["fail"], st["time_ns"]) == (2, 100, 2, 11)
    assert (m["success"], m["queued"], m["running"], m["busy_instances"], m["workers"]) == (100, 2, 4, 2, 2)
    assert m["instances"] == ["m_0_0", "m_0_1"] and m["batches"] == {"1": 100}
    assert m["latency_ms"]["p50"] <= 1.25 and m["latency_ms"]["p99"] >= 100  # from the summed histogram
    assert (x["state"], x["reason"], x["workers"], x["success"]) == ("UNAVAILABLE", "boom", 0, 0)
