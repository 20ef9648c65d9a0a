#!/usr/bin/env python3
"""Big JSON requests next to small clients: what one request can take from the others (docs/limits.md).

Starts triton_actor on a throw-away repository with one Python model (``total``: FP32 [-1] in, its sum
out), then, at once, ``--big`` clients each POST one JSON ``/infer`` whose ``data`` is a float array of
``--mib`` MiB of JSON text, while ``--small`` clients send tiny ``/infer`` requests back to back. Reports,
for the small clients: requests, failures (an answer slower than ``--small-timeout`` s counts as failed, as
a client with that deadline sees it), median / p99 / max latency; for the big ones their latency; and the
server's peak resident memory (VmHWM) above its idle size.

``--many-inputs``: the big requests carry one-element inputs the model does not have (about 62 bytes of
JSON each: 24 MiB is 400,000 inputs); the server must refuse them (400) without holding the others up.

    .venv/bin/python scripts/bench_hostile.py --big 4 --mib 57
    .venv/bin/python scripts/bench_hostile.py --big 1 --mib 24 --many-inputs

``--grpc-typed``: the big requests go over gRPC, as typed ``contents`` (``fp32_contents``) of ``--mib``
MiB on the wire (4 bytes a value), the way non-tritonclient gRPC clients often send tensors.

    .venv/bin/python scripts/bench_hostile.py --big 1 --mib 53 --grpc-typed

``--slow N``: instead of big requests, N raw-socket clients each declare a ``--slow-mib`` MiB body (16 x
64 MiB: the whole default request memory budget) and send one byte every ``--slow-every`` s, while the
small clients run for ``--duration`` s; reports what the slow clients were answered and when.

    .venv/bin/python scripts/bench_hostile.py --slow 16 --duration 30

``--reopen``: each slow client opens a new connection as soon as one is answered, so more slow clients
than the budget admits keep a line of silent 64 MiB reservations ahead of every small request.

    .venv/bin/python scripts/bench_hostile.py --slow 90 --reopen --duration 40

``--gzip http|grpc``: the big requests are gzip bombs: an HTTP body (``Content-Encoding: gzip``, binary
FP32 zeros) or a gRPC message (``grpc-encoding: gzip``, raw contents of zeros, sent on a raw HTTP/2
connection) that inflates to ``--mib`` MiB from about 1/1000 of that on the wire; reports the answers
they got and the resident memory left above idle after them. ``--gzip answer``: the big requests send
``--mib`` MiB of FP32 in binary to an echo model and ask ``Accept-Encoding: gzip`` for the answer.

    .venv/bin/python scripts/bench_hostile.py --gzip grpc --big 1 --mib 2047
    .venv/bin/python scripts/bench_hostile.py --gzip http --big 40 --mib 64
    .venv/bin/python scripts/bench_hostile.py --gzip answer --big 4 --mib 60

``--scrape N``: instead of big requests, N clients scrape ``/metrics`` back to back (each on its own
keep-alive connection) for ``--duration`` s beside the small clients; reports the scrapes answered.

    .venv/bin/python scripts/bench_hostile.py --scrape 32 --duration 20
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """name: "total"
backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""
MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array(
            [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().sum()], dtype=np.float32))])
            for r in requests]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _body(n: int) -> bytes:
    data = ",".join(["0.123456789"] * n)
    head = '{"inputs":[{"name":"INPUT0","shape":[' + str(n) + '],"datatype":"FP32","data":['
    return (head + data + "]}]}").encode()


def _many_inputs(mib: float) -> bytes:
    one = '{"name":"x%07d","shape":[1],"datatype":"FP32","data":[1.0]}'
    n = int(mib * 2**20 / len(one % 0))
    return ('{"inputs":[' + ",".join(one % i for i in range(n)) + "]}").encode()


ECHO_CONFIG = """name: "echo"
backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""
ECHO_MODEL = """import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
            pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def _json_output_request(n: int) -> tuple[bytes, int]:
    """``n`` FP32 values in binary to the ``echo`` model, asking for the output as JSON: (body, header length)."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [n], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4 * n}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}).encode()
    return header + struct.pack(f"<{n}f", *([0.123456789] * n)), len(header)


def _post(port: int, body: bytes, timeout: float, expect: int = 200, model: str = "total",
          header_length: int | None = None) -> tuple[bool, float]:
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        headers = {"Content-Type": "application/json"}
        if header_length is not None:
            headers["Inference-Header-Content-Length"] = str(header_length)
        conn.request("POST", f"/v2/models/{model}/infer", body, headers)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        ok = resp.status == expect
    except OSError:
        ok = False
    return ok, time.perf_counter() - t0


def _typed_request(n: int) -> bytes:
    """A serialized ModelInferRequest of ``n`` FP32 values as typed contents (built before the clock starts:
    the small clients are threads of this process, and building it holds our own interpreter)."""
    import numpy as np

    from triton_actor.protocol._generated import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name="total")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[n]).contents.fp32_contents.extend(
        np.full(n, 0.5, dtype=np.float32))
    return req.SerializeToString()


def _grpc_call(port: int, body: bytes) -> tuple[bool, float]:
    """One ModelInfer of a serialized request; (answered, seconds)."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        t0 = time.perf_counter()
        try:
            call(body, timeout=600)
            ok = True
        except grpc.RpcError:
            ok = False
        return ok, time.perf_counter() - t0


