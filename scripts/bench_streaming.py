#!/usr/bin/env python3
"""Decoupled streaming through the server: how fast one request's responses reach a client that reads.

A decoupled Python model ``burst`` sends COUNT responses of SIZE bytes as fast as it can (no sleep), then
its final flag. One client at a time asks for them and reads them all:

* ``grpc tokens``: ``ModelStreamInfer`` (tritonclient.grpc), 20000 responses of 16 bytes (a token stream);
* ``grpc large``: the same, 400 responses of 1 MiB;
* ``sse tokens``: ``generate_stream`` (HTTP, Server-Sent Events), 5000 responses of 16 bytes;
* ``bls exec`` / ``bls async``: a Python model ``bls_reader`` reads 20000 responses of 16 bytes of
  ``burst`` through BLS, ``exec(decoupled=True)`` or ``await async_exec(decoupled=True)``, and answers
  one unary gRPC request with their count.

Prints the median over ``--rounds`` of responses/s (and MB/s) from the request to the final response,
the server's CPU time per response (user + system: less sensitive than wall time to a busy machine),
and the server's peak RSS (VmHWM). A server whose model runs ahead of the client holds what the client
has not read yet; one that makes the model wait (runtime/response_channel.py) holds at most its bound.

    .venv/bin/python scripts/bench_streaming.py [--rounds 5] [--isolated]
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from bench_http import ROOT, free_port, wait_ready

BURST_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] }, { name: "SIZE", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_UINT8, dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
BURST_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy().reshape(-1)[0])
            out = np.zeros(size, np.uint8)
            for _ in range(count):
                if sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
BLS_READER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] }, { name: "SIZE", data_type: TYPE_INT32, dims: [ 1 ] },
        { name: "ASYNC", data_type: TYPE_BOOL, dims: [ 1 ] } ]
output [ { name: "READ", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
BLS_READER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("COUNT", "SIZE")]
            ask = pb_utils.InferenceRequest(model_name="burst", inputs=inputs, requested_output_names=["OUT"])
            if pb_utils.get_input_tensor_by_name(request, "ASYNC").as_numpy().reshape(-1)[0]:
                responses = await ask.async_exec(decoupled=True)
            else:
                responses = ask.exec(decoupled=True)
            read = sum(1 for response in responses if not response.has_error())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("READ", np.array([read], np.int32))]))
        return out
"""
CASES = (("grpc tokens", "grpc", 20000, 16), ("grpc large", "grpc", 400, 1 << 20), ("sse tokens", "sse", 5000, 16),
         ("bls exec", "bls exec", 20000, 16), ("bls async", "bls async", 20000, 16))


def grpc_stream(url: str, count: int, size: int) -> float:
    """Seconds from the request to its final response; every response is read."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put(error))
    inputs = []
    for name, value in (("COUNT", count), ("SIZE", size)):
        x = grpcclient.InferInput(name, [1], "INT32")
        x.set_data_from_numpy(np.array([value], np.int32))
        inputs.append(x)
    t0 = time.perf_counter()
    client.async_stream_infer("burst", inputs, enable_empty_final_response=True)
    for _ in range(count + 1):
        error = got.get(timeout=300)
        if error is not None:
            raise SystemExit(f"stream failed: {error}")
    elapsed = time.perf_counter() - t0
    client.stop_stream()
    client.close()
    return elapsed


def bls_stream(url: str, count: int, size: int, use_async: bool) -> float:
    """Seconds for ``bls_reader`` to read ``count`` responses of ``burst`` through BLS (and the final one)."""
    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, value, dtype in (("COUNT", count, np.int32), ("SIZE", size, np.int32), ("ASYNC", use_async, bool)):
        x = grpcclient.InferInput(name, [1], "BOOL" if dtype is bool else "INT32")
        x.set_data_from_numpy(np.array([value], dtype))
        inputs.append(x)
    t0 = time.perf_counter()
    read = int(client.infer("bls_reader", inputs, client_timeout=300).as_numpy("READ")[0])
    elapsed = time.perf_counter() - t0
    client.close()
    if read != count + 1:
        raise SystemExit(f"bls_reader read {read} responses of {count} and the final one")
    return elapsed


def run_case(kind: str, http: int, grpc: int, count: int, size: int) -> float:
    if kind == "grpc":
        return grpc_stream(f"127.0.0.1:{grpc}", count, size)
    if kind == "sse":
        return sse_stream(f"127.0.0.1:{http}", count, size)
    return bls_stream(f"127.0.0.1:{grpc}", count, size, kind == "bls async")


def sse_stream(url: str, count: int, size: int) -> float:
    body = f'{{"COUNT": {count}, "SIZE": {size}}}'.encode()
    req = urllib.request.Request(f"http://{url}/v2/models/burst/generate_stream", data=body, method="POST")
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as answer:
        events = answer.read().count(b"data: ")
    elapsed = time.perf_counter() - t0
    if events != count:
        raise SystemExit(f"got {events} events of {count}")
    return elapsed


def cpu_s(pid: int) -> float:
    """CPU time the process used so far (user + system; /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    m = re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024 if m else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--isolated", action="store_true", help="the model in a process of its own (isolation=process)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, config, source in (("burst", BURST_CONFIG, BURST_PY), ("bls_reader", BLS_READER_CONFIG, BLS_READER_PY)):
            model = Path(tmp) / "repo" / name
            (model / "1").mkdir(parents=True)
            (model / "config.pbtxt").write_text(config)
            (model / "1" / "model.py").write_text(source)
        http, grpc = free_port(), free_port()
        proc = subprocess.Popen([sys.executable, "-m", "triton_actor", "--model-repository", str(model.parent),
                                 "--http-port", str(http), "--http-address", "127.0.0.1", "--grpc-port", str(grpc),
                                 "--grpc-address", "127.0.0.1", "--log-info=false", "--allow-metrics=false",
                                 *(["--backend-config=python,isolation=process"] if args.isolated else [])],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(http, proc)
            grpc_stream(f"127.0.0.1:{grpc}", 100, 16)  # warm up both paths
            sse_stream(f"127.0.0.1:{http}", 100, 16)
            bls_stream(f"127.0.0.1:{grpc}", 100, 16, True)
            print(f"{'case':<12} {'responses/s':>12} {'MB/s':>8} {'server CPU us/response':>23}   "
                  f"(median of {args.rounds})")
            for name, kind, count, size in CASES:
                times, cpus = [], []
                for _ in range(args.rounds):
                    cpu0 = cpu_s(proc.pid)
                    times.append(run_case(kind, http, grpc, count, size))
                    cpus.append(cpu_s(proc.pid) - cpu0)
                t = statistics.median(times)
                cpu_us = statistics.median(cpus) / count * 1e6
                print(f"{name:<12} {count / t:>12.0f} {count * size / t / 1e6:>8.1f} {cpu_us:>23.1f}")
            print(f"server peak RSS: {peak_rss_mb(proc.pid):.0f} MB")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
