"""Our HTTP/2 gRPC transport (frontends/grpc_h2.py) under clients that stray from the common path:
compression, unknown methods, size limits, concurrency on one connection, raw HTTP/2 misbehaviour.
Every case ends with the server still answering."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import gevent
import gevent.event
import grpc
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from scripts.bench_hostile import grpc_gzip_bomb

from .server import ROOT, ServerProcess


@pytest.fixture
def channel(example_server: ServerProcess) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(example_server.grpc_url, options=[("grpc.max_receive_message_length", -1)])
    yield ch
    ch.close()


def _add_sub(n: int = 4) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="FP32", shape=[4])
        req.raw_input_contents.append(np.arange(n, dtype=np.float32).tobytes())
    return req


def _still_serving(example_server: ServerProcess) -> None:
    with grpc.insecure_channel(example_server.grpc_url) as ch:
        resp = pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(_add_sub(), timeout=30)
    assert np.frombuffer(resp.raw_output_contents[0], np.float32).tolist() == [0, 2, 4, 6]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(example_server: ServerProcess, algorithm: str) -> None:
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(np.full(4, 3, dtype=np.float32))
        inputs.append(i)
    result = client.infer("add_sub", inputs, compression_algorithm=algorithm)
    assert result.as_numpy("OUTPUT0").tolist() == [6, 6, 6, 6]
    client.close()


def test_a_big_compressed_message_does_not_hold_its_connections_other_calls(example_server: ServerProcess) -> None:
    """A compressed ModelInfer is inflated in its call's greenlet, not in the connection's reader (the
    fast path): there, the slices of a 512 MiB one held a small call sent after it on the same connection
    until its end (2.3 s). Now the small call is answered first."""
    big, small = grpc_gzip_bomb("add_sub", 256 * 1024 * 1024), _add_sub().SerializeToString()  # refused once decoded
    encoder = hpack.Encoder()

    def head(*extra: tuple[str, str]) -> bytes:
        return encoder.encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                               (":path", "/inference.GRPCInferenceService/ModelInfer"),
                               ("content-type", "application/grpc"), ("te", "trailers"), *extra])

    out = _PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, head(("grpc-encoding", "gzip")))
    out += b"".join(_frame(0, 0, 1, big[i:i + 16384]) for i in range(0, len(big), 16384)) + _frame(0, 1, 1)
    out += _frame(1, 4, 3, head()) + _frame(0, 1, 3, struct.pack(">BI", 0, len(small)) + small)
    with _connect(example_server) as sock:
        sock.sendall(out)
        sock.settimeout(60)
        buf, ends = b"", []  # the streams in the order their trailers came
        while len(ends) < 2:
            chunk = sock.recv(65536)
            assert chunk, "the connection closed"
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + (struct.unpack_from(">I", buf)[0] >> 8):
                length_type, flags, sid = struct.unpack_from(">IBI", buf)
                if length_type & 0xFF == 1 and flags & 1:
                    ends.append(sid)
                buf = buf[9 + (length_type >> 8):]
    assert ends == [3, 1]
    _still_serving(example_server)


def test_unknown_method_is_unimplemented(channel: grpc.Channel, example_server: ServerProcess) -> None:
    call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc")
    with pytest.raises(grpc.RpcError) as e:
        call(b"", timeout=30)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "NoSuchRpc" in e.value.details()
    _still_serving(example_server)


def test_two_messages_on_a_unary_call(channel: grpc.Channel, example_server: ServerProcess) -> None:
    # a stream-stream call on a unary method path: two messages where one is expected
    call = channel.stream_stream("/inference.GRPCInferenceService/ModelInfer",
                                 request_serializer=pb.ModelInferRequest.SerializeToString)
    with pytest.raises(grpc.RpcError) as e:
        list(call(iter([_add_sub(), _add_sub()]), timeout=30))
    assert e.value.code() == grpc.StatusCode.INTERNAL
    _still_serving(example_server)


def test_many_concurrent_calls_on_one_connection(channel: grpc.Channel) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    futures = [stub.ModelInfer.future(_add_sub()) for _ in range(200)]
    answers = {np.frombuffer(f.result(timeout=60).raw_output_contents[1], np.float32).tolist().__str__()
               for f in futures}
    assert answers == {"[0.0, 0.0, 0.0, 0.0]"}


def test_large_messages_both_ways_beyond_the_windows(channel: grpc.Channel) -> None:
    """40 MB in and out on one call, twice concurrently: more than our stream window (16 MiB) and
    the client's, so both directions wait on WINDOW_UPDATE."""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    n = 10 * 1024 * 1024
    req = pb.ModelInferRequest(model_name="identity_batch")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, n])
    req.raw_input_contents.append(np.arange(n, dtype=np.float32).tobytes())
    futures = [stub.ModelInfer.future(req, timeout=120) for _ in range(2)]
    for f in futures:
        out = np.frombuffer(f.result().raw_output_contents[0], np.float32)
        assert out.shape == (n,) and out[-1] == n - 1


