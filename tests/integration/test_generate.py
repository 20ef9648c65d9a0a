"""Decoupled models and the generate extension over HTTP: ``/generate`` (one JSON answer) and
``/generate_stream`` (Server-Sent Events), on real servers."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import gevent
import pytest

from .server import IDENTITY_CONFIG, add_model

SQUARE_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

# Triton's decoupled examples answer from a thread they start in execute() and return at once.
SQUARE_PY = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.inflight = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if n < 0:
                raise ValueError("IN must not be negative")
            thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), n))
            thread.daemon = True
            with self.lock:
                self.inflight += 1
            thread.start()
        return None

    def respond(self, sender, n):
        for i in range(n):
            time.sleep(0.005)  # the model's token pace
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            self.inflight -= 1

    def finalize(self):
        deadline = time.time() + 5
        while self.inflight and time.time() < deadline:
            time.sleep(0.01)  # model code: finalize waits for its threads
"""


# Triton's "response sender in default mode": a non-decoupled model may answer through the sender.
SENDER_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.size and x[0] < 0:
                continue  # forgets to answer this one
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _post(url: str, path: str, body: object) -> tuple[int, str, str]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def _events(text: str) -> list[dict]:
    assert text.endswith("\n\n") or not text, text
    return [json.loads(chunk[len("data: "):]) for chunk in text.split("\n\n") if chunk]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    from .server import ROOT, ServerProcess

    repo = tmp_path_factory.mktemp("generate_repo")
    add_model(repo, "square", SQUARE_CONFIG, SQUARE_PY)
    add_model(repo, "sender_default", IDENTITY_CONFIG, SENDER_PY)
    server = ServerProcess(ROOT / "model_repository", repo).wait_ready()
    yield server
    server.stop()


def test_generate_stream_sends_one_event_per_token(server) -> None:
    status, ctype, text = _post("http://" + server.url, "/v2/models/text_generator/generate_stream",
                                {"text_input": "hello", "max_tokens": 5, "id": "r1"})
    assert status == 200 and ctype == "text/event-stream; charset=utf-8"
    events = _events(text)
    assert [e["index"] for e in events] == [0, 1, 2, 3, 4]
    assert all(e["id"] == "r1" and e["model_name"] == "text_generator" and e["model_version"] == "1" for e in events)
    again = _events(_post("http://" + server.url, "/v2/models/text_generator/generate_stream",
                          {"text_input": "hello", "max_tokens": 5})[2])
    assert "".join(e["text_output"] for e in again) == "".join(e["text_output"] for e in events)  # deterministic


def test_decoupled_model_answering_from_its_own_threads(server) -> None:
    calls = [gevent.spawn(_post, "http://" + server.url, "/v2/models/square/generate_stream", {"IN": n})
             for n in (3, 0, 5, 1)]
    gevent.joinall(calls, timeout=60, raise_error=True)
    for n, call in zip((3, 0, 5, 1), calls, strict=True):
        status, _, text = call.value
        assert status == 200
        assert [e["OUT"] for e in _events(text)] == list(range(n))  # 0 responses: only the final flag, no event


def test_error_inside_a_stream_is_an_event_and_the_server_keeps_serving(server) -> None:
    status, _, text = _post("http://" + server.url, "/v2/models/text_generator/generate_stream",
                            {"text_input": "x", "max_tokens": -1})
    assert status == 200 and _events(text) == [{"error": "max_tokens must be >= 0"}]
    status, _, text = _post("http://" + server.url, "/v2/models/square/generate_stream", {"IN": -1})
    assert status == 200
    [event] = _events(text)
    assert "IN must not be negative" in event["error"]
    status, _, text = _post("http://" + server.url, "/v2/models/square/generate_stream", {"IN": 2})
    assert [e["OUT"] for e in _events(text)] == [0, 1]


