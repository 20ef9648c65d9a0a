#!/usr/bin/env python3
"""The OpenAI routes against the same models through Triton's own protocol: embeddings and streamed generation.

One server on a repository written by ``scripts/minilm.py`` (the encoder with dynamic batching); for each
route and each ``--concurrency``, that many closed-loop clients (greenlets, one keep-alive connection each)
send one sentence per request for ``--seconds``, the two routes taking turns ``--rounds`` times so that a
change in the machine's load falls on both. Printed: requests/s, the mean latency and the server's CPU time
per request (user + system from ``/proc/<pid>/stat`` of the server and its child processes, over the
requests answered), with the OpenAI route's overhead in each (``v1 / v2 - 1`` of the CPU per request, ``1 -
v1 / v2`` of the rates). CPU per request is the steadier figure on a shared machine: it does not count the
time the server waited for a core. The client runs on the server's machine: on a small one it takes CPU
from the server, the same for both routes.

With ``--generation``: ``tiny_lm`` (``scripts/tinylm.py``, no delay per token) streams ``--tokens`` greedy
tokens per request, one request at a time, over SSE (``/v1/completions``, ``stream: true``) and over the gRPC
stream (``ModelStreamInfer`` through ``tritonclient.grpc``); time to first token and tokens/s, medians over
``--requests`` requests, and the server's CPU time per token over them all.

    .venv/bin/pip install -e ".[onnx,examples]"
    .venv/bin/python scripts/bench_openai.py                      # c = 1,8,32; 5 s each: about a minute
    .venv/bin/python scripts/bench_openai.py --generation         # 20 requests each way: seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import minilm  # noqa: E402
import tinylm  # noqa: E402
from bench_http import free_port, start_ours, stop_servers, wait_ready  # noqa: E402

MODEL = "minilm_ensemble"
SENTENCE = "Triton serves this sentence-embedding pipeline from one Python process."
ROUTES = {
    "v1/embeddings": ("/v1/embeddings", orjson.dumps({"model": MODEL, "input": [SENTENCE],
                                                      "encoding_format": "float"})),
    "v2 infer": (f"/v2/models/{MODEL}/infer", orjson.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1],
                                                                       "datatype": "BYTES", "data": [SENTENCE]}]})),
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and of its live children (a Python model's own process,
    where a model runs isolated), from ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(stat: str) -> float:
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3 of stat(5)
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if int(entry.name) == pid or ppid == pid:
            total += own(stat)
    return total


def drive(port: int, path: str, body: bytes, concurrency: int, seconds: float) -> tuple[int, float, float]:
    """(requests answered, seconds, latency ms summed) of ``concurrency`` closed-loop clients for ``seconds``."""
    import gevent
    from geventhttpclient import HTTPClient
    done: list[float] = []
    stop_at = time.perf_counter() + seconds

    def client() -> None:
        http = HTTPClient("127.0.0.1", port, concurrency=1, network_timeout=60)
        try:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                reply = http.post(path, body, headers={"Content-Type": "application/json"})
                reply.read()
                if reply.status_code != 200:
                    raise SystemExit(f"{path}: {reply.status_code}")
                done.append(time.perf_counter() - t0)
        finally:
            http.close()

    started = time.perf_counter()
    gevent.joinall([gevent.spawn(client) for _ in range(concurrency)], raise_error=True)
    return len(done), time.perf_counter() - started, 1000 * sum(done)


def sse_stream(port: int, tokens: int) -> tuple[float, int, float]:
    """One streamed completion: (seconds to the first text, tokens, seconds in all)."""
    import http.client

    body = orjson.dumps({"model": "tiny_lm", "prompt": "The server", "max_tokens": tokens, "temperature": 0,
                         "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    first, count = 0.0, 0
    for line in conn.getresponse():
        if line.startswith(b"data: {"):
            if orjson.loads(line[6:])["choices"][0]["text"]:
                count += 1
                first = first or time.perf_counter() - t0
    conn.close()
    return first, count, time.perf_counter() - t0


def grpc_stream(url: str, tokens: int) -> tuple[float, int, float]:
    """The same generation over ModelStreamInfer."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error, time.perf_counter())))
    inputs = []
    for name, dtype, value in (("text_input", "BYTES", np.array([b"The server"], dtype=np.object_)),
                               ("stream", "BOOL", np.array([True])),
                               ("sampling_parameters", "BYTES", np.array(
                                   [orjson.dumps({"max_tokens": tokens, "temperature": 0})], dtype=np.object_))):
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    t0 = time.perf_counter()
    client.async_stream_infer("tiny_lm", inputs, enable_empty_final_response=True)
    first, count = 0.0, 0
    while True:
        result, error, at = got.get(timeout=60)
        if error is not None:
            raise SystemExit(f"gRPC stream: {error}")
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        count += 1
        first = first or at - t0
    end = time.perf_counter()
    client.stop_stream()
    client.close()
    return first, count, end - t0


