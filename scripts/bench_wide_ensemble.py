#!/usr/bin/env python3
"""A very wide ensemble next to health checks: how long one request's steps hold the hub.

Starts triton_actor on a throw-away repository with one Python model (``ident``: Y = X, FP32 [2]) and an
ensemble ``wide`` of ``--steps`` steps that all read the ensemble input ``IN`` (each writes an output of its
own, ``O0`` ... ``O<n-1>``), or with ``--chain`` an ensemble whose steps run one after the other (IN → T1 →
... → OUT). A client thread GETs ``/v2/health/ready`` back to back on one connection all along; meanwhile
``--requests`` clients send one ensemble request each, at once, asking for one output (``--all-outputs``:
every output, so the answer's encoding is measured too). Reports the ensemble requests' latency and the
health checks' median / p99 / max latency while they ran (the idle figures first).

    .venv/bin/python scripts/bench_wide_ensemble.py --steps 2000 --requests 1
    .venv/bin/python scripts/bench_wide_ensemble.py --steps 2000 --requests 4
    .venv/bin/python scripts/bench_wide_ensemble.py --steps 2000 --chain

Run it against another checkout with ``--root`` (the server is started there) to compare.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDENT_CONFIG = """name: "ident"
backend: "python"
input [ { name: "X", data_type: TYPE_FP32, dims: [ %(n)d ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ %(n)d ] } ]
instance_group [ { count: %(count)d, kind: KIND_CPU } ]
"""
BATCHING = """max_batch_size: %d
dynamic_batching { }
"""
IDENT_MODEL = """import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def _step(inp: str, out: str) -> str:
    return f'{{ model_name: "ident" model_version: -1 input_map {{ key: "X" value: "{inp}" }} ' \
           f'output_map {{ key: "Y" value: "{out}" }} }}'


def ensemble_config(steps: int, chain: bool, max_batch_size: int = 0, elems: int = 2) -> tuple[str, list[str]]:
    """The ``wide`` ensemble's config and its output names."""
    if chain:
        names = ["IN", *(f"T{i}" for i in range(1, steps)), "OUT"]
        step_text = [_step(names[i], names[i + 1]) for i in range(steps)]
        outputs = ["OUT"]
    else:
        outputs = [f"O{i}" for i in range(steps)]
        step_text = [_step("IN", o) for o in outputs]
    outs = ", ".join(f'{{ name: "{o}", data_type: TYPE_FP32, dims: [ {elems} ] }}' for o in outputs)
    return (f'name: "wide"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            f'input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ {elems} ] }} ]\n'
            f'output [ {outs} ]\nensemble_scheduling {{ step [ {", ".join(step_text)} ] }}\n'), outputs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(outputs: list[str] | None, batching: bool, elems: int) -> tuple[bytes, int]:
    head: dict = {"inputs": [{"name": "IN", "shape": [1, elems] if batching else [elems], "datatype": "FP32",
                              "parameters": {"binary_data_size": 4 * elems}}]}
    if outputs is not None:
        head["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    header = json.dumps(head).encode()
    return header + struct.pack(f"<{elems}f", *([1.5] * elems)), len(header)


def _infer(port: int, body: bytes, header_length: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v2/models/wide/infer", body, {"Inference-Header-Content-Length": str(header_length)})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status, time.perf_counter() - t0


class HealthLoop(threading.Thread):
    """GET /v2/health/ready back to back on one connection; latencies by phase."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.phase = "idle"
        self.seen: dict[str, list[float]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while not self.stop.is_set():
            phase = self.phase
            t0 = time.perf_counter()
            conn.request("GET", "/v2/health/ready")
            resp = conn.getresponse()
            resp.read()
            self.seen.setdefault(phase, []).append(time.perf_counter() - t0)
            time.sleep(0.002)
        conn.close()


def _summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"n={len(ms)} median {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="steps of the ensemble")
    ap.add_argument("--requests", type=int, default=1, help="ensemble requests sent at once")
    ap.add_argument("--rounds", type=int, default=1, help="times the requests are sent")
    ap.add_argument("--chain", action="store_true", help="steps one after the other instead of side by side")
    ap.add_argument("--all-outputs", action="store_true", help="ask for every output (default: the first)")
    ap.add_argument("--elems", type=int, default=2, help="FP32 values in the ensemble input (and each output)")
    ap.add_argument("--instances", type=int, default=1, help="instances of the composing model")
    ap.add_argument("--max-batch-size", type=int, default=0,
                    help="the composing model batches (dynamic batcher) up to this many steps at once")
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose server runs")
    ap.add_argument("--flags", default="", help="extra server flags")
    ap.add_argument("--server-log", help="write the server's stderr here")
    args = ap.parse_args()
    config, outputs = ensemble_config(args.steps, args.chain, args.max_batch_size, args.elems)
    body, header_length = _request(None if args.all_outputs else outputs[:1], args.max_batch_size > 0, args.elems)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "ident", "1").mkdir(parents=True)
        ident = IDENT_CONFIG % {"count": args.instances, "n": args.elems}
        if args.max_batch_size:
            ident += BATCHING % args.max_batch_size
        Path(tmp, "ident", "config.pbtxt").write_text(ident)
        Path(tmp, "ident", "1", "model.py").write_text(IDENT_MODEL)
        Path(tmp, "wide", "1").mkdir(parents=True)
        Path(tmp, "wide", "config.pbtxt").write_text(config)
        port = _free_port()
        cmd = [sys.executable, "-m", "triton_actor", "--model-repository", tmp, "--http-port", str(port),
               "--grpc-port", str(_free_port()), "--allow-metrics", "false", *args.flags.split()]
        print(f"[wide] {'chain' if args.chain else 'wide'} ensemble of {args.steps} steps, {args.requests} request(s) "
              f"at once x {args.rounds}, server in {args.root}", flush=True)
        log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL
        server = subprocess.Popen(cmd, cwd=args.root, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.time() + 120
            while True:
                try:
                    if _infer(port, body, header_length)[0] == 200:
                        break
                except OSError:
                    pass
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("server did not come up")
                time.sleep(0.5)
            print("[wide] server up, first request answered (warm-up)", flush=True)
            health = HealthLoop(port)
            health.start()
            time.sleep(1.0)
            for r in range(args.rounds):
                health.phase = "busy"
                results: list[tuple[int, float]] = []
                clients = [threading.Thread(target=lambda out=results: out.append(_infer(port, body, header_length)))
                           for _ in range(args.requests)]
                for t in clients:
                    t.start()
                for t in clients:
                    t.join()
                health.phase = "after"
                took = ", ".join(f"{status} in {s:.2f} s" for status, s in results)
                print(f"[wide] round {r + 1}: ensemble answers {took}", flush=True)
                time.sleep(0.5)
            health.stop.set()
            health.join()
            for phase in ("idle", "busy"):
                if phase in health.seen:
                    print(f"[wide] health checks {phase}: {_summary(health.seen[phase])}", flush=True)
        finally:
            server.terminate()
            server.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
