"""The load generator: ``python -m triton_actor.tune.loadgen SPEC_JSON`` prints one JSON result line.

Its own process, so it never shares the server's interpreter (nor the tuner's). A closed loop as
perf_analyzer's concurrency mode: ``concurrency`` requests in flight, each answered one followed by the
next, binary tensors through the official ``tritonclient`` (HTTP: that many greenlets on geventhttpclient's
pool; gRPC: that many chains of ``async_infer`` callbacks). After a warm-up it measures in windows until
the last ``min_windows`` agree: the coefficient of variation of their throughput and of their mean latency
both under ``stability_pct`` (perf_analyzer's ``--stability-percentage``), or ``max_windows`` is reached
(then ``stable`` is false). The figures are those of the last ``min_windows`` windows; its own CPU time
over them is reported, since on a small host the load generator competes with the server.

With ``request_rate`` it is an open loop instead (perf_analyzer's ``--request-rate-range`` with
``--request-distribution poisson``): requests are sent at Poisson arrival times whether or not earlier
ones were answered, and each latency is measured from the request's *scheduled* send time, not from
when it got a connection or was written. A closed loop (or an open loop timed from the actual send)
waits for the server before it sends the next request, so the waits a real client population would
see in the queue never enter a figure (coordinated omission); from the schedule they do, and a server
that cannot keep up shows latencies that grow window after window (never stable) and a throughput below
the offered rate. At most ``MAX_OUTSTANDING`` requests are kept in flight; one that finds that many is
counted failed (a backlog that large is minutes of latency at any rate we measure).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..protocol import dtypes

Stop = Callable[[], None]
MAX_OUTSTANDING = 4096  # the open loop's backlog bound: its greenlets or callbacks, a few KiB each
OPEN_LOOP_CONNECTIONS = 64  # HTTP connections the open loop may use at once (a request beyond waits, timed)


def arrivals(rate: float, rng: np.random.Generator, start: float = 0.0) -> Iterator[float]:
    """Poisson arrivals at ``rate`` per second from ``start``: exponential gaps of mean ``1 / rate``."""
    t = start
    while True:
        t += float(rng.exponential(1.0 / rate))
        yield t


def inputs_from_config(cfg_json: dict[str, Any]) -> list[dict[str, Any]]:
    """Request inputs synthesised from a model's config (as ``/v2/models/M/config`` prints it): batch 1
    in front when the model batches, a variable dimension taken as 1, optional inputs left out."""
    batch = [1] if int(cfg_json.get("max_batch_size", 0)) > 0 else []
    out = []
    for spec in cfg_json.get("input", []):
        if spec.get("optional"):
            continue
        dims = [int(d) if int(d) > 0 else 1 for d in spec.get("dims", [])]
        wire = dtypes.BY_ENUM_NAME[spec.get("data_type", "TYPE_FP32")].wire
        out.append({"name": spec["name"], "datatype": wire, "shape": batch + dims})
    return out


def synthesise(datatype: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"tune", dtype=np.object_)
    dtype = dtypes.BY_WIRE[datatype].numpy
    if dtype is None:
        raise ValueError(f"cannot synthesise {datatype} inputs")
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return np.zeros(shape, dtype=dtype)
    return rng.integers(0, 8, size=shape).astype(dtype)  # small: integer inputs are often indices


def _http(spec: dict[str, Any], latencies: list[float], errors: list[str]) -> tuple[Stop, Callable[[float], None]]:
    import gevent
    import tritonclient.http as client_module

    client = client_module.InferenceServerClient(spec["url"], concurrency=spec["concurrency"], network_timeout=120)
    inputs, outputs = _tensors(client_module, spec, binary=True)
    running = [True]

    def loop() -> None:
        while running[0]:
            start = time.perf_counter()
            try:
                client.infer(spec["model"], inputs, outputs=outputs)
                latencies.append(time.perf_counter() - start)
            except Exception as e:  # noqa: BLE001 - counted and reported: the point records it
                errors.append(str(e))
                gevent.sleep(0.01)  # a model that refuses every request must not spin the loop

    greenlets = [gevent.spawn(loop) for _ in range(spec["concurrency"])]

    def stop() -> None:
        running[0] = False
        gevent.joinall(greenlets, timeout=60)
        client.close()

    return stop, gevent.sleep


def _grpc(spec: dict[str, Any], latencies: list[float], errors: list[str]) -> tuple[Stop, Callable[[float], None]]:
    import tritonclient.grpc as client_module

    client = client_module.InferenceServerClient(spec["url"])
    inputs, outputs = _tensors(client_module, spec, binary=False)
    state = {"running": True, "in_flight": 0}

    def issue() -> None:
        state["in_flight"] += 1
        start = time.perf_counter()
        client.async_infer(spec["model"], inputs, lambda result, error: done(start, error), outputs=outputs)

    def done(start: float, error: Any) -> None:  # runs in gRPC's callback thread
        state["in_flight"] -= 1
        _record(latencies, errors, start, error)
        if error is not None:
            time.sleep(0.01)  # a model that refuses every request must not spin the loop
        if state["running"]:
            issue()

    for _ in range(spec["concurrency"]):
        issue()

    def stop() -> None:
        state["running"] = False
        deadline = time.monotonic() + 60
        while state["in_flight"] > 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the last answers arrive on gRPC's thread; nothing to wait on here
        client.close()

    return stop, time.sleep


def _http_open(spec: dict[str, Any], latencies: list[float], errors: list[str]) -> tuple[Stop, Callable[[float], None]]:
    import gevent
    import gevent.pool
    import tritonclient.http as client_module

    client = client_module.InferenceServerClient(spec["url"], concurrency=OPEN_LOOP_CONNECTIONS, network_timeout=120)
    inputs, outputs = _tensors(client_module, spec, binary=True)
    pool, running = gevent.pool.Pool(), [True]

    def one(scheduled: float) -> None:
        try:
            client.infer(spec["model"], inputs, outputs=outputs)
            latencies.append(time.perf_counter() - scheduled)  # from the schedule: queueing is counted
        except Exception as e:  # noqa: BLE001 - counted and reported: the point records it
            errors.append(str(e))

    def schedule() -> None:
        for t in arrivals(spec["request_rate"], np.random.default_rng(spec.get("seed", 0)), time.perf_counter()):
            delay = t - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)  # the next arrival; a late wake-up sends at once, still timed from t
            if not running[0]:
                return
            if len(pool) >= MAX_OUTSTANDING:
                errors.append(f"more than {MAX_OUTSTANDING} requests outstanding: the server cannot keep up")
                continue
            pool.spawn(one, t)

    scheduler = gevent.spawn(schedule)

    def stop() -> None:
        running[0] = False
        scheduler.join(timeout=10)
        pool.kill(timeout=10)  # the backlog of an overloaded point is not waited for: it is measured already
        client.close()

    return stop, gevent.sleep


def _grpc_open(spec: dict[str, Any], latencies: list[float], errors: list[str]) -> tuple[Stop, Callable[[float], None]]:
    """gRPC's asyncio client on an event loop of its own thread: one scheduler coroutine and a task per
    request. A thread sleeping to each arrival, sending with ``async_infer`` beside gRPC's callback
    threads, fell behind its own schedule on the busy 2-core host (load average 12): 56.8/s served of
    100/s offered, p99 589 ms; this way 94.9/s, p99 133 ms, as HTTP's greenlets (95.1/s), same seed."""
    import asyncio
    import threading

    import tritonclient.grpc.aio as client_module

    loop = asyncio.new_event_loop()
    stopping = asyncio.Event()
    ready = threading.Event()
    outstanding: set[asyncio.Task[None]] = set()

    async def one(client: Any, inputs: list[Any], outputs: list[Any], scheduled: float) -> None:
        try:
            await client.infer(spec["model"], inputs, outputs=outputs)
            _record(latencies, errors, scheduled, None)  # from the schedule: queueing is counted
        except Exception as e:  # noqa: BLE001 - counted and reported: the point records it
            _record(latencies, errors, scheduled, e)

    async def schedule() -> None:
        client = client_module.InferenceServerClient(spec["url"])
        inputs, outputs = _tensors(client_module, spec, binary=False)
        ready.set()
        for t in arrivals(spec["request_rate"], np.random.default_rng(spec.get("seed", 0)), time.perf_counter()):
            try:
                await asyncio.wait_for(stopping.wait(), max(0.0, t - time.perf_counter()))
                break  # stopped
            except asyncio.TimeoutError:
                pass  # the next arrival; a late wake-up sends at once, still timed from t
            if len(outstanding) >= MAX_OUTSTANDING:
                errors.append(f"more than {MAX_OUTSTANDING} requests outstanding: the server cannot keep up")
                continue
            task = loop.create_task(one(client, inputs, outputs, t))
            outstanding.add(task)
            task.add_done_callback(outstanding.discard)
        for task in list(outstanding):  # the backlog of an overloaded point is not waited for: it is measured already
            task.cancel()
        await asyncio.gather(*outstanding, return_exceptions=True)
        await client.close()

    runner = threading.Thread(target=loop.run_until_complete, args=(schedule(),), name="open-loop", daemon=True)
    runner.start()
    ready.wait(30)

    def stop() -> None:
        loop.call_soon_threadsafe(stopping.set)
        runner.join(timeout=30)

    return stop, time.sleep


