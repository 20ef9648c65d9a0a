#!/usr/bin/env python3
"""In-process micro-benchmark of add_sub's per-request CPU outside the transport: no server, no sockets.

Times, in µs per call (best of ``--repeat`` runs of ``--number`` calls each):

* ``python execute``: ``PythonInstance.execute([request])`` on ``model_repository/add_sub`` (builds the
  ``pb_utils.InferenceRequest``, runs ``model.py``, converts the response back), plus its parts
  ``_to_pb`` and ``_from_pb`` alone;
* ``grpc decode`` / ``grpc encode``: ``v2_grpc.decode_infer_request`` on a ``ModelInferRequest`` made
  the way tritonclient makes one (``raw_input_contents``, both outputs named) and
  ``v2_grpc.encode_infer_response`` of add_sub's answer; protobuf parsing and serialization are
  timed separately (``pb parse`` / ``pb serialize``) since the transport does them.

    .venv/bin/python scripts/bench_python_backend.py [--number 20000] [--repeat 5]
    PYTHONPATH=<checkout> .venv/bin/python scripts/bench_python_backend.py --cpu 7   # execute's CPU time only

``--cpu ROUNDS`` times ``python execute`` by this thread's CPU clock instead (best and median of ROUNDS
rounds of ``--number`` calls): on a machine shared with other jobs, the figure that compares checkouts.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

import numpy as np

import triton_actor.bootstrap  # noqa: F401  (patches gevent before the server modules load)
from triton_actor.backends.base import InstanceContext
from triton_actor.backends.python import backend as py_backend
from triton_actor.inference import InferInput, InferRequest
from triton_actor.protocol import v2_grpc
from triton_actor.protocol._generated import grpc_service_pb2 as pb
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.repository import config as config_mod

ROOT = Path(__file__).resolve().parents[1]


def make_instance() -> py_backend.PythonInstance:
    model_dir = ROOT / "model_repository" / "add_sub"
    config, _ = config_mod.read(model_dir, "add_sub", auto_complete=False)
    config_json = json.dumps(config_mod.to_json_dict(config))
    ctx = InstanceContext("add_sub", 1, model_dir, model_dir / "1", config, config_json, "add_sub_0_0", "CPU", 0, 0)
    return py_backend.PythonInstance(ctx)


def make_request() -> InferRequest:
    fp32 = BY_WIRE["FP32"]
    a = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32).reshape(4)
    b = np.frombuffer(np.ones(4, dtype=np.float32).tobytes(), dtype=np.float32).reshape(4)
    inputs = {"INPUT0": InferInput("INPUT0", fp32, (4,), a), "INPUT1": InferInput("INPUT1", fp32, (4,), b)}
    return InferRequest("add_sub", -1, "", inputs)


def make_grpc_bytes() -> bytes:
    """A ModelInferRequest as tritonclient.grpc builds it (InferInput.set_data_from_numpy → raw contents)."""
    try:
        from tritonclient.grpc import service_pb2 as client_pb
    except ImportError:  # same wire format
        client_pb = pb
    msg = client_pb.ModelInferRequest(model_name="add_sub", model_version="", id="")
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="FP32", shape=[4])
        msg.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    for name in ("OUTPUT0", "OUTPUT1"):
        msg.outputs.add(name=name)
    return msg.SerializeToString()


def bench(label: str, fn, number: int, repeat: int, results: dict[str, float]) -> None:
    best = min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6
    results[label] = best
    print(f"{label:<28} {best:8.2f} us")


def cpu_time(inst: py_backend.PythonInstance, reqs: list[InferRequest], number: int, rounds: int) -> int:
    """Print ``execute``'s CPU time per call (this thread's clock: preemption by other jobs is not counted)."""
    import os
    import statistics
    import time

    for _ in range(number // 10):
        inst.execute(reqs)
    per = []
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        for _ in range(number):
            inst.execute(reqs)
        per.append((time.thread_time_ns() - t0) / number / 1e3)
    print(f"python execute (1 request): best {min(per):.2f} us, median {statistics.median(per):.2f} us CPU "
          f"({rounds} x {number}; load average {os.getloadavg()[0]:.2f})")
    inst.finalize()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cpu", type=int, default=0, metavar="ROUNDS", help="only execute's CPU time, ROUNDS rounds")
    args = ap.parse_args()
    n, r = args.number, args.repeat

    inst = make_instance()
    req = make_request()
    reqs = [req]
    if args.cpu:
        return cpu_time(inst, reqs, n, args.cpu)
    response = inst.execute(reqs)[0]
    assert not isinstance(response, Exception), response
    pb_req = py_backend._to_pb(req)
    pb_resp = inst.model.execute([pb_req])[0]

    raw = make_grpc_bytes()
    grpc_msg = pb.ModelInferRequest.FromString(raw)
    grpc_req = v2_grpc.decode_infer_request(grpc_msg, None)
    grpc_resp = v2_grpc.encode_infer_response(grpc_req, response, 1, {}, False, None)

    results: dict[str, float] = {}
    bench("python execute (1 request)", lambda: inst.execute(reqs), n, r, results)
    bench("  _to_pb", lambda: py_backend._to_pb(req), n, r, results)
    bench("  model.execute only", lambda: inst.model.execute([pb_req]), n, r, results)
    bench("  _from_pb", lambda: inst._from_pb(pb_resp), n, r, results)
    bench("grpc decode", lambda: v2_grpc.decode_infer_request(grpc_msg, None), n, r, results)
    bench("grpc encode", lambda: v2_grpc.encode_infer_response(grpc_req, response, 1, {}, False, None), n, r, results)
    bench("  pb parse (transport)", lambda: pb.ModelInferRequest.FromString(raw), n, r, results)
    bench("  pb serialize (transport)", lambda: grpc_resp.SerializeToString(), n, r, results)
    inst.finalize()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
