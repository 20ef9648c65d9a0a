"""Bad input gets Triton's status and text (captured from Triton 2.51), and the server keeps serving."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from .server import ServerProcess
from .test_examples import _post

GOOD = [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [10, 20, 30, 40]}]


def _infer_json(server: ServerProcess, body: object, model: str = "add_sub", path: str | None = None) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, data = _post(server, path or f"/v2/models/{model}/infer", raw)
    return status, json.loads(data) if data else {}


CASES = [
    ("malformed json", b'{"inputs":[{"name":"INPUT0",', 500, "failed to parse the request JSON buffer"),
    ("no inputs", {}, 500, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ("wrong dtype", {"inputs": [{**GOOD[0], "datatype": "FP64"}, GOOD[1]]}, 400,
     "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'"),
    ("wrong shape", {"inputs": [{**GOOD[0], "shape": [5], "data": [1, 2, 3, 4, 5]}, GOOD[1]]}, 400,
     "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]."),
    ("missing input", {"inputs": [GOOD[0]]}, 400,
     "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
     "but missing required input(s) ['INPUT1']. Please provide all required input(s)."),
    ("unknown input", {"inputs": [*GOOD, {**GOOD[0], "name": "INPUT9"}]}, 400,
     "[request id: <id_unknown>] unexpected inference input 'INPUT9' for model 'add_sub'"),
    ("unknown output", {"inputs": GOOD, "outputs": [{"name": "OUTPUT9"}]}, 400,
     "unexpected inference output 'OUTPUT9' for model 'add_sub'"),
    ("too few elements", {"inputs": [{**GOOD[0], "data": [1, 2, 3]}, GOOD[1]]}, 500,
     "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ("string in FP32", {"inputs": [{**GOOD[0], "data": [1, 2, "x", 4]}, GOOD[1]]}, 500, "Unable to parse 'data'"),
    ("FP16 as JSON", {"inputs": [{**GOOD[0], "datatype": "FP16"}, GOOD[1]]}, 400,
     "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT0"),
    ("no data", {"inputs": [{k: v for k, v in GOOD[0].items() if k != "data"}, GOOD[1]]}, 400,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But no field is set"),
    ("triton_ parameter", {"inputs": GOOD, "parameters": {"triton_x": 1}}, 400,
     "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
    ("unknown datatype", {"inputs": [{**GOOD[0], "datatype": "FLOAT"}, GOOD[1]]}, 400, "invalid datatype"),
    ("negative shape", {"inputs": [{**GOOD[0], "shape": [-4]}, GOOD[1]]}, 500,
     "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("element count past INT64_MAX", {"inputs": [{**GOOD[0], "shape": [2**4, 2**60 + 2]}, GOOD[1]]}, 400,
     "causes total element count to exceed maximum size of 9223372036854775807"),
    ("inputs not a list", {"inputs": {"a": 1}}, 500, "Unable to parse 'inputs'"),
    ("deeply wrong types", {"inputs": [7, "x"]}, 400, "each entry of 'inputs' must be an object"),
]


@pytest.mark.parametrize(("case", "body", "status", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_json_requests(example_server: ServerProcess, case: str, body: object, status: int, message: str) -> None:
    got_status, got = _infer_json(example_server, body)
    assert got_status == status, got
    assert message in got["error"], got["error"]


def test_unknown_model_and_version(example_server: ServerProcess) -> None:
    assert _infer_json(example_server, {"inputs": GOOD}, model="nope") == (
        404, {"error": "Request for unknown model: 'nope' is not found"})
    assert _infer_json(example_server, {"inputs": GOOD}, path="/v2/models/add_sub/versions/2/infer") == (
        404, {"error": "Request for unknown model: 'add_sub' version 2 is not found"})
    status, _, data = _post(example_server, "/v2/models/add_sub/versions/abc/infer", b"{}")
    assert (status, json.loads(data)) == (404, {"error": "Not Found"})
    status, _, data = _post(example_server, "/v2/models/add_sub/infer", b"", method="GET")
    assert (status, json.loads(data)) == (405, {"error": "Method Not Allowed"})
    status, _, data = _post(example_server, "/v2/models/nope/ready", b"", method="GET")
    assert (status, json.loads(data)) == (400, {"error": "Model version not ready"})
    status, _, data = _post(example_server, "/v2/models/nope/stats", b"", method="GET")
    assert (status, json.loads(data)) == (400, {"error": "requested model 'nope' is not available"})
    log_before = len(example_server.log())
    status, _, data = _post(example_server, "/static/x", b"", method="GET")  # Flask's own static route: was a
    assert (status, json.loads(data)) == (404, {"error": "Not Found"})  # 500 and a traceback per request
    assert "Traceback" not in example_server.log()[log_before:]


@pytest.mark.parametrize("name", ["..", "%2e%2e", "..%2fadd_sub", "a%2fb", "%2e%2e%2f%2e%2e%2fetc", "add_sub%00"])
def test_path_like_model_names(example_server: ServerProcess, name: str) -> None:
    for path in (f"/v2/models/{name}", f"/v2/models/{name}/config", f"/v2/models/{name}/infer"):
        status, _, data = _post(example_server, path, json.dumps({"inputs": GOOD}).encode(),
                                method="POST" if path.endswith("infer") else "GET")
        assert status in (400, 404), (path, status, data)


def test_batch_larger_than_max_batch_size(example_server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [17, 1], "datatype": "FP32", "data": list(range(17))}]}
    assert _infer_json(example_server, body, model="identity_batch") == (
        400, {"error": "[request id: <id_unknown>] inference request batch-size must be <= 16 for 'identity_batch'"})


def _binary_body(sizes: list[int], payload: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [
        {"name": f"INPUT{i}", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": n}}
        for i, n in enumerate(sizes)]}).encode()
    return header + payload, {"Inference-Header-Content-Length": str(len(header))}


def test_binary_sizes_that_do_not_add_up(example_server: ServerProcess) -> None:
    data = np.arange(4, dtype=np.float32).tobytes()
    body, headers = _binary_body([16, 16], data + data[:8])
    status, _, out = _post(example_server, "/v2/models/add_sub/infer", body, headers)
    assert (status, json.loads(out)["error"]) == (400, "unexpected size for input 'INPUT1', expecting 8 additional bytes for model 'add_sub'")
    body, headers = _binary_body([16, 16], data + data + b"12345678")
    status, _, out = _post(example_server, "/v2/models/add_sub/infer", body, headers)
    assert (status, json.loads(out)["error"]) == (400, "unexpected additional input data for model 'add_sub'")
    body, headers = _binary_body([12, 16], data[:12] + data)
    status, _, out = _post(example_server, "/v2/models/add_sub/infer", body, headers)
    assert json.loads(out)["error"] == ("[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' "
                                        "for model 'add_sub'. Expected 16, got 12")
    status, _, out = _post(example_server, "/v2/models/add_sub/infer", body, {"Inference-Header-Content-Length": "99999"})
    assert status == 400 and "inference header size should be in range" in json.loads(out)["error"]
    status, _, out = _post(example_server, "/v2/models/add_sub/infer", body, {"Inference-Header-Content-Length": "x"})
    assert (status, json.loads(out)["error"]) == (400, "Unable to parse Inference-Header-Content-Length")


def test_bytes_tensor_with_broken_length_prefix(example_server: ServerProcess) -> None:
    header = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 2], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 9}}]}).encode()
    body = header + struct.pack("<I", 3) + b"abc" + b"\xff\xff"
    status, _, out = _post(example_server, "/v2/models/string_ops/infer", body,
                           {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "TEXT" in json.loads(out)["error"]


def test_raw_binary_request_needs_single_input(example_server: ServerProcess) -> None:
    status, _, out = _post(example_server, "/v2/models/add_sub/infer", b"", {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "Raw request must only have 1 input" in json.loads(out)["error"]


def test_raw_binary_request_single_input(example_server: ServerProcess) -> None:
    data = np.arange(6, dtype=np.float32)
    status, headers, out = _post(example_server, "/v2/models/identity_batch/infer", data.tobytes(),
                                 {"Inference-Header-Content-Length": "0"})
    assert status == 200
    n = int(headers["inference-header-content-length"])
    assert json.loads(out[:n])["outputs"][0]["shape"] == [1, 6]
    np.testing.assert_array_equal(np.frombuffer(out[n:], dtype=np.float32), data)


def test_server_survives_garbage(example_server: ServerProcess) -> None:
    for body in (b"\x00" * 100, b"[1,2,3]", b"null", b'{"inputs": null}', b'{"inputs": [{"name": 5}]}',
                 b'{"inputs": [], "outputs": 5}', b'{"inputs": [], "parameters": []}', b'{"id": 7, "inputs": []}'):
        status, _, _ = _post(example_server, "/v2/models/add_sub/infer", body)
        assert status in (400, 500)
    status, _, _ = _post(example_server, "/v2/models/add_sub/infer", json.dumps({"inputs": GOOD}).encode())
    assert status == 200
