"""Mutated /infer requests on raw HTTP/1.1 connections (seeded): whatever the bytes, each gets an
answer with a status line or a closed connection, the server keeps serving, and logs no traceback.
Valid requests are interleaved so the parsed-head and request-plan caches are hit with bodies that
do and do not fit them."""

from __future__ import annotations

import random
import socket

import numpy as np
import orjson

from .server import ServerProcess


def _request(header: bytes, body: bytes, header_length: int | None, extra: bytes = b"") -> bytes:
    head = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n" % \
        len(header + body)
    if header_length is not None:
        head += b"Inference-Header-Content-Length: %d\r\n" % header_length
    return head + extra + b"\r\n" + header + body


def _valid() -> tuple[bytes, bytes]:
    header = orjson.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    return header, np.arange(4, dtype=np.float32).tobytes() * 2


def _exchange(example_server: ServerProcess, data: bytes, half_close: bool = False) -> bytes:
    """Send ``data`` and read until the server closes (its requests say ``Connection: close``). A client
    that half-closes (``half_close``) has left, as nginx sees it: a request still waiting is cancelled."""
    host, port = example_server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:
            pass
    return out


def test_mutated_infer_requests(example_server: ServerProcess) -> None:
    rng = random.Random(4321)
    log_before = len(example_server.log())
    header, body = _valid()
    for i in range(300):
        h, b, hl = bytearray(header), bytearray(body), len(header)
        kind = i % 6
        if kind == 1:  # flip bytes in the JSON header
            for _ in range(rng.randint(1, 4)):
                h[rng.randrange(len(h))] = rng.randrange(256)
        elif kind == 2:  # a body that does not fit the (cached) plan
            b = b[: rng.randrange(len(b))] if rng.random() < 0.5 else b + rng.randbytes(rng.randint(1, 8))
        elif kind == 3:  # a wrong header length
            hl = rng.choice([0, 1, len(header) - 1, len(header) + 1, len(header) + len(body) + 5])
        elif kind == 4:  # random bytes for a header
            h = bytearray(rng.randbytes(rng.randint(0, 60)))
            hl = len(h)
        elif kind == 5:  # truncated on the wire
            raw = _request(bytes(h), bytes(b), hl)
            _exchange(example_server, raw[: rng.randrange(len(raw))], half_close=True)
            continue
        answer = _exchange(example_server, _request(bytes(h), bytes(b), hl))
        assert answer.startswith(b"HTTP/1.1 ") or answer == b"", answer[:200]
        if kind == 0:
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
            assert answer.endswith(np.array([0, 2, 4, 6], np.float32).tobytes())
    assert b"HTTP/1.1 200 " in _exchange(example_server, _request(header, body, len(header)))
    assert "Traceback" not in example_server.log()[log_before:]