def _slow_clients(port: int, mib: float, every: float, stop: threading.Event, out: list[tuple[str, float]],
                  reopen: bool) -> None:
    """One slow client after another (``reopen``: a new one as soon as one is answered) until ``stop``."""
    while True:
        _slow_client(port, mib, every, stop, out)
        if not reopen or stop.is_set():
            return


def _slow_client(port: int, mib: float, every: float, stop: threading.Event, out: list[tuple[str, float]]) -> None:
    """Declare ``mib`` MiB, then trickle a byte every ``every`` s until answered (or ``stop``)."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v2/models/total/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n{" % int(mib * 2**20))
        sock.settimeout(every)
        while not stop.is_set():
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                sock.sendall(b" ")
                continue
            except OSError as e:
                answer = repr(e).encode()
            out.append((answer.split(b"\r\n", 1)[0].decode() or "closed", time.perf_counter() - t0))
            return
    out.append(("still holding", time.perf_counter() - t0))


def _gzip_zeros(head: bytes, n: int, tail: bytes = b"") -> bytes:
    """gzip of ``head``, ``n`` zero bytes and ``tail``, made a MiB at a time (never ``n`` bytes at once)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts, mib = [c.compress(head)], bytes(2**20)
    for left in range(n, 0, -(2**20)):
        parts.append(c.compress(mib[:min(left, 2**20)]))
    return b"".join([*parts, c.compress(tail), c.flush()])


