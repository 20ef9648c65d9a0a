#!/usr/bin/env python3
"""Many models, one memory budget (``--model-memory-budget`` with ``--model-load-on-demand``, plane/memory_budget.py).

Generates ``--models`` models of 5..50 MiB each (sizes drawn with ``--seed``): ONNX models (a share
``--onnx-share``) whose weights are a real initializer of that size, and Python models that fill that much
numpy in ``initialize`` (a sparse weights file of the same size is the estimate before a model's first load).
It starts our server in EXPLICIT mode with nothing loaded and a budget of ``--budget-share`` of their total, then sends
Zipf-distributed traffic (exponent ``--zipf``) at ``--concurrency`` for ``--seconds``: every request names a
model drawn by rank. Reports requests and failures (must be 0), the hit ratio (requests that found their
model loaded), p50/p99 of hot and cold requests (cold: a load of its model finished while it waited, read
from the server's log), loads and evictions per minute, and the server's peak memory (unique set size of
its process tree, sampled every 0.1 s) above what it held before the first request, against the budget.

``--triton`` then sends the same traffic (same seed) to real Triton 2.51 with every model loaded, for the memory
comparison (Triton here has only its Python backend, so ``--triton`` makes every model a Python model); Triton
is stopped if its process tree passes ``--triton-max-gib`` while loading ("does not fit"). ``--plot`` draws
memory over time for both, with the budget.

    .venv/bin/python scripts/bench_many_models.py --models 30 --seconds 60
    .venv/bin/python scripts/bench_many_models.py --models 200 --seconds 180 --triton --plot docs/many_models.png

Writes ``bench_out/many_models.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from bench_http import ROOT, TOOLS, free_port, start_ours, stop_servers, wait_ready

sys.path.insert(0, str(ROOT))
from triton_actor.runtime.process_memory import process_bytes, tree_pids

MIB = 1 << 20
CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
MODEL_PY = """import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.ones({mib} * 1024 * 1024, np.uint8)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}).encode()
USED = re.compile(r"memory budget: loaded .*; (\d+) of \d+ used")
LOADED = re.compile(r"^I(\d{4} \d\d:\d\d:\d\d\.\d{6}) .*memory budget: loaded '([^']+)'")


ONNX_CONFIG = CONFIG.replace('backend: "python"', 'platform: "onnxruntime_onnx"')