# -- raw HTTP/2 ----------------------------------------------------------------------------------
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload


def _read_frames(sock: socket.socket, until: int, flags: int = 0, timeout: float = 10,
                 also: int | None = None) -> list[tuple[int, int, int, bytes]]:
    """Frames until one of type ``until`` (with ``flags`` set) arrived, and one of type ``also`` if
    given, or until the peer closes."""
    sock.settimeout(timeout)
    buf, frames = b"", []

    def done() -> bool:
        return any(t == until and f & flags == flags for t, f, _, _ in frames) and \
            (also is None or any(t == also for t, _, _, _ in frames))

    while True:
        while len(buf) >= 9:
            lt, frame_flags, sid = struct.unpack_from(">IBI", buf)
            if len(buf) < 9 + (lt >> 8):
                break
            frames.append((lt & 0xFF, frame_flags, sid, buf[9:9 + (lt >> 8)]))
            buf = buf[9 + (lt >> 8):]
        if done():
            return frames
        chunk = sock.recv(65536)
        if not chunk:
            return frames
        buf += chunk


def _connect(example_server: ServerProcess) -> socket.socket:
    host, port = example_server.grpc_url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def test_raw_unary_call_and_ping(example_server: ServerProcess) -> None:
    """A hand-made client: headers split over HEADERS + CONTINUATION, padded DATA, a PING."""
    with _connect(example_server) as sock:
        block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                        (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                        ("content-type", "application/grpc"), ("te", "trailers")])
        body = _add_sub().SerializeToString()
        message = struct.pack(">BI", 0, len(body)) + body
        padded = bytes([3]) + message + b"\0\0\0"
        sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 0, 1, block[:5]) + _frame(9, 4, 1, block[5:])
                     + _frame(0, 0x1 | 0x8, 1, padded) + _frame(6, 0, 0, b"12345678"))
        frames = _read_frames(sock, until=1, flags=1, also=6)  # the trailers (HEADERS, END_STREAM), a PING
        assert (6, 1, 0, b"12345678") in frames  # PING ACK with our payload
        data = b"".join(p for t, _, sid, p in frames if t == 0 and sid == 1)
        resp = pb.ModelInferResponse.FromString(data[5:])
        assert np.frombuffer(resp.raw_output_contents[0], np.float32).tolist() == [0, 2, 4, 6]
        decoder = hpack.Decoder()
        head, trailers = (decoder.decode(p) for t, _, sid, p in frames if t == 1 and sid == 1)
        assert ("content-type", "application/grpc") in head and ("grpc-status", "0") in trailers
    _still_serving(example_server)


