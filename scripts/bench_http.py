#!/usr/bin/env python3
"""add_sub over HTTP: triton_actor next to real Triton 2.51, driven by perf_analyzer, in one run.

Both servers serve Triton's own ``add_sub`` unchanged (``scripts/triton_reference/add_sub``: FP32 [4],
python backend, no batching, no parameter of ours).
Rounds interleave the servers so machine noise hits both alike; the table reports medians and the
ratio ours/Triton. Resident memory is read from /proc (Triton: server + its python stub processes).

    scripts/install_bench_tools.sh          # once: perf_analyzer and real tritonserver
    .venv/bin/python scripts/bench_http.py --rounds 3

Writes ``bench_out/http.json`` and ``bench_out/http.md``.

``--metrics-compare`` measures what metrics cost instead (no Triton): triton_actor with ``--allow-metrics=false``
against triton_actor with metrics on and ``/metrics`` scraped every ``--scrape-interval-ms`` (as Prometheus
would) during the run; the ratio column is metrics on / metrics off (the goal: >= 0.95 at c=4; docs/performance.md#metrics).

``--otel-compare`` measures what OpenTelemetry tracing costs (no Triton): triton_actor with tracing off, and with
``--trace-config mode=opentelemetry`` at ``rate=1`` (every request traced: three spans each) and ``rate=1000``,
exporting to an OTLP/HTTP sink in this script (it answers 200 and counts the exports); the ratio column is
traced / off (docs/traces.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(os.environ.get("BENCH_TOOLS_DIR", Path.home() / ".cache" / "triton_actor_bench"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not become ready")


def rss_kb(pid: int, with_children: bool) -> int:
    """VmRSS of ``pid`` (and of its child processes, for Triton's python stubs)."""
    pids = [pid]
    if with_children:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    total = 0
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        m = re.search(r"VmRSS:\s+(\d+)", status)
        total += int(m.group(1)) if m else 0
    return total


def start_ours(repo: Path, port: int, *extra: str, log: Path | None = None) -> subprocess.Popen:
    """Our server on ``repo`` (extra flags appended); its output goes to ``log`` if given, else nowhere."""
    args = [sys.executable, "-m", "triton_actor", "--model-repository", str(repo), "--http-port", str(port),
            "--http-address", "127.0.0.1", "--log-info=false", "--allow-grpc=false",
            "--allow-metrics=false", *extra]  # metrics off unless extra turns them on (the last flag wins)
    out = log.open("wb") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log:
            out.close()


def copy_add_sub(repo: Path) -> None:
    """A repository with just Triton's own ``add_sub`` (``scripts/triton_reference/add_sub``: Triton's
    config.pbtxt and model.py, no parameter of ours), served unchanged by both servers."""
    shutil.copytree(ROOT / "scripts" / "triton_reference" / "add_sub", repo / "add_sub",
                    ignore=shutil.ignore_patterns("__pycache__"))


def start_metrics_off(repo: Path, port: int) -> subprocess.Popen:
    return start_ours(repo, port)


class MetricsScraper:
    """``--metrics-compare``: our server with /metrics on a free port, scraped every ``interval_s`` from a thread."""

    def __init__(self, interval_s: float) -> None:
        self.port = free_port()
        self.interval_s = interval_s
        self.scrapes = 0
        self._stop = threading.Event()

    def start_server(self, repo: Path, port: int) -> subprocess.Popen:
        proc = start_ours(repo, port, "--allow-metrics=true", "--metrics-port", str(self.port), "--metrics-address", "127.0.0.1")
        threading.Thread(target=self._run, daemon=True).start()
        return proc

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                pass  # not listening yet, or stopping

    def stop(self) -> None:
        self._stop.set()


class OtlpSink:
    """``--otel-compare``: an OTLP/HTTP traces endpoint on a free port that takes every export (200) and counts them."""

    def __init__(self) -> None:
        sink = self
        self.exports = self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server calls it by this name
                sink.bytes += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                sink.exports += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def starter(self, rate: int) -> Callable[[Path, int], subprocess.Popen]:
        url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        return lambda repo, port: start_ours(repo, port, "--trace-config", "mode=opentelemetry", "--trace-config",
                                             "level=TIMESTAMPS", "--trace-config", f"rate={rate}",
                                             "--trace-config", f"opentelemetry,url={url}")

    def stop(self) -> None:
        self.server.shutdown()


def start_triton(repo: Path, port: int) -> subprocess.Popen:
    args = [str(TOOLS / "tritonserver"), f"--model-repository={repo}", "--http-address=127.0.0.1",
            f"--http-port={port}", "--allow-grpc=false", "--allow-metrics=false", "--log-info=false"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class PerfFailed(SystemExit):
    """perf_analyzer exited non-zero (e.g. no stable measurement within --max-trials); carries its output."""


def perf(port: int, concurrency: int, window_ms: int, out_csv: Path, protocol: str = "http", *,
         model: str = "add_sub", stability: int = 20, max_trials: int = 20,
         extra: tuple[str, ...] = ()) -> dict[str, float]:
    """One perf_analyzer run (HTTP, one concurrency); infer/s and p50/p99 latency (µs) from its CSV, plus the
    server-side queue and compute-infer times (µs per request) it read from the statistics endpoint."""
    args = [str(TOOLS / "perf_analyzer"), "-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol,
            "--concurrency-range", str(concurrency), "-p", str(window_ms), "-s", str(stability),
            "--max-trials", str(max_trials), "-f", str(out_csv), *extra]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PerfFailed(f"perf_analyzer failed:\n{proc.stdout}\n{proc.stderr}")
    row = next(csv.DictReader(out_csv.open()))
    return {"rps": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"]),
            "p99_us": float(row["p99 latency"]), "queue_us": float(row.get("Server Queue") or 0),
            "infer_us": float(row.get("Server Compute Infer") or 0)}


def stop_servers(procs: list[subprocess.Popen], work: Path) -> None:
    """SIGINT every server (a clean stop), kill what is still there after 30 s, remove the scratch folder."""
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--no-triton", action="store_true", help="measure triton_actor only")
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out")
    ap.add_argument("--metrics-compare", action="store_true",
                    help="triton_actor with metrics off vs on (scraped during the run); no Triton")
    ap.add_argument("--stability", type=int, default=20,
                    help="perf_analyzer's stability percentage (raise it on a busy machine)")
    ap.add_argument("--scrape-interval-ms", type=int, default=1000, help="--metrics-compare: scrape period")
    ap.add_argument("--otel-compare", action="store_true",
                    help="triton_actor with tracing off vs OpenTelemetry at rate 1 and 1000; no Triton")
    args = ap.parse_args()
    scraper = MetricsScraper(args.scrape_interval_ms / 1000) if args.metrics_compare else None
    sink = OtlpSink() if args.otel_compare else None
    starters: tuple[tuple[str, Callable[[Path, int], subprocess.Popen]], ...]
    if sink is not None:
        starters = (("trace_off", start_metrics_off), ("otel_rate1", sink.starter(1)), ("otel_rate1000", sink.starter(1000)))
    elif scraper is not None:
        starters = (("metrics_off", start_metrics_off), ("metrics_on", scraper.start_server))
    else:
        starters = (("triton_actor", start_metrics_off), ("triton", start_triton))
    base = "trace_off" if sink else "metrics_off" if scraper else "triton"
    if not (TOOLS / "perf_analyzer").exists():
        raise SystemExit(f"{TOOLS}/perf_analyzer missing: run scripts/install_bench_tools.sh")
    conc = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_http_"))
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        for name, starter in starters:
            if name == "triton" and args.no_triton:
                continue
            repo = work / name
            copy_add_sub(repo)
            port = free_port()
            proc = starter(repo, port)
            wait_ready(port, proc)
            servers[name] = (proc, port)
            print(f"[bench] {name} ready on port {port}", flush=True)
        memory = {n: rss_kb(p.pid, n == "triton") / 1024 for n, (p, _) in servers.items()}
        print(f"[bench] resident memory with add_sub loaded (MB): {memory}", flush=True)
        results: dict[str, dict[int, list[dict[str, float]]]] = {n: {c: [] for c in conc} for n in servers}
        steps = args.rounds * len(conc) * len(servers)
        step = 0
        for r in range(args.rounds):
            for c in conc:
                for name, (_, port) in servers.items():
                    step += 1
                    res = perf(port, c, args.window_ms, work / "pa.csv", stability=args.stability)
                    results[name][c].append(res)
                    print(f"[bench {step}/{steps}] round {r + 1} c={c} {name:12s} {res['rps']:8.0f} infer/s "
                          f"p50 {res['p50_us']:5.0f} us p99 {res['p99_us']:5.0f} us", flush=True)
        memory_after = {n: rss_kb(p.pid, n == "triton") / 1024 for n, (p, _) in servers.items()}
    finally:
        if scraper is not None:
            scraper.stop()
            print(f"[bench] /metrics scraped {scraper.scrapes} times during the run", flush=True)
        stop_servers([proc for proc, _ in servers.values()], work)
        if sink is not None:
            sink.stop()
            print(f"[bench] OTLP sink took {sink.exports} exports, {sink.bytes} bytes", flush=True)
    med = {n: {c: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for c, runs in per.items()}
           for n, per in results.items()}
    lines = [f"| concurrency | server | infer/s (median) | p50 µs | p99 µs | ratio vs {base} (infer/s) |",
             "|---|---|---|---|---|---|"]
    for c in conc:
        for name in servers:
            m = med[name][c]
            ratio = f"{m['rps'] / med[base][c]['rps']:.2f}x" if base in med else "-"
            lines.append(f"| {c} | {name} | {m['rps']:.0f} | {m['p50_us']:.0f} | {m['p99_us']:.0f} | "
                         f"{ratio if name != base else '1.00x'} |")
    lines.append("")
    lines.append("Resident memory, add_sub loaded (Triton: server + its python stub): " + ", ".join(
        f"{n} {memory[n]:.0f} MB at start, {memory_after[n]:.0f} MB after the run" for n in servers))
    lines.append(f"Load average at the end: {os.getloadavg()}")
    table = "\n".join(lines)
    print(table)
    stem = "http_otel" if sink else "http_metrics" if scraper else "http"
    (args.out / f"{stem}.md").write_text(table + "\n")
    (args.out / f"{stem}.json").write_text(json.dumps({"results": results, "median": med, "memory_mb": memory,
                                                    "memory_after_mb": memory_after, "load": os.getloadavg()},
                                                   indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
