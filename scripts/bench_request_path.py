#!/usr/bin/env python3
"""The request path's own CPU per inference: a real server in this process, Triton's ``add_sub`` loaded,
and the request perf_analyzer sends handed to it over and over from this thread.

* ``http``: the request's bytes through the HTTP/1.1 state machine (``protocol/http1.py``), the router and
  ``/infer`` view (routing, decode, validation, scheduler, the model inline, statistics, encode) and the
  response head, as the connection's loop (``frontends/http_server.py``) does minus ``recv``/``send``;
* ``grpc``: the ``ModelInferRequest`` message parsed, ``ModelInfer`` started and finished through the method
  table (what the HTTP/2 reader runs for a unary call), the answer serialized and framed;
* ``http-socket`` and ``grpc-socket``: the same requests over a TCP connection to the server's own port
  (its connection loop, socket calls and the hub's turns included), sent and read by a minimal client in
  this greenlet, whose own small share is in the figure.

The figure is the CPU time of this thread (``time.thread_time_ns``) per request, best and median of
``--rounds`` rounds of ``--n`` requests: on a machine shared with other jobs the process is preempted,
which CPU time does not count, so runs of two checkouts compare within a few percent where
perf_analyzer's wall-clock rates swing by half. What it leaves out (the socket calls, HTTP/2 framing, the
hub's loop) is in the socket modes, and with perf_analyzer in ``scripts/bench_grpc.py``'s CPU column.
``--opcodes`` counts the bytecodes a request runs, by function: a figure no load on the machine moves.

    PYTHONPATH=. .venv/bin/python scripts/bench_request_path.py
    PYTHONPATH=/path/to/other/checkout .venv/bin/python scripts/bench_request_path.py    # that checkout's code
    PYTHONPATH=. .venv/bin/python scripts/bench_request_path.py --profile /tmp/http.prof --only http
    PYTHONPATH=. .venv/bin/python scripts/bench_request_path.py --opcodes 40 --perf-analyzer grpc   # a real client
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from triton_actor import bootstrap  # noqa: F401  (gevent patching first)

HERE = Path(__file__).resolve().parent


def _has(module: str) -> bool:
    """Whether the checkout being measured has ``triton_actor.<module>`` (an editable install of another
    checkout would otherwise answer the import of a module this one lacks)."""
    import triton_actor

    return (Path(triton_actor.__file__).parent / (module.replace(".", "/") + ".py")).exists()


def _server(repo: Path, trace: list[str] | None = None, cache: bool = False):
    if _has("config.command_line"):
        from triton_actor.config.command_line import parse
    else:  # a checkout from before the package reorganisation
        from triton_actor.cli import parse
    from triton_actor.server import Server

    settings = parse(["--model-repository", str(repo), "--http-port", "0", "--http-address", "127.0.0.1",
                      "--grpc-port", "0", "--grpc-address", "127.0.0.1", "--allow-metrics=false", "--log-info=false",
                      *(arg for setting in trace or () for arg in ("--trace-config", setting)),
                      *(["--cache-config", "local,size=1048576"] if cache else [])])
    server = Server(settings)
    server.start()
    return server


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32)


def http_request(server) -> Callable[[], object]:
    """One ``/infer`` as perf_analyzer sends it (binary inputs and outputs), bytes to answer."""
    from triton_actor.protocol import http1

    raw = _http_bytes()
    frontend, limits = server.frontend, server._http_limits()
    conn = http1.ServerConnection(limits, time.monotonic())

    def one() -> object:
        conn.receive_data(raw, 0.0)
        head = conn.next_event()
        method, target, _version, headers, keep_alive, _expect, _length = head
        (data,) = conn.next_event()
        path, _, query = target.partition("?")
        status, out_headers, out = frontend(method, path, query, headers, data)
        conn.start_next_cycle(0.0)
        return http1.response_head(status, out_headers, len(out), keep_alive) + out

    return one


def grpc_request(server) -> Callable[[], object]:
    """One ``ModelInfer`` as perf_analyzer sends it (raw contents), message bytes to framed answer."""
    if _has("frontends.grpc_methods"):
        from triton_actor.frontends.grpc_methods import method_table
    else:
        from triton_actor.frontends.grpc_calls import method_table
    from triton_actor.protocol import http2 as h2
    from triton_actor.protocol._generated import grpc_service_pb2 as pb

    servicer = server.grpc.servicer if hasattr(server.grpc, "servicer") else None
    if servicer is None:
        from triton_actor.frontends.grpc import GrpcServicer

        servicer = GrpcServicer(server.plane, caching=server.response_cache is not None)
    method = method_table(servicer)[b"/inference.GRPCInferenceService/ModelInfer"]
    a, b = _inputs()
    msg = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        t = msg.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(4)
    msg.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    data = msg.SerializeToString()
    start, finish = getattr(method, "start", None), getattr(method, "finish", None)

    def one() -> object:
        request, pending = start(method.parse(data), None)
        answer = finish(request, pending)  # the answer's bytes (a checkout before: its message)
        return h2.grpc_message(answer if answer.__class__ is bytes else answer.SerializeToString())

    def called() -> object:  # a checkout whose ModelInfer has one step
        return h2.grpc_message(method.call(method.parse(data)).SerializeToString())

    return one if start is not None else called


def _http_bytes() -> bytes:
    """The bytes of one ``/infer`` as perf_analyzer sends it (binary inputs and outputs)."""
    import tritonclient.http as httpclient

    a, b = _inputs()
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        inp = httpclient.InferInput(name, [4], "FP32")
        inp.set_data_from_numpy(value, binary_data=True)
        inputs.append(inp)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: localhost:8000\r\n"
            b"Content-Type: application/octet-stream\r\n"
            + f"Inference-Header-Content-Length: {json_size}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body)


def http_socket(server) -> Callable[[], object]:
    """One ``/infer`` over a TCP connection to the server's port, from this greenlet: the whole
    server (its connection loop, socket calls, the hub's turns) plus this client's send and read."""
    import socket as pysocket

    import gevent.socket

    raw = _http_bytes()
    sock = gevent.socket.create_connection(("127.0.0.1", server.http_port))
    sock.setsockopt(pysocket.IPPROTO_TCP, pysocket.TCP_NODELAY, 1)
    sock.sendall(raw)
    first = sock.recv(65536)
    head, _, _ = first.partition(b"\r\n\r\n")
    length = len(head) + 4 + int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length")))

    def one() -> object:
        sock.sendall(raw)
        got = sock.recv(65536)
        while len(got) < length:
            got += sock.recv(65536)
        return got

    return one


def grpc_socket(server) -> Callable[[], object]:
    """One ``ModelInfer`` over an HTTP/2 connection to the server's gRPC port, from this greenlet (frames
    made here as a gRPC client makes them: HPACK-indexed headers, one DATA frame, generous windows)."""
    import socket as pysocket
    import struct

    import gevent.socket
    import hpack

    from triton_actor.protocol._generated import grpc_service_pb2 as pb

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return struct.pack("!I", len(payload))[1:] + bytes([kind, flags]) + struct.pack("!I", stream) + payload

    a, b = _inputs()
    msg = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        t = msg.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(4)
    msg.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    data = msg.SerializeToString()
    body = b"\x00" + struct.pack("!I", len(data)) + data
    encoder = hpack.Encoder()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
               (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers")]
    sock = gevent.socket.create_connection(("127.0.0.1", server.grpc.server_port))
    sock.setsockopt(pysocket.IPPROTO_TCP, pysocket.TCP_NODELAY, 1)
    big = 2**31 - 1
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, struct.pack("!HI", 4, big))
                 + frame(8, 0, 0, struct.pack("!I", big - 65535)))
    # a client's HPACK encoder sends the same block on every call once its table holds the fields
    blocks = [encoder.encode(headers), encoder.encode(headers)]
    state = {"stream": 1, "buf": b"", "acked": False}

    def one() -> object:
        sid = state["stream"]
        state["stream"] = sid + 2
        out = frame(1, 4, sid, blocks[min(sid // 2, 1)]) + frame(0, 1, sid, body)
        if not state["acked"]:
            out = frame(4, 1, 0, b"") + out  # the server's SETTINGS, acknowledged
            state["acked"] = True
        sock.sendall(out)
        buf = state["buf"]
        while True:
            while len(buf) >= 9:
                size = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + size:
                    break
                kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                buf = buf[9 + size:]
                if kind == 1 and flags & 1 and stream == sid:  # the trailers: the call is over
                    state["buf"] = buf
                    return sid
            buf += sock.recv(65536)

    return one


def measure(one: Callable[[], object], n: int, rounds: int) -> tuple[list[float], list[float]]:
    """CPU µs per request of each round, and the garbage collector's collections per 1000 requests by
    generation over all rounds (allocation shows up there)."""
    import gc

    for _ in range(max(200, n // 10)):  # warm-up: the model is promoted to run inline after 32 short runs
        one()
    per = []
    before = [g["collections"] for g in gc.get_stats()]
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        for _ in range(n):
            one()
        per.append((time.thread_time_ns() - t0) / n / 1e3)
    after = [g["collections"] for g in gc.get_stats()]
    return per, [(b - a) * 1000 / (n * rounds) for a, b in zip(before, after, strict=True)]


def count_opcodes(one: Callable[[], object], n: int, top: int, drive: Callable[[], int] | None = None) -> None:
    """Bytecodes executed per request, by function (``sys.settrace`` with opcode events), and calls into C
    functions (``sys.setprofile``); both per request, over ``n`` requests (or over what ``drive()`` ran: it
    returns how many)."""
    import collections

    own: collections.Counter[object] = collections.Counter()
    c_calls: collections.Counter[str] = collections.Counter()
    entered: collections.Counter[object] = collections.Counter()

    def trace(frame, event, arg):
        if event == "opcode":
            own[frame.f_code] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            entered[frame.f_code] += 1
        return trace

    def profile(frame, event, arg):
        if event == "c_call":
            c_calls[getattr(arg, "__qualname__", repr(arg))] += 1

    # traced, an inline run of the model takes long enough to be demoted to its thread (the instance's
    # rule for slow models): counted, the path would not be the one served untraced
    if _has("actors.scheduling.instance"):
        from triton_actor.actors.scheduling import instance
    else:  # a checkout from before the package reorganisation
        from triton_actor.actors import instance  # type: ignore[no-redef]

    limits = instance.DEMOTE_NS, instance.DEMOTE_WALL_NS
    instance.DEMOTE_NS = instance.DEMOTE_WALL_NS = 1 << 62
    sys.settrace(trace)
    sys.setprofile(profile)
    try:
        if drive is not None:
            n = drive()
        else:
            for _ in range(n):
                one()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
        instance.DEMOTE_NS, instance.DEMOTE_WALL_NS = limits
    print(f"     {sum(own.values()) / n:.0f} bytecodes, {sum(entered.values()) / n:.0f} Python calls and "
          f"{sum(c_calls.values()) / n:.0f} calls into C per request, in {len(own)} functions; by own bytecodes "
          "(bytecodes, calls):")
    for code, k in own.most_common(top):
        print(f"     {k / n:7.1f} {entered[code] / n:5.2f}  {code.co_qualname} ({Path(code.co_filename).parent.name}/"
              f"{Path(code.co_filename).name}:{code.co_firstlineno})")
    print("     calls into C per request:", ", ".join(f"{name} {k / n:.1f}" for name, k in c_calls.most_common(top)))


def perf_analyzer_drive(server, protocol: str, concurrency: int) -> Callable[[], int]:
    """A run of perf_analyzer (``scripts/install_bench_tools.sh``) against the server's port, the
    server's hub serving it in this process: the requests a real client sends (grpc-c++'s two
    WINDOW_UPDATEs a call, its outputs named, libcurl's head) rather than this script's minimal ones.
    Returns the inferences it made, by the model's statistics."""
    import gevent.subprocess

    tool = Path.home() / ".cache" / "triton_actor_bench" / "perf_analyzer"
    if not tool.exists():
        raise SystemExit(f"{tool} missing: run scripts/install_bench_tools.sh")
    port = server.http_port if protocol == "http" else server.grpc.server_port

    def served() -> int:
        return server.plane.statistics("add_sub", -1)["model_stats"][0]["inference_stats"]["success"]["count"]

    def run(ms: int) -> None:
        out = gevent.subprocess.run([str(tool), "-m", "add_sub", "-u", f"127.0.0.1:{port}", "-i", protocol,
                                     "--concurrency-range", str(concurrency), "-p", str(ms), "-s", "50",
                                     "--max-trials", "3"], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"perf_analyzer failed:\n{out.stdout}\n{out.stderr}")

    def drive() -> int:
        n0 = served()
        run(3000)
        return served() - n0

    run(1000)  # warm: the plans, the model promoted
    return drive


