"""The HTTP, gRPC and metrics ports share one descriptor table (frontends/descriptors.py): connections
flooding all three must never run the process out of descriptors. Before, each port's cap left
headroom on its own, their sum did not: accept failed with EMFILE (a traceback per try) and no new
client got in. The server here runs with RLIMIT_NOFILE 256, so the limit is reached with few sockets."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .server import ROOT, ServerProcess
from .test_http_hardening import _descriptors, _infer_ok  # noqa: F401 - the fixture: room for our sockets

OPEN_FILES = 256
FLOOD = 300  # connections tried per port: more than its cap and than the process may hold


def _flood(port: int, data: bytes, socks: list[socket.socket]) -> int:
    """Up to FLOOD connections to ``port`` that each sent ``data`` and wait; stops at the first that
    is not accepted within two seconds (the listen queue is full; a loaded machine may be slow to accept). Returns how many connected."""
    n = 0
    for _ in range(FLOOD):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
        except OSError:
            break
        socks.append(sock)
        if data:
            sock.sendall(data)
        n += 1
    return n


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "model_repository" / "add_sub", tmp_path / "add_sub")
    return tmp_path


@pytest.fixture
def flooded(start_server: Callable[..., ServerProcess], repo: Path) -> Iterator[tuple[ServerProcess, list[socket.socket]]]:
    server = start_server(repo, open_files=OPEN_FILES)
    socks: list[socket.socket] = []
    try:
        _flood(server.grpc_port, b"", socks)  # no preface yet: a connection with no stream open
        _flood(server.metrics_port, b"GET /metrics HTTP/1.1\r\nHo", socks)
        _flood(server.port, b"GET /v2/health/live HTTP/1.1\r\nHo", socks)
        yield server, socks
    finally:
        for sock in socks:
            sock.close()


def test_connections_on_every_port_leave_room_for_a_new_client(flooded: tuple[ServerProcess, list[socket.socket]]) -> None:
    """gRPC, then metrics, then HTTP connections waiting for a request: a new HTTP client is still
    served (the longest-waiting connections, on any port, were closed to make room), and the
    descriptor limit was never reached (no accept error, no traceback)."""
    server, socks = flooded
    assert len(socks) > OPEN_FILES  # the flood was larger than the process's descriptor table
    _infer_ok(server)
    assert server.stderr.wait(lambda: "client connections open on all ports" in server.log(), 30)  # the drain said so
    log = server.log()
    assert "Traceback" not in log and "Too many open files" not in log, log[-3000:]


def test_grpc_serves_again_after_the_flood(flooded: tuple[ServerProcess, list[socket.socket]]) -> None:
    server, socks = flooded
    for sock in socks:
        sock.close()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        a = np.arange(4, dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
        for x in inputs:
            x.set_data_from_numpy(a)
        result = client.infer("add_sub", inputs, client_timeout=60)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)
    finally:
        client.close()
    assert "Traceback" not in server.log()
