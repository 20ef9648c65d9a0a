#!/usr/bin/env python3
"""What a pipeline step costs: three-step Python ensembles, latency and server CPU per inference.

Writes one repository in Triton's format (the same files serve real Triton 2.51 with ``--triton``):

* ``pipeline``: an ensemble of three Python models, ``lookup`` (a table lookup: INT32 [128] indices →
  FP32 [128,32] rows, 16 KB), ``dense`` (a 128x128 matmul with relu, 16 KB out) and ``mean`` (FP32 [32]);
* ``trivial``: an ensemble of three trivial steps, ``alloc`` (FP32 [4] → a new [4096] array, 16 KB),
  ``pass`` (hands its input on) and ``cut`` (slices it back to [4]); ``pass`` alone on [4] is the one-step
  reference, so one extra step costs ``(trivial p50 - pass p50) / 2``.

A Python client (tritonclient HTTP, one connection, concurrency 1) sends ``--requests`` requests per
model after a warm-up; the server's CPU time (utime + stime from /proc of the server and its child
processes: Triton's Python stubs) over the run, divided by the requests, is the CPU per inference.
Measure CPU on a busy machine (other engineers' jobs skew wall times, not CPU); compare runs made in the
same conditions, ``--rounds`` interleaves the servers. Set ``OPENBLAS_NUM_THREADS=1``: numpy's BLAS threads
spin after each matmul, and on a loaded host their CPU swamps what the servers do.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/bench_pipeline.py --requests 2000 --rounds 3
    TRITON_ACTOR_FAST_PATHS=0 .venv/bin/python scripts/bench_pipeline.py     # the slow paths
    .venv/bin/python scripts/bench_pipeline.py --triton                        # and real Triton beside it
    .venv/bin/python scripts/bench_pipeline.py --profile out.prof --only trivial   # cProfile of our server
    .venv/bin/python scripts/bench_pipeline.py --before /work/main --rounds 3      # another checkout beside

Prints a table and writes ``bench_out/pipeline.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http import ROOT, PerfFailed, free_port, perf, start_triton, stop_servers, wait_ready

_PY_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        rng = np.random.default_rng(0)
        self.table = rng.standard_normal((1024, 32)).astype(np.float32)
        self.w = rng.standard_normal((128, 128)).astype(np.float32)

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", %s)]))
        return out
"""
_BODIES = {  # model → (input dtype, input dims, output dims, the expression of Y)
    "lookup": ("TYPE_INT32", "[ 128 ]", "[ 128, 32 ]", "self.table[x % 1024]"),
    "dense": ("TYPE_FP32", "[ 128, 32 ]", "[ 32, 128 ]", "np.maximum(x.reshape(32, 128) @ self.w, 0)"),
    "mean": ("TYPE_FP32", "[ 32, 128 ]", "[ 32 ]", "x.mean(axis=1)"),
    "alloc": ("TYPE_FP32", "[ -1 ]", "[ -1 ]", "np.full(4096, x[0], np.float32)"),
    "pass": ("TYPE_FP32", "[ -1 ]", "[ -1 ]", "x"),
    "cut": ("TYPE_FP32", "[ -1 ]", "[ -1 ]", "x[:4].copy()"),
}
_CONFIG = """name: "%s"
backend: "python"
input [ { name: "X", data_type: %s, dims: %s } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: %s } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
_ENSEMBLE = """name: "%(name)s"
platform: "ensemble"
input [ { name: "IN", data_type: %(dtype)s, dims: %(dims)s } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: %(out)s } ]
ensemble_scheduling { step [
  { model_name: "%(a)s" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "T1" } },
  { model_name: "%(b)s" model_version: -1 input_map { key: "X" value: "T1" } output_map { key: "Y" value: "T2" } },
  { model_name: "%(c)s" model_version: -1 input_map { key: "X" value: "T2" } output_map { key: "Y" value: "OUT" } }
] }
"""
# what each measured model is sent: (input dtype, array)
INPUTS = {
    "pipeline": ("INT32", np.arange(128, dtype=np.int32)),
    "trivial": ("FP32", np.ones(4, np.float32)),
    "pass": ("FP32", np.ones(4, np.float32)),
}


def write_repository(repo: Path) -> None:
    for name, (dtype, dims, out, expr) in _BODIES.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_CONFIG % (name, dtype, dims, out))
        (repo / name / "1" / "model.py").write_text(_PY_MODEL % expr)
    for name, dtype, dims, out, steps in (("pipeline", "TYPE_INT32", "[ 128 ]", "[ 32 ]", ("lookup", "dense", "mean")),
                                          ("trivial", "TYPE_FP32", "[ -1 ]", "[ -1 ]", ("alloc", "pass", "cut"))):
        (repo / name / "1").mkdir(parents=True)
        a, b, c = steps
        (repo / name / "config.pbtxt").write_text(_ENSEMBLE % dict(name=name, dtype=dtype, dims=dims, out=out, a=a, b=b, c=c))


def cpu_ns(pid: int) -> int:
    """utime + stime of ``pid`` and its live child processes (Triton's Python stubs), in ns."""
    tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    total = 0
    pids = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children = (task / "children").read_text().split()
            pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) * tick
    return total


