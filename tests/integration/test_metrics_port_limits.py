"""The metrics port has the HTTP port's bounds (it is served by the same HTTP/1.1 driver): idle and
half-sent connections time out, and the connection cap closes the connections waiting longest for a
request head while a scrape still gets its answer. Waits are on sockets (select), never fixed sleeps."""

from __future__ import annotations

import http.client
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from triton_actor.metrics.exposition import CONTENT_TYPE

from .server import ServerProcess
from .test_http_hardening import HALF_SENT, REPO, _closed_within, _connect, _half_sent

TIMEOUTS = ("--http-header-timeout-secs", "0.5", "--http-body-timeout-secs", "0.5",
            "--http-keepalive-timeout-secs", "0.5", "--allow-grpc=false")


def _scrape_ok(server: ServerProcess) -> None:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"] == CONTENT_TYPE
        assert b"# TYPE nv_inference_request_success counter\n" in r.read()


@pytest.fixture(scope="module")
def impatient_server() -> Iterator[ServerProcess]:
    server = ServerProcess(REPO, flags=TIMEOUTS).wait_ready()
    yield server
    server.stop()


@pytest.mark.parametrize("data", HALF_SENT.values(), ids=HALF_SENT.keys())
def test_idle_and_half_sent_connections_time_out(impatient_server: ServerProcess, data: bytes) -> None:
    with _connect(impatient_server, impatient_server.metrics_port) as sock:
        started = time.monotonic()
        sock.sendall(data)
        assert _closed_within(sock, 10)
        assert time.monotonic() - started >= 0.4
    _scrape_ok(impatient_server)


def test_connection_cap_closes_waiting_connections(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(REPO, flags=("--allow-grpc=false",))
    with _half_sent(server, 200, b"GET /metrics HTTP/1.1\r\nHo", port=server.metrics_port) as socks:
        _scrape_ok(server)
        closed = sum(_closed_within(sock, 10 if i == 0 else 0.01) for i, sock in enumerate(socks[:130]))
        assert closed == 130  # the oldest waiting ones made room; at most 64 (metrics_server.MAX_CONNECTIONS) stay open
    assert "Traceback" not in server.log()


def test_bodies_and_other_requests(impatient_server: ServerProcess) -> None:
    """No route on the metrics port takes a body: a large one is refused from its head, not buffered."""
    conn = http.client.HTTPConnection("127.0.0.1", impatient_server.metrics_port, timeout=30)
    try:
        conn.putrequest("POST", "/metrics")
        conn.putheader("Content-Length", "1000000")
        conn.endheaders()
        answer = conn.getresponse()
        assert answer.status == 400 and b"exceeds the maximum allowed input size" in answer.read()
        conn.close()
        conn.request("GET", "/other")
        answer = conn.getresponse()
        assert answer.status == 404 and answer.getheader("Content-Type") == "text/plain"
        answer.read()
        conn.request("HEAD", "/metrics")
        answer = conn.getresponse()
        assert (answer.status, answer.getheader("Content-Type"), answer.read()) == (200, CONTENT_TYPE, b"")
    finally:
        conn.close()