def _record(latencies: list[float], errors: list[str], since: float, error: Any) -> None:
    if error is None:
        latencies.append(time.perf_counter() - since)
    else:
        errors.append(str(error))


def _tensors(module: Any, spec: dict[str, Any], *, binary: bool) -> tuple[list[Any], list[Any]]:
    rng = np.random.default_rng(0)
    inputs = []
    for item in spec["inputs"]:
        tensor = module.InferInput(item["name"], item["shape"], item["datatype"])
        data = synthesise(item["datatype"], item["shape"], rng)
        if binary:
            tensor.set_data_from_numpy(data, binary_data=True)
        else:
            tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    kwargs = {"binary_data": True} if binary else {}
    return inputs, [module.InferRequestedOutput(name, **kwargs) for name in spec["outputs"]]


def _cv(values: list[float]) -> float:
    mean = float(np.mean(values))
    return float(np.std(values) / mean * 100) if mean > 0 else 100.0


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then windows until stable; the result as a JSON-ready dict."""
    latencies: list[float] = []
    errors: list[str] = []
    grpc, open_loop = spec.get("protocol") == "grpc", bool(spec.get("request_rate"))
    start = {(False, False): _http, (True, False): _grpc, (False, True): _http_open, (True, True): _grpc_open}
    stop, sleep = start[grpc, open_loop](spec, latencies, errors)
    k = spec.get("min_windows", 3)
    windows: list[tuple[float, list[float]]] = []
    stable = False
    try:
        sleep(spec.get("warmup_s", 1.0))
        cursor, cpu0, wall0 = len(latencies), _cpu(), time.perf_counter()
        while len(windows) < spec.get("max_windows", 10):
            start = time.perf_counter()
            sleep(spec.get("window_s", 1.0))
            done, elapsed = latencies[cursor:], time.perf_counter() - start
            cursor += len(done)
            windows.append((len(done) / elapsed, done))
            last = windows[-k:]
            if len(last) == k and all(w[1] for w in last) and max(
                    _cv([w[0] for w in last]), _cv([float(np.mean(w[1])) for w in last])) < spec.get("stability_pct", 10):
                stable = True
                break
        cpu_pct = (_cpu() - cpu0) / (time.perf_counter() - wall0) * 100
        measured = list(errors)  # the open loop's backlog, cut off by the stop, is no failure of the server
    finally:
        stop()
    return _result(windows[-k:], len(windows), cpu_pct, measured, stable)


def _result(last: list[tuple[float, list[float]]], count: int, cpu_pct: float, errors: list[str],
            stable: bool) -> dict[str, Any]:
    merged = np.array([x for w in last for x in w[1]]) * 1000
    rates = [w[0] for w in last]
    p50, p95, p99 = (float(np.percentile(merged, q)) for q in (50, 95, 99)) if merged.size else (0.0, 0.0, 0.0)
    cv = _cv(rates) if merged.size else 100.0
    return {"throughput": float(np.mean(rates)) if rates else 0.0, "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
            "cv_pct": cv, "stable": stable, "windows": count,
            "loadgen_cpu_pct": cpu_pct, "errors": len(errors), "error": errors[0] if errors and not merged.size else ""}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    result = measure(json.loads(argv[0]))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
