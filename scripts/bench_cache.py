#!/usr/bin/env python3
"""Response cache hits: triton_actor next to real Triton 2.51's local cache, the same repeated request.

Both servers serve Triton's own ``add_sub`` (``scripts/triton_reference/add_sub``) with
``response_cache { enable: true }`` appended, started with ``--cache-config local,size=1048576``.
perf_analyzer sends one request over and over (``--input-data zero``): after the first, every request
is a hit on both servers (the script checks the statistics: misses stay at 1). Reported per server and
concurrency: infer/s, p50/p99, the ratio ours/Triton, and CPU per hit (the server's user+system time,
Triton's with its python stub, over the requests the statistics counted) and perf_analyzer's own CPU per
request (its user+system time, the same count): on a machine with few cores the client's CPU is in every
throughput figure, and bounds what any server can reach there. ``--uncached`` adds
triton_actor without ``--cache-config`` (every request runs add_sub) for what the cache saves here.
Rounds interleave the servers so machine noise hits all alike; medians are reported.

    scripts/install_bench_tools.sh          # once: perf_analyzer and real tritonserver
    .venv/bin/python scripts/bench_cache.py --rounds 2 --window-ms 2000

Writes ``bench_out/cache.json`` and ``bench_out/cache.md``.

``--client wrk`` sends the request with wrk instead (``scripts/bench_cache_wrk.py``: one thread, keep-alive
connections, a request built once; about a fifth of perf_analyzer's CPU per request): our one process,
our ``--workers 2`` and Triton, ``--concurrency`` connections (1,4,16), ``--body binary`` (perf_analyzer's
request) or ``json`` (the same in V2 JSON), ``--pin-client CPU`` to run wrk under taskset. Writes
``bench_out/cache_wrk.json`` and ``bench_out/cache_wrk.md``.

    .venv/bin/python scripts/bench_cache.py --client wrk --rounds 5 --duration-s 3

``--cpu-per-hit N`` measures our server alone instead, without perf_analyzer: N identical add_sub
requests (perf_analyzer's body) one after another on one keep-alive connection, then N
``/v2/health/ready``, and prints the server's CPU time per request for each (the hit's own cost is the
difference: the HTTP driver's is in both); then N add_sub requests over gRPC, each with its own id. Run it with another checkout's ``PYTHONPATH`` to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http import (  # the scripts folder is not a package: found through sys.path
    ROOT,
    TOOLS,
    copy_add_sub,
    free_port,
    perf,
    stop_servers,
    wait_ready,
)

CACHE_FLAG = "--cache-config=local,size=1048576"
_TICK = os.sysconf("SC_CLK_TCK")


def cached_repo(repo: Path) -> None:
    copy_add_sub(repo)
    config = repo / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")


def start(name: str, repo: Path, port: int, grpc_port: int = 0) -> subprocess.Popen:
    """``triton``, ``triton_actor`` (both with the local cache), ``triton_actor_w2`` (the same, ``--workers
    2``) or ``triton_actor_uncached``; gRPC on ``grpc_port`` (ours only) when given."""
    if name == "triton":
        args = [str(TOOLS / "tritonserver"), f"--model-repository={repo}", "--http-address=127.0.0.1",
                f"--http-port={port}", "--allow-grpc=false", "--allow-metrics=false", "--log-info=false", CACHE_FLAG]
    else:
        args = [sys.executable, "-m", "triton_actor", "--model-repository", str(repo), "--http-port", str(port),
                "--http-address", "127.0.0.1", "--log-info=false", "--allow-metrics=false",
                *((f"--grpc-port={grpc_port}",) if grpc_port else ("--allow-grpc=false",)),
                *(() if name.endswith("uncached") else (CACHE_FLAG,)),
                *(("--workers=2",) if name.endswith("_w2") else ())]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cpu_seconds(pid: int) -> float:
    """User + system time of ``pid`` and its children (Triton's python stub), from /proc."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    total = 0
    for p in [pid, *(int(x) for x in out.split())]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _TICK


def children_cpu_seconds() -> float:
    """User + system time of this script's ended children (perf_analyzer's runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cache_counts(port: int) -> tuple[int, int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/add_sub/stats", timeout=30) as r:
        s = json.load(r)["model_stats"][0]
    d = s["inference_stats"]
    return int(d["cache_hit"]["count"]), int(d["cache_miss"]["count"]), int(d["success"]["count"])


def _raw_request(head: bytes, body: bytes = b"", path: str = "/v2/models/add_sub/infer") -> bytes:
    if not body:
        return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def _exchange(sock: socket.socket, request: bytes) -> None:
    """Send one request and read its whole answer (Content-Length framed)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1])
    while len(rest) < length:
        rest += sock.recv(65536)