def generation(args: argparse.Namespace, work: Path) -> None:
    tinylm.write_model(work / "repo", token_delay_ms=0)
    port, grpc_port = free_port(), free_port()
    proc = start_ours(work / "repo", port, "--allow-grpc=true", "--grpc-port", str(grpc_port),
                      "--grpc-address", "127.0.0.1", log=work / "server.log")
    try:
        wait_ready(port, proc, timeout=120)
        print("| transport | time to first token ms (median) | tokens/s (median) | tokens | server CPU µs/token |")
        print("| --- | --- | --- | --- | --- |")
        for name, run in (("SSE /v1/completions", lambda: sse_stream(port, args.tokens)),
                          ("gRPC ModelStreamInfer", lambda: grpc_stream(f"127.0.0.1:{grpc_port}", args.tokens))):
            run()  # warm up
            cpu = cpu_seconds(proc.pid)
            runs = [run() for _ in range(args.requests)]
            per_token = 1e6 * (cpu_seconds(proc.pid) - cpu) / sum(r[1] for r in runs)
            ttft = sorted(r[0] for r in runs)[len(runs) // 2]
            rate = sorted(r[1] / r[2] for r in runs)[len(runs) // 2]
            print(f"| {name} | {1000 * ttft:.1f} | {rate:.0f} | {runs[0][1]} | {per_token:.0f} |", flush=True)
    finally:
        stop_servers([proc], work)


def embeddings(args: argparse.Namespace, work: Path) -> None:
    minilm.write_pipeline(work / "repo")
    port = free_port()
    proc = start_ours(work / "repo", port, log=work / "server.log")
    try:
        wait_ready(port, proc, timeout=180)
        for path, body in ROUTES.values():  # warm both routes up
            drive(port, path, body, 2, 1.0)
        print("| concurrency | v2 infer req/s | v1/embeddings req/s | rate overhead | v2 CPU ms/req "
              "| v1 CPU ms/req | CPU overhead | v2 ms | v1 ms |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in args.concurrency:
            sums = {name: [0, 0.0, 0.0, 0.0] for name in ROUTES}  # requests, seconds, latency ms, CPU s
            for _ in range(args.rounds):
                for name, (path, body) in ROUTES.items():
                    cpu = cpu_seconds(proc.pid)
                    n, elapsed, latency = drive(port, path, body, c, args.seconds / args.rounds)
                    for i, value in enumerate((n, elapsed, latency, cpu_seconds(proc.pid) - cpu)):
                        sums[name][i] += value
            (n2, s2, l2, c2), (n1, s1, l1, c1) = sums["v2 infer"], sums["v1/embeddings"]
            cpu2, cpu1 = 1000 * c2 / n2, 1000 * c1 / n1
            print(f"| {c} | {n2 / s2:.0f} | {n1 / s1:.0f} | {100 * (1 - (n1 / s1) / (n2 / s2)):+.1f} % "
                  f"| {cpu2:.2f} | {cpu1:.2f} | {100 * (cpu1 / cpu2 - 1):+.1f} % | {l2 / n2:.1f} | {l1 / n1:.1f} |",
                  flush=True)
    finally:
        stop_servers([proc], work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=5.0, help="per route and concurrency, over all rounds")
    parser.add_argument("--rounds", type=int, default=5, help="turns each route takes per concurrency")
    parser.add_argument("--generation", action="store_true", help="streamed generation instead of embeddings")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per generation")
    parser.add_argument("--requests", type=int, default=20, help="generations per transport")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_openai_"))
    if args.generation:
        generation(args, work)  # plain threads: grpcio's client does not run under gevent's patching
    else:
        from gevent import monkey

        monkey.patch_all()  # the closed-loop clients are greenlets
        embeddings(args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
