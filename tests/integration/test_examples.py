"""The example repository through the official tritonclient, HTTP and gRPC: values checked against numpy.

Tests taking ``any_client`` run once per protocol (see ``clients.py``); the others are HTTP-only.
"""

from __future__ import annotations

import gzip
import http.client
import json
from functools import partial

import gevent.queue
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from .clients import Client
from .server import ServerProcess


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        i = httpclient.InferInput(name, list(arr.shape), "FP32")
        i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    return inputs


def _inputs(client: Client, a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[object]:
    return [client.input("INPUT0", a, "FP32", binary), client.input("INPUT1", b, "FP32", binary)]


def test_health_and_server_metadata(any_client: Client) -> None:
    client = any_client
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"] and "statistics" in meta["extensions"]


def test_model_metadata_and_config(any_client: Client) -> None:
    client = any_client
    meta = client.get_model_metadata("add_sub")
    assert meta == {
        "name": "add_sub", "versions": ["1"], "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]}, {"name": "INPUT1", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [4]}, {"name": "OUTPUT1", "datatype": "FP32", "shape": [4]}],
    }
    batch_meta = client.get_model_metadata("identity_batch")
    assert batch_meta["inputs"][0]["shape"] == [-1, -1]  # batch dimension prepended
    cfg = client.get_model_config("identity_batch")
    assert cfg["max_batch_size"] == 16
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [16]
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 0  # a number, not "0"
    assert cfg["input"][0]["dims"] == [-1]
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU" and cfg["instance_group"][0]["count"] == 2
    assert list(cfg)[:6] == ["name", "platform", "backend", "runtime", "version_policy", "max_batch_size"]
    assert client.is_model_ready("add_sub") and client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "7")


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub_values(any_client: Client, binary: bool) -> None:
    client = any_client
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    outputs = [client.output(n, binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", _inputs(client, a, b, binary), outputs=outputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert client.response(result)["id"] == "r1"
    assert client.response(result)["model_version"] == "1"


def test_requested_output_subset(any_client: Client) -> None:
    client = any_client
    a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    result = client.infer("add_sub", _inputs(client, a, b), outputs=[client.output("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)



def test_an_output_asked_for_twice_is_refused(any_client: Client) -> None:
    """Triton core refuses it on every front end (its L0_grpc python_unit_test sends OUTPUT0 twice); the
    same request without the second name is served."""
    client = any_client
    a = np.arange(4, dtype=np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.raw.infer("add_sub", _inputs(client, a, a), outputs=[client.output("OUTPUT0"), client.output("OUTPUT0")])
    assert e.value.status() == client.expect("INVALID_ARGUMENT", 400)
    assert e.value.message().endswith("output 'OUTPUT0' already exists in request")
    result = client.raw.infer("add_sub", _inputs(client, a, a), outputs=[client.output("OUTPUT0")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_string_model(any_client: Client) -> None:
    client = any_client
    text = np.array([["hello", "wörld"], ["a", ""]], dtype=np.object_)
    for binary in (True, False):
        i = client.input("TEXT", text, "BYTES", binary)
        outs = [client.output(n, binary) for n in ("UPPER", "LENGTH")]
        result = client.infer("string_ops", [i], outputs=outs)
        upper = result.as_numpy("UPPER")
        assert upper.shape == (2, 2)
        assert [x.decode() if isinstance(x, bytes) else x for x in upper.reshape(-1)] == ["HELLO", "WÖRLD", "A", ""]
        np.testing.assert_array_equal(result.as_numpy("LENGTH"), [[5, 6], [1, 0]])


def test_identity_batch_concurrent_grpc(grpc_client: Client) -> None:
    """gRPC ``async_infer``: 16 requests in flight at once, answered through callbacks."""
    any_client = grpc_client
    done = gevent.queue.Queue()
    for k in range(16):
        i = any_client.input("INPUT0", np.full((1, 3), k, dtype=np.float32), "FP32")
        any_client.async_infer("identity_batch", [i], partial(_collect, done, k))
    for _ in range(16):
        k, result, error = done.get(timeout=30)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 3), k, dtype=np.float32))


def _collect(done: gevent.queue.Queue, k: int, result: object, error: object) -> None:
    done.put((k, result, error))


def test_identity_batch_concurrent(client: httpclient.InferenceServerClient) -> None:
    pending = []
    for k in range(16):
        i = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        i.set_data_from_numpy(np.full((1, 3), k, dtype=np.float32))
        pending.append((k, client.async_infer("identity_batch", [i])))
    for k, p in pending:
        np.testing.assert_array_equal(p.get_result().as_numpy("OUTPUT0"), np.full((1, 3), k, dtype=np.float32))


def test_classification(any_client: Client) -> None:
    client = any_client
    a, b = np.array([1, 2, 3, 4], dtype=np.float32), np.array([10, 20, 30, 40], dtype=np.float32)
    out = client.output("OUTPUT0", binary=False, class_count=2)
    result = client.infer("add_sub", _inputs(client, a, b), outputs=[out])
    assert [x.decode() if isinstance(x, bytes) else x for x in result.as_numpy("OUTPUT0")] == ["44.000000:3", "33.000000:2"]


def test_compression_both_ways(client: httpclient.InferenceServerClient) -> None:
    a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    for algo in ("gzip", "deflate"):
        result = client.infer("add_sub", _add_sub_inputs(a, b), request_compression_algorithm=algo,
                              response_compression_algorithm=algo)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_statistics_are_cumulative(any_client: Client) -> None:
    client = any_client
    before = client.get_inference_statistics("add_sub")["model_stats"][0]
    a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    for _ in range(3):
        client.infer("add_sub", _inputs(client, a, b))
    after = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert after["name"] == "add_sub" and after["version"] == "1"
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 3
    s0, s1 = before["inference_stats"], after["inference_stats"]
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert s1[key]["count"] - s0[key]["count"] == 3, key
    assert s1["compute_infer"]["ns"] > s0["compute_infer"]["ns"]
    assert {b["batch_size"] for b in after["batch_stats"]} == {1}
    assert set(after) == {"name", "version", "last_inference", "inference_count", "execution_count",
                          "inference_stats", "response_stats", "batch_stats", "memory_usage"}
    everything = client.get_inference_statistics()["model_stats"]
    assert {m["name"] for m in everything} >= {"add_sub", "string_ops", "identity_batch"}


def test_repository_index(any_client: Client) -> None:
    client = any_client
    index = client.get_model_repository_index()
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index
    assert all(entry["state"] == "READY" for entry in index)  # (the generated ONNX/TorchScript examples too)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("add_sub")
    assert e.value.status() == ("StatusCode.UNAVAILABLE" if client.grpc else "503")
    assert "explicit model load / unload is not allowed" in e.value.message()


def _post(server: ServerProcess, path: str, body: bytes, headers: dict[str, str] | None = None,
          method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def test_curl_style_json(example_server: ServerProcess) -> None:
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [10, 20, 30, 40]}]}).encode()
    status, headers, data = _post(example_server, "/v2/models/add_sub/infer", body)
    assert status == 200 and headers["content-type"] == "application/json"
    assert data == (b'{"model_name":"add_sub","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"FP32",'
                    b'"shape":[4],"data":[11.0,22.0,33.0,44.0]},{"name":"OUTPUT1","datatype":"FP32","shape":[4],'
                    b'"data":[-9.0,-18.0,-27.0,-36.0]}]}')
    status, headers, data = _post(example_server, "/v2/models/add_sub/infer", body, {"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip" and json.loads(gzip.decompress(data))["model_name"] == "add_sub"


def test_binary_output_headers(example_server: ServerProcess) -> None:
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [10, 20, 30, 40]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]}).encode()
    status, headers, data = _post(example_server, "/v2/models/add_sub/infer", body)
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    n = int(headers["inference-header-content-length"])
    header = json.loads(data[:n])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert header["outputs"][1]["data"] == [-9.0, -18.0, -27.0, -36.0]
    np.testing.assert_array_equal(np.frombuffer(data[n:], dtype=np.float32), [11, 22, 33, 44])
