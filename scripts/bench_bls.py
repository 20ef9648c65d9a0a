#!/usr/bin/env python3
"""What one BLS call costs, and where it goes: a real server in this process, Triton's ``add_sub`` (a Python
model), ``bls`` (a Python model forwarding its two inputs to ``add_sub`` by ``pb_utils.InferenceRequest.exec()``
and answering its outputs) and ``nobls`` (the same model computing the sums itself: no call). The request
perf_analyzer sends goes through the HTTP state machine and ``/infer`` view from this thread (the hub), as
``bench_step_opcodes.py`` sends its own; ``bls - nobls`` is one BLS call.

Per request, best of ``--rounds`` rounds of ``--n``, the models alternated: wall time, this (hub) thread's CPU
time, and the CPU time of the ``bls`` instance's own thread (``pthread_getcpuclockid``): CPU figures,
which preemption by other jobs does not move much, beside a wall figure it does. ``--opcodes`` counts the
bytecodes per request by function, on the hub and on the caller's thread (a tracer installed on that thread
by a call submitted to it), a figure no load moves.

    PYTHONPATH=. .venv/bin/python scripts/bench_bls.py
    PYTHONPATH=. .venv/bin/python scripts/bench_bls.py --opcodes
    TRITON_ACTOR_FAST_PATHS=0 PYTHONPATH=. .venv/bin/python scripts/bench_bls.py   # the slow paths

``--perf`` serves the same repository from a server process of this checkout (and, with ``--triton``, from
real Triton 2.51, scripts/install_bench_tools.sh) to perf_analyzer over HTTP instead: per model and server,
the median over ``--rounds`` of infer/s, p50, and the server's CPU (user + system from /proc, Triton's python
stubs included) per request its statistics counted.

    .venv/bin/python scripts/bench_bls.py --perf --triton --rounds 3
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from triton_actor import bootstrap  # noqa: F401  (gevent patching first)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_request_path as request_path
import bench_step_opcodes as step_opcodes

IO_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""

ADD_SUB = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""

BLS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            call = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0", "OUTPUT1"],
                                             inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0"),
                                                     pb_utils.get_input_tensor_by_name(r, "INPUT1")])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                                                   pb_utils.get_output_tensor_by_name(answer, "OUTPUT1")]))
        return out
"""

NOBLS = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1")
            x, y = a.as_numpy(), b.as_numpy()
            answer = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + y), pb_utils.Tensor("OUTPUT1", x - y)])
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                                                   pb_utils.get_output_tensor_by_name(answer, "OUTPUT1")]))
        return out
"""

MODELS = {"add_sub": ADD_SUB, "bls": BLS, "nobls": NOBLS}


def write_repository(repo: Path) -> None:
    for name, source in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(IO_CONFIG)
        (repo / name / "1" / "model.py").write_text(source)


def http_infer(server: object, model: str) -> Callable[[], object]:
    """One binary ``/infer`` of ``model`` as perf_analyzer sends add_sub's, bytes to answer (status checked)."""
    import tritonclient.http as httpclient

    given = []
    for name, array in zip(("INPUT0", "INPUT1"), request_path._inputs(), strict=True):
        given.append(httpclient.InferInput(name, [4], "FP32"))
        given[-1].set_data_from_numpy(array, binary_data=True)
    asked = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    return step_opcodes.http_call(server, model, given, asked)


def instance_thread(model: str) -> object:
    from triton_actor.runtime.bridge import workers_tagged

    (worker,) = workers_tagged((model, 1))
    return worker


def thread_cpu_ns(worker: object) -> int:
    return time.clock_gettime_ns(time.pthread_getcpuclockid(worker.thread_id))


def measure(calls: dict[str, Callable[[], object]], rounds: int, n: int) -> dict[str, tuple[float, float, float]]:
    """Best (wall, hub CPU, instance thread CPU) per request in us, each figure's best round, per model."""
    threads = {model: instance_thread(model) for model in calls}
    best = {model: [float("inf")] * 3 for model in calls}
    for r in range(rounds):
        for model, one in calls.items():
            worker = threads[model]
            w0, h0, t0 = time.perf_counter_ns(), time.thread_time_ns(), thread_cpu_ns(worker)
            for _ in range(n):
                one()
            got = (time.perf_counter_ns() - w0, time.thread_time_ns() - h0, thread_cpu_ns(worker) - t0)
            best[model] = [min(b, g / n / 1000) for b, g in zip(best[model], got, strict=True)]
        print(f"  round {r + 1}/{rounds}: " + ", ".join(
            f"{m} {b[0]:.0f}/{b[1]:.0f}/{b[2]:.0f}" for m, b in best.items()) + " us wall/hub/thread", file=sys.stderr)
    return {m: tuple(b) for m, b in best.items()}