def test_generate_on_an_ordinary_model(server) -> None:
    status, ctype, text = _post("http://" + server.url, "/v2/models/add_sub/generate",
                                {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})
    assert status == 200 and ctype.startswith("application/json")
    assert json.loads(text) == {"model_name": "add_sub", "model_version": "1",
                                "OUTPUT0": [2.0, 3.0, 4.0, 5.0], "OUTPUT1": [0.0, 1.0, 2.0, 3.0]}
    status, _, text = _post("http://" + server.url, "/v2/models/add_sub/generate_stream",
                            {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})
    assert [e["OUTPUT0"] for e in _events(text)] == [[2.0, 3.0, 4.0, 5.0]]


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3], "INPUT1": [1, 1, 1, 1]}, 400, ["INPUT0", "3 element"]),
    # a 500 and a traceback per request before (orjson writes 255 levels at most)
    ("/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "p": _nested(300)}, 400,
     ["parameter 'p' is nested too deep"]),
    ("/v2/models/add_sub/generate", {"INPUT0": [[1, 2], [3, 4]], "INPUT1": [1, 1, 1, 1]}, 400, ["flat list"]),
    ("/v2/models/add_sub/generate", {"INPUT0": ["a", 2, 3, 4], "INPUT1": [1, 1, 1, 1]}, 400, ["FP32"]),
    ("/v2/models/add_sub/generate", [1, 2], 400, ["JSON object"]),
    ("/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "id": {"a": 1}}, 400,
     ["'id' must be a string"]),
    ("/v2/models/text_generator/generate", {"text_input": "x", "max_tokens": 2 ** 40}, 400, ["max_tokens", "INT32"]),
    ("/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3, 4], "triton_x": 1}, 400, ["triton_"]),
    ("/v2/models/nope/generate_stream", {"x": 1}, 404, ["unknown model"]),
    ("/v2/models/text_generator/infer", {"inputs": []}, 501, ["decoupled"]),
])
def test_bad_generate_requests(server, path: str, body: object, status: int, words: list[str]) -> None:
    got, ctype, text = _post("http://" + server.url, path, body)
    assert got == status and ctype.startswith("application/json"), text
    error = json.loads(text)["error"]
    for word in words:
        assert word in error, error


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_generate_takes_identity_bodies_only(server, path: str) -> None:
    """As Triton's generate endpoints: a body is JSON as sent; a compressed one is a 400, not inflated."""
    import gzip

    body = gzip.compress(json.dumps({"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}).encode())
    req = urllib.request.Request(f"http://{server.url}/v2/models/add_sub/{path}", data=body, method="POST",
                                 headers={"Content-Encoding": "gzip"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400 and "JSON" in json.loads(e.value.read())["error"]


def test_client_leaving_mid_stream_cancels_the_generation(server) -> None:
    host, port = server.url.split(":")
    body = json.dumps({"text_input": "a long story", "max_tokens": 500, "id": "leaver"}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/text_generator/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while b"data: " not in received:  # wait for the first token, then go away
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
    assert server.stderr.wait(lambda: any("request 'leaver' cancelled after" in line for line in server.stderr.lines),
                              30), "the model never saw the cancellation:\n" + server.log()
    status, _, text = _post("http://" + server.url, "/v2/models/text_generator/generate_stream",
                            {"text_input": "still here", "max_tokens": 2})
    assert status == 200 and len(_events(text)) == 2


def test_ordinary_model_answering_through_its_response_sender(server) -> None:
    status, _, text = _post("http://" + server.url, "/v2/models/sender_default/infer",
                            {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})
    assert status == 200 and json.loads(text)["outputs"][0]["data"] == [2.0, 4.0]
    status, _, text = _post("http://" + server.url, "/v2/models/sender_default/infer",
                            {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [-1]}]})
    assert status == 500 and "sent no response" in json.loads(text)["error"]


# -- the same decoupled models over gRPC ModelStreamInfer -------------------------------------------
def _stream(server, requests: list[tuple[str, list, dict]], expect: int) -> list[tuple[object, object]]:
    """Send ``(model, inputs, kwargs)`` on one stream; collect ``expect`` callbacks (result, error)."""
    import gevent.queue
    import tritonclient.grpc as grpcclient

    out: gevent.queue.Queue = gevent.queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: out.put((result, error)))
    try:
        for model, inputs, kw in requests:
            client.async_stream_infer(model, inputs, **kw)
        return [out.get(timeout=30) for _ in range(expect)]
    finally:
        client.stop_stream()
        client.close()


def _grpc_input(name: str, value: object, dtype: str):
    import numpy as np
    import tritonclient.grpc as grpcclient

    array = np.array([value], dtype=np.object_ if dtype == "BYTES" else np.int32)
    tensor = grpcclient.InferInput(name, [1], dtype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_grpc_stream_carries_every_token_with_the_final_flag(server) -> None:
    inputs = [_grpc_input("text_input", b"hello", "BYTES"), _grpc_input("max_tokens", 5, "INT32")]
    answers = _stream(server, [("text_generator", inputs, {"request_id": "g1"})], 5)
    assert all(error is None for _, error in answers)
    results = [result for result, _ in answers]
    assert [int(r.as_numpy("index")[0]) for r in results] == [0, 1, 2, 3, 4]
    http = _events(_post("http://" + server.url, "/v2/models/text_generator/generate_stream",
                         {"text_input": "hello", "max_tokens": 5})[2])
    assert [r.as_numpy("text_output")[0].decode() for r in results] == [e["text_output"] for e in http]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in results]
    assert finals == [False] * 5  # the model closes with a flags-only final: nothing more is sent...


def test_grpc_stream_empty_final_response_when_asked(server) -> None:
    inputs = [_grpc_input("IN", 2, "INT32")]
    answers = _stream(server, [("square", inputs, {"request_id": "s1", "enable_empty_final_response": True})], 3)
    results = [result for result, error in answers if error is None]
    assert len(results) == 3
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in results]
    assert finals == [False, False, True]  # ...unless the request asked for the empty final response
    assert results[-1].get_response().outputs == [] and results[-1].get_response().id == "s1"


def test_grpc_stream_errors_and_keeps_going(server) -> None:
    answers = _stream(server, [
        ("square", [_grpc_input("IN", -1, "INT32")], {"request_id": "bad"}),
        ("square", [_grpc_input("IN", 2, "INT32")], {"request_id": "good"}),
    ], 3)
    errors = [error for _, error in answers if error is not None]
    assert len(errors) == 1 and "IN must not be negative" in str(errors[0])
    assert sorted(int(r.as_numpy("OUT")[0]) for r, e in answers if e is None) == [0, 1]


def test_grpc_stream_cancel_reaches_the_model(server) -> None:
    import gevent.queue
    import tritonclient.grpc as grpcclient

    out: gevent.queue.Queue = gevent.queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: out.put((result, error)))
    inputs = [_grpc_input("text_input", b"a long story", "BYTES"), _grpc_input("max_tokens", 500, "INT32")]
    client.async_stream_infer("text_generator", inputs, request_id="grpc-leaver")
    _result, error = out.get(timeout=30)  # the first token arrived: now cancel the stream
    assert error is None
    client.stop_stream(cancel_requests=True)
    client.close()
    assert server.stderr.wait(lambda: any("request 'grpc-leaver' cancelled after" in line for line in server.stderr.lines),
                              30), "the model never saw the cancellation:\n" + server.log()


def test_decoupled_model_with_warmup_loads(tmp_path, start_server) -> None:
    """Warmup runs a decoupled model through a response sink and waits for its final flag."""
    import shutil

    from .server import ROOT

    shutil.copytree(ROOT / "model_repository" / "text_generator", tmp_path / "gen",
                    ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "gen" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "text_generator"', 'name: "gen"') + """
model_warmup [ { name: "hello", batch_size: 1,
  inputs { key: "text_input" value: { data_type: TYPE_STRING, dims: [ 1 ], zero_data: true } }
  inputs { key: "max_tokens" value: { data_type: TYPE_INT32, dims: [ 1 ], zero_data: true } } } ]
""")
    server = start_server(tmp_path)
    status, _, text = _post("http://" + server.url, "/v2/models/gen/generate_stream", {"text_input": "hi", "max_tokens": 2})
    assert status == 200 and len(_events(text)) == 2
