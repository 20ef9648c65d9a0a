"""The gevent driver of the HTTP/2 state machine (frontends/grpc_h2.py) in process, against a raw
socket peer: the timeouts that need the driver (a shut send window, a stream without progress, a
peer that stops reading) end streams and connections instead of holding them forever."""

from __future__ import annotations

import socket
import struct
from typing import Any

import gevent
import gevent.event
import hpack
import pytest

from scripts.bench_grpc_transport import StubServicer
from triton_actor.frontends.budget import ByteBudget
from triton_actor.frontends.grpc_calls import Call
from triton_actor.frontends.grpc_h2 import GrpcH2Server
from triton_actor.frontends.grpc_methods import method_table
from triton_actor.protocol import http2 as h2
from triton_actor.protocol._generated import grpc_service_pb2 as pb
from triton_actor.protocol.h2_events import Limits
from triton_actor.runtime import fastpath

from .test_grpc_transport import _PREFACE, _frame, _read_frames

_FIELDS = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
           (":path", "/inference.GRPCInferenceService/ModelInfer"), ("content-type", "application/grpc")]


def _servicer(size: int) -> StubServicer:
    """ModelInfer answers at once with ``size`` bytes of output."""
    servicer = StubServicer()
    servicer.response = pb.ModelInferResponse(model_name="m", raw_output_contents=[b"\0" * size])
    servicer.ModelInfer = lambda request: servicer.response  # the slow path's (TRITON_ACTOR_FAST_PATHS=0)
    return servicer


@pytest.fixture
def serve():
    started = []

    def start(limits: Limits, size: int = 16) -> tuple[GrpcH2Server, socket.socket, gevent.Greenlet]:
        server = GrpcH2Server(_servicer(size), "127.0.0.1", 0, limits=limits)
        listener = socket.create_server(("127.0.0.1", 0))
        theirs = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
        listener.close()
        started.append((gevent.spawn(server._handle, ours, None), theirs))
        return server, theirs, started[-1][0]

    yield start
    for greenlet, sock in started:
        sock.close()
        greenlet.kill()


def _call(sid: int, end_stream: bool = True) -> bytes:
    body = pb.ModelInferRequest(model_name="m").SerializeToString()
    head = _frame(1, 4, sid, hpack.Encoder().encode(_FIELDS))
    return head + (_frame(0, 1, sid, h2.grpc_message(body)) if end_stream else b"")


def _rst(frames: list) -> list[tuple[int, int]]:
    return [(sid, struct.unpack(">I", payload)[0]) for t, _, sid, payload in frames if t == 3]


def test_a_send_window_that_never_opens_resets_the_stream(serve) -> None:
    server, sock, _ = serve(Limits(window_timeout=0.3))
    sock.sendall(_PREFACE + _frame(4, 0, 0, struct.pack(">HI", 4, 0)) + _call(1))  # INITIAL_WINDOW_SIZE 0
    assert (1, h2.CANCEL) in _rst(_read_frames(sock, until=3, timeout=5))
    assert server.wait_idle(5)


def test_a_stream_without_progress_is_cancelled(serve) -> None:
    server, sock, _ = serve(Limits(stream_timeout=0.3))
    sock.sendall(_PREFACE + _frame(4, 0, 0) + _call(1, end_stream=False))  # HEADERS, then nothing
    assert (1, h2.CANCEL) in _rst(_read_frames(sock, until=3, timeout=5))
    assert server.wait_idle(5)


def test_a_peer_that_stops_reading_is_dropped(serve) -> None:
    server, sock, handler = serve(Limits(write_timeout=0.5), size=4 * 1024 * 1024)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    windows = _frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1)) + _frame(8, 0, 0, struct.pack(">I", 2**31 - 65536))
    sock.sendall(_PREFACE + windows + b"".join(_call(sid) for sid in (1, 3, 5)))  # never read
    handler.join(timeout=10)  # the connection is over, its calls cancelled
    assert handler.dead and not server.connections and not server.calls


def test_a_call_and_a_connection_error_in_one_read(serve) -> None:
    """Found by scripts/fuzz.py (h2): a call and a connection error (DATA on stream 0) in one read —
    the call was started after the GOAWAY was queued and its answer went out behind it."""
    server, sock, handler = serve(Limits())
    sock.sendall(_PREFACE + _frame(4, 0, 0) + _call(1) + _frame(0, 0, 0, b"x"))
    frames = _read_frames(sock, until=-1)  # every frame, until the server closes
    assert frames[-1][0] == 7 and struct.unpack(">I", frames[-1][3][4:8])[0] == h2.PROTOCOL_ERROR, frames
    handler.join(timeout=10)
    assert handler.dead and handler.exception is None and not server.calls


