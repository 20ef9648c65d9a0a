"""The load generator: ``python -m triton_actor.tune.loadgen SPEC_JSON`` prints one JSON result line.

Its own process, so it never shares the server's interpreter (nor the tuner's). A closed loop as
perf_analyzer's concurrency mode: ``concurrency`` requests in flight, each answered one followed by the
next, binary tensors through the official ``tritonclient`` (HTTP: that many greenlets on geventhttpclient's
pool; gRPC: that many chains of ``async_infer`` callbacks). After a warm-up it measures in short windows
and stops as soon as the measurement is tight, not after a fixed time: the 95 % confidence interval of
the mean throughput over the last windows (at least ``min_windows``; Student's t, for windows are few)
and that of their mean latency, both within ``stability_pct`` of the mean, over at least
``MIN_REQUESTS`` answers (a p99 needs them); or ``max_windows`` is reached (then ``stable`` is false
and the figures are those of the last ``min_windows`` windows). A quiet point settles after three
windows; a noisy one measures as long as its noise needs. Its own CPU time is reported, since on a
small host the load generator competes with the server.

``--serve`` keeps one process for a whole run: a spec per line on stdin, a result per line on stdout
(a tuning run's points are many and short; importing the clients again for each cost half a second).

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
MIN_REQUESTS = 100  # answers a settled point's windows must hold: a p99 of fewer is its largest sample
# Student's t at 97.5 % for 1..12 degrees of freedom (a two-sided 95 % interval of the mean of 2..13 windows)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179)
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


def half_width_pct(values: list[float]) -> float:
    """The half-width of the 95 % confidence interval of the mean of ``values``, in % of the mean."""
    n = len(values)
    mean = float(np.mean(values)) if n else 0.0
    if n < 2 or mean <= 0:
        return 100.0
    t = T_975[n - 2] if n - 2 < len(T_975) else 1.96
    return t * float(np.std(values, ddof=1)) / n ** 0.5 / mean * 100


Window = tuple[float, list[float]]  # a window's throughput and the latencies of the answers in it


def settled(windows: list[Window], k: int, pct: float, min_requests: int = MIN_REQUESTS) -> list[Window] | None:
    """The longest run of last windows (``k`` or more) whose mean throughput and mean latency are both
    known within ``pct`` (95 % confidence) from ``min_requests`` answers or more; None while none is.
    The longest first: more windows narrow the interval, and an early window still warming up drops out
    when leaving it out is what settles the point."""
    for n in range(len(windows), k - 1, -1):
        last = windows[-n:]
        if not all(w[1] for w in last) or sum(len(w[1]) for w in last) < min_requests:
            continue
        if max(half_width_pct([w[0] for w in last]), half_width_pct([float(np.mean(w[1])) for w in last])) <= pct:
            return last
    return None


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up, then windows until the measurement settles; the result as a JSON-ready dict."""
    latencies: list[float] = []
    errors: list[str] = []
    grpc, open_loop = spec.get("protocol") == "grpc", bool(spec.get("request_rate"))
    start = {(False, False): _http, (True, False): _grpc, (False, True): _http_open, (True, True): _grpc_open}
    stop, sleep = start[grpc, open_loop](spec, latencies, errors)
    k = spec.get("min_windows", 3)
    windows: list[Window] = []
    used: list[Window] | None = None
    try:
        sleep(spec.get("warmup_s", 0.5))
        cursor, cpu0, wall0 = len(latencies), _cpu(), time.perf_counter()
        while len(windows) < spec.get("max_windows", 10):
            begun = time.perf_counter()
            sleep(spec.get("window_s", 0.5))
            done, elapsed = latencies[cursor:], time.perf_counter() - begun
            cursor += len(done)
            windows.append((len(done) / elapsed, done))
            used = settled(windows, k, spec.get("stability_pct", 10.0), spec.get("min_requests", MIN_REQUESTS))
            if used is not None:
                break
        cpu_pct = (_cpu() - cpu0) / (time.perf_counter() - wall0) * 100
        measured = list(errors)  # the open loop's backlog, cut off by the stop, is no failure of the server
    finally:
        stop()
    return _result(used or windows[-k:], len(windows), cpu_pct, measured, used is not None)


def _result(last: list[Window], count: int, cpu_pct: float, errors: list[str],
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
    if argv[:1] == ["--serve"]:  # a spec per line until stdin closes: the tuner's whole run
        for line in sys.stdin:
            if line.strip():
                sys.stdout.write(json.dumps(measure(json.loads(line))) + "\n")
                sys.stdout.flush()
        return 0
    sys.stdout.write(json.dumps(measure(json.loads(argv[0]))) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
