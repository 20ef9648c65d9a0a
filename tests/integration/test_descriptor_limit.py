"""The HTTP, gRPC and metrics ports share one descriptor table (frontends/descriptors.py): connections
flooding all three must never run the process out of descriptors. Before, each port's cap left
headroom on its own, their sum did not: accept failed with EMFILE (a traceback per try) and no new
client got in. Client shared-memory regions hold a descriptor each and are bounded the same way. The
server here runs with RLIMIT_NOFILE 256, so the limit is reached with few sockets and regions."""

from __future__ import annotations

import os
import shutil
import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from .clients import register_until_refused
from .server import ROOT, ServerProcess
from .test_http_hardening import _descriptors, _infer_ok  # noqa: F401 - the fixture: room for our sockets

OPEN_FILES = 256
FLOOD = 300  # connections tried per port, and regions registered: more than the process may hold


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


@pytest.fixture
def objects() -> Iterator[list[str]]:
    """FLOOD POSIX shared-memory objects of 64 bytes (their keys), destroyed after the test."""
    made = [shm.create_shared_memory_region(f"o{i}", f"/ta_fd_{os.getpid()}_{i}", 64) for i in range(FLOOD)]
    yield [f"/ta_fd_{os.getpid()}_{i}" for i in range(FLOOD)]
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def test_shared_memory_regions_leave_room_for_clients(start_server: Callable[..., ServerProcess], repo: Path,
                                                      objects: list[str]) -> None:
    """One client registers regions (one object each) until refused: the refusal comes well before the
    process's descriptor limit, in Triton's shape for a region it cannot hold, on both protocols; fresh
    HTTP, gRPC and metrics clients are still served; an unregistered region makes room for another."""
    server = start_server(repo, flags=("--allow-client-shm=true",), open_files=OPEN_FILES)
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    registered, refused = register_until_refused(client, objects)
    assert refused.status() == "400", refused
    assert f"failed to register shared memory region 'r{registered}'" in refused.message()
    assert 0 < registered <= OPEN_FILES // 8  # half of the quarter left beside connections
    assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) < OPEN_FILES // 2
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            grpc.register_system_shared_memory("by_grpc", objects[-1], 64)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "failed to register" in e.value.message()
        _infer_ok(server)
        a = np.arange(4, dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
        for x in inputs:
            x.set_data_from_numpy(a)
        np.testing.assert_array_equal(grpc.infer("add_sub", inputs, client_timeout=60).as_numpy("OUTPUT0"), a + a)
    finally:
        grpc.close()
    with urllib.request.urlopen(server.metrics_url, timeout=30) as scrape:
        assert b"nv_inference_count" in scrape.read()
    client.unregister_system_shared_memory("r0")
    client.register_system_shared_memory("again", objects[-1], 64)
    assert len(client.get_system_shared_memory_status()) == registered
    client.close()
    assert "Traceback" not in server.log()