def test_model_stream_infer_runs_a_bounded_number_of_requests_per_stream(serve, monkeypatch) -> None:
    monkeypatch.setattr(Call, "STREAM_REQUESTS", 4)
    server, sock, _ = serve(Limits())
    running, four, release = [], gevent.event.Event(), gevent.event.Event()

    def stream_infer(request: Any, *_: Any) -> Any:
        running.append(request)
        if len(running) == 4:
            four.set()
        release.wait()
        yield pb.ModelStreamInferResponse()

    server.servicer.stream_infer = stream_infer
    server.methods = method_table(server.servicer)
    message = h2.grpc_message(pb.ModelInferRequest(model_name="m").SerializeToString())
    fields = [(k, v.replace("ModelInfer", "ModelStreamInfer")) for k, v in _FIELDS]
    sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, hpack.Encoder().encode(fields))
                 + _frame(0, 0, 1, message * 10))
    _read_frames(sock, until=4, flags=1)  # our SETTINGS ACK: the frames were read
    assert four.wait(5)
    for _ in range(3):
        gevent.idle()  # the stream's reading loop had its chance to start more
    assert len(running) == 4
    conn = next(iter(server.connections))
    assert conn.h2.unconsumed == 5 * len(message)  # queued (the fifth waits for a slot, taken) count
    release.set()
    assert [t for t, f, _, _ in _read_frames(sock, until=0) if t == 0]


def _model_infer_only(server: GrpcH2Server) -> None:
    """The server's method table as a server without the response cache has it (the stub's is cached)."""
    server.servicer.caching = False
    server.methods = method_table(server.servicer)


def _status(frames: list) -> bytes | None:
    """grpc-status of the trailers among ``frames``."""
    decoder = hpack.Decoder()
    fields = [dict(decoder.decode(payload, raw=True)) for t, _, _, payload in frames if t == 1]
    return fields[-1].get(b"grpc-status") if fields else None


def test_a_request_whole_in_its_data_frame_is_parsed_as_it_came(serve, monkeypatch) -> None:
    """A ModelInfer message that is all of its call's one DATA frame (any client's small request) is taken
    as it came (a fast path, Call.on_data); the slow path splits it out of the call's buffer. Both hold
    its bytes of the request memory budget while the call runs, and give them back after."""
    server, sock, _ = serve(Limits())
    _model_infer_only(server)
    splits, held = [], []
    monkeypatch.setattr(h2, "split_messages", lambda buf, real=h2.split_messages: splits.append(len(buf)) or real(buf))
    stub_start, stub_infer = server.servicer.start_infer, server.servicer.ModelInfer
    server.servicer.start_infer = lambda req, *rest: held.append(server.budget.used) or stub_start(req, *rest)
    server.servicer.ModelInfer = lambda req: held.append(server.budget.used) or stub_infer(req)  # the slow path's
    server.methods = method_table(server.servicer)
    message = h2.grpc_message(pb.ModelInferRequest(model_name="m").SerializeToString())
    sock.sendall(_PREFACE + _frame(4, 0, 0) + _call(1))
    assert _status(_read_frames(sock, until=1, flags=1)) == b"0"
    assert splits == ([] if fastpath.enabled else [len(message)])
    assert held == [len(message)]
    assert server.wait_idle(5)
    assert server.budget.used == 0


def test_a_request_whole_in_its_data_frame_past_the_budget_is_refused(serve) -> None:
    """The request memory budget binds a message taken whole from its DATA frame as one gathered in
    the call's buffer: RESOURCE_EXHAUSTED, nothing of it held after."""
    server, sock, _ = serve(Limits())
    _model_infer_only(server)
    server.budget = ByteBudget(64)
    assert server.budget.try_reserve(60)  # another request holds most of it
    sock.sendall(_PREFACE + _frame(4, 0, 0) + _call(1))
    assert _status(_read_frames(sock, until=1, flags=1)) == b"8"
    assert server.wait_idle(5)
    assert server.budget.used == 60


def test_a_refused_call_holds_nothing_of_the_data_read_with_its_headers(serve) -> None:
    """A call refused at its headers (an unknown method: UNIMPLEMENTED) whose DATA came in the same read:
    the DATA reached the refused call, which reserved its bytes of the request memory budget and, being
    counted out already, never gave them back (each such call leaked its message's size)."""
    server, sock, _ = serve(Limits())
    fields = [(k, v.replace("ModelInfer", "Nope")) for k, v in _FIELDS]
    body = h2.grpc_message(pb.ModelInferRequest(model_name="m").SerializeToString())
    sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, hpack.Encoder().encode(fields)) + _frame(0, 1, 1, body))
    assert _status(_read_frames(sock, until=1, flags=1)) == b"12"
    assert server.budget.used == 0


def test_stub_servicer_is_not_cached_so_model_infer_takes_the_whole_message_path() -> None:
    """The benchmark's stub once answered ``caching`` through its catch-all ``__getattr__`` (a truthy
    lambda), so every server built on it ran ModelInfer as if the response cache were on."""
    servicer = StubServicer()
    assert servicer.caching is False
    infer = method_table(servicer)[b"/inference.GRPCInferenceService/ModelInfer"]
    assert infer.whole
    assert infer.again is not servicer.again_infer
    with pytest.raises(AttributeError):
        _ = servicer.not_an_rpc
