#!/usr/bin/env python3
"""Syscalls and context switches per inference, by thread, for add_sub under perf_analyzer.

Counts, not times: ``perf stat --per-thread`` with the kernel's syscall tracepoints on the server's
process tree over one perf_analyzer run, divided by the inferences its statistics endpoint counted
meanwhile (the two statistics reads add a few syscalls, nothing per inference). Unlike ``strace -f``,
which stops the server at every call, this leaves its timing alone: under strace a client's request
written in two pieces (curl's head and body) always arrived whole, untraced not always, and that
shows here as a second ``recvfrom`` per hundred requests. ``recvfrom=EAGAIN`` is a read tried with
nothing there. ``--triton`` runs real Triton 2.51 beside ours for reference.

    .venv/bin/python scripts/count_syscalls.py                         # gRPC and HTTP, c=1 and 4
    .venv/bin/python scripts/count_syscalls.py --protocols http --concurrency 1 --triton
    .venv/bin/python scripts/count_syscalls.py --root /path/to/other/checkout

Needs ``perf`` with the syscalls tracepoints (root, or perf_event_paranoid and tracefs that allow it)
and perf_analyzer (``scripts/install_bench_tools.sh``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_grpc import start_ours, start_triton
from bench_http import ROOT, TOOLS, copy_add_sub, free_port, stop_servers, wait_ready
from bench_workers import served, tree

CALLS = ("epoll_wait", "epoll_ctl", "recvfrom", "sendto", "read", "write", "futex", "getpid", "clock_gettime")
EVENTS = ["raw_syscalls:sys_enter", "context-switches", *(f"syscalls:sys_enter_{c}" for c in CALLS)]


def count(pids: list[int], http_port: int, pa: list[str], out: Path) -> tuple[int, dict[str, dict[str, int]]]:
    """One perf_analyzer run under ``perf stat``: the inferences and, by thread, each event's count."""
    args = ["perf", "stat", "-x", ",", "--per-thread", "-o", str(out), *(x for e in EVENTS for x in ("-e", e)),
            "-e", "syscalls:sys_exit_recvfrom", "--filter", "ret == -11", "-p", ",".join(map(str, pids))]
    perf = subprocess.Popen(args)
    time.sleep(0.5)  # perf attached (the run is seconds long: what it misses is outside both counts)
    n0 = served(http_port)
    subprocess.run(pa, capture_output=True, check=False)
    n = served(http_port) - n0
    perf.send_signal(signal.SIGINT)
    perf.wait()
    rows: dict[str, dict[str, int]] = {}
    for line in out.read_text().splitlines():
        f = line.split(",")
        if len(f) < 4 or not f[1].strip().isdigit():
            continue
        name = f[3].replace("raw_syscalls:sys_enter", "all").replace("syscalls:sys_enter_", "")
        rows.setdefault(f[0].strip(), {})[name.replace("syscalls:sys_exit_recvfrom", "recvfrom=EAGAIN")] = int(f[1])
    return n, rows


def report(label: str, main_pid: int, n: int, rows: dict[str, dict[str, int]]) -> None:
    print(f"{label}: {n} inferences, load average {os.getloadavg()[0]:.2f}")
    for thread, r in sorted(rows.items(), key=lambda kv: -kv[1].get("all", 0)):
        if max(r.values(), default=0) < n / 100:  # quiet threads: less than once per hundred inferences
            continue
        named = sum(v for k, v in r.items() if k in CALLS)
        cells = [f"{k} {v / n:.2f}" for k, v in r.items() if k != "all" and v >= n / 200]
        cells.append(f"other {(r.get('all', 0) - named) / n:.2f}")
        hub = " (main thread: the hub)" if thread.endswith(f"-{main_pid}") else ""
        print(f"  {thread}{hub}: {r.get('all', 0) / n:.2f} syscalls/inference: " + ", ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--window-ms", type=int, default=2000)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose server is counted")
    ap.add_argument("--triton", action="store_true", help="count real Triton 2.51 too")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="count_syscalls_"))
    copy_add_sub(work / "repo")
    servers = []
    for kind in ("ours", "triton") if a.triton else ("ours",):
        http, grpc = free_port(), free_port()
        repo = work / "repo"
        proc = start_ours(repo, http, grpc, a.root) if kind == "ours" else start_triton(repo, http, grpc)
        servers.append((kind, proc, {"http": http, "grpc": grpc}))
    try:
        for kind, proc, ports in servers:
            wait_ready(ports["http"], proc)
            for protocol in a.protocols.split(","):
                for c in a.concurrency.split(","):
                    pa = [str(TOOLS / "perf_analyzer"), "-m", "add_sub", "-u", f"127.0.0.1:{ports[protocol]}",
                          "-i", protocol, "--concurrency-range", c, "-p", str(a.window_ms), "-s", "50",
                          "--max-trials", "3", "-f", str(work / "pa.csv")]
                    subprocess.run(pa, capture_output=True, check=False)  # warm: connections, caches, promotion
                    n, rows = count(tree(proc.pid), ports["http"], pa, work / "perf.txt")
                    report(f"{kind} {protocol} c={c}", proc.pid, max(1, n), rows)
    finally:
        stop_servers([p for _, p, _ in servers], work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
