#!/usr/bin/env python3
"""add_sub over gRPC and HTTP: triton_actor next to real Triton 2.51, driven by perf_analyzer, in one run.

Every server serves a copy of ``model_repository`` (add_sub: FP32 [4], python backend). Rounds
interleave servers, protocols and concurrencies so machine noise hits all alike; the table gives
medians, p50/p99, the ratio ours/Triton per protocol, and the server's CPU per inference: user + system
time of its process tree from /proc (Triton: tritonserver and its python stub) over each perf_analyzer
run, divided by the inferences its statistics endpoint counted meanwhile. CPU time is what a busy
machine does not blur: it is the figure to compare there, wall-clock rates only on a quiet machine.

    scripts/install_bench_tools.sh          # once: perf_analyzer and real tritonserver
    .venv/bin/python scripts/bench_grpc.py --rounds 3
    .venv/bin/python scripts/bench_grpc.py --root before=/path/to/other/checkout   # another commit beside

Writes ``bench_out/grpc.json`` and ``bench_out/grpc.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_http import ROOT, TOOLS, copy_add_sub, free_port, perf, rss_kb, stop_servers, wait_ready
from bench_workers import cpu_split, served, switches, tree


def start_ours(repo: Path, http: int, grpc: int, root: Path = ROOT) -> subprocess.Popen:
    """The server as shipped, from checkout ``root`` (this one unless ``--root`` names another)."""
    args = [sys.executable, "-m", "triton_actor", "--model-repository", str(repo), "--http-port", str(http),
            "--http-address", "127.0.0.1", "--grpc-port", str(grpc), "--grpc-address", "127.0.0.1",
            "--log-info=false", "--allow-metrics=false"]
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_triton(repo: Path, http: int, grpc: int) -> subprocess.Popen:
    args = [str(TOOLS / "tritonserver"), f"--model-repository={repo}", "--http-address=127.0.0.1",
            f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--allow-metrics=false",
            "--log-info=false"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(pid: int, ports: dict[str, int], c: int, window_ms: int, out_csv: Path,
            protocol: str) -> dict[str, float] | None:
    """One perf_analyzer run, with the server's CPU per inference over it (``cpu_us``)."""
    pids = tree(pid)
    (user0, sys0), n0, cs0 = cpu_split(pids), served(ports["http"]), switches(pids)
    try:
        res = perf(ports[protocol], c, window_ms, out_csv, protocol)
    except SystemExit as e:  # perf_analyzer could not stabilise on a noisy machine: record a gap
        print(f"[bench] {str(e).splitlines()[0] if str(e) else 'perf_analyzer failed'}", flush=True)
        return None
    pids = tree(pid)
    (user1, sys1), n, cs1 = cpu_split(pids), max(1, served(ports["http"]) - n0), switches(pids)
    # the kernel's share apart: at c=1 each request wakes the idle server (its context switch, epoll_wait),
    # and the context switches per inference say how many wake-ups it paid for (a server thread's own)
    return res | {"cpu_us": (user1 + sys1 - user0 - sys0) * 1e6 / n, "sys_us": (sys1 - sys0) * 1e6 / n,
                  "switches": (cs1 - cs0) / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--root", action="append", default=[], metavar="NAME=PATH",
                    help="also measure the server of another checkout (e.g. before=/work/wt-old), named NAME")
    ap.add_argument("--window-ms", type=int, default=3000)
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out")
    args = ap.parse_args()
    if not (TOOLS / "perf_analyzer").exists():
        raise SystemExit(f"{TOOLS}/perf_analyzer missing: run scripts/install_bench_tools.sh")
    conc = [int(c) for c in args.concurrency.split(",")]
    protocols = args.protocols.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_grpc_"))
    servers: dict[str, tuple[subprocess.Popen, dict[str, int]]] = {}
    roots = {"triton_actor": ROOT} | {n: Path(p).resolve() for n, p in (r.split("=", 1) for r in args.root)}
    names = [*roots] + ([] if args.no_triton else ["triton"])
    try:
        for name in names:
            repo = work / name
            copy_add_sub(repo)
            ports = {"http": free_port(), "grpc": free_port()}
            if name == "triton":
                proc = start_triton(repo, ports["http"], ports["grpc"])
            else:
                proc = start_ours(repo, ports["http"], ports["grpc"], roots[name])
            wait_ready(ports["http"], proc)
            servers[name] = (proc, ports)
            print(f"[bench] {name} ready on {ports}", flush=True)
        results: dict[str, list[dict[str, float]]] = {}
        for r in range(args.rounds):
            for c in conc:
                for protocol in protocols:
                    for name, (proc, ports) in servers.items():
                        res = measure(proc.pid, ports, c, args.window_ms, work / "pa.csv", protocol)
                        if res is None:
                            continue
                        results.setdefault(f"{protocol}|{c}|{name}", []).append(res)
                        print(f"[bench] round {r + 1} {protocol:4s} c={c} {name:22s} {res['rps']:7.0f} infer/s "
                              f"p50 {res['p50_us']:5.0f} us p99 {res['p99_us']:6.0f} us "
                              f"CPU {res['cpu_us']:5.0f} us/inference, system {res['sys_us']:3.0f}, "
                              f"{res['switches']:.2f} switches (load {os.getloadavg()[0]:.2f})", flush=True)
        memory = {n: rss_kb(p.pid, n == "triton") / 1024 for n, (p, _) in servers.items()}
    finally:
        stop_servers([proc for proc, _ in servers.values()], work)
    med = {k: {m: statistics.median(x[m] for x in runs) for m in runs[0]} | {"n": len(runs)}
           for k, runs in results.items()}
    lines = ["| protocol | concurrency | server | infer/s (median) | p50 µs | p99 µs | ratio vs Triton "
             "| CPU µs/inference (system) | context switches/inference | CPU vs Triton | runs |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for protocol in protocols:
        for c in conc:
            ref = med.get(f"{protocol}|{c}|triton")
            for name in servers:
                m = med.get(f"{protocol}|{c}|{name}")
                if m is None:
                    continue
                ratio = f"{m['rps'] / ref['rps']:.2f}x" if ref else "-"
                cpu_ratio = f"{m['cpu_us'] / ref['cpu_us']:.2f}" if ref else "-"
                lines.append(f"| {protocol} | {c} | {name} | {m['rps']:.0f} | {m['p50_us']:.0f} | {m['p99_us']:.0f} "
                             f"| {ratio} | {m['cpu_us']:.0f} ({m['sys_us']:.0f}) | {m['switches']:.2f} | {cpu_ratio} | {m['n']} |")
    lines.append("")
    lines.append(f"load average at the end: {os.getloadavg()}; resident memory MB: "
                 + ", ".join(f"{n} {v:.0f}" for n, v in memory.items()))
    table = "\n".join(lines)
    print(table)
    (args.out / "grpc.md").write_text(table + "\n")
    (args.out / "grpc.json").write_text(json.dumps({"results": results, "median": med, "memory_mb": memory,
                                                    "load": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
