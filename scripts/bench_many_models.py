#!/usr/bin/env python3
"""Many models, one memory budget (``--model-memory-budget`` with ``--model-load-on-demand``, plane/memory_budget.py).

Generates ``--models`` Python models that each fill 5..50 MiB of numpy in ``initialize`` (sizes drawn with
``--seed``; a sparse weights file of the same size is the estimate before a model's first load), starts our
server in EXPLICIT mode with nothing loaded and a budget of ``--budget-share`` of their total, then sends
Zipf-distributed traffic (exponent ``--zipf``) at ``--concurrency`` for ``--seconds``: every request names a
model drawn by rank. Reports requests and failures (must be 0), the hit ratio (requests that found their
model loaded), p50/p99 of hot and cold requests (cold: a load of its model finished while it waited, read
from the server's log), loads and evictions per minute, and the server's peak memory (unique set size of
its process tree, sampled every 0.1 s) above what it held before the first request, against the budget.

    .venv/bin/python scripts/bench_many_models.py --models 30 --seconds 60

Writes ``bench_out/many_models.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from bench_http import ROOT, free_port, start_ours, stop_servers, wait_ready

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


def make_repo(repo: Path, count: int, low: int, high: int, rng: random.Random) -> dict[str, int]:
    sizes = {}
    for i in range(count):
        name, mib = f"m{i:03d}", rng.randint(low, high)
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG)
        (repo / name / "1" / "model.py").write_text(MODEL_PY.format(mib=mib))
        with open(repo / name / "1" / "weights.bin", "wb") as f:
            f.truncate(mib * MIB)  # sparse
        sizes[name] = mib
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


def sample_memory(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.1):
        peak[0] = max(peak[0], sum(process_bytes(p, unique=True) for p in tree_pids(pid)))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--min-mib", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=50)
    ap.add_argument("--budget-share", type=float, default=0.2, help="budget / total size of the models")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="many_models_"))
    sizes = make_repo(work / "repo", a.models, a.min_mib, a.max_mib, rng)
    budget = int(sum(sizes.values()) * MIB * a.budget_share)
    port, log = free_port(), work / "server.log"
    proc = start_ours(work / "repo", port, "--model-control-mode=explicit", "--model-load-on-demand",
                      f"--model-memory-budget={budget}", "--log-info=true", log=log)
    try:
        wait_ready(port, proc)
        baseline = sum(process_bytes(p, unique=True) for p in tree_pids(proc.pid))
        names = list(sizes)
        rng.shuffle(names)  # popularity rank unrelated to size
        weights = [1 / (rank + 1) ** a.zipf for rank in range(len(names))]
        stop, peak, results = threading.Event(), [baseline], []
        sampler = threading.Thread(target=sample_memory, args=(proc.pid, stop, peak))
        sampler.start()
        until = time.time() + a.seconds
        threads = [threading.Thread(target=client, args=(port, names, weights, until, a.seed + i, results))
                   for i in range(a.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
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
    report = {
        "command": " ".join(sys.argv), "models": a.models, "total_mib": sum(sizes.values()),
        "budget_mib": round(budget / MIB, 1), "concurrency": a.concurrency, "seconds": a.seconds, "zipf": a.zipf,
        "requests": len(results), "failed": len(failed), "hit_ratio": round(len(hot) / max(1, len(hot) + len(cold)), 4),
        "hot_p50_ms": round(pct(hot, 0.5), 2), "hot_p99_ms": round(pct(hot, 0.99), 2),
        "cold_p50_ms": round(pct(cold, 0.5), 2), "cold_p99_ms": round(pct(cold, 0.99), 2),
        "loads_per_min": round(status["loads"] / minutes, 1), "evictions_per_min": round(status["evictions"] / minutes, 1),
        "peak_above_baseline_mib": round((peak[0] - baseline) / MIB, 1), "baseline_mib": round(baseline / MIB, 1),
        "budget_used_peak_mib": round(max((int(m.group(1)) for m in map(USED.search, log.read_text().splitlines())
                                           if m), default=0) / MIB, 1),
        "budget_used_at_end_mib": round(status["used"] / MIB, 1), "log": str(log), "failures": [r[4].decode() for r in failed[:5]],
    }
    print(json.dumps(report, indent=1))
    out = ROOT / "bench_out"
    out.mkdir(exist_ok=True)
    (out / "many_models.json").write_text(json.dumps(report, indent=1))
    shutil.rmtree(work / "repo", ignore_errors=True)  # the server log stays (its path is in the report)
    return 1 if failed else 0


def urllib_get(port: int, path: str):
    import urllib.request
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30)


if __name__ == "__main__":
    sys.exit(main())