def onnx_model(path: Path, mib: int, seed: int) -> None:
    """OUTPUT0 = INPUT0 + W[int(INPUT0)]: W (``mib`` MiB of float32) is read by the graph, so ONNX Runtime
    can neither fold it away nor drop it; its values are random so its pages are really there."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    weights = np.random.default_rng(seed).random(mib * MIB // 4, dtype=np.float32) * 1e-6
    graph = helper.make_graph(
        [helper.make_node("Cast", ["INPUT0"], ["idx"], to=TensorProto.INT64),
         helper.make_node("Gather", ["W", "idx"], ["w"]),
         helper.make_node("Add", ["INPUT0", "w"], ["OUTPUT0"])],
        "weights", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [-1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [-1])],
        [numpy_helper.from_array(weights, "W")])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


def make_repo(repo: Path, count: int, low: int, high: int, onnx_share: float, rng: random.Random) -> dict[str, int]:
    sizes = {}
    for i in range(count):
        name, mib = f"m{i:03d}", rng.randint(low, high)
        (repo / name / "1").mkdir(parents=True)
        if rng.random() < onnx_share:
            (repo / name / "config.pbtxt").write_text(ONNX_CONFIG)
            onnx_model(repo / name / "1" / "model.onnx", mib, i)
        else:
            (repo / name / "config.pbtxt").write_text(CONFIG)
            (repo / name / "1" / "model.py").write_text(MODEL_PY.format(mib=mib))
            with open(repo / name / "1" / "weights.bin", "wb") as f:
                f.truncate(mib * MIB)  # sparse
        sizes[name] = mib
        if (i + 1) % 20 == 0 or i + 1 == count:
            print(f"[bench] generated {i + 1}/{count} models", file=sys.stderr, flush=True)
    return sizes


def client(port: int, names: list[str], weights: list[float], until: float, seed: int, out: list) -> None:
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while time.time() < until:
        name = rng.choices(names, weights)[0]
        start = time.time()
        try:
            conn.request("POST", f"/v2/models/{name}/infer", BODY, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            text = answer.read()
            ok = answer.status == 200
        except OSError as e:
            ok, text = False, repr(e).encode()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        out.append((name, start, time.time(), ok, b"" if ok else text[:200]))


def tree_uss(pid: int) -> int:
    total = 0
    for p in tree_pids(pid):
        try:
            total += process_bytes(p, unique=True)
        except OSError:  # a child that just exited
            pass
    return total


def sample_memory(pid: int, stop: threading.Event, peak: list[int], series: list[tuple[float, int]],
                  cap: int = 0) -> None:
    """Every 0.1 s: the process tree's unique set size (peak and a series for the plot); past ``cap``
    (when given) the server is killed and the sampler stops."""
    start = time.time()
    while not stop.wait(0.1):
        used = tree_uss(pid)
        peak[0] = max(peak[0], used)
        series.append((time.time() - start, used))
        if cap and used > cap:
            for p in tree_pids(pid):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            peak.append(-1)  # marks "stopped at the cap"
            return


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else 0.0


def drive(port: int, names: list[str], weights: list[float], a: argparse.Namespace) -> list:
    """``--concurrency`` client threads for ``--seconds``; a progress line every 10 s."""
    results: list = []
    until = time.time() + a.seconds
    threads = [threading.Thread(target=client, args=(port, names, weights, until, a.seed + i, results))
               for i in range(a.concurrency)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        threads[0].join(10)
        left = max(0, until - time.time())
        print(f"[bench] {len(results)} requests, {sum(1 for r in results if not r[3])} failed, {left:.0f} s left",
              file=sys.stderr, flush=True)
    for t in threads:
        t.join()
    return results


def pcts(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(values, 0.5), 2), "p99_ms": round(pct(values, 0.99), 2)}


def run_ours(a: argparse.Namespace, repo: Path, work: Path, sizes: dict[str, int], names: list[str],
             weights: list[float]) -> dict:
    budget = int(sum(sizes.values()) * MIB * a.budget_share)
    port, log = free_port(), work / "server.log"
    proc = start_ours(repo, port, "--model-control-mode=explicit", "--model-load-on-demand",
                      f"--model-memory-budget={budget}", "--log-info=true", log=log)
    series: list[tuple[float, int]] = []
    try:
        wait_ready(port, proc)
        baseline = tree_uss(proc.pid)
        stop, peak = threading.Event(), [baseline]
        sampler = threading.Thread(target=sample_memory, args=(proc.pid, stop, peak, series))
        sampler.start()
        results = drive(port, names, weights, a)
        stop.set()
        sampler.join()
        with urllib_get(port, "/status.json") as answer:
            status = json.loads(answer.read())["memory_budget"]
    finally:
        stop_servers([proc], Path(tempfile.mkdtemp()))
    year = datetime.now().year
    loaded = [(m.group(2), datetime.strptime(f"{year}{m.group(1)}", "%Y%m%d %H:%M:%S.%f").timestamp())
              for m in map(LOADED.match, log.read_text().splitlines()) if m]
    hot, cold, failed = [], [], [r for r in results if not r[3]]
    for name, start, end, ok, _ in results:
        if ok:
            (cold if any(n == name and start <= t <= end for n, t in loaded) else hot).append(end - start)
    minutes = a.seconds / 60
    return {
        "budget_mib": round(budget / MIB, 1),
        "requests": len(results), "failed": len(failed), "hit_ratio": round(len(hot) / max(1, len(hot) + len(cold)), 4),
        "hot_p50_ms": round(pct(hot, 0.5), 2), "hot_p99_ms": round(pct(hot, 0.99), 2),
        "cold_p50_ms": round(pct(cold, 0.5), 2), "cold_p99_ms": round(pct(cold, 0.99), 2),
        "all": pcts([r[2] - r[1] for r in results if r[3]]),
        "loads_per_min": round(status["loads"] / minutes, 1), "evictions_per_min": round(status["evictions"] / minutes, 1),
        "peak_above_baseline_mib": round((peak[0] - baseline) / MIB, 1), "baseline_mib": round(baseline / MIB, 1),
        "peak_mib": round(peak[0] / MIB, 1),
        "budget_used_peak_mib": round(max((int(m.group(1)) for m in map(USED.search, log.read_text().splitlines())
                                           if m), default=0) / MIB, 1),
        "budget_used_at_end_mib": round(status["used"] / MIB, 1), "log": str(log),
        "failures": [r[4].decode() for r in failed[:5]],
        "series": [(round(t, 1), round(b / MIB, 1)) for t, b in series],
    }


def run_triton(a: argparse.Namespace, repo: Path, names: list[str], weights: list[float]) -> dict:
    """Real Triton 2.51 with every model loaded (EXPLICIT, --load-model=*), the same traffic."""
    port = free_port()
    args = [str(TOOLS / "tritonserver"), f"--model-repository={repo}", "--http-address=127.0.0.1",
            f"--http-port={port}", "--allow-grpc=false", "--allow-metrics=false", "--log-info=false",
            "--model-control-mode=explicit", "--load-model=*"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    series: list[tuple[float, int]] = []
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=sample_memory, args=(proc.pid, stop, peak, series, int(a.triton_max_gib * (1 << 30))))
    sampler.start()
    load_start = time.time()
    try:
        try:
            wait_ready(port, proc, timeout=1800)
        except SystemExit as e:
            stop.set()
            sampler.join()
            return {"fits": False, "why": f"{e} (peak {peak[0] / MIB:.0f} MiB, cap {a.triton_max_gib} GiB)",
                    "peak_mib": round(peak[0] / MIB, 1), "series": [(round(t, 1), round(b / MIB, 1)) for t, b in series]}
        load_s = time.time() - load_start
        print(f"[bench] triton ready with {len(names)} models in {load_s:.0f} s", file=sys.stderr, flush=True)
        results = drive(port, names, weights, a)
        stop.set()
        sampler.join()
    finally:
        stop.set()
        stop_servers([proc], Path(tempfile.mkdtemp()))
    failed = [r for r in results if not r[3]]
    return {"fits": peak[-1] != -1, "load_all_s": round(load_s, 1), "requests": len(results), "failed": len(failed),
            "all": pcts([r[2] - r[1] for r in results if r[3]]), "peak_mib": round(peak[0] / MIB, 1),
            "failures": [r[4].decode() for r in failed[:5]],
            "series": [(round(t, 1), round(b / MIB, 1)) for t, b in series]}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    ours = report["ours"]
    ax.plot(*zip(*ours["series"], strict=True), label="triton_actor (load on demand, LRU eviction)", color="tab:blue")
    ax.axhline(ours["baseline_mib"] + ours["budget_mib"], color="tab:blue", linestyle="--",
               label=f"its budget ({ours['budget_mib']:.0f} MiB) above its idle size")
    if report.get("triton", {}).get("series"):
        ax.plot(*zip(*report["triton"]["series"], strict=True), label="Triton 2.51 (all models loaded)", color="tab:orange")
    ax.set_xlabel("seconds since start (Triton: including its loads)")
    ax.set_ylabel("unique set size of the process tree, MiB")
    ax.set_title(f"{report['models']} models ({report['total_mib']} MiB of weights), Zipf {report['zipf']} "
                 f"traffic at concurrency {report['concurrency']}")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--min-mib", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=50)
    ap.add_argument("--onnx-share", type=float, default=0.5, help="share of ONNX models (0 with --triton)")
    ap.add_argument("--budget-share", type=float, default=0.2, help="budget / total size of the models")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--triton", action="store_true", help="the same traffic to real Triton 2.51, every model loaded")
    ap.add_argument("--triton-max-gib", type=float, default=12.0, help="stop Triton past this (does not fit)")
    ap.add_argument("--plot", type=Path, help="write a PNG of memory over time here")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="many_models_"))
    sizes = make_repo(work / "repo", a.models, a.min_mib, a.max_mib, 0.0 if a.triton else a.onnx_share, rng)
    names = list(sizes)
    rng.shuffle(names)  # popularity rank unrelated to size
    weights = [1 / (rank + 1) ** a.zipf for rank in range(len(names))]
    report = {"command": " ".join(sys.argv), "models": a.models, "total_mib": sum(sizes.values()),
              "onnx_models": sum(1 for n in names if (work / "repo" / n / "1" / "model.onnx").exists()),
              "concurrency": a.concurrency, "seconds": a.seconds, "zipf": a.zipf}
    report["ours"] = run_ours(a, work / "repo", work, sizes, names, weights)
    if a.triton:
        report["triton"] = run_triton(a, work / "repo", names, weights)
    shown = {k: ({kk: vv for kk, vv in v.items() if kk != "series"} if isinstance(v, dict) else v)
             for k, v in report.items()}
    print(json.dumps(shown, indent=1))
    out = ROOT / "bench_out"
    out.mkdir(exist_ok=True)
    (out / "many_models.json").write_text(json.dumps(report, indent=1))
    if a.plot:
        plot(report, a.plot)
    shutil.rmtree(work / "repo", ignore_errors=True)  # the server log stays (its path is in the report)
    failed = report["ours"]["failed"] + report.get("triton", {}).get("failed", 0)
    return 1 if failed else 0


def urllib_get(port: int, path: str):
    import urllib.request
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30)


if __name__ == "__main__":
    sys.exit(main())