def test_http1_on_the_grpc_port_is_hung_up(example_server: ServerProcess) -> None:
    with _connect(example_server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        frames = _read_frames(sock, until=7)  # our SETTINGS went out first; then the close
        assert [f[0] for f in frames] == [4, 8]
    _still_serving(example_server)


@pytest.mark.parametrize(("junk", "code"), [
    (_PREFACE + b"\xff" * 64, 0x6),  # a frame longer than any we accept: FRAME_SIZE_ERROR
    (_PREFACE + _frame(1, 4, 2, b"\x82"), 0x1),  # HEADERS on an even stream id: PROTOCOL_ERROR
    (_PREFACE + _frame(1, 4, 1, b"\xff\xff\xff\xff"), 0x9),  # undecodable header block: COMPRESSION_ERROR
    (_PREFACE + _frame(0, 1, 9, b"x"), 0x1),  # DATA on a stream never opened
    (_PREFACE + _frame(4, 0, 0, b"\0\4\xff\xff\xff\xff"), 0x3),  # INITIAL_WINDOW_SIZE past 2^31-1
    (_PREFACE + _frame(1, 0, 1, b"\x82") + _frame(6, 0, 0, b"\0" * 8), 0x1),  # PING while CONTINUATION is owed
    (_PREFACE + _frame(1, 0, 1, b"\x82") + _frame(9, 0, 1) * 100, 0xB),  # endless empty CONTINUATION frames
    (_PREFACE + _frame(8, 0, 0, b"\0\0\0\0"), 0x1),  # WINDOW_UPDATE of 0
])
def test_protocol_errors_close_the_connection_only(example_server: ServerProcess, junk: bytes, code: int) -> None:
    with _connect(example_server) as sock:
        sock.sendall(junk)
        frames = _read_frames(sock, until=7)
        assert frames[-1][0] == 7, frames  # GOAWAY, with the error code the violation calls for
        assert struct.unpack(">I", frames[-1][3][4:8])[0] == code
    _still_serving(example_server)


def test_client_gone_mid_call_and_many_connections(start_server) -> None:
    """Connections that open a call and vanish, 50 at once: the server keeps serving, and nothing
    is left counted as running (the shutdown does not wait out its exit timeout)."""
    server = start_server(ROOT / "model_repository", flags=("--exit-timeout-secs", "120"))
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                    ("content-type", "application/grpc")])

    def rude() -> None:
        with _connect(server) as sock:
            sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, block) + _frame(0, 0, 1, b"\0\0\0\0\x10"))

    gevent.joinall([gevent.spawn(rude) for _ in range(50)], timeout=60, raise_error=True)
    _still_serving(server)
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 60


def test_keepalive_ping_unanswered_closes_the_connection(tmp_path, start_server) -> None:
    server = start_server(ROOT / "model_repository", flags=(
        "--grpc-keepalive-time=300", "--grpc-keepalive-timeout=300", "--grpc-keepalive-permit-without-calls=true"))
    with _connect(server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0))
        frames = _read_frames(sock, until=6)  # our keepalive PING
        assert frames[-1][:2] == (6, 0)
        assert _read_frames(sock, until=-1, timeout=10) == []  # not answered: closed, nothing else sent
    _still_serving(server)


def test_too_many_pings_without_data(example_server: ServerProcess) -> None:
    with _connect(example_server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0) + b"".join(_frame(6, 0, 0, b"%08d" % i) for i in range(4)))
        frames = _read_frames(sock, until=7)
        assert [f[3] for f in frames if f[0] == 6] == [b"00000000", b"00000001", b"00000002"]
        code, debug = struct.unpack(">I", frames[-1][3][4:8])[0], frames[-1][3][8:]
        assert (code, debug) == (0xB, b"too_many_pings")  # ENHANCE_YOUR_CALM, as grpc
    _still_serving(example_server)


def test_a_stream_opened_in_the_read_that_ends_the_connection_does_not_hold_shutdown(start_server) -> None:
    """Ping strikes end the connection mid-read; a streaming call opened by the next frame of the
    same read must not stay counted as running (SIGTERM would then wait the whole exit timeout)."""
    server = start_server(ROOT / "model_repository", flags=("--exit-timeout-secs", "120"))
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
                                    ("content-type", "application/grpc")])
    with _connect(server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0) + b"".join(_frame(6, 0, 0, b"%08d" % i) for i in range(4))
                     + _frame(1, 4, 1, block))
        assert _read_frames(sock, until=7)[-1][0] == 7
    _still_serving(server)
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 60


def test_not_grpc_content_type_gets_415(example_server: ServerProcess) -> None:
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                    ("content-type", "text/plain")])
    with _connect(example_server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, block))
        frames = _read_frames(sock, until=3)  # the answer, then RST_STREAM (the request was still open)
        head = next(p for t, _, sid, p in frames if t == 1 and sid == 1)
        assert (":status", "415") in hpack.Decoder().decode(head)
    _still_serving(example_server)


