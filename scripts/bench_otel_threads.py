#!/usr/bin/env python3
"""Where OpenTelemetry tracing's CPU goes: our server's CPU per request, per thread, with tracing off and
with ``--trace-config mode=opentelemetry rate=1`` (every request traced), exporting to the OTLP/HTTP sink of
``bench_http.py``.

One keep-alive client sends N add_sub requests (perf_analyzer's body) one after another; the server's
threads' user + system time is read from ``/proc/PID/task/*/stat`` before and after: ``hub`` is the
process's main thread (the gevent hub, where spans are made), the others by their name (the SDK's batch
span processor, which encodes and posts the spans, is a native thread).

    PYTHONPATH=. .venv/bin/python scripts/bench_otel_threads.py --requests 5000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cache import _exchange, _raw_request  # the scripts folder is not a package: found through sys.path
from bench_http import OtlpSink, copy_add_sub, free_port, start_ours, wait_ready

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """Seconds of CPU per thread name (``hub``: the main thread), from /proc."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        key = "hub" if tid == str(pid) else name
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    n = ap.parse_args().requests
    sink = OtlpSink()
    head = json.dumps({"inputs": [{"name": f"INPUT{i}", "shape": [4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 16}} for i in (0, 1)],
                       "outputs": [{"name": f"OUTPUT{i}", "parameters": {"binary_data": True}} for i in (0, 1)]}).encode()
    request = _raw_request(head, head + bytes(32))
    try:
        for label, starter in (("off", start_ours), ("rate=1", sink.starter(1))):
            work = Path(tempfile.mkdtemp(prefix="bench_otel_threads_"))
            copy_add_sub(work / "repo")
            port = free_port()
            proc = starter(work / "repo", port)
            try:
                wait_ready(port, proc)
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    for _ in range(300):  # warm up
                        _exchange(sock, request)
                    before = thread_cpu(proc.pid)
                    for _ in range(n):
                        _exchange(sock, request)
                    time.sleep(1.0)  # the processor's last scheduled export (its default delay is 5 s: most went before)
                    after = thread_cpu(proc.pid)
                # summed by name: a thread that ended in between (a model instance's) lowers its name's sum
                per = {k: max(0.0, after[k] - before.get(k, 0.0)) * 1e6 / n for k in after}
                shown = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 0.5)
                print(f"[bench] tracing {label}: µs of CPU per request by thread: {shown}; total {sum(per.values()):.1f} "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(30)
    finally:
        sink.stop()
    print(f"[bench] OTLP sink took {sink.exports} exports, {sink.bytes} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
