"""Two ``Server`` objects in one process share no state (docs/architecture.md#process-wide-state).

Each server owns its tracer, the hooks its Python models call the server through (BLS, model control),
the registry of their custom metric families and its open response channels; before, all four were module
globals, so the server started last took the other's traces, answered its models' BLS calls and counted
its custom metrics, and each server's ``/status.json`` counted the other's streams.
Both servers run in this process (HTTP on port 0, the official tritonclient), each on a repository of
its own with the same model names: a ``target`` that answers with its server's tag, and a ``caller``
that counts its requests in a custom counter and asks ``target`` through BLS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from triton_actor.config.command_line import parse
from triton_actor.inference import InferInput, InferRequest
from triton_actor.plane import live_status
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.server import Server

from .server import add_model

pytestmark = pytest.mark.timeout(120)

IO = """
    input [{ name: "IN", data_type: TYPE_INT32, dims: [1] }]
    output [{ name: "OUT", data_type: TYPE_STRING, dims: [1] }]
"""
TARGET_CONFIG = 'name: "target"\nbackend: "python"\nmax_batch_size: 0\n' + IO
CALLER_CONFIG = 'name: "caller"\nbackend: "python"\nmax_batch_size: 0\n' + IO
TARGET_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([b"{tag}"], dtype=object))])
                for _ in requests]
"""
CALLER_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily("two_servers_calls", "requests to caller", pb_utils.MetricFamily.COUNTER)
        self.calls = family.Metric(labels={"model": "caller"})

    def execute(self, requests):
        responses = []
        for r in requests:
            self.calls.increment(1)
            answer = pb_utils.InferenceRequest(model_name="target", requested_output_names=["OUT"],
                                               inputs=[pb_utils.get_input_tensor_by_name(r, "IN")]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUT")]))
        return responses
"""
STREAM_CONFIG = ('name: "stream"\nbackend: "python"\nmax_batch_size: 0\n'
                 'model_transaction_policy { decoupled: true }\n' + IO)
STREAM_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([b"x"], dtype=object))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def _server(root: Path, tag: str) -> Server:
    repo = root / f"repo_{tag}"
    add_model(repo, "target", TARGET_CONFIG, TARGET_PY.format(tag=tag))
    add_model(repo, "caller", CALLER_CONFIG, CALLER_PY)
    add_model(repo, "stream", STREAM_CONFIG, STREAM_PY)
    settings = parse(["--model-repository", str(repo), "--http-port", "0", "--http-address", "127.0.0.1",
                      "--allow-grpc=false", "--allow-metrics=false", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1", "--trace-config", f"triton,file={root / f'trace_{tag}.json'}"])
    server = Server(settings)
    server.start_actors()
    server.serve()
    server.load_models()
    server.plane.accepting = True
    return server


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("two_servers")
    started: dict[str, Server] = {}
    try:
        for tag in ("A", "B"):  # B starts last: before, its module globals replaced A's
            started[tag] = _server(root, tag)
        yield started
    finally:
        for server in started.values():
            server.stop()


def _infer(server: Server, model: str) -> str:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", network_timeout=30)
    try:
        i = httpclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([1], dtype=np.int32))
        return client.infer(model, [i]).as_numpy("OUT")[0].decode()
    finally:
        client.close()


def _trace_ids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return sorted({entry["id"] for entry in json.loads(path.read_text())})


def test_each_server_writes_its_own_traces(servers: dict[str, Server]) -> None:
    a, b = servers["A"], servers["B"]
    for _ in range(3):
        assert _infer(a, "target") == "A"
    assert a.plane.runtime.tracer.flush(10) and b.plane.runtime.tracer.flush(10)
    trace_a = a.settings.trace_config["trace_file"][0]
    trace_b = b.settings.trace_config["trace_file"][0]
    assert len(_trace_ids(Path(trace_a))) >= 3  # A's requests (and only those: B served none yet)
    assert _trace_ids(Path(trace_b)) == []


def test_a_bls_call_reaches_the_callers_own_server(servers: dict[str, Server]) -> None:
    assert _infer(servers["A"], "caller") == "A"
    assert _infer(servers["B"], "caller") == "B"
    assert _infer(servers["A"], "caller") == "A"


def _calls(server: Server) -> float:
    custom = server.metrics_source({})["custom"]
    families = [f for f in custom if f["name"] == "two_servers_calls"]
    assert len(families) == 1, custom
    return sum(s["value"] for s in families[0]["series"])


def test_custom_metric_families_count_their_own_servers_requests(servers: dict[str, Server]) -> None:
    a, b = servers["A"], servers["B"]
    before_a, before_b = _calls(a), _calls(b)
    for _ in range(3):
        _infer(b, "caller")
    _infer(a, "caller")
    assert _calls(a) - before_a == 1
    assert _calls(b) - before_b == 3


def _open_streams(server: Server) -> int:
    return live_status.local_status(server.plane)["streams"]["open"]


def test_each_server_counts_its_own_open_streams(servers: dict[str, Server]) -> None:
    a, b = servers["A"], servers["B"]
    request = InferRequest("stream", -1, "", {"IN": InferInput("IN", BY_WIRE["INT32"], (1,), np.array([1], np.int32))})
    streamed = a.plane.infer_stream(request)  # A's channel stays open until its final response is read
    try:
        assert (_open_streams(a), _open_streams(b)) == (1, 0)
        item, final = next(streamed.responses)
        assert final and not isinstance(item, Exception)
    finally:
        streamed.responses.close()  # type: ignore[attr-defined]
    assert (_open_streams(a), _open_streams(b)) == (0, 0)
