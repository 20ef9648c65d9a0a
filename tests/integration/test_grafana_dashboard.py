"""The Grafana dashboard's every query (deploy/grafana/triton-actor-dashboard.json), evaluated by a real
Prometheus (Debian's) scraping a real server through deploy/prometheus.yml while tritonclient sends traffic
over HTTP and gRPC: each panel must return data, and so must every query of Triton's own sample dashboard.

What the host lacks is supplied, not skipped: no GPU here, so the server imports a stand-in ``pynvml``
(a module in ``tmp_path`` first on its PYTHONPATH) and its GPU families are real exports of made-up device
readings. The cache panels need the response cache (``--cache-config``): where this build refuses the flag,
they are checked to return nothing (no ``nv_cache_*`` family exists, as in Triton without a cache); where
it accepts it, the test turns the cache on and they must return data like every other panel.

``TRITON_ACTOR_DASHBOARD_OUT=run.json`` keeps the traffic going ``TRITON_ACTOR_DASHBOARD_SECS`` (60) more
seconds and writes every query's range over the run there, for ``scripts/plot_dashboard.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import gevent
import gevent.event
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from triton_actor.config.command_line import parse

from .gunicorn_server import Gunicorn
from .prometheus import DASHBOARD, PROMETHEUS, RATE_INTERVAL, Prometheus, finite, panels, scrape_config, substitute
from .server import ChildServer, ServerProcess, add_model
from .test_metrics import ECHO_CONFIG, ECHO_PY

pytestmark = [pytest.mark.host_tools, pytest.mark.timeout(300)]

FAKE_NVML = """
import time
from types import SimpleNamespace

_T0 = time.monotonic()

