#!/usr/bin/env python3
"""In-process micro-benchmark of the gRPC transport's Python per unary call: no model, no data plane.

A ``GrpcH2Server`` serves one end of a socket pair with a stub servicer (``ModelInfer`` answers a
canned add_sub response at once, as a quick inline model does); a client greenlet on the other end
sends add_sub's unary call the way grpcio does (HEADERS whose block is indexed-only after the first
call, one DATA frame with END_STREAM) and reads the HEADERS + DATA + trailers answer, one call at a
time. Prints µs per call (best of ``--repeat`` runs of ``--number`` calls): the transport (framing,
HPACK, state machine, greenlet and socket calls) plus protobuf parse and serialize and the client's
few socket calls. It also times the state machine alone (``protocol/h2_connection.py``: the call's
bytes in, events out, the answer's bytes out; no socket, no protobuf).

    .venv/bin/python scripts/bench_grpc_transport.py [--number 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import socket
import struct
import time
from types import SimpleNamespace
from typing import Any, ClassVar

import gevent
import hpack
import numpy as np

import triton_actor.bootstrap  # noqa: F401  (patches gevent before the server modules load)
from triton_actor.frontends.grpc_h2 import GrpcH2Server
from triton_actor.protocol._generated import grpc_service_pb2 as pb

_OK = b"grpc-status\x010"  # how our trailers end (a literal)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload


def add_sub_request() -> bytes:
    req = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="FP32", shape=[4])
        req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    req.outputs.add(name="OUTPUT0")
    req.outputs.add(name="OUTPUT1")
    return req.SerializeToString()


class StubServicer:
    """Every RPC answers at once; ModelInfer with add_sub's canned answer."""

    parsers: ClassVar[dict[str, Any]] = {}  # every message by its type's FromString (GrpcServicer.parsers)
    # no response cache: a cached servicer's ModelInfer skips the whole-message fast path (method_table),
    # so a stub that looked cached would measure the slow path
    caching: ClassVar[bool] = False

    def __init__(self) -> None:
        resp = pb.ModelInferResponse(model_name="add_sub", model_version="1")
        for name in ("OUTPUT0", "OUTPUT1"):
            resp.outputs.add(name=name, datatype="FP32", shape=[4])
            resp.raw_output_contents.append(np.arange(4, dtype=np.float32).tobytes())
        self.response = resp
        self.ready = SimpleNamespace(reply=SimpleNamespace(ready=lambda: True))

    def start_infer(self, req: Any, *_: Any) -> tuple[Any, Any]:
        return req, self.ready

    def finish_infer(self, request: Any, pending: Any) -> Any:
        return self.response

    def finish_infer_wire(self, request: Any, pending: Any) -> bytes:  # what the HTTP/2 call's ModelInfer sends
        return self.response.SerializeToString()

    def stream_infer(self, req: Any, *_: Any) -> Any:
        yield from ()

    def again_infer(self, buf: bytearray) -> tuple[None, None]:  # no response cache: never answered by bytes
        return None, None

    def learn_infer(self, kept: Any, request: Any, pending: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        # only RPCs (CamelCase) answer: a setting the server reads off its servicer must be declared
        # above, never a truthy lambda
        if not name[:1].isupper():
            raise AttributeError(name)
        return lambda req: pb.ServerLiveResponse(live=True)


def call_bytes(encoder: hpack.Encoder, sid: int, body: bytes) -> bytes:
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":authority", "localhost"),
                            (":path", "/inference.GRPCInferenceService/ModelInfer"), ("te", "trailers"),
                            ("content-type", "application/grpc"), ("user-agent", "grpc-python/1.0")])
    return frame(1, 4, sid, block) + frame(0, 1, sid, struct.pack(">BI", 0, len(body)) + body)


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of a loopback TCP connection (the transport sets TCP_NODELAY)."""
    listener = socket.create_server(("127.0.0.1", 0))
    theirs = socket.create_connection(listener.getsockname())
    ours, _ = listener.accept()
    listener.close()
    return ours, theirs


def bench_socket(number: int, repeat: int) -> float:
    server = GrpcH2Server(StubServicer(), "127.0.0.1", 0)
    ours, theirs = tcp_pair()
    gevent.spawn(server._handle, ours, None)
    enc, body = hpack.Encoder(), add_sub_request()
    # windows as large as they go, as grpcio's BDP probing ends up: the benchmark never waits on them
    theirs.sendall(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1))
                   + frame(8, 0, 0, struct.pack(">I", 2**31 - 1 - 65535)))
    sid = 1
    theirs.sendall(call_bytes(enc, sid, body))
    buf = b""
    while not buf.endswith(_OK):  # our SETTINGS, WINDOW_UPDATE, SETTINGS ACK and the answer
        buf += theirs.recv(65536)
    template = call_bytes(enc, 3, body)  # indexed-only from now on: the same block every call
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            sid += 2
            theirs.sendall(_with_sid(template, sid))
            got = theirs.recv(65536)
            while not got.endswith(_OK):
                got += theirs.recv(65536)
        best = min(best, (time.perf_counter() - started) / number)
    return best * 1e6


def _with_sid(template: bytes, sid: int) -> bytes:
    """The call's two frames with stream id ``sid``."""
    head_len = 9 + (struct.unpack_from(">I", template)[0] >> 8)
    sid_bytes = struct.pack(">I", sid)
    return template[:5] + sid_bytes + template[9:head_len + 5] + sid_bytes + template[head_len + 9:]


def bench_machine(number: int, repeat: int) -> float:
    from triton_actor.protocol import h2_connection as h2c
    from triton_actor.protocol import h2_events as h2e
    from triton_actor.protocol.http2 import grpc_message

    conn = h2c.H2Connection()
    conn.initiate_connection()
    conn.receive_data(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1))
                      + frame(8, 0, 0, struct.pack(">I", 2**31 - 1 - 65535)))
    enc, body = hpack.Encoder(), add_sub_request()
    conn.receive_data(call_bytes(enc, 1, body))  # inserts the headers in both HPACK tables
    conn.send_response(1, b"\x88", b"", b"")
    template = call_bytes(enc, 1, body)
    answer = grpc_message(StubServicer().response.SerializeToString())
    head, trailers = b"\x88", b"\x00\x0bgrpc-status\x010"
    sid, best = 1, float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            sid += 2
            for event in conn.receive_data(_with_sid(template, sid)):
                if type(event) is h2e.DataReceived and event.end_stream:
                    conn.send_response(event.stream_id, head, answer, trailers)
            conn.data_to_send()
        best = min(best, (time.perf_counter() - started) / number)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    try:
        print(f"state machine alone: {bench_machine(args.number, args.repeat):.1f} us/call")
    except ImportError:
        pass  # before protocol/h2_connection.py
    print(f"unary ModelInfer over a socket pair: {bench_socket(args.number, args.repeat):.1f} us/call")


if __name__ == "__main__":
    main()
