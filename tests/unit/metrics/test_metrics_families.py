"""The metrics pipeline without a model server: config switches, sums over workers, the exposition's
names, the endpoint on a socket handed down (as gunicorn does), and the StatsD names and deltas."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from triton_actor.frontends.metrics_server import MetricsServer
from triton_actor.host.base import LocalHost
from triton_actor.metrics.config import MetricsConfig, parse_metrics_config
from triton_actor.metrics.exposition import render
from triton_actor.metrics.families import TritonCollector, merge_custom, merge_models
from triton_actor.metrics.latency import LatencyRecorder
from triton_actor.metrics.statsd_push import StatsdPusher, sanitise


def _entry(success: int, pending: int = 0, model: str = "m") -> dict:
    return {"model": model, "version": "1", "success": success, "failures": {"BACKEND": 1}, "inference_count": success,
            "exec_count": success, "pending": pending, "load_secs": 0.5,
            "durations_us": dict.fromkeys(("request", "queue", "compute_input", "compute_infer", "compute_output"), 10)}


def _worker(success: int, pending: int, counter: float) -> dict:
    return {"models": [_entry(success, pending)],
            "custom": [{"name": "c", "description": "d", "kind": "counter",
                        "series": [{"labels": {"a": "b"}, "value": counter}]}]}


def test_config_switches() -> None:
    assert parse_metrics_config([]) == MetricsConfig()
    c = parse_metrics_config(["summary_latencies=true", "counter_latencies=false", "summary_quantiles=0.5:0.05,0.9:0.01"])
    assert c.summary_latencies and not c.counter_latencies and c.summary_quantiles == ((0.5, 0.05), (0.9, 0.01))
    for bad in ("nonsense=1", "summary_latencies=maybe", "summary_latencies", "summary_quantiles=x"):
        with pytest.raises(ValueError):
            parse_metrics_config([bad])


def test_workers_are_summed() -> None:
    workers = [_worker(3, 1, 2.5), _worker(4, 2, 1.5)]
    [m] = merge_models(workers)
    assert (m["success"], m["pending"], m["failures"], m["durations_us"]["request"]) == (7, 3, {"BACKEND": 2}, 20)
    assert merge_custom(workers)[0]["series"] == [{"labels": {"a": "b"}, "value": 4.0}]
    assert workers[0]["models"][0]["success"] == 3  # merging does not change a worker's snapshot


def test_exposition_keeps_triton_counter_names() -> None:
    text = render(TritonCollector(lambda: [_worker(3, 1, 2.5), _worker(4, 2, 1.5)], MetricsConfig(), dict)).decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="m",version="1"} 7.0\n' in text
    assert 'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2.0\n' in text
    assert 'nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 0.0\n' in text
    assert 'nv_inference_pending_request_count{model="m",version="1"} 3.0\n' in text
    assert '# TYPE c counter\nc{a="b"} 4.0\n' in text


def test_latency_window_forgets_old_samples() -> None:
    now = [0.0]
    rec = LatencyRecorder(True, True, clock=lambda: now[0])
    rec.observe(2_000_000, 1000, (0, 1_000_000, 0))
    now[0] = 61.0
    rec.observe(600_000_000, 0, (0, 0, 0))
    snap = rec.snapshot()
    assert snap["count"] == 2 and snap["samples"]["request"] == [600_000]  # the first one aged out
    assert snap["buckets"] == [1, 0, 1, 0, 0]  # 2 ms (le 100) and 600 ms (le 2000)


def test_endpoint_on_a_socket_handed_down() -> None:
    host = LocalHost()
    host.register("metrics", lambda _args: _worker(1, 0, 1.0))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    server = MetricsServer(host, MetricsConfig(), listener, interval_s=60)
    port = server.start()
    try:
        assert port == listener.getsockname()[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert 'nv_inference_request_success{model="m",version="1"} 1.0' in r.read().decode()
    finally:
        server.stop()


class _Pipe:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float]] = []

    def __enter__(self) -> _Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def incr(self, name: str, n: int) -> None:
        self.sent.append(("c", name, n))

    def gauge(self, name: str, v: float, delta: bool = False) -> None:
        self.sent.append(("g+" if delta else "g", name, v))

    def timing(self, name: str, ms: float) -> None:
        self.sent.append(("ms", name, ms))


def test_statsd_names_and_deltas() -> None:
    totals = [{"models": [_entry(3, 1, model="a.b/c")]}]
    pusher = StatsdPusher(lambda: totals[0], "127.0.0.1", 9, "triton")
    pipe = _Pipe()
    pusher.client.pipeline = lambda: pipe  # type: ignore[method-assign]
    pusher.push_once()
    assert ("c", "model.a_b_c.1.request_success", 3) in pipe.sent
    assert ("c", "model.a_b_c.1.request_failure.BACKEND", 1) in pipe.sent
    assert ("g+", "model.a_b_c.1.pending_request_count", 1) in pipe.sent
    assert ("g", "model.a_b_c.1.load_duration_secs", 0.5) in pipe.sent
    assert ("ms", "model.a_b_c.1.request_duration_ms", 10 / 3 / 1000) in pipe.sent
    pipe.sent.clear()
    totals[0]["models"][0] = {**_entry(5, 0, model="a.b/c")}
    pusher.push_once()
    assert ("c", "model.a_b_c.1.request_success", 2) in pipe.sent  # only what happened since the last push
    assert not any(name.endswith("request_failure.BACKEND") for _, name, _ in pipe.sent)  # nothing new
    assert ("g+", "model.a_b_c.1.pending_request_count", -1) in pipe.sent  # this worker's share went 1 -> 0
    assert sanitise("") == "_"


class _FakeNvml:
    """The few NVML calls the sampler makes, for one GPU (no GPU on the CI machines)."""

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return b"GPU-1234"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return type("Mem", (), {"total": 80e9, "used": 1e9})()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return type("Util", (), {"gpu": 25})()

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 70_000  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return 5_000  # mJ


def test_gpu_gauges_through_nvml() -> None:
    from triton_actor.metrics.system import SystemSampler

    sampler = SystemSampler(60)
    sampler._nvml = _FakeNvml()
    sampler.sample()
    sampler.sample()  # the CPU utilisation needs two readings
    text = render(TritonCollector(list, MetricsConfig(), lambda: sampler.values)).decode()
    assert 'nv_gpu_utilization{gpu_uuid="GPU-1234"} 0.25\n' in text
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-1234"} 70.0\n' in text
    assert "# TYPE nv_energy_consumption counter\n" in text
    assert 'nv_energy_consumption{gpu_uuid="GPU-1234"} 5.0\n' in text
    assert "nv_cpu_utilization " in text and "nv_cpu_memory_total_bytes " in text


def test_statsd_graphite_tags() -> None:
    pusher = StatsdPusher(lambda: {"models": [_entry(2, 0, model="a.b/c")]}, "127.0.0.1", 9, "triton", tags=True)
    pipe = _Pipe()
    pusher.client.pipeline = lambda: pipe  # type: ignore[method-assign]
    pusher.push_once()
    assert ("c", "request_success;model=a.b_c;version=1", 2) in pipe.sent
    assert ("c", "request_failure;model=a.b_c;version=1;reason=BACKEND", 1) in pipe.sent
