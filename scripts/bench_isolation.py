#!/usr/bin/env python3
"""Triton's add_sub in-process vs process-isolated (``--backend-config=python,isolation=process``), over HTTP
with perf_analyzer, rounds interleaved. ``--direct``: one instance's ``execute`` called in a loop, no server
(the round trip to the model's process alone). ``--frames``: how a BYTES tensor crosses the pipe, pickled in
band vs encoded with the BYTES codec (protocol/bytes_codec.py), encode + decode per tensor.

    scripts/install_bench_tools.sh          # once: perf_analyzer
    .venv/bin/python scripts/bench_isolation.py --rounds 3 [--concurrency 1,4]
    .venv/bin/python scripts/bench_isolation.py --direct   # + 3 custom metrics per request
    .venv/bin/python scripts/bench_isolation.py --scrape   # /metrics scrape time
    .venv/bin/python scripts/bench_isolation.py --frames

Writes ``bench_out/isolation.json`` and ``bench_out/isolation.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

from bench_http import (
    ROOT,
    TOOLS,
    copy_add_sub,
    free_port,
    perf,
    rss_kb,
    start_ours,
    start_triton,
    stop_servers,
    wait_ready,
)

VARIANTS = {"in_process": (), "isolated": ("--backend-config=python,isolation=process",)}


def frames() -> int:
    import numpy as np

    from triton_actor.backends.python.isolation_frames import FrameDecoder, encode
    from triton_actor.protocol import bytes_codec

    def cross(message: object) -> object:
        return FrameDecoder().feed(b"".join(bytes(p) for p in encode(message)))[0]

    print("| BYTES tensor | pickled in band | BYTES codec + raw buffer |\n|---|---|---|")
    for count, size in ((1, 16), (1000, 16), (1000, 1024)):
        array = np.array([b"x" * size] * count, dtype=object)

        def pickled(array: np.ndarray = array) -> None:
            cross(("t", array))

        def codec(array: np.ndarray = array, count: int = count) -> None:
            _, raw, shape = cross(("t", np.frombuffer(bytes_codec.serialize(array), np.uint8), array.shape))
            bytes_codec.deserialize(memoryview(raw), count, "t").reshape(shape)

        times = [min(timeit.repeat(f, number=200, repeat=5)) / 200 * 1e6 for f in (pickled, codec)]
        print(f"| {count} x {size} B | {times[0]:.0f} µs | {times[1]:.0f} µs |")
    return 0


# add_sub that also updates three custom metrics per request (the cost of forwarding them)
METERED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.count = pb_utils.MetricFamily("bench_requests", "d", pb_utils.MetricFamily.COUNTER).Metric()
        self.last = pb_utils.MetricFamily("bench_last", "d", pb_utils.MetricFamily.GAUGE).Metric()
        self.sizes = pb_utils.MetricFamily("bench_sizes", "d", pb_utils.MetricFamily.HISTOGRAM).Metric(
            buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            self.count.increment(1)
            self.last.set(float(a[0]))
            self.sizes.observe(float(a.size))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""


def direct(number: int, repeat: int) -> int:
    from bench_python_backend import make_instance, make_request  # (it patches gevent first, as the server)

    from triton_actor.backends.python import backend as py_backend
    from triton_actor.backends.python import isolated

    request = make_request()
    in_process = make_instance()
    metered_dir = Path(tempfile.mkdtemp(prefix="bench_isolation_")) / "add_sub"
    (metered_dir / "1").mkdir(parents=True)
    (metered_dir / "1" / "model.py").write_text(METERED_PY)
    metered = dataclasses.replace(in_process.ctx, model_dir=metered_dir, version_dir=metered_dir / "1")
    print("| add_sub execute([request]) | µs per call (best of repeats) |\n|---|---|")
    for name, make in (("in-process", lambda: in_process), ("isolated", lambda: isolated.IsolatedInstance(in_process.ctx)),
                       ("in-process, 3 custom metrics per request", lambda: py_backend.PythonInstance(metered)),
                       ("isolated, 3 custom metrics per request", lambda: isolated.IsolatedInstance(metered))):
        instance = make()
        instance.execute([request])
        best = min(timeit.repeat(lambda i=instance: i.execute([request]), number=number, repeat=repeat)) / number
        print(f"| {name} | {best * 1e6:.1f} |")
        instance.finalize()
    return 0


def scrape(count: int) -> int:
    """``/metrics`` scrape time with add_sub in-process vs isolated (each scrape of the isolated server asks
    the model's process for its unsent custom-metric changes first: one round trip)."""
    import urllib.request

    work = Path(tempfile.mkdtemp(prefix="bench_isolation_"))
    servers = {}
    try:
        for name, flags in VARIANTS.items():
            copy_add_sub(work / name)
            port, metrics_port = free_port(), free_port()
            proc = start_ours(work / name, port, *flags, "--allow-metrics=true", "--metrics-port", str(metrics_port),
                              "--metrics-address", "127.0.0.1")
            wait_ready(port, proc)
            servers[name] = (proc, metrics_port)
        print("| add_sub | /metrics scrape, median µs | p90 µs |\n|---|---|---|")
        for name, (_, metrics_port) in servers.items():
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            times = []
            for _ in range(count):
                start = timeit.default_timer()
                with urllib.request.urlopen(url, timeout=30) as r:
                    r.read()
                times.append((timeit.default_timer() - start) * 1e6)
            times.sort()
            print(f"| {name} | {statistics.median(times):.0f} | {times[int(len(times) * 0.9)]:.0f} |")
    finally:
        stop_servers([p for p, _ in servers.values()], work)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--stability", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out")
    ap.add_argument("--frames", action="store_true", help="only the BYTES-tensor framing micro-benchmark")
    ap.add_argument("--direct", action="store_true", help="only execute() in a loop, no server")
    ap.add_argument("--scrape", action="store_true", help="only /metrics scrape times, in-process vs isolated")
    ap.add_argument("--with-triton", action="store_true",
                    help="real Triton too (it isolates every Python model in a stub process)")
    ap.add_argument("--number", type=int, default=2000, help="--direct: calls per repeat")
    ap.add_argument("--repeat", type=int, default=5, help="--direct: repeats")
    args = ap.parse_args()
    if args.frames:
        return frames()
    if args.direct:
        return direct(args.number, args.repeat)
    if args.scrape:
        return scrape(200)
    if not (TOOLS / "perf_analyzer").exists():
        raise SystemExit(f"{TOOLS}/perf_analyzer missing: run scripts/install_bench_tools.sh")
    conc = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_isolation_"))
    servers = {}
    variants = {**VARIANTS, "triton": None} if args.with_triton else VARIANTS
    try:
        for name, flags in variants.items():
            copy_add_sub(work / name)
            port = free_port()
            proc = start_triton(work / name, port) if flags is None else start_ours(work / name, port, *flags)
            wait_ready(port, proc)
            servers[name] = (proc, port)
        memory = {n: rss_kb(p.pid, True) / 1024 for n, (p, _) in servers.items()}
        results: dict[str, dict[int, list[dict[str, float]]]] = {n: {c: [] for c in conc} for n in servers}
        for r in range(args.rounds):
            for c in conc:
                for name, (_, port) in servers.items():
                    res = perf(port, c, args.window_ms, work / "pa.csv", stability=args.stability)
                    results[name][c].append(res)
                    print(f"[round {r + 1}] c={c} {name:10s} {res['rps']:7.0f} infer/s p50 {res['p50_us']:5.0f} us "
                          f"p99 {res['p99_us']:5.0f} us", flush=True)
    finally:
        stop_servers([p for p, _ in servers.values()], work)
    med = {n: {c: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for c, runs in per.items()}
           for n, per in results.items()}
    lines = ["| concurrency | add_sub | infer/s (median) | p50 µs | p99 µs | vs in-process (infer/s) |",
             "|---|---|---|---|---|---|"]
    for c in conc:
        for name in servers:
            m = med[name][c]
            lines.append(f"| {c} | {name} | {m['rps']:.0f} | {m['p50_us']:.0f} | {m['p99_us']:.0f} | "
                         f"{m['rps'] / med['in_process'][c]['rps']:.2f}x |")
    lines.append("")
    lines.append("Resident memory with add_sub loaded (server + model processes): " +
                 ", ".join(f"{n} {mb:.0f} MB" for n, mb in memory.items()))
    _report(args.out, lines, {"results": results, "median": med, "memory_mb": memory})
    return 0


def _report(out: Path, lines: list[str], data: dict[str, object]) -> None:
    """Print the table; keep it (``isolation.md``) and the raw runs (``isolation.json``, with the load)."""
    table = "\n".join(lines)
    print(table)
    (out / "isolation.md").write_text(table + "\n")
    (out / "isolation.json").write_text(json.dumps({**data, "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