def count_both(one: Callable[[], object], worker: object, n: int, top: int) -> None:
    """Bytecodes per request by function, on the hub (this thread) and on ``worker``'s thread."""
    counts: dict[str, collections.Counter[object]] = {"hub": collections.Counter(), "thread": collections.Counter()}

    def tracer(own: collections.Counter[object]) -> Callable[..., object]:
        def trace(frame, event, arg):
            if event == "opcode":
                own[frame.f_code] += 1
            elif event == "call":
                frame.f_trace_opcodes = True
            return trace

        return trace

    def on_thread(_state: object, fn: object) -> None:
        sys.settrace(fn)

    worker.submit(on_thread, tracer(counts["thread"])).get()
    sys.settrace(tracer(counts["hub"]))
    try:
        for _ in range(n):
            one()
    finally:
        sys.settrace(None)
        worker.submit(on_thread, None).get()
    for where, own in counts.items():
        print(f"  {where}: {sum(own.values()) / n:.0f} bytecodes per request; by own bytecodes:")
        for code, k in own.most_common(top):
            print(f"     {k / n:7.1f}  {code.co_qualname} ({Path(code.co_filename).name}:{code.co_firstlineno})")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its child processes (Triton's python stubs)."""
    import subprocess

    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    total = 0
    for p in [pid, *(int(x) for x in out.split())]:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (the 14th and 15th fields)
    return total / os.sysconf("SC_CLK_TCK")


def served(port: int, model: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=30) as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def perf_main(a: argparse.Namespace) -> int:
    import statistics

    import bench_http as http

    work = Path(tempfile.mkdtemp(prefix="bench_bls_perf_"))
    write_repository(work / "repo")
    servers: dict[str, tuple[object, int]] = {}
    try:
        port = http.free_port()
        servers["triton_actor"] = (http.start_ours(work / "repo", port), port)
        if a.triton:
            port = http.free_port()
            servers["triton"] = (http.start_triton(work / "repo", port), port)
        for proc, port in servers.values():
            http.wait_ready(port, proc)
        rows: dict[tuple[str, str], list[tuple[float, float, float]]] = collections.defaultdict(list)
        for r in range(a.rounds):
            for name, (proc, port) in servers.items():
                for model in ("bls", "nobls"):
                    c0, n0 = process_cpu_s(proc.pid), served(port, model)
                    got = http.perf(port, a.concurrency, a.window_ms, work / "pa.csv", model=model,
                                    stability=a.stability)
                    c1, n1 = process_cpu_s(proc.pid), served(port, model)
                    rows[name, model].append((got["rps"], got["p50_us"], (c1 - c0) * 1e6 / max(1, n1 - n0)))
            print(f"  round {r + 1}/{a.rounds} done, load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
        print(f"perf_analyzer over HTTP, concurrency {a.concurrency}, medians of {a.rounds} rounds; "
              f"load average {os.getloadavg()[0]:.2f}")
        print("| server | model | infer/s | p50 us | server CPU us per request |")
        print("|---|---|---|---|---|")
        med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
        for (name, model), (rps, p50, cpu) in med.items():
            print(f"| {name} | {model} | {rps:.0f} | {p50:.0f} | {cpu:.0f} |")
        for name in servers:
            b, n = med[name, "bls"], med[name, "nobls"]
            print(f"{name}: one BLS call adds {b[1] - n[1]:.0f} us of p50 and {b[2] - n[2]:.0f} us of server CPU")
    finally:
        http.stop_servers([proc for proc, _ in servers.values()], work)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="requests per round and model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--opcodes", action="store_true", help="count bytecodes per request instead, by function")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--perf", action="store_true", help="perf_analyzer over HTTP on a server process instead")
    ap.add_argument("--triton", action="store_true", help="with --perf: real Triton 2.51 beside ours")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--stability", type=int, default=20, help="perf_analyzer's stability percentage")
    a = ap.parse_args()
    if a.perf:
        return perf_main(a)
    work = Path(tempfile.mkdtemp(prefix="bench_bls_"))
    write_repository(work)
    server = request_path._server(work)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        cleanup.callback(server.stop)
        calls = {model: http_infer(server, model) for model in ("bls", "nobls")}
        for one in calls.values():
            for _ in range(300):  # warm: caches filled, nobls promoted inline
                one()
        print(f"load average {os.getloadavg()[0]:.2f}; fast paths "
              f"{'on' if __import__('triton_actor.runtime.fastpath').runtime.fastpath.enabled else 'off'}")
        if a.opcodes:
            from triton_actor.actors.scheduling import instance

            instance.DEMOTE_NS = instance.DEMOTE_WALL_NS = 1 << 62  # traced, the inline runs stay inline
            for model, one in calls.items():
                print(model)
                count_both(one, instance_thread(model), a.n // 5, a.top)
            return 0
        best = measure(calls, a.rounds, a.n)
        for model, (wall, hub, thread) in best.items():
            print(f"{model:6s} wall {wall:6.1f} us, hub CPU {hub:6.1f} us, instance thread CPU {thread:6.1f} us")
        print("one BLS call (bls - nobls): " + ", ".join(
            f"{what} {best['bls'][i] - best['nobls'][i]:.1f} us" for i, what in enumerate(("wall", "hub CPU", "thread CPU"))))
        print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
