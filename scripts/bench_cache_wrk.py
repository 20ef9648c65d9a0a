"""``scripts/bench_cache.py --client wrk``: the same repeated add_sub request sent by wrk, a lean client.

perf_analyzer spends about 100 µs of CPU per request, more than either server on a cache hit, so on a
machine with few cores its figures are the client's (docs/performance.md). wrk (one thread, ``-t1``,
``c`` keep-alive connections) sends one request built once, from a Lua script this module writes: the
body perf_analyzer sends (``--body binary``: the JSON header and both FP32 [4] inputs as binary tensors,
outputs asked for as binary) or the same request in plain V2 JSON (``--body json``). Its done() callback
prints one JSON line: the requests completed in the window, the errors, the p50/p99 latency.

Per server and round: the hits, misses and successes the server's statistics counted over the run
(every request must be a hit: the run starts after a first miss, and a miss or a failure during it
stops the script), the server's CPU time (its whole process tree: Triton's python stub, our gunicorn
workers) per hit and wrk's own CPU time per hit (this script's ended children). ``--pin-client CPU``
runs wrk under ``taskset -c CPU``; the servers are never pinned.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import urllib.request
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def bodies(kind: str) -> tuple[dict[str, str], bytes]:
    """The headers and body of the add_sub request: ``binary`` (perf_analyzer's ``--input-data zero``)
    or ``json``."""
    if kind == "json":
        body = json.dumps({"inputs": [{"name": f"INPUT{i}", "shape": [4], "datatype": "FP32", "data": [0, 0, 0, 0]}
                                      for i in (0, 1)]}).encode()
        return {"Content-Type": "application/json"}, body
    head = json.dumps({"inputs": [{"name": f"INPUT{i}", "shape": [4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 16}} for i in (0, 1)],
                       "outputs": [{"name": f"OUTPUT{i}", "parameters": {"binary_data": True}} for i in (0, 1)]}).encode()
    return ({"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))},
            head + bytes(32))


def lua_script(kind: str) -> str:
    """wrk's script: a static request (wrk formats it once) and a done() that prints one JSON line."""
    headers, body = bodies(kind)
    lines = ['wrk.method = "POST"', 'wrk.path = "/v2/models/add_sub/infer"',
             *(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()),
             'wrk.body = "' + "".join(f"\\{b:03d}" for b in body) + '"',
             "function done(summary, latency, requests)",
             '  local e = summary.errors',
             '  io.write(string.format(\'{"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, '
             '"p99_us": %d}\\n\', summary.requests, summary.duration, '
             'e.connect + e.read + e.write + e.status + e.timeout, latency:percentile(50), latency:percentile(99)))',
             "end"]
    return "\n".join(lines) + "\n"


def first_misses(wrk: Path, script: Path, port: int, processes: int, kind: str, counts) -> None:
    """Send the request until each of the server's ``processes`` (our workers each have a cache of
    their own) has had its first miss, so that a measured run is all hits."""
    headers, body = bodies(kind)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/add_sub/infer", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    for _ in range(20):  # new connections each time: the kernel hands them to whichever worker accepts
        if counts(port)[1] >= processes:
            return
        run_wrk(wrk, script, port, 16, 1, None)
    raise SystemExit(f"port {port}: fewer than {processes} misses after 20 warm-up runs")


def tree_cpu_seconds(pid: int) -> float:
    """User + system time of ``pid`` and all its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        todo.extend(int(k) for k in kids)
    return total / _TICK


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(wrk: Path, script: Path, port: int, connections: int, duration_s: float, pin: str | None) -> dict:
    args = [str(wrk), "-t1", f"-c{connections}", f"-d{duration_s:g}s", "-s", str(script),
            f"http://127.0.0.1:{port}/v2/models/add_sub/infer"]
    if pin is not None:
        args = ["taskset", "-c", pin, *args]
    proc = subprocess.run(args, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(line)


def measure(wrk: Path, script: Path, pid: int, port: int, connections: int, duration_s: float, pin: str | None,
            counts) -> dict[str, float]:
    """One wrk run against one server; ``counts(port)`` is ``(hits, misses, successes)`` from its statistics."""
    hits0, misses0, done0 = counts(port)
    cpu0, client0 = tree_cpu_seconds(pid), children_cpu_seconds()
    out = run_wrk(wrk, script, port, connections, duration_s, pin)
    cpu1, client1 = tree_cpu_seconds(pid), children_cpu_seconds()
    hits1, misses1, done1 = counts(port)
    hits = hits1 - hits0
    if out["errors"] or misses1 != misses0 or done1 - done0 != hits or hits < out["requests"]:
        raise SystemExit(f"not all hits on port {port}: wrk {out}, statistics: hits {hits}, misses "
                         f"{misses1 - misses0}, successes {done1 - done0}")
    return {"rps": out["requests"] * 1e6 / out["duration_us"], "p50_us": out["p50_us"], "p99_us": out["p99_us"],
            "hits": hits, "cpu_us_per_hit": (cpu1 - cpu0) * 1e6 / hits,
            "client_cpu_us_per_hit": (client1 - client0) * 1e6 / hits}