def nvmlInit(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUUID(h): return "GPU-00000000-fake-nvml-for-the-dashboard-test"
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=80 * 2**30, used=(20 + int(time.monotonic()) % 5) * 2**30)
def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=40 + int(time.monotonic()) % 20)
def nvmlDeviceGetPowerUsage(h): return 250_000
def nvmlDeviceGetEnforcedPowerLimit(h): return 700_000
def nvmlDeviceGetTotalEnergyConsumption(h): return int((time.monotonic() - _T0) * 250_000)
"""

# echo (test_metrics' model: a negative input fails with a BACKEND error) twice: "batched" behind the
# dynamic batcher, with the response cache where there is one; "plain" without either
BATCHED = ECHO_CONFIG + "dynamic_batching { }\n"
# the queries of Triton's own sample dashboard (triton-inference-server/server deploy/k8s-onprem/dashboard.json),
# which Triton users already run: they must answer from our server too
TRITON_SAMPLE = (
    "count(count(nv_inference_count) by (instance))",
    "sum by (pod) (rate(nv_inference_count[1m])) / ignoring(pod) group_left sum (rate(nv_inference_count[1m]))",
    "sum(nv_inference_request_success) by (pod)",
    "sum(nv_inference_request_failure) by (pod)",
    "sum(rate(nv_inference_compute_infer_duration_us[30s])) by (model) / 1000",
    "avg(rate(nv_inference_queue_duration_us[30s])/(1+rate(nv_inference_request_success[30s]))) by (pod)",
    "nv_gpu_power_usage", "sum(nv_gpu_power_usage)", "nv_gpu_memory_used_bytes", "nv_gpu_utilization * 100",
    "nv_cpu_memory_used_bytes", "nv_cpu_utilization * 100",
)
CACHE_FAMILIES = "nv_cache_"
MODELS = ["batched", "plain"]


def cache_supported() -> bool:
    """Whether this build serves a response cache (``--cache-config`` accepted, not refused)."""
    try:
        parse(["--model-repository", "unused", "--cache-config", "local,size=1048576"], environ={})
    except SystemExit:
        return False
    return True


def _client_loop(protocol: str, server: ChildServer, model: str, stop: gevent.event.Event, counts: dict) -> None:
    mod = grpcclient if protocol == "grpc" else httpclient
    client = mod.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.url)
    try:
        for i in itertools.count():
            if stop.is_set():
                return
            rows = 1 + i % 3
            # mostly a few distinct inputs (cache hits where the cache is on), every 5th a new one (a miss)
            value = -1.0 if i % 10 == 9 else float(i) if i % 5 == 0 else float(i % 4)
            x = mod.InferInput("INPUT0", [rows, 2], "FP32")
            x.set_data_from_numpy(np.full((rows, 2), value, np.float32))
            try:
                client.infer(model, [x])
                counts["ok"] += 1
            except InferenceServerException:
                counts["failed"] += 1
    finally:
        client.close()


def _start_traffic(server: ChildServer, models: list[str]) -> tuple[gevent.event.Event, list, dict]:
    stop, counts = gevent.event.Event(), {"ok": 0, "failed": 0}
    loops = [gevent.spawn(_client_loop, protocol, server, model, stop, counts)
             for model in models for protocol in ("http", "grpc", "http")]
    return stop, loops, counts


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {"model": "|".join(MODELS), "instance": ".*", "__rate_interval": RATE_INTERVAL}
    out = []
    for p in panels(dashboard):
        for t in p["targets"]:
            out.append((p["title"], substitute(t["expr"], variables)))
    return out


def _write_ranges(prom: Prometheus, queries: list[tuple[str, str]], start: float, path: Path) -> None:
    end = time.time()
    runs = [{"panel": title, "expr": expr, "result": prom.query_range(expr, start, end)} for title, expr in queries]
    path.write_text(json.dumps({"start": start, "end": end, "queries": runs}))


@pytest.fixture(params=["one process", "two workers"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChildServer]:
    """The server under test, alone or as two gunicorn workers (one /metrics answering for both), with
    the two models, the stand-in NVML, and the response cache where this build has one."""
    repo = tmp_path / "models"
    cache_config = "response_cache { enable: true }\n" if cache_supported() else ""
    add_model(repo, "batched", BATCHED + cache_config, ECHO_PY)
    add_model(repo, "plain", ECHO_CONFIG, ECHO_PY)
    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_NVML)
    flags = ("--metrics-interval-ms", "500", *(("--cache-config", "local,size=1048576") if cache_config else ()))
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH", "")) if p)}
    if request.param == "one process":
        started: ChildServer = ServerProcess(repo, flags=flags, env=env).wait_ready()
    else:
        started = Gunicorn("--model-repository", str(repo), *flags, workers=2, env=env)
        started.wait_serving(2)
    yield started
    started.stop()


def test_every_panel_returns_data(tmp_path: Path, server: ChildServer) -> None:
    assert PROMETHEUS.exists(), "Debian's prometheus is missing: run scripts/install_test_deps.sh"
    cache = cache_supported()
    prom = Prometheus(tmp_path / "prometheus", scrape_config(f"127.0.0.1:{server.metrics_port}"))
    stop, loops, counts = _start_traffic(server, MODELS)
    started = time.time()
    try:
        prom.wait_target_up()
        queries = _queries()
        expect_data = [(t, e) for t, e in queries if cache or CACHE_FAMILIES not in e]
        expect_data += [("Triton's sample dashboard", e) for e in TRITON_SAMPLE]
        pending = dict.fromkeys(expect_data)

        def all_answered() -> bool:
            for q in list(pending):
                if finite(prom.query(q[1])):
                    del pending[q]
            return not pending

        prom.poll(all_answered, 120, lambda: f"every panel to return data; still empty: {list(pending)}")
        if not cache:  # no cache in this build: the cache panels are empty, not wrong
            assert all(prom.query(e) == [] for t, e in queries if CACHE_FAMILIES in e)
        assert counts["ok"] > 0 and counts["failed"] > 0, counts
        out = os.environ.get("TRITON_ACTOR_DASHBOARD_OUT")
        if out:
            gevent.sleep(float(os.environ.get("TRITON_ACTOR_DASHBOARD_SECS", "60")))  # the plot's time span
            _write_ranges(prom, queries, started, Path(out))
    finally:
        stop.set()
        gevent.joinall(loops, timeout=30)
        prom.stop()
    assert all(g.successful() for g in loops), [g.exception for g in loops]