def _bomb(kind: str, mib: float) -> tuple[bytes, int]:
    """(what goes on the wire, its header length): an HTTP body of ``mib`` MiB of FP32 zeros once inflated,
    or a gRPC message (:func:`grpc_gzip_bomb`) of ``mib`` MiB of raw contents."""
    n = int(mib * 2**20) // 4 * 4
    if kind == "grpc":
        return grpc_gzip_bomb("total", n), 0
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [n // 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": n}}]}).encode()
    return _gzip_zeros(header, n), len(header)


def grpc_gzip_bomb(model: str, n: int) -> bytes:
    """A gzip ModelInferRequest message for ``model`` (with its 5-byte gRPC prefix): FP32 input ``INPUT0``
    of ``n`` bytes of zeros as raw contents, about n / 1000 bytes on the wire."""
    from triton_actor.protocol._generated import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[n // 4])
    req.raw_input_contents.append(b"")  # field 7 comes last: its length, then its bytes
    head, left = bytearray(req.SerializeToString()[:-1]), n
    while True:  # the length as a varint
        byte, left = left & 0x7F, left >> 7
        head.append(byte | (0x80 if left else 0))
        if not left:
            break
    body = _gzip_zeros(bytes(head), n)
    return struct.pack(">BI", 1, len(body)) + body


def _post_gzip(port: int, body: bytes, header_length: int) -> tuple[str, float]:
    """A gzip-encoded binary /infer to ``total``: (status, seconds)."""
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", "/v2/models/total/infer", body, {
            "Content-Encoding": "gzip", "Inference-Header-Content-Length": str(header_length),
            "Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        status = str(resp.status)
    except OSError as e:
        status = type(e).__name__
    return status, time.perf_counter() - t0


def _grpc_raw(port: int, message: bytes) -> tuple[str, float]:
    """One ModelInfer of a ready ``grpc-encoding: gzip`` message on a raw HTTP/2 connection (a gRPC client
    would compress the whole message first): (grpc-status, seconds). The message must fit the server's
    16 MiB windows."""
    import hpack

    def frame(ftype: int, flags: int, payload: bytes = b"", sid: int = 1) -> bytes:
        return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload

    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                    (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                    ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-encoding", "gzip")])
    data = [message[i:i + 16384] for i in range(0, len(message), 16384)]
    out = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", frame(4, 0, sid=0), frame(1, 4, block)]
    out += [frame(0, int(i == len(data) - 1), d) for i, d in enumerate(data)]
    t0, decoder, buf = time.perf_counter(), hpack.Decoder(), b""
    with socket.create_connection(("127.0.0.1", port), timeout=600) as sock:
        sock.sendall(b"".join(out))
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return "closed", time.perf_counter() - t0
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + (struct.unpack_from(">I", buf)[0] >> 8):
                length_type, flags = struct.unpack_from(">IB", buf)
                payload, buf = buf[9:9 + (length_type >> 8)], buf[9 + (length_type >> 8):]
                if length_type & 0xFF == 1:
                    fields = dict(decoder.decode(payload))
                    if flags & 1:
                        return fields.get("grpc-status", "?"), time.perf_counter() - t0
                elif length_type & 0xFF == 6 and not flags & 1:
                    sock.sendall(frame(6, 1, payload, sid=0))


def _gzip_answer(port: int, n: int) -> tuple[str, float]:
    """``n`` FP32 values in binary to ``echo``, the answer asked in binary with Accept-Encoding gzip."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [n], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4 * n}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + random.Random(0).randbytes(4 * n)  # compresses as random floats do: hardly
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v2/models/echo/infer", body, {"Inference-Header-Content-Length": str(len(header)),
                                                         "Accept-Encoding": "gzip"})
    resp = conn.getresponse()
    got = resp.read()
    conn.close()
    return f"{resp.status} {resp.getheader('Content-Encoding')} {len(got) >> 20} MiB", time.perf_counter() - t0


def _scraper(port: int, stop: threading.Event, out: list[float]) -> None:
    """Scrape ``/metrics`` back to back on one keep-alive connection until ``stop``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            resp.read()
        except OSError:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            continue
        if resp.status == 200:
            out.append(time.perf_counter() - t0)
    conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big", type=int, default=4, help="clients sending one big JSON request each")
    ap.add_argument("--mib", type=float, default=57.0, help="MiB of JSON text per big request")
    ap.add_argument("--small", type=int, default=10, help="clients sending small requests meanwhile")
    ap.add_argument("--small-timeout", type=float, default=1.0, help="a small answer slower than this failed")
    ap.add_argument("--many-inputs", action="store_true", help="big requests of many unknown inputs (refused)")
    ap.add_argument("--grpc-typed", action="store_true", help="big requests over gRPC as typed contents")
    ap.add_argument("--json-output", action="store_true",
                    help="big requests: --mib MiB of FP32 in binary to an echo model, the answer asked as JSON")
    ap.add_argument("--flags", default="", help="extra server flags")
    ap.add_argument("--slow", type=int, default=0, help="slow clients (instead of --big)")
    ap.add_argument("--slow-mib", type=float, default=64.0, help="MiB each slow client declares")
    ap.add_argument("--slow-every", type=float, default=1.0, help="seconds between a slow client's bytes")
    ap.add_argument("--reopen", action="store_true",
                    help="--slow: each slow client opens a new connection as soon as one is answered (a queue flood)")
    ap.add_argument("--duration", type=float, default=30.0, help="--slow: seconds the small clients run")
    ap.add_argument("--gzip", choices=("http", "grpc", "answer"),
                    help="big requests: gzip bombs of --mib MiB inflated (http, grpc), or gzip answers of --mib MiB")
    ap.add_argument("--scrape", type=int, default=0, help="clients scraping /metrics back to back (instead of --big)")
    args = ap.parse_args()
    if args.slow or args.scrape:
        args.big, args.mib = 0, 0.0

    n = int(args.mib * 2**20 / len("0.123456789,"))
    if args.gzip in ("http", "grpc"):
        big, header_length = _bomb(args.gzip, args.mib)
        print(f"big request: {len(big) / 2**20:.2f} MiB of gzip, {args.mib:g} MiB inflated", flush=True)
    elif args.gzip == "answer":
        n = int(args.mib * 2**20 / 4)
        big = b""
        print(f"big request: {n} FP32 values in binary, the answer asked gzipped", flush=True)
    elif args.grpc_typed:
        n = int(args.mib * 2**20 / 4)
        big = _typed_request(n)
        print(f"big request: {len(big) / 2**20:.1f} MiB of protobuf, {n} FP32 typed values", flush=True)
    elif args.json_output:
        n = int(args.mib * 2**20 / 4)
        big, header_length = _json_output_request(n)
        print(f"big request: {n} FP32 values in binary, answered as JSON (~{n * 10 / 2**20:.0f} MiB)", flush=True)
    elif args.big:
        big = _many_inputs(args.mib) if args.many_inputs else _body(n)
        what = "one-element inputs" if args.many_inputs else "floats"
        print(f"big request: {len(big) / 2**20:.1f} MiB of JSON, {big.count(b'name') if args.many_inputs else n} {what}",
              flush=True)
    else:
        big = b""
    small = _body(4)
    with tempfile.TemporaryDirectory() as tmp:
        version = Path(tmp, "total", "1")
        version.mkdir(parents=True)
        (version.parent / "config.pbtxt").write_text(CONFIG)
        (version / "model.py").write_text(MODEL)
        Path(tmp, "echo", "1").mkdir(parents=True)
        Path(tmp, "echo", "config.pbtxt").write_text(ECHO_CONFIG)
        Path(tmp, "echo", "1", "model.py").write_text(ECHO_MODEL)
        port, grpc_port, metrics_port = _free_port(), _free_port(), _free_port()
        metrics = ["--metrics-port", str(metrics_port)] if args.scrape else ["--allow-metrics", "false"]
        cmd = [sys.executable, "-m", "triton_actor", "--model-repository", tmp, "--http-port", str(port),
               "--grpc-port", str(grpc_port), *metrics,
               "--http-max-input-size", str(max(len(big) + 1024, int(args.slow_mib * 2**20),
                                                int(args.mib * 2**20) + 1024 if args.gzip else 0)),
               *args.flags.split()]
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            while not _post(port, small, 1)[0]:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("server did not come up")
                time.sleep(0.2)
            idle_kb = _status_kb(server.pid, "VmRSS")
            stop = threading.Event()
            small_results: list[tuple[bool, float]] = []
            big_results: list[tuple[bool, float]] = []

            def small_client() -> None:
                while not stop.is_set():
                    ok, took = _post(port, small, 30)
                    small_results.append((ok and took <= args.small_timeout, took))

            def big_client() -> None:
                if args.gzip == "http":
                    big_results.append(_post_gzip(port, big, header_length))
                elif args.gzip == "grpc":
                    big_results.append(_grpc_raw(grpc_port, big))
                elif args.gzip == "answer":
                    big_results.append(_gzip_answer(port, n))
                elif args.grpc_typed:
                    big_results.append(_grpc_call(grpc_port, big))
                elif args.json_output:
                    big_results.append(_post(port, big, 600, model="echo", header_length=header_length))
                else:
                    big_results.append(_post(port, big, 600, 400 if args.many_inputs else 200))

            smalls = [threading.Thread(target=small_client) for _ in range(args.small)]
            bigs = [threading.Thread(target=big_client) for _ in range(args.big)]
            slow_results: list[tuple[str, float]] = []
            slows = [threading.Thread(target=_slow_clients, args=(port, args.slow_mib, args.slow_every, stop,
                                                                   slow_results, args.reopen))
                     for _ in range(args.slow)]
            scrapes: list[float] = []
            slows += [threading.Thread(target=_scraper, args=(metrics_port, stop, scrapes)) for _ in range(args.scrape)]
            for t in slows:
                t.start()
            if slows:
                time.sleep(1.0)  # the slow clients hold the budget before the small ones start
            for t in smalls:
                t.start()
            time.sleep(1.0)
            t0 = time.perf_counter()
            for t in bigs:
                t.start()
            for t in bigs:
                t.join()
            if slows:
                time.sleep(args.duration)
            took = time.perf_counter() - t0
            stop.set()
            for t in smalls + slows:
                t.join()
            peak_kb = _status_kb(server.pid, "VmHWM")
            after_kb = _status_kb(server.pid, "VmRSS")
        finally:
            server.terminate()
            server.wait(30)
    lat = sorted(t for _, t in small_results)
    failed = sum(1 for ok, _ in small_results if not ok)
    summary = {
        "big_requests": args.big, "big_mib": round(len(big) / 2**20, 1), "big_ok": sum(ok is True for ok, _ in big_results),
        "big_seconds": [round(t, 2) for _, t in big_results], "window_s": round(took, 2),
        "small_requests": len(lat), "small_failed": failed,
        "small_median_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
        "small_p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 1) if lat else None,
        "small_max_ms": round(lat[-1] * 1000, 1) if lat else None,
        "peak_rss_over_idle_mb": round((peak_kb - idle_kb) / 1024),
        "rss_after_over_idle_mb": round((after_kb - idle_kb) / 1024),
    }
    if args.gzip:  # the answers (an HTTP status or a grpc-status) instead of "ok"
        answers: dict[str, int] = {}
        for answer, _ in big_results:
            answers[str(answer)] = answers.get(str(answer), 0) + 1
        summary["big_ok"] = answers
    if args.scrape:
        scraped = sorted(scrapes)
        summary["scrapes"] = len(scraped)
        summary["scrape_median_ms"] = round(statistics.median(scraped) * 1000, 1) if scraped else None
    if args.slow:
        answers: dict[str, list[float]] = {}
        for answer, seconds in slow_results:
            answers.setdefault(answer, []).append(seconds)
        summary["slow_clients"] = {k: f"{len(v)} after {min(v):.1f}-{max(v):.1f} s" for k, v in answers.items()}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
