#!/usr/bin/env python3
"""What one ensemble step costs, in bytecodes: a real server in this process with
``bench_pipeline.py``'s repository, the ``trivial`` ensemble (three trivial Python steps) and its one step
alone (``pass``), each sent over the in-process HTTP path of ``bench_request_path.py`` after a warm-up
that promotes the models; one extra step is ``(trivial - pass) / 2``. Bytecodes do not move with the
machine's load (a shared host's timings of the same step swing by half), so two checkouts compare here
exactly; ``bench_pipeline.py`` gives the time.

    PYTHONPATH=. .venv/bin/python scripts/bench_step_opcodes.py              # --top N: the functions
    PYTHONPATH=/path/to/other/checkout .venv/bin/python scripts/bench_step_opcodes.py --root /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from triton_actor import bootstrap  # noqa: F401  (gevent patching first)

HERE = Path(__file__).resolve().parent


def _request(server, model: str) -> Callable[[], bytes]:
    """One ``/infer`` of ``model`` as tritonclient sends it (binary input and output), bytes to answer."""
    import bench_pipeline as bp
    import tritonclient.http as httpclient

    from triton_actor.protocol import http1

    dtype, data = bp.INPUTS[model]
    name, out = ("X", "Y") if model == "pass" else ("IN", "OUT")
    inp = httpclient.InferInput(name, list(data.shape), dtype)
    inp.set_data_from_numpy(data, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(out, binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body([inp], outputs=outputs)
    raw = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n"
           f"Inference-Header-Content-Length: {json_size}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    frontend = server.frontend
    conn = http1.ServerConnection(server._http_limits(), time.monotonic())

    def one() -> bytes:
        conn.receive_data(raw, 0.0)
        method, target, _version, headers, _keep_alive, _expect, _length = conn.next_event()
        (payload,) = conn.next_event()
        path, _, query = target.partition("?")
        status, _headers, answer = frontend(method, path, query, headers, payload)
        if not status.startswith("200"):
            raise SystemExit(f"{model}: {status} {answer[:300]!r}")
        conn.start_next_cycle(0.0)
        return answer

    return one


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=HERE.parent, help="the checkout whose scripts/ to use (its package: PYTHONPATH)")
    ap.add_argument("--n", type=int, default=200, help="requests counted per model")
    ap.add_argument("--top", type=int, default=0, help="also list the top N functions per model")
    args = ap.parse_args()
    sys.path.insert(0, str(args.root / "scripts"))
    import bench_pipeline as bp
    import bench_request_path as brp
    import gevent

    repo = Path(tempfile.mkdtemp(prefix="bench_step_opcodes_")) / "repo"
    bp.write_repository(repo)
    server = brp._server(repo)
    for model in ("pass", "trivial"):
        one = _request(server, model)
        for _ in range(300):  # past PROMOTE_STREAK: the models run inline, as they do when served
            one()
            gevent.sleep(0)
        print(f"== {model}", flush=True)
        brp.count_opcodes(one, args.n, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
