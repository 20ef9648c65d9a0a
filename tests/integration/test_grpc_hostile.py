"""Hostile HTTP/2 clients on the gRPC port (docs/security.md#grpc): rapid reset, SETTINGS floods, streams past
MAX_CONCURRENT_STREAMS, half-sent prefaces against the connection cap; and TLS (Triton's
``--grpc-use-ssl*`` flags). Each attacker is a raw socket; each test ends with a real tritonclient
call that must succeed quickly."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import gevent
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from .server import ROOT, ServerProcess
from .test_grpc_transport import _PREFACE, _connect, _frame, _read_frames

_BLOCK_FIELDS = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                 (":path", "/inference.GRPCInferenceService/ModelInfer"), ("content-type", "application/grpc")]


def _quick_infer(url: str, within: float = 10.0, **ssl_args: str | bool) -> None:
    """A real tritonclient call answers, and fast."""
    started = time.monotonic()
    client = grpcclient.InferenceServerClient(url, **ssl_args)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [4], "FP32")
        i.set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs.append(i)
    result = client.infer("add_sub", inputs, client_timeout=within)
    client.close()
    assert result.as_numpy("OUTPUT0").tolist() == [0, 2, 4, 6]
    assert time.monotonic() - started < within


def _goaway_code(frames: list[tuple[int, int, int, bytes]]) -> int:
    assert frames and frames[-1][0] == 7, [f[:3] for f in frames[-5:]]
    return struct.unpack(">I", frames[-1][3][4:8])[0]


def test_rapid_reset_is_told_to_calm_down(example_server: ServerProcess) -> None:
    """CVE-2023-44487: HEADERS + RST_STREAM in a loop. The connection gets GOAWAY(ENHANCE_YOUR_CALM)
    after a bounded number of resets; other clients are served meanwhile."""
    enc = hpack.Encoder()
    attack = b"".join(_frame(1, 4, sid, enc.encode(_BLOCK_FIELDS)) + _frame(3, 0, sid, b"\0\0\0\x08")
                      for sid in range(1, 4001, 2))
    with _connect(example_server) as sock:
        sender = gevent.spawn(sock.sendall, _PREFACE + _frame(4, 0, 0) + attack)
        _quick_infer(example_server.grpc_url)
        frames = _read_frames(sock, until=7, timeout=30)
        sender.kill()
    assert _goaway_code(frames) == 0xB
    assert struct.unpack(">I", frames[-1][3][:4])[0] < 4000  # the last stream it took: it stopped early
    _quick_infer(example_server.grpc_url)


def test_settings_flood_with_open_streams_is_told_to_calm_down(example_server: ServerProcess) -> None:
    """128 open streams, then SETTINGS frames changing INITIAL_WINDOW_SIZE: bounded work per frame,
    bounded frames; the flood ends with GOAWAY(ENHANCE_YOUR_CALM)."""
    enc = hpack.Encoder()
    streams = b"".join(_frame(1, 4, sid, enc.encode(_BLOCK_FIELDS)) for sid in range(1, 257, 2))
    flood = b"".join(_frame(4, 0, 0, struct.pack(">HI", 4, 65535 + i % 2)) for i in range(20000))
    with _connect(example_server) as sock:
        sender = gevent.spawn(sock.sendall, _PREFACE + _frame(4, 0, 0) + streams + flood)
        _quick_infer(example_server.grpc_url)
        frames = _read_frames(sock, until=7, timeout=30)
        sender.kill()
    assert _goaway_code(frames) == 0xB
    assert sum(1 for f in frames if f[0] == 4 and f[1] == 1) < 2000  # ACKs stopped with the budget
    _quick_infer(example_server.grpc_url)


def test_max_concurrent_streams_is_advertised_and_enforced(example_server: ServerProcess) -> None:
    enc = hpack.Encoder()
    streams = b"".join(_frame(1, 4, sid, enc.encode(_BLOCK_FIELDS)) for sid in range(1, 260, 2))  # 130
    with _connect(example_server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0) + streams)
        frames = _read_frames(sock, until=3)
        ours = frames[0][3]
        advertised = dict(struct.unpack(">HI", ours[i:i + 6]) for i in range(0, len(ours), 6))
        assert advertised[3] == 128
        refused = [(sid, struct.unpack(">I", p)[0]) for t, _, sid, p in frames if t == 3]
        assert refused[0] == (257, 0x7)  # the 129th stream: REFUSED_STREAM
    _quick_infer(example_server.grpc_url)


def test_half_sent_prefaces_time_out_under_the_connection_cap(start_server) -> None:
    """More silent and half-sent connections than the cap: they are dropped after the header
    timeout, and a real client gets its turn."""
    server = start_server(ROOT / "model_repository",
                          flags=("--grpc-header-timeout-secs", "1", "--grpc-max-connections", "8"))
    socks = [_connect(server) for _ in range(20)]
    try:
        for i, sock in enumerate(socks):
            if i % 2:
                sock.sendall(_PREFACE[:10])
        _quick_infer(server.grpc_url, within=15)
        started = time.monotonic()
        for sock in socks[:8]:
            sock.settimeout(10)
            while sock.recv(65536):  # our SETTINGS, maybe a GOAWAY, then the close
                pass
        assert time.monotonic() - started < 10
    finally:
        for sock in socks:
            sock.close()
    _quick_infer(server.grpc_url)


# -- TLS --------------------------------------------------------------------------------------------
def test_tls(pki: Path, start_server) -> None:
    server = start_server(ROOT / "model_repository", flags=(
        "--grpc-use-ssl=true", "--grpc-server-cert", str(pki / "server.pem"), "--grpc-server-key", str(pki / "server.key")))
    _quick_infer(f"localhost:{server.grpc_port}", ssl=True, root_certificates=str(pki / "ca.pem"))
    with pytest.raises(Exception):  # noqa: B017 - plaintext against TLS: whatever grpc raises
        _quick_infer(server.grpc_url, within=5)


def test_mutual_tls(pki: Path, start_server) -> None:
    server = start_server(ROOT / "model_repository", flags=(
        "--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(pki / "server.pem"),
        "--grpc-server-key", str(pki / "server.key"), "--grpc-root-cert", str(pki / "ca.pem")))
    url = f"localhost:{server.grpc_port}"
    _quick_infer(url, ssl=True, root_certificates=str(pki / "ca.pem"), private_key=str(pki / "client.key"),
                 certificate_chain=str(pki / "client.pem"))
    with pytest.raises(Exception):  # noqa: B017 - no client certificate: the handshake fails
        _quick_infer(url, within=5, ssl=True, root_certificates=str(pki / "ca.pem"))


def test_tls_handshake_has_one_deadline_not_one_per_read(pki: Path, start_server) -> None:
    """A ClientHello dripped a byte at a time (each read well within the timeout) is dropped when
    the whole handshake has taken the header timeout."""
    server = start_server(ROOT / "model_repository", flags=(
        "--grpc-use-ssl=true", "--grpc-server-cert", str(pki / "server.pem"), "--grpc-server-key", str(pki / "server.key"),
        "--grpc-header-timeout-secs", "1"))
    started = time.monotonic()
    with _connect(server) as sock:
        sock.settimeout(0.4)
        hello = b"\x16\x03\x01\x02\x00" + b"\x01" * 512  # a record header announcing 512 bytes, dripped
        closed = False
        for byte in hello:
            if closed or time.monotonic() - started > 6:
                break
            try:
                sock.send(bytes([byte]))
                closed = sock.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                closed = True
    assert closed and time.monotonic() - started < 4


@pytest.mark.parametrize("alpn", [["http/1.1"], None], ids=["http1-only", "no-alpn"])
def test_tls_without_alpn_h2_is_refused(pki: Path, start_server, alpn: list[str] | None) -> None:
    """A TLS client that does not agree on ALPN h2 is closed after the handshake (grpc-go's and grpc-core's
    rule); one that offers h2 gets our SETTINGS."""
    import ssl

    server = start_server(ROOT / "model_repository", flags=(
        "--grpc-use-ssl=true", "--grpc-server-cert", str(pki / "server.pem"), "--grpc-server-key", str(pki / "server.key")))

    def first_bytes(protocols: list[str] | None) -> bytes:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        if protocols:
            context.set_alpn_protocols(protocols)
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as sock:
            try:
                sock.sendall(_PREFACE + _frame(4, 0, 0))
                return sock.recv(9)
            except OSError:
                return b""

    assert first_bytes(alpn) == b""
    assert first_bytes(["h2"])[3] == 4  # a SETTINGS frame
    _quick_infer(f"localhost:{server.grpc_port}", ssl=True, root_certificates=str(pki / "ca.pem"))


@pytest.mark.parametrize("extra", [[("Content-Type", "application/grpc")], [("connection", "keep-alive")],
                                   [("te", "gzip")]], ids=["uppercase", "connection", "te"])
def test_malformed_header_blocks_are_reset(example_server: ServerProcess, extra: list) -> None:
    """RFC 9113 §8.2: uppercase names and connection-specific fields make a request malformed: RST_STREAM
    PROTOCOL_ERROR (as grpc-go), and the connection serves the next stream."""
    enc = hpack.Encoder()
    good = _BLOCK_FIELDS[:3] + [(":path", "/inference.GRPCInferenceService/ServerLive"), _BLOCK_FIELDS[4]]
    with _connect(example_server) as sock:
        sock.sendall(_PREFACE + _frame(4, 0, 0) + _frame(1, 4, 1, enc.encode(good + extra))
                     + _frame(0, 1, 1, b"\0\0\0\0\0"))
        frames = _read_frames(sock, until=3)
        assert [(sid, struct.unpack(">I", p)[0]) for t, _, sid, p in frames if t == 3] == [(1, 0x1)]
        sock.sendall(_frame(1, 4, 3, enc.encode(good)) + _frame(0, 1, 3, b"\0\0\0\0\0"))
        frames = _read_frames(sock, until=1, flags=1)  # the trailers of stream 3: answered
        assert any(t == 1 and sid == 3 for t, _, sid, _ in frames)
    _quick_infer(example_server.grpc_url)


def _identity_message() -> bytes:
    request = service_pb2.ModelInferRequest(model_name="identity_batch")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones(4, dtype=np.float32).tobytes())
    body = request.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body


def _answered(frames: list[tuple[int, int, int, bytes]], sid: int) -> bool:
    return any(t == 1 and f & 1 and s == sid for t, f, s, _ in frames)


def test_a_call_reset_in_the_read_that_completes_it(start_server) -> None:
    """HEADERS + DATA(END_STREAM) + RST_STREAM in one read, once the model is warm (it runs inline and
    answers in the reader): the answer went to a stream the same read had closed, StreamClosedError
    escaped the connection's reader, the connection died without GOAWAY (a call beside it was never
    answered), the call was never counted finished (SIGTERM then waited the whole exit timeout), and
    each such connection logged a traceback. Now the reset call is just over; the connection serves on."""
    server = start_server(ROOT / "model_repository")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    for _ in range(300):  # warm: a quick model is promoted to run inline
        client.infer("identity_batch", [x])
    client.close()
    enc = hpack.Encoder()
    message = _identity_message()
    call = [*_BLOCK_FIELDS, ("te", "trailers")]
    with socket.create_connection(tuple(server.grpc_url.rsplit(":", 1)), timeout=10) as sock:  # type: ignore[arg-type]
        sock.sendall(_PREFACE + _frame(4, 0, 0)
                     + _frame(1, 4, 1, enc.encode(call)) + _frame(0, 1, 1, message)
                     + _frame(1, 4, 3, enc.encode(call)) + _frame(0, 1, 3, message) + _frame(3, 0, 3, b"\0\0\0\x08"))
        frames = _read_frames(sock, until=1, flags=1)
        assert _answered(frames, 1), [f[:3] for f in frames]
        sock.sendall(_frame(1, 4, 5, enc.encode(call)) + _frame(0, 1, 5, message))
        frames = _read_frames(sock, until=1, flags=1)
        assert _answered(frames, 5), [f[:3] for f in frames]  # before: the connection was closed
        not_grpc = [(k, "text/plain" if k == "content-type" else v) for k, v in call]
        sock.sendall(_frame(1, 5, 7, enc.encode(not_grpc)) + _frame(3, 0, 7, b"\0\0\0\x08")  # the same for a
                     + _frame(1, 4, 9, enc.encode(call)) + _frame(0, 1, 9, message))  # request refused at once
        frames = _read_frames(sock, until=1, flags=1)
        assert _answered(frames, 9), [f[:3] for f in frames]
    _quick_infer(server.grpc_url)
    assert "Traceback" not in server.log()
