#!/usr/bin/env python3
"""The workers sweep: add_sub over HTTP and gRPC at several concurrencies, against 1..N triton_actor worker
processes and, in the same run, real Triton 2.51 with ``count: 1`` and ``count: 8`` instances.

Both servers serve Triton's own ``add_sub`` (``scripts/triton_reference/add_sub``) unchanged; only the Triton
``count: 8`` column edits its ``instance_group`` (that is the configuration being compared). For every cell:
infer/s (perf_analyzer), p99, and the server's CPU per request (µs): CPU time of the server's processes
(/proc, arbiter + workers, or tritonserver + its python stubs) divided by the requests its statistics
endpoint counted. Memory: RSS and unshared (USS = private pages, /proc/<pid>/smaps_rollup) per process.

    scripts/install_bench_tools.sh     # once: perf_analyzer and real tritonserver
    .venv/bin/python scripts/bench_workers.py --workers 1,2 --concurrency 1,4,16,64

Writes ``bench_out/workers.json`` and ``bench_out/workers.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench_http import ROOT, TOOLS, copy_add_sub, free_port, perf, stop_servers, wait_ready

_TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [pid, *[p for c in out.split() for p in tree(int(c))]]


def cpu_s(pids: list[int]) -> float:
    return sum(cpu_split(pids))


def cpu_split(pids: list[int]) -> tuple[float, float]:
    """The processes' user and system CPU seconds."""
    user = system = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11])  # utime
        system += int(fields[12])  # stime
    return user / _TICK, system / _TICK


def switches(pids: list[int]) -> int:
    """The context switches (voluntary and not) of every thread of the processes: at concurrency 1 each
    request wakes an idle server at least once, and each wake-up is kernel time of its own."""
    total = 0
    for p in pids:
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                status = Path(f"/proc/{p}/task/{t}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
    return total


def memory(pids: list[int]) -> list[dict[str, float]]:
    out = []
    for p in pids:
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        kb = {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", text, re.M)}
        out.append({"pid": p, "rss_mb": kb.get("Rss", 0) / 1024,
                    "uss_mb": (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) / 1024,
                    "pss_mb": kb.get("Pss", 0) / 1024})
    return out


def served(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/stats", timeout=10) as r:
        return int(json.load(r)["model_stats"][0]["inference_count"])


def start(kind: str, n: int, repo: Path, http: int, grpc: int) -> subprocess.Popen:
    if kind == "ours":
        args = [sys.executable, "-m", "triton_actor", "--model-repository", str(repo), "--http-port", str(http),
                "--http-address", "127.0.0.1", "--grpc-port", str(grpc), "--grpc-address", "127.0.0.1",
                "--log-info=false", "--workers", str(n)]
        return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    args = [str(TOOLS / "tritonserver"), f"--model-repository={repo}", "--http-address=127.0.0.1",
            f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}", "--allow-metrics=false",
            "--log-info=false"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def repo_for(kind: str, n: int, work: Path) -> Path:
    repo = work / f"{kind}{n}"
    copy_add_sub(repo)
    if kind == "triton" and n > 1:
        config = repo / "add_sub" / "config.pbtxt"
        text = re.sub(r"instance_group\s*\[[^\]]*\]", "", config.read_text())
        config.write_text(text + f"\ninstance_group [ {{ count: {n}, kind: KIND_CPU }} ]\n")
    return repo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--triton-counts", default="1,8")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument("--window-ms", type=int, default=2000)
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out")
    a = ap.parse_args()
    configs = [("ours", int(n)) for n in a.workers.split(",")]
    if not a.no_triton:
        configs += [("triton", int(n)) for n in a.triton_counts.split(",")]
    conc = [int(c) for c in a.concurrency.split(",")]
    protocols = a.protocols.split(",")
    results, mem = [], {}
    work = Path(tempfile.mkdtemp(prefix="bench_workers_"))
    total, step = len(configs) * len(conc) * len(protocols), 0
    for kind, n in configs:
        http, grpc = free_port(), free_port()
        proc = start(kind, n, repo_for(kind, n, work), http, grpc)
        try:
            wait_ready(http, proc)
            mem[f"{kind}{n}"] = memory(tree(proc.pid))
            for protocol in protocols:
                for c in conc:
                    step += 1
                    pids = tree(proc.pid)
                    cpu0, n0 = cpu_s(pids), served(http)
                    try:
                        row = perf(http if protocol == "http" else grpc, c, a.window_ms,
                                   work / "perf.csv", protocol, stability=25, max_trials=10)
                    except SystemExit as e:
                        print(f"[{step}/{total}] {kind} {n} {protocol} c={c}: perf_analyzer failed: "
                              f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
                        continue
                    cpu_us = (cpu_s(tree(proc.pid)) - cpu0) * 1e6 / max(1, served(http) - n0)
                    results.append({"server": kind, "n": n, "protocol": protocol, "concurrency": c,
                                    "rps": row["rps"], "p99_us": row["p99_us"], "cpu_us_per_req": cpu_us})
                    print(f"[{step}/{total}] {kind} {'workers' if kind == 'ours' else 'count'}={n} {protocol} c={c}: "
                          f"{row['rps']:.0f} infer/s, p99 {row['p99_us']:.0f} µs, {cpu_us:.0f} µs CPU/request",
                          flush=True)
        finally:
            stop_servers([proc], work / "none")
    a.out.mkdir(exist_ok=True)
    (a.out / "workers.json").write_text(json.dumps({"results": results, "memory": mem}, indent=1))
    lines = ["| server | protocol | " + " | ".join(f"c={c} infer/s (CPU µs/req)" for c in conc) + " |",
             "|---|---|" + "---|" * len(conc)]
    for kind, n in configs:
        for protocol in protocols:
            cells = []
            for c in conc:
                r = next((r for r in results if (r["server"], r["n"], r["protocol"], r["concurrency"])
                          == (kind, n, protocol, c)), None)
                cells.append(f"{r['rps']:.0f} ({r['cpu_us_per_req']:.0f})" if r else "-")
            name = f"triton_actor, {n} worker{'s' if n > 1 else ''}" if kind == "ours" else f"Triton 2.51, count: {n}"
            lines.append(f"| {name} | {protocol} | " + " | ".join(cells) + " |")
    lines += ["", "| server | process | RSS MB | unshared (USS) MB |", "|---|---|---|---|"]
    for key, procs in mem.items():
        for i, m in enumerate(procs):
            lines.append(f"| {key} | {'arbiter/server' if i == 0 else f'child {i}'} | {m['rss_mb']:.0f} | "
                         f"{m['uss_mb']:.0f} |")
    (a.out / "workers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