KINDS = {"http": http_request, "grpc": grpc_request, "http-socket": http_socket, "grpc-socket": grpc_socket}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", choices=KINDS, action="append")
    ap.add_argument("--profile", type=Path, help="cProfile (this thread's CPU clock) of one more round, written here")
    ap.add_argument("--opcodes", type=int, default=0, metavar="TOP",
                    help="count the bytecodes run per request (and calls into C), and list the TOP functions by "
                         "their own bytecodes: a count that no load on the machine changes")
    ap.add_argument("--cache", action="store_true",
                    help="add_sub with response_cache enabled and a local cache: every request after the first "
                         "is a cache hit (scripts/bench_cache.py's set-up)")
    ap.add_argument("--trace-config", action="append", default=[], metavar="SETTING",
                    help="the server's --trace-config (repeat it): the path's cost with tracing on, e.g. "
                         "level=TIMESTAMPS, rate=1, triton,file=/tmp/t.json")
    ap.add_argument("--perf-analyzer", choices=("grpc", "http"), metavar="PROTOCOL",
                    help="with --opcodes: count while perf_analyzer drives the server over PROTOCOL (a real "
                         "client's requests, the server's whole hub) instead of the modes above")
    ap.add_argument("--concurrency", type=int, default=1, help="perf_analyzer's, with --perf-analyzer")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_request_path_"))
    shutil.copytree(HERE / "triton_reference" / "add_sub", work / "add_sub",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if a.cache:
        config = work / "add_sub" / "config.pbtxt"
        config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    server = _server(work, a.trace_config, a.cache)
    import triton_actor

    try:
        if a.perf_analyzer:
            print(f"perf_analyzer over {a.perf_analyzer}, concurrency {a.concurrency}, {Path(triton_actor.__file__).parents[1]}:",
                  flush=True)
            count_opcodes(lambda: None, 0, a.opcodes or 40, perf_analyzer_drive(server, a.perf_analyzer, a.concurrency))
            return 0
        for kind in a.only or list(KINDS):
            one = KINDS[kind](server)
            per, collections = measure(one, a.n, a.rounds)
            print(f"{kind:11s} {Path(triton_actor.__file__).parents[1]}: best {min(per):6.1f} µs, median "
                  f"{statistics.median(per):6.1f} µs CPU per request ({a.rounds} x {a.n}; load average "
                  f"{os.getloadavg()[0]:.2f}); collections per 1000 requests "
                  + "/".join(f"{c:.1f}" for c in collections), flush=True)
            if a.opcodes:
                count_opcodes(one, a.n // 10 or 1, a.opcodes)
            if a.profile:
                import cProfile

                prof = cProfile.Profile(time.thread_time)
                prof.enable()
                for _ in range(a.n):
                    one()
                prof.disable()
                prof.dump_stats(str(a.profile.with_suffix(f".{kind}{a.profile.suffix}")))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
