"""Compressed requests and answers (frontends/compression.py): a gzip bomb is refused at the request
memory budget with the budget's message, on HTTP, unary gRPC and a gRPC stream, and the server goes on
serving (before, the budget counted the compressed bytes only: 64 KB on the wire became 64 MiB, or 2 GiB,
inflated on the hub); ``Accept-Encoding`` with ``q=0`` is not compressed."""

from __future__ import annotations

import gzip
import http.client
import queue
import zlib
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .server import IDENTITY_CONFIG, IDENTITY_PY, ServerProcess, add_model

BUDGET = 8_000_000
BOMB = 16 * 1024 * 1024  # FP32 zeros: 64 MiB inflated, ~64 KB compressed, eight budgets
FITS = 1024 * 1024  # 4 MiB inflated: fits the budget


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("compressed") / "repo"
    add_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    s = ServerProcess(repo, flags=("--request-memory-budget", str(BUDGET),
                                   "--http-max-input-size", str(80 * 1024 * 1024))).wait_ready()
    yield s
    s.stop()


def _inputs(module, n: int) -> list:  # type: ignore[no-untyped-def]
    x = module.InferInput("INPUT0", [n], "FP32")
    x.set_data_from_numpy(np.zeros(n, dtype=np.float32), **({"binary_data": True} if module is httpclient else {}))
    return [x]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_grpc_bomb_is_refused_at_the_budget(server: ServerProcess, algorithm: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for _ in range(2):  # the second time too: the first gave back all it held
            with pytest.raises(InferenceServerException) as refused:
                client.infer("identity", _inputs(grpcclient, BOMB), compression_algorithm=algorithm)
            assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert f"request memory budget {BUDGET}" in refused.value.message()
            result = client.infer("identity", _inputs(grpcclient, FITS), compression_algorithm=algorithm)
            assert result.as_numpy("OUTPUT0").shape == (FITS,) and not result.as_numpy("OUTPUT0").any()
    finally:
        client.close()


def test_an_http_bomb_is_503_at_the_budget(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        for _ in range(2):
            with pytest.raises(InferenceServerException) as refused:
                client.infer("identity", _inputs(httpclient, BOMB), request_compression_algorithm="gzip")
            assert refused.value.status() == "503"
            assert f"request memory budget {BUDGET}" in refused.value.message()
            result = client.infer("identity", _inputs(httpclient, FITS), request_compression_algorithm="deflate")
            assert result.as_numpy("OUTPUT0").shape == (FITS,) and not result.as_numpy("OUTPUT0").any()
    finally:
        client.close()


def test_a_stream_message_holds_its_inflated_bytes_until_answered_and_a_bomb_is_refused(server: ServerProcess) -> None:
    """Six 4 MiB requests one after another on one stream with an 8 MB budget: each gives back what it
    inflated once answered (else the third would not fit); a bomb is answered with the budget's error
    and the stream goes on."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: results.put((result, error)), compression_algorithm="gzip")
    try:
        for _ in range(6):
            client.async_stream_infer("identity", _inputs(grpcclient, FITS))
            result, error = results.get(timeout=60)
            assert error is None and result.as_numpy("OUTPUT0").shape == (FITS,)
        client.async_stream_infer("identity", _inputs(grpcclient, BOMB))
        result, error = results.get(timeout=60)
        assert result is None and f"request memory budget {BUDGET}" in error.message()
        client.async_stream_infer("identity", _inputs(grpcclient, FITS))
        result, error = results.get(timeout=60)
        assert error is None and result.as_numpy("OUTPUT0").shape == (FITS,)
    finally:
        client.stop_stream()
        client.close()


def _post(server: ServerProcess, accept_encoding: str) -> tuple[str | None, bytes]:
    host, port = server.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]})
    conn.request("POST", "/v2/models/identity/infer", body, {"Accept-Encoding": accept_encoding})
    answer = conn.getresponse()
    assert answer.status == 200
    data = answer.read()
    conn.close()
    return answer.getheader("Content-Encoding"), data


@pytest.mark.parametrize(("accept_encoding", "coding"), [
    ("gzip;q=0", None),  # RFC 9110 §12.5.3: not acceptable (it was answered gzipped)
    ("gzip;q=0, identity", None),
    ("identity;q=0.5, gzip", "gzip"),
    ("deflate, gzip", "deflate"),  # Triton: the first of equals (it was gzip)
])
def test_accept_encoding_weights(server: ServerProcess, accept_encoding: str, coding: str | None) -> None:
    got, data = _post(server, accept_encoding)
    assert got == coding
    text = {None: bytes, "gzip": gzip.decompress, "deflate": zlib.decompress}[coding](data)
    assert orjson.loads(text)["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_a_big_answer_is_compressed_whole(server: ServerProcess) -> None:
    """An answer over compression.ON_HUB goes to a thread in slices: the client gets all of it."""
    client = httpclient.InferenceServerClient(server.url)
    try:
        n = 3 * 1024 * 1024 // 4 + 7
        x = httpclient.InferInput("INPUT0", [n], "FP32")
        values = np.random.default_rng(0).random(n, dtype=np.float32)
        x.set_data_from_numpy(values, binary_data=True)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        result = client.infer("identity", [x], outputs=[out], response_compression_algorithm="gzip")
        assert np.array_equal(result.as_numpy("OUTPUT0"), values)
    finally:
        client.close()


INFLATED_MAX = 2 * 1024 * 1024  # --http-max-input-size of the server below


@pytest.fixture(scope="module")
def small_limit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default 1 GiB budget, a 2 MiB body limit: only the inflation limit can refuse a bomb."""
    repo = tmp_path_factory.mktemp("inflation_limit") / "repo"
    add_model(repo, "identity", IDENTITY_CONFIG, IDENTITY_PY)
    s = ServerProcess(repo, flags=("--http-max-input-size", str(INFLATED_MAX))).wait_ready()
    yield s
    s.stop()


def test_grpc_and_http_share_one_inflation_limit(small_limit_server: ServerProcess) -> None:
    """A message that inflates past --http-max-input-size is refused on gRPC as a gzip body is on HTTP
    (before, a gRPC message inflated up to the request budget: 1 MiB of gzip made 1 GiB)."""
    over, fits = INFLATED_MAX // 4 + 1, INFLATED_MAX // 8  # FP32 values
    grpc = grpcclient.InferenceServerClient(small_limit_server.grpc_url)
    http = httpclient.InferenceServerClient(small_limit_server.url)
    try:
        for algorithm in ("gzip", "deflate"):
            with pytest.raises(InferenceServerException) as refused:
                grpc.infer("identity", _inputs(grpcclient, over), compression_algorithm=algorithm)
            assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert f"vs. {INFLATED_MAX}) after decompression" in refused.value.message()
            with pytest.raises(InferenceServerException) as refused:
                http.infer("identity", _inputs(httpclient, over), request_compression_algorithm=algorithm)
            assert refused.value.status() == "400"
            assert refused.value.message() == (  # Triton's words for it (its http_input_size_limit_test)
                f"Decompressed data size exceeds the maximum allowed value of {INFLATED_MAX} bytes. "
                "Use --http-max-input-size to increase the limit.")
            result = grpc.infer("identity", _inputs(grpcclient, fits), compression_algorithm=algorithm)
            assert result.as_numpy("OUTPUT0").shape == (fits,)
        # an uncompressed gRPC message keeps gRPC's own limit (INT32_MAX, as Triton)
        result = grpc.infer("identity", _inputs(grpcclient, over))
        assert result.as_numpy("OUTPUT0").shape == (over,)
    finally:
        grpc.close()
        http.close()
