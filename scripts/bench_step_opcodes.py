#!/usr/bin/env python3
"""What one ensemble step runs, counted: bytecodes per request of ``bench_pipeline.py``'s ``pass`` (one trivial
Python step) and ``trivial`` (three), in-process through the HTTP state machine and the ``/infer`` view as
``bench_request_path.py --opcodes`` counts them; ``(trivial - pass) / 2`` is one extra step. A count no load
on the machine moves, where the step's CPU figures from ``/proc`` swing by more than a change is worth.
``--cpu ROUNDS`` also times the same in-process requests by this thread's CPU time (best of ROUNDS rounds
of 2000 per model, the models alternated): what a step costs in microseconds, without sockets or a client.

    PYTHONPATH=. .venv/bin/python scripts/bench_step_opcodes.py
    PYTHONPATH=. .venv/bin/python scripts/bench_step_opcodes.py --cpu 7
    PYTHONPATH=. .venv/bin/python scripts/bench_step_opcodes.py --backend   # the backend's functions, listed
    PYTHONPATH=/path/to/other/checkout .venv/bin/python scripts/bench_step_opcodes.py   # that checkout's code
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from triton_actor import bootstrap  # noqa: F401  (gevent patching first)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_pipeline as pipeline
import bench_request_path as request_path

# the functions counted as the Python backend's: its own modules and pb_utils
_BACKEND = re.compile(r"^\s+([\d.]+)\s+[\d.]+\s+\S+ \((?:python|triton_python_backend_utils)/", re.M)


def http_infer(server, model: str, input_name: str, output_name: str) -> Callable[[], object]:
    """One binary ``/infer`` of an FP32 [4] input, bytes to answer (the status checked)."""
    import tritonclient.http as httpclient

    given = httpclient.InferInput(input_name, [4], "FP32")
    given.set_data_from_numpy(np.ones(4, np.float32), binary_data=True)
    return http_call(server, model, [given], [httpclient.InferRequestedOutput(output_name, binary_data=True)])


def http_call(server, model: str, given: list, asked: list) -> Callable[[], object]:
    """One binary ``/infer`` of ``model`` with the client's ``given`` inputs and ``asked`` outputs, through
    the server's HTTP/1.1 state machine and front end on this thread; bytes to answer (status checked)."""
    import tritonclient.http as httpclient

    from triton_actor.protocol import http1

    body, json_size = httpclient.InferenceServerClient.generate_request_body(given, outputs=asked)
    raw = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream"
           f"\r\nInference-Header-Content-Length: {json_size}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    frontend, conn = server.frontend, http1.ServerConnection(server._http_limits(), time.monotonic())

    def one() -> object:
        conn.receive_data(raw, 0.0)
        method, target, _version, headers, _keep_alive, _expect, _length = conn.next_event()
        (data,) = conn.next_event()
        path, _, query = target.partition("?")
        status, _headers, out = frontend(method, path, query, headers, data)
        if not str(status).startswith("200"):
            raise RuntimeError(f"{model}: {status} {out[:200]!r}")
        conn.start_next_cycle(0.0)
        return out

    return one


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="requests counted per model")
    ap.add_argument("--cpu", type=int, default=0, metavar="ROUNDS",
                    help="also time the requests by thread CPU: best of ROUNDS rounds of 2000 per model")
    ap.add_argument("--backend", action="store_true",
                    help="also list the Python backend's functions (and the models' execute) by own bytecodes")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_step_opcodes_"))
    pipeline.write_repository(work)
    server = request_path._server(work)
    counts: dict[str, tuple[float, float]] = {}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        cleanup.callback(server.stop)
        for model, input_name, output_name in (("pass", "X", "Y"), ("trivial", "IN", "OUT")):
            one = http_infer(server, model, input_name, output_name)
            for _ in range(a.n):  # warm: the caches of the fast paths filled, the models promoted inline
                one()
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                request_path.count_opcodes(one, a.n, 400)
            found = re.search(r"(\d+) bytecodes", text.getvalue())
            assert found is not None
            counts[model] = (float(found[1]), sum(float(m[1]) for m in _BACKEND.finditer(text.getvalue())))
            print(f"{model:8s} {counts[model][0]:6.0f} bytecodes per request, the Python backend's {counts[model][1]:5.0f}")
            if a.backend:
                for line in text.getvalue().splitlines():
                    if re.search(r"\((?:python|triton_python_backend_utils|1)/", line):
                        print(line)
        step, backend = ((counts["trivial"][i] - counts["pass"][i]) / 2 for i in (0, 1))
        print(f"one extra step: {step:.0f} bytecodes, the Python backend's {backend:.0f}")
        if a.cpu:
            print(f"thread CPU per extra step, {cpu_per_step(server, a.cpu):.1f} us")
    return 0


def cpu_per_step(server: object, rounds: int, n: int = 2000) -> float:
    """``(trivial - pass) / 2`` in microseconds of this thread's CPU time, each model's best round."""
    calls = {model: http_infer(server, model, i, o) for model, i, o in (("pass", "X", "Y"), ("trivial", "IN", "OUT"))}
    best = dict.fromkeys(calls, float("inf"))
    for r in range(rounds):
        for model, one in calls.items():
            t0 = time.thread_time_ns()
            for _ in range(n):
                one()
            best[model] = min(best[model], (time.thread_time_ns() - t0) / n / 1000)
        print(f"  round {r + 1}/{rounds}: pass {best['pass']:.1f} us, trivial {best['trivial']:.1f} us (best so far)",
              file=sys.stderr)
    return (best["trivial"] - best["pass"]) / 2


if __name__ == "__main__":
    raise SystemExit(main())
