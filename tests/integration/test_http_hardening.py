"""Hostile HTTP/1.1 clients on raw sockets (docs/security.md): strict sizes, bounded connections, timeouts;
and the one router's 404/405 answers. Waits are on sockets (select), never fixed sleeps."""

from __future__ import annotations

import contextlib
import resource
import select
import socket
import time
from collections.abc import Callable, Iterator

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from .server import ROOT, ServerProcess
from .test_http_fuzz import _exchange

REPO = ROOT / "model_repository"


@pytest.fixture(scope="module", autouse=True)
def _descriptors() -> Iterator[None]:
    """Room for a thousand client sockets in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _connect(server: ServerProcess, port: int | None = None) -> socket.socket:
    """A connection to the HTTP port (or to ``port``: the metrics port)."""
    return socket.create_connection(("127.0.0.1", port or server.port), timeout=30)


@contextlib.contextmanager
def _half_sent(server: ServerProcess, n: int, data: bytes, port: int | None = None) -> Iterator[list[socket.socket]]:
    """``n`` connections (to the HTTP port, or to ``port``) that each sent ``data`` and wait; closed at the end."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(_connect(server, port))
            socks[-1].sendall(data)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _closed_within(sock: socket.socket, timeout: float) -> bool:
    """Wait (on the socket) until the server closes it; True when it did within ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            try:
                if not sock.recv(65536):
                    return True
            except OSError:
                return True
    return False


def _rss_kb(server: ServerProcess) -> int:
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _infer_ok(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    try:
        a = np.arange(4, dtype=np.float32)
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        client.close()


CHUNKED = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("size", [b"-7FFFFFFFFFFFFFFF", b"-1", b"1" * 60_000, b"1" * 17, b"0x10", b"zz", b"+10"])
def test_bad_chunk_size_is_400_and_memory_stays_flat(example_server: ServerProcess, size: bytes) -> None:
    answer = _exchange(example_server, CHUNKED + size + b"\r\n")
    assert _status(answer) == 400 and b"Traceback" not in answer, answer
    rss_before = _rss_kb(example_server)
    sent = 0
    with _connect(example_server) as sock:  # then keep pushing: the server must stop reading, not buffer
        piece = b"x" * (1 << 20)
        try:
            sock.sendall(CHUNKED + size + b"\r\n")
            while sent < 256 << 20:
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass
    assert sent < 128 << 20, "the server kept reading a body it had refused"
    assert _rss_kb(example_server) - rss_before < 64 * 1024


# a second field or a list, even of equal values, as nginx (Content-Length is one of its unique header lines)
@pytest.mark.parametrize("value", [b"1_0", b"+5", b"-1", b"5 5", b"0x5", b"5\r\nContent-Length: 6",
                                   b"5\r\nContent-Length: 5", b"5, 5"])
def test_bad_content_length_is_400(example_server: ServerProcess, value: bytes) -> None:
    head = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\n"
    assert _status(_exchange(example_server, head + b"{}{}{}{}{}")) == 400


def test_transfer_encoding_on_http_1_0_is_400(example_server: ServerProcess) -> None:
    """nginx: "client sent HTTP/1.0 request with Transfer-Encoding header" (HTTP/1.0 has no chunked coding)."""
    head = b"POST /v2/models/add_sub/infer HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert _status(_exchange(example_server, head + b"2\r\n{}\r\n0\r\n\r\n")) == 400


def test_content_length_with_transfer_encoding_is_400(example_server: ServerProcess) -> None:
    head = b"POST /v2/models/add_sub/infer HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert _status(_exchange(example_server, head + b"0\r\n\r\n")) == 400


def test_chunked_body_over_the_limit(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(REPO, flags=("--http-max-input-size", "1000"))
    answer = _exchange(server, CHUNKED + b"258\r\n" + b" " * 600 + b"\r\n258\r\n")
    assert _status(answer) == 400
    assert b"request JSON size of 1200 bytes exceeds the maximum allowed input size of 1000 bytes" in answer
    # a raw binary body (the body is the input): Triton words it differently (its http_input_size_limit_test)
    raw = (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nInference-Header-Content-Length: 0\r\n"
           b"Content-Length: 1001\r\n\r\n")
    answer = _exchange(server, raw + b" " * 1001)
    assert _status(answer) == 400 and b"Raw input has a byte_size (1001 bytes) that exceeds the maximum allowed value " \
        b"of 1000 bytes. Use --http-max-input-size to increase the limit." in answer


def test_router_answers_unknown_paths_and_wrong_methods(example_server: ServerProcess) -> None:
    answer = _exchange(example_server, b"GET /v2/nope HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 404 Not Found\r\n") and answer.endswith(b'{"error":"Not Found"}')
    answer = _exchange(example_server, b"GET /v2/models/add_sub/infer HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 405 Not Allowed\r\n") and b"\r\nAllow: POST\r\n" in answer
    assert answer.endswith(b'{"error":"Method Not Allowed"}')
    answer = _exchange(example_server, b"DELETE /v2/health/live HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert b"\r\nAllow: GET, HEAD\r\n" in answer
    answer = _exchange(example_server, b"HEAD /v2/health/ready HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\n")


def test_head_limits(example_server: ServerProcess) -> None:
    assert _status(_exchange(example_server, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n")) == 414
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(200))
    answer = _exchange(example_server, b"GET /v2 HTTP/1.1\r\n" + fields + b"\r\n")
    assert _status(answer) == 431 and orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]


def test_a_thousand_half_sent_heads_do_not_stop_a_client(example_server: ServerProcess) -> None:
    with _half_sent(example_server, 1000, b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Le"):
        _infer_ok(example_server)


def test_connection_cap_closes_waiting_connections(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server(REPO, flags=("--http-max-connections", "50"))
    with _half_sent(server, 200, b"GET /v2/health/ready HTTP/1.1\r\nHo") as socks:
        _infer_ok(server)
        closed = sum(_closed_within(sock, 10 if i == 0 else 0.01) for i, sock in enumerate(socks[:150]))
        assert closed == 150  # the oldest waiting ones made room; at most 50 stay open
    assert "Traceback" not in server.log()


@pytest.fixture(scope="module")
def impatient_server() -> Iterator[ServerProcess]:
    flags = ("--http-header-timeout-secs", "0.5", "--http-body-timeout-secs", "0.5",
             "--http-keepalive-timeout-secs", "0.5", "--allow-grpc=false")
    server = ServerProcess(REPO, flags=flags).wait_ready()
    yield server
    server.stop()


HALF_SENT = {
    "idle": b"",
    "half head": b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Le",
    "half body": b"POST /v2/models/add_sub/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"inputs\":",
    "half chunk": CHUNKED + b"64\r\n{\"inputs\":",
}


@pytest.mark.parametrize("data", HALF_SENT.values(), ids=HALF_SENT.keys())
def test_idle_and_half_sent_connections_time_out(impatient_server: ServerProcess, data: bytes) -> None:
    with _connect(impatient_server) as sock:
        started = time.monotonic()
        sock.sendall(data)
        assert _closed_within(sock, 10)
        assert time.monotonic() - started >= 0.4


def test_keep_alive_idles_out_after_answers(impatient_server: ServerProcess) -> None:
    with _connect(impatient_server) as sock:
        for _ in range(3):
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
        assert _closed_within(sock, 10)


def test_header_timeout_counts_the_whole_head(impatient_server: ServerProcess) -> None:
    """A head trickled a byte at a time (slowloris) is cut at the header timeout, not per read."""
    head = b"GET /v2/health/ready HTTP/1.1\r\n" + b"X-Slow: " + b"y" * 1000
    with _connect(impatient_server) as sock:
        started = time.monotonic()
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if select.select([sock], [], [], 0.05)[0]:  # the wait between bytes is on the socket
                closed = not sock.recv(65536)
                break
        assert closed or _closed_within(sock, 10)
        assert time.monotonic() - started < 5


def test_more_inputs_than_the_model_has_are_refused_before_conversion(example_server: ServerProcess) -> None:
    """Hub time (docs/limits.md#memory-and-hub-time-per-request): add_sub has two inputs; a request naming 20 more is refused at its first
    unknown name, on HTTP and gRPC alike, before any tensor is converted: INPUT0's bad data, which the
    conversion would have reported first, is never looked at."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, "x", 4.0]}]
    inputs += [{"name": f"x{i}", "shape": [1], "datatype": "FP32", "data": [1.0]} for i in range(20)]
    body = orjson.dumps({"inputs": inputs})
    head = f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    answer = _exchange(example_server, head.encode() + body)
    assert _status(answer) == 400 and b"unexpected inference input 'x0' for model 'add_sub'" in answer, answer
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    try:
        tensors = [grpcclient.InferInput("INPUT0", [4], "FP32")]
        tensors[0].set_data_from_numpy(np.zeros(4, dtype=np.float32))
        tensors[0]._raw_content = b"abc"  # 3 bytes for 4 FP32 elements: a conversion error
        for i in range(20):
            tensors.append(grpcclient.InferInput(f"x{i}", [1], "FP32"))
            tensors[-1].set_data_from_numpy(np.ones(1, dtype=np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", tensors)
        assert "unexpected inference input 'x0' for model 'add_sub'" in info.value.message()
    finally:
        client.close()


def test_a_big_json_request_refused_logs_no_traceback(start_server: Callable[..., ServerProcess],
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """A JSON body over 1 MiB is decoded on gevent's thread pool, which logged every exception there
    with its traceback: each bad big request wrote a traceback to the log (a client could fill it)."""
    import shutil

    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "model_repository" / "add_sub", repo / "add_sub")
    server = start_server(repo)
    data = list(range(300_000))  # 2 MiB of JSON for a [4] input: a shape mismatch
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": data},
                                    {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    head = f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    for _ in range(3):
        answer = _exchange(server, head.encode() + body)
        assert _status(answer) == 500 and b"Shape does not match" in answer, answer[:300]  # Triton: INTERNAL
    _infer_ok(server)
    assert "Traceback" not in server.log()
