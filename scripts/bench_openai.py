#!/usr/bin/env python3
"""The OpenAI routes against the same models through Triton's own protocol: embeddings and streamed generation.

One server on a repository written by ``scripts/minilm.py`` (the encoder with dynamic batching); for each
route and each ``--concurrency``, that many closed-loop clients (greenlets, one keep-alive connection each)
send one sentence per request for ``--seconds``; requests/s and the mean latency are printed, with the
OpenAI route's overhead (``1 - v1 / v2`` of the rates). The client runs on the server's machine: on a small
one it takes CPU from the server, the same for both routes.

With ``--generation``: ``tiny_lm`` (``scripts/tinylm.py``, no delay per token) streams ``--tokens`` greedy
tokens per request, one request at a time, over SSE (``/v1/completions``, ``stream: true``) and over the gRPC
stream (``ModelStreamInfer`` through ``tritonclient.grpc``); time to first token and tokens/s, medians over
``--requests`` requests.

    .venv/bin/pip install -e ".[onnx,examples]"
    .venv/bin/python scripts/bench_openai.py                      # c = 1,8,32; 5 s each: about a minute
    .venv/bin/python scripts/bench_openai.py --generation         # 20 requests each way: seconds
"""

from __future__ import annotations

import argparse
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


def drive(port: int, path: str, body: bytes, concurrency: int, seconds: float) -> tuple[float, float]:
    """(requests/s, mean latency ms) of ``concurrency`` closed-loop clients for ``seconds``."""
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
    elapsed = time.perf_counter() - started
    return len(done) / elapsed, 1000 * sum(done) / max(1, len(done))


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
        print("| transport | time to first token ms (median) | tokens/s (median) | tokens |")
        print("| --- | --- | --- | --- |")
        for name, run in (("SSE /v1/completions", lambda: sse_stream(port, args.tokens)),
                          ("gRPC ModelStreamInfer", lambda: grpc_stream(f"127.0.0.1:{grpc_port}", args.tokens))):
            run()  # warm up
            runs = [run() for _ in range(args.requests)]
            ttft = sorted(r[0] for r in runs)[len(runs) // 2]
            rate = sorted(r[1] / r[2] for r in runs)[len(runs) // 2]
            print(f"| {name} | {1000 * ttft:.1f} | {rate:.0f} | {runs[0][1]} |", flush=True)
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
        print("| concurrency | v2 infer req/s | v1/embeddings req/s | overhead | v2 ms | v1 ms |")
        print("| --- | --- | --- | --- | --- | --- |")
        for c in args.concurrency:
            v2_rate, v2_ms = drive(port, *ROUTES["v2 infer"], c, args.seconds)
            v1_rate, v1_ms = drive(port, *ROUTES["v1/embeddings"], c, args.seconds)
            print(f"| {c} | {v2_rate:.0f} | {v1_rate:.0f} | {100 * (1 - v1_rate / v2_rate):+.1f} % "
                  f"| {v2_ms:.1f} | {v1_ms:.1f} |", flush=True)
    finally:
        stop_servers([proc], work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=5.0)
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