def cpu_per_hit(n: int) -> int:
    """``--cpu-per-hit``: our server's CPU per cache hit and per health check, one client, no perf_analyzer."""
    work = Path(tempfile.mkdtemp(prefix="bench_cache_cpu_"))
    cached_repo(work / "repo")
    port, grpc_port = free_port(), free_port()
    proc = start("triton_actor", work / "repo", port, grpc_port)
    try:
        wait_ready(port, proc)
        head = json.dumps({"inputs": [{"name": f"INPUT{i}", "shape": [4], "datatype": "FP32",
                                       "parameters": {"binary_data_size": 16}} for i in (0, 1)],
                           "outputs": [{"name": f"OUTPUT{i}", "parameters": {"binary_data": True}} for i in (0, 1)]}).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for what, request in (("cache hit", _raw_request(head, head + bytes(32))),
                                  ("health", _raw_request(b"", path="/v2/health/ready"))):
                for _ in range(min(n, 300)):  # the first is the miss; warm up
                    _exchange(sock, request)
                cpu0 = cpu_seconds(proc.pid)
                for _ in range(n):
                    _exchange(sock, request)
                print(f"[bench] {what}: {(cpu_seconds(proc.pid) - cpu0) * 1e6 / n:.1f} µs of server CPU per request "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
        _grpc_cpu_per_hit(proc, grpc_port, n)
    finally:
        stop_servers([proc], work)
    return 0


def _grpc_cpu_per_hit(proc: subprocess.Popen, port: int, n: int) -> None:
    """The same request over gRPC (tritonclient, one channel), each with an id of its own, as a client
    numbering its requests sends them: our server's CPU per hit."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = [grpcclient.InferInput(f"INPUT{i}", [4], "FP32") for i in (0, 1)]
    for x in inputs:
        x.set_data_from_numpy(np.zeros(4, np.float32))
    try:
        for k in range(min(n, 300)):
            client.infer("add_sub", inputs, request_id=str(k))
        cpu0 = cpu_seconds(proc.pid)
        for k in range(n):
            client.infer("add_sub", inputs, request_id=str(k))
        print(f"[bench] gRPC cache hit: {(cpu_seconds(proc.pid) - cpu0) * 1e6 / n:.1f} µs of server CPU per request "
              f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        client.close()


def wrk_main(args: argparse.Namespace) -> int:
    """``--client wrk``: our one process, our ``--workers 2`` and Triton, interleaved rounds (bench_cache_wrk.py)."""
    import bench_cache_wrk as bw

    if not (TOOLS / "wrk").exists():
        raise SystemExit(f"{TOOLS}/wrk missing: run scripts/install_bench_tools.sh")
    conc = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_cache_wrk_"))
    script = work / "add_sub.lua"
    script.write_text(bw.lua_script(args.body))
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    results: dict[str, dict[int, list[dict[str, float]]]] = {}
    try:
        for name in args.servers.split(","):
            cached_repo(work / name)
            port = free_port()
            servers[name] = (start(name, work / name, port), port)
            wait_ready(port, servers[name][0])
            bw.first_misses(TOOLS / "wrk", script, port, 2 if name.endswith("_w2") else 1, args.body, cache_counts)
            results[name] = {c: [] for c in conc}
            print(f"[bench] {name} ready on port {port}", flush=True)
        for r in range(args.rounds):
            for c in conc:
                for name, (proc, port) in servers.items():
                    res = bw.measure(TOOLS / "wrk", script, proc.pid, port, c, args.duration_s, args.pin_client,
                                     cache_counts)
                    results[name][c].append(res)
                    print(f"[bench] round {r + 1} c={c} {name:14s} {res['rps']:8.0f} infer/s p50 {res['p50_us']:6.0f} us "
                          f"cpu {res['cpu_us_per_hit']:5.1f} us/hit wrk {res['client_cpu_us_per_hit']:4.1f} us/hit "
                          f"hits {res['hits']:.0f} (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        stop_servers([proc for proc, _ in servers.values()], work)
    base = "triton" if "triton" in results else next(iter(results))
    return report(args.out / "cache_wrk", results, base, [
        f"wrk -t1, body {args.body}, {args.duration_s:g} s per run, {args.rounds} rounds, client pinned to "
        f"{args.pin_client or 'nothing'}", "",
        "| connections | server | infer/s (median) | p50 µs | p99 µs | server CPU µs per hit | wrk CPU µs per hit "
        f"| ratio vs {base} | CPU per hit: {base} / this |", "|---|---|---|---|---|---|---|---|---|"],
        ("cpu_us_per_hit", "client_cpu_us_per_hit"), cpu="cpu_us_per_hit")


def report(out: Path, results: dict[str, dict[int, list[dict[str, float]]]], base: str, head: list[str],
           columns: tuple[str, ...], cpu: str = "") -> int:
    """Print the table of medians (``head``, then a row per concurrency and server: infer/s, p50, p99,
    ``columns``, the ratio to ``base``, and ``base``'s ``cpu`` over this one's when given: what the
    throughputs' ratio would be with a core each, which a loaded machine moves less) and write it to
    ``out``.md, the runs to ``out``.json."""
    med = {n: {c: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for c, runs in per.items()}
           for n, per in results.items()}
    lines = list(head)
    for c in next(iter(med.values())):
        for name, per in med.items():
            m = per[c]
            cells = [str(c), name, *(f"{m[k]:.0f}" for k in ("rps", "p50_us", "p99_us")),
                     *(f"{m[k]:.1f}" for k in columns), f"{m['rps'] / med[base][c]['rps']:.2f}x",
                     *((f"{med[base][c][cpu] / m[cpu]:.2f}x",) if cpu else ())]
            lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join([*lines, "", f"load average at the end: {os.getloadavg()}"])
    print(table)
    out.with_suffix(".md").write_text(table + "\n")
    out.with_suffix(".json").write_text(json.dumps({"results": results, "median": med, "load": os.getloadavg()},
                                                   indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", default=None, help="1,4 (perf_analyzer), 1,4,16 (wrk's connections)")
    ap.add_argument("--client", choices=("perf_analyzer", "wrk"), default="perf_analyzer")
    ap.add_argument("--body", choices=("binary", "json"), default="binary", help="wrk: the request's encoding")
    ap.add_argument("--duration-s", type=float, default=5, help="wrk: seconds per run")
    ap.add_argument("--servers", default="triton_actor,triton_actor_w2,triton", help="wrk: which, in this order")
    ap.add_argument("--pin-client", default=None, metavar="CPU", help="wrk: run it under taskset -c CPU")
    ap.add_argument("--window-ms", type=int, default=2000)
    ap.add_argument("--stability", type=int, default=30, help="perf_analyzer's stability percentage")
    ap.add_argument("--out", type=Path, default=ROOT / "bench_out")
    ap.add_argument("--uncached", action="store_true", help="also triton_actor without the cache")
    ap.add_argument("--cpu-per-hit", type=int, default=0, metavar="N",
                    help="only our server's CPU per hit and per health check over N sequential requests")
    args = ap.parse_args()
    if args.cpu_per_hit:
        return cpu_per_hit(args.cpu_per_hit)
    if args.client == "wrk":
        args.concurrency = args.concurrency or "1,4,16"
        return wrk_main(args)
    args.concurrency = args.concurrency or "1,4"
    if not (TOOLS / "perf_analyzer").exists():
        raise SystemExit(f"{TOOLS}/perf_analyzer missing: run scripts/install_bench_tools.sh")
    conc = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_cache_"))
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    results: dict[str, dict[int, list[dict[str, float]]]] = {}
    try:
        for name in ("triton_actor", "triton", *(("triton_actor_uncached",) if args.uncached else ())):
            cached_repo(work / name)
            port = free_port()
            servers[name] = (start(name, work / name, port), port)
            wait_ready(port, servers[name][0])
            results[name] = {c: [] for c in conc}
            print(f"[bench] {name} ready on port {port}", flush=True)
        for r in range(args.rounds):
            for c in conc:
                for name, (proc, port) in servers.items():
                    cpu0, (_, _, done0), client0 = cpu_seconds(proc.pid), cache_counts(port), children_cpu_seconds()
                    res = perf(port, c, args.window_ms, work / "pa.csv", stability=args.stability,
                               extra=("--input-data", "zero"))
                    hits, misses, done = cache_counts(port)
                    res["cpu_us_per_request"] = (cpu_seconds(proc.pid) - cpu0) * 1e6 / max(1, done - done0)
                    res["client_cpu_us_per_request"] = (children_cpu_seconds() - client0) * 1e6 / max(1, done - done0)
                    res["hits"], res["misses"] = hits, misses
                    results[name][c].append(res)
                    print(f"[bench] round {r + 1} c={c} {name:12s} {res['rps']:8.0f} infer/s p50 {res['p50_us']:5.0f} us "
                          f"cpu {res['cpu_us_per_request']:5.0f} us/req client {res['client_cpu_us_per_request']:5.0f} us/req hits {hits} misses {misses}", flush=True)
    finally:
        stop_servers([proc for proc, _ in servers.values()], work)
    return report(args.out / "cache", results, "triton", [
        "| concurrency | server | infer/s (median) | p50 µs | p99 µs | CPU µs per request | perf_analyzer CPU µs "
        "per request | misses | ratio vs triton |", "|---|---|---|---|---|---|---|---|---|"],
        ("cpu_us_per_request", "client_cpu_us_per_request", "misses"))

if __name__ == "__main__":
    sys.exit(main())