def run_model(port: int, pid: int, model: str, requests: int, warmup: int) -> dict[str, float]:
    """``requests`` sequential requests (after ``warmup``): p50/p99 latency (µs) and server CPU per inference (µs)."""
    import tritonclient.http as httpclient

    dtype, data = INPUTS[model]
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    inp = httpclient.InferInput("IN" if model != "pass" else "X", list(data.shape), dtype)
    inp.set_data_from_numpy(data, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUT" if model != "pass" else "Y", binary_data=True)]
    for _ in range(warmup):
        client.infer(model, [inp], outputs=outputs)
    lat = []
    c0, p0 = cpu_ns(pid), time.process_time_ns()
    for _ in range(requests):
        t0 = time.perf_counter_ns()
        client.infer(model, [inp], outputs=outputs)
        lat.append(time.perf_counter_ns() - t0)
    server = cpu_ns(pid) - c0
    client_cpu = time.process_time_ns() - p0
    client.close()
    lat.sort()
    return {"p50_us": statistics.median(lat) / 1e3, "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
            "server_cpu_us": server / requests / 1e3, "client_cpu_us": client_cpu / requests / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--triton", action="store_true", help="real Triton 2.51 beside ours (scripts/install_bench_tools.sh)")
    ap.add_argument("--only", choices=sorted(INPUTS), action="append", help="measure only these models")
    ap.add_argument("--profile", type=Path, help="run our server under cProfile, write its stats here")
    ap.add_argument("--before", type=Path, help="another checkout (e.g. main's) measured beside this one, as 'before'")
    ap.add_argument("--concurrency", default="", help="also drive `pipeline` with perf_analyzer over HTTP at these "
                    "concurrencies (e.g. 1,4): throughput, p50/p99 and server CPU per inference")
    ap.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer's measurement window")
    ap.add_argument("--workers", type=int, default=1, help="also our server with this many worker processes "
                    "(`--workers N`, one port), as 'workers'")
    args = ap.parse_args()
    models = args.only or ["pass", "trivial", "pipeline"]
    levels = [int(c) for c in args.concurrency.split(",") if c]
    work = Path(tempfile.mkdtemp(prefix="bench_pipeline_"))
    repo = work / "repo"
    write_repository(repo)
    servers = (["ours"] + (["workers"] if args.workers > 1 else []) + (["before"] if args.before else [])
               + (["triton"] if args.triton else []))
    results: dict[str, dict[str, list[dict[str, float]]]] = {server: {} for server in servers}
    try:
        for _ in range(args.rounds):
            for server in servers:
                port = free_port()
                if server == "ours":
                    proc = start_server(repo, port, ROOT, args.profile)
                elif server == "workers":
                    proc = start_server(repo, port, ROOT, None, args.workers)
                elif server == "before":
                    proc = start_server(repo, port, args.before)
                else:
                    proc = start_triton(repo, port)
                try:
                    wait_ready(port, proc)
                    for model in models:
                        r = run_model(port, proc.pid, model, args.requests, args.warmup)
                        results[server].setdefault(model, []).append(r)
                    for c in levels:
                        r = drive(port, proc.pid, c, args.window_ms, work / "perf.csv")
                        if r is not None:
                            results[server].setdefault(f"pipeline c={c}", []).append(r)
                finally:
                    stop_servers([proc], work / "none")
    finally:
        stop_servers([], work)
    report(results, servers)
    out = ROOT / "bench_out"
    out.mkdir(exist_ok=True)
    (out / "pipeline.json").write_text(json.dumps(results, indent=1))
    return 0


_RUN = "sys.argv = ['triton_actor'] + sys.argv[1:]\nrunpy.run_module('triton_actor', run_name='__main__')\n"
_PROFILED = """import cProfile, os, time
prof = cProfile.Profile(time.thread_time)
_exit = os._exit
def _dump_then_exit(code):
    prof.disable()
    prof.dump_stats(%r)
    _exit(code)
os._exit = _dump_then_exit
prof.enable()
"""


def start_server(repo: Path, port: int, root: Path, profile: Path | None = None, workers: int = 1) -> subprocess.Popen:
    """Our server from checkout ``root``; with ``profile``, under cProfile counting the hub thread's CPU
    time (a busy host preempts: wall time would mostly be waiting). The server ends with ``os._exit``,
    which skips cProfile's own dump, so the wrapper dumps first."""
    code = "import runpy, sys\n" + (_PROFILED % str(profile) if profile is not None else "") + _RUN
    args = [sys.executable, "-c", code, "--model-repository", str(repo), "--http-port", str(port),
            "--http-address", "127.0.0.1", "--log-info=false", "--allow-grpc=false", "--allow-metrics=false"]
    if workers > 1:
        args += ["--workers", str(workers)]
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def drive(port: int, pid: int, c: int, window_ms: int, out_csv: Path) -> dict[str, float] | None:
    """``pipeline`` under perf_analyzer (random INT32 inputs, as it sends them) at concurrency ``c``; the
    server's CPU per inference over the run, from /proc and the ensemble's statistics (its inference count)."""
    cpu0, n0 = cpu_ns(pid), _count(port)
    try:
        r = perf(port, c, window_ms, out_csv, model="pipeline")
    except PerfFailed as e:  # no stable measurement on a noisy machine: a gap, said
        print(f"[bench] pipeline c={c}: {str(e).splitlines()[0]}", flush=True)
        return None
    cpu_us = (cpu_ns(pid) - cpu0) / 1000 / max(1, _count(port) - n0)
    print(f"[bench] pipeline c={c} port {port}: {r['rps']:.0f} infer/s, p50 {r['p50_us']:.0f} µs, "
          f"p99 {r['p99_us']:.0f} µs, {cpu_us:.0f} µs CPU/inference", flush=True)
    return {"p50_us": r["p50_us"], "p99_us": r["p99_us"], "server_cpu_us": cpu_us, "rps": r["rps"]}


def _count(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/pipeline/stats", timeout=10) as r:
        return int(json.load(r)["model_stats"][0]["inference_count"])


def report(results: dict[str, dict[str, list[dict[str, float]]]], servers: list[str]) -> None:
    print(f"{'server':8} {'model':9} {'p50 µs':>8} {'p99 µs':>8} {'server CPU µs/inf':>18}")
    for server in servers:
        med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results[server].items()}
        for model, r in med.items():
            rate = f" {r['rps']:8.0f} infer/s" if "rps" in r else ""
            print(f"{server:8} {model:9} {r['p50_us']:8.0f} {r['p99_us']:8.0f} {r['server_cpu_us']:18.0f}{rate}")
        if "trivial" in med and "pass" in med:
            step = (med["trivial"]["p50_us"] - med["pass"]["p50_us"]) / 2
            cpu = (med["trivial"]["server_cpu_us"] - med["pass"]["server_cpu_us"]) / 2
            print(f"{server:8} one extra step: {step:.0f} µs of p50, {cpu:.0f} µs of server CPU")
    for name in ("ours", "workers"):
        if "triton" not in servers or name not in servers:
            continue
        for model in sorted(m for m in results[name] if m.startswith("pipeline c=") and m in results["triton"]):
            ours, triton = (statistics.median(r["rps"] for r in results[s][model]) for s in (name, "triton"))
            print(f"{model}: {name} {ours:.0f} infer/s, Triton {triton:.0f}: {ours / triton:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