UNTIL_CANCELLED_PY = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
            deadline = time.monotonic() + 300
            while not sender.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.02)  # model code polling is_cancelled()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def test_a_cancelled_stream_cancels_a_model_waiting_to_answer(tmp_path, start_server) -> None:
    """The model answers once, then waits until it is cancelled: the client cancelling the stream
    must reach it at once (not at its next response), so the server can then stop promptly."""
    from .server import IDENTITY_CONFIG, add_model

    add_model(tmp_path, "waits", IDENTITY_CONFIG + "\nmodel_transaction_policy { decoupled: true }\n",
              UNTIL_CANCELLED_PY)
    server = start_server(tmp_path, flags=("--exit-timeout-secs", "200"))
    hold = gevent.event.Event()

    def requests():
        req = pb.ModelInferRequest(model_name="waits")
        req.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        req.raw_input_contents.append(np.ones(1, np.float32).tobytes())
        yield req
        hold.wait(120)  # the client keeps its side open

    with grpc.insecure_channel(server.grpc_url) as ch:
        call = pb_grpc.GRPCInferenceServiceStub(ch).ModelStreamInfer(requests())
        first = next(call)
        assert np.frombuffer(first.infer_response.raw_output_contents[0], np.float32).tolist() == [1.0]
        call.cancel()
    hold.set()
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 60, "a cancelled stream kept the model (and the shutdown) waiting"


def test_a_streams_grpc_timeout_ends_it_and_cancels_its_model(tmp_path, start_server) -> None:
    """A hand-made client's ``grpc-timeout`` on ModelStreamInfer: at the deadline the stream ends
    DEADLINE_EXCEEDED after the responses already sent, and the model waiting to answer is cancelled
    (so the server stops at once)."""
    from .server import IDENTITY_CONFIG, add_model

    add_model(tmp_path, "waits", IDENTITY_CONFIG + "\nmodel_transaction_policy { decoupled: true }\n",
              UNTIL_CANCELLED_PY)
    server = start_server(tmp_path, flags=("--exit-timeout-secs", "200"))
    req = pb.ModelInferRequest(model_name="waits")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    req.raw_input_contents.append(np.ones(1, np.float32).tobytes())
    message = req.SerializeToString()
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                    (":path", "/inference.GRPCInferenceService/ModelStreamInfer"),
                                    ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "1S")])
    with _connect(server) as sock:  # the client's side stays open: only the deadline ends the call
        sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, block)
                     + _frame(0, 0, 1, b"\0" + len(message).to_bytes(4, "big") + message))
        frames = _read_frames(sock, until=1, flags=1, timeout=30)
    data = b"".join(p for t, _, sid, p in frames if t == 0 and sid == 1)
    response = pb.ModelStreamInferResponse.FromString(data[5:])
    assert np.frombuffer(response.infer_response.raw_output_contents[0], np.float32).tolist() == [1.0]
    trailers = dict(hpack.Decoder().decode(next(p for t, f, sid, p in frames[::-1] if t == 1 and f & 1)))
    assert trailers["grpc-status"] == "4", trailers
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 60, "the stream's deadline did not cancel the model"


def test_random_frames_never_take_the_server_down(example_server: ServerProcess) -> None:
    """200 connections of well-formed frame heads with random types, flags, streams and payloads
    (seeded): each may be answered or closed; the server keeps serving."""
    import random

    rng = random.Random(1234)
    log_before = len(example_server.log())
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                                    ("content-type", "application/grpc")])
    for _ in range(200):
        frames = [_frame(4, 0, 0)]
        for _ in range(rng.randint(1, 12)):
            ftype = rng.choice([0, 1, 2, 3, 4, 6, 7, 8, 9, 0x0A])
            payload = block if ftype == 1 and rng.random() < 0.5 else rng.randbytes(rng.choice([0, 1, 4, 5, 8, 9, 40]))
            frames.append(_frame(ftype, rng.choice([0, 1, 4, 5, 8, 0x20, 0x2D]), rng.choice([0, 1, 2, 3, 5, 2**31 - 1]),
                                 payload))
        with _connect(example_server) as sock:
            sock.sendall(_PREFACE + b"".join(frames))
            sock.settimeout(0.2)
            try:
                while sock.recv(65536):
                    pass
            except OSError:
                pass  # still open and quiet, or reset: both fine
    _still_serving(example_server)
    assert "Traceback" not in example_server.log()[log_before:]  # every case was an expected path
