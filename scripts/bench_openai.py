#!/usr/bin/env python3
"""Sentence embeddings through ``/v1/embeddings`` against the same model through ``/v2/models/<model>/infer``.

One server on a repository written by ``scripts/minilm.py`` (the encoder with dynamic batching); for each
route and each ``--concurrency``, that many closed-loop clients (greenlets, one keep-alive connection each)
send one sentence per request for ``--seconds``; requests/s and the mean latency are printed, with the
OpenAI route's overhead (``1 - v1 / v2`` of the rates). The client runs on the server's machine: on a small
one it takes CPU from the server, the same for both routes.

    .venv/bin/pip install -e ".[onnx,examples]"
    .venv/bin/python scripts/bench_openai.py                      # c = 1,8,32; 5 s each: about a minute
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from gevent import monkey

monkey.patch_all()

import gevent  # noqa: E402
import orjson  # noqa: E402
from geventhttpclient import HTTPClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import minilm  # noqa: E402
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_openai_"))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
