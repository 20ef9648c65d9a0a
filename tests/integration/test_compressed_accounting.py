"""What a compressed gRPC message holds of the request memory budget, to the byte, with our HTTP/2
driver in process (frontends/grpc_h2.py, grpc_calls.py, compression.py) against a raw socket peer: the
inflated bytes are held while the request is served and all of them come back when it is answered,
refused or reset, also while its inflation is still on a thread."""

from __future__ import annotations

import gzip
import socket
import struct
from collections.abc import Iterator
from typing import Any

import gevent
import gevent.event
import hpack
import pytest

from scripts.bench_grpc_transport import StubServicer
from triton_actor.frontends import compression
from triton_actor.frontends.budget import ByteBudget
from triton_actor.frontends.grpc_h2 import GrpcH2Server
from triton_actor.protocol._generated import grpc_service_pb2 as pb

from .model_control import wait_for
from .test_grpc_transport import _PREFACE, _frame, _read_frames

MIB = 1 << 20
BUDGET = 32 * MIB


def _message(size: int) -> bytes:
    """A gzip-compressed ModelInferRequest of ``size`` bytes of raw contents, with its gRPC prefix."""
    body = gzip.compress(pb.ModelInferRequest(model_name="m", raw_input_contents=[bytes(size)]).SerializeToString(), 1)
    return struct.pack(">BI", 1, len(body)) + body


def _head(sid: int, method: str = "ModelInfer") -> bytes:
    return _frame(1, 4, sid, hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":authority", "x"),
        (":path", f"/inference.GRPCInferenceService/{method}"), ("content-type", "application/grpc"),
        ("grpc-encoding", "gzip")]))


def _data(sid: int, message: bytes, end_stream: bool = True) -> bytes:
    chunks = [message[i:i + 16384] for i in range(0, len(message), 16384)]
    return b"".join(_frame(0, int(end_stream and i == len(chunks) - 1), sid, c) for i, c in enumerate(chunks))


@pytest.fixture
def served() -> Iterator[tuple[GrpcH2Server, socket.socket, list[Any]]]:
    servicer = StubServicer()
    seen: list[Any] = []  # the requests the servicer got (unary and stream)
    servicer.ModelInfer = lambda request: seen.append(request) or servicer.response  # type: ignore[method-assign]

    def stream_infer(request: Any, *_: Any) -> Iterator[pb.ModelStreamInferResponse]:
        seen.append(request)
        yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(model_name="m"))

    servicer.stream_infer = stream_infer  # type: ignore[method-assign]
    server = GrpcH2Server(servicer, "127.0.0.1", 0, budget=ByteBudget(BUDGET))
    listener = socket.create_server(("127.0.0.1", 0))
    theirs = socket.create_connection(listener.getsockname())
    ours, _ = listener.accept()
    listener.close()
    greenlet = gevent.spawn(server._handle, ours, None)
    theirs.sendall(_PREFACE + _frame(4, 0, 0))
    yield server, theirs, seen
    theirs.close()
    greenlet.kill()


def _trailers(sock: socket.socket) -> list[tuple[str, str]]:
    frames = _read_frames(sock, until=1, flags=1, timeout=30)
    return hpack.Decoder().decode([p for t, f, _, p in frames if t == 1 and f & 1][-1])


def test_a_unary_message_holds_what_it_inflated_until_answered(served) -> None:
    server, sock, seen = served
    sock.sendall(_head(1) + _data(1, _message(8 * MIB)))
    assert ("grpc-status", "0") in _trailers(sock)
    assert len(seen[0].raw_input_contents[0]) == 8 * MIB
    wait_for(lambda: server.budget.used == 0, what="the budget to be given back")


def test_a_bomb_is_refused_at_the_budget_and_gives_it_back(served) -> None:
    server, sock, seen = served
    sock.sendall(_head(1) + _data(1, _message(64 * MIB)))
    trailers = dict(_trailers(sock))
    assert trailers["grpc-status"] == "8" and f"request memory budget {BUDGET}" in trailers["grpc-message"]
    assert not seen
    wait_for(lambda: server.budget.used == 0, what="the budget to be given back")


def test_a_call_reset_while_its_inflation_runs_on_a_thread_gives_the_budget_back_once(served, monkeypatch) -> None:
    """The call is reset while a slice runs on a thread: the call gives back all it held at once, and
    its inflation, stopped after the slice, gives back nothing more (no double release)."""
    server, sock, seen = served
    on_thread, go_on = gevent.event.Event(), gevent.event.Event()
    real = compression.call_in_thread

    waiting: list[gevent.Greenlet] = []

    def gated(fn: Any, *args: Any) -> Any:
        waiting.append(gevent.getcurrent())
        on_thread.set()
        go_on.wait(30)
        return real(fn, *args)

    monkeypatch.setattr(compression, "call_in_thread", gated)
    sock.sendall(_head(1) + _data(1, _message(16 * MIB)))
    assert on_thread.wait(30)
    assert server.budget.used > compression.ON_HUB  # the first slices are held
    sock.sendall(_frame(3, 0, 1, struct.pack(">I", 8)))  # RST_STREAM(CANCEL)
    wait_for(lambda: server.calls == 0, what="the call to end")
    assert server.budget.used == 0
    waiting[0].join(10)  # the call's greenlet, killed where it waited for the thread
    assert waiting[0].dead and server.budget.used == 0 and not seen  # its inflation gave back nothing more
    go_on.set()


def test_a_stream_message_holds_what_it_inflated_until_answered(served) -> None:
    """Messages of 8 MiB inflated, one after another on one stream (32 MiB budget): each is given back
    once answered (else the fifth would not fit); a bomb is answered with the budget's error message and
    the stream goes on."""
    server, sock, seen = served
    sock.sendall(_head(1, "ModelStreamInfer"))
    for i in range(6):
        sock.sendall(_data(1, _message(8 * MIB), end_stream=False))
        frames = _read_frames(sock, until=0, timeout=30)
        response = pb.ModelStreamInferResponse.FromString(b"".join(p for t, _, _, p in frames if t == 0)[5:])
        assert not response.error_message and len(seen) == i + 1
    sock.sendall(_data(1, _message(64 * MIB), end_stream=False))
    frames = _read_frames(sock, until=0, timeout=30)
    response = pb.ModelStreamInferResponse.FromString(b"".join(p for t, _, _, p in frames if t == 0)[5:])
    assert f"request memory budget {BUDGET}" in response.error_message and len(seen) == 6
    sock.sendall(_data(1, _message(MIB), end_stream=True))
    assert ("grpc-status", "0") in _trailers(sock)
    assert len(seen) == 7
    wait_for(lambda: server.budget.used == 0, what="the budget to be given back")
