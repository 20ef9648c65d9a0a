"""The ``triton_grpc_error: true`` stream header (Triton 24.08+): an error ends the stream with its gRPC
status; without it the error travels as ``error_message`` and the stream goes on (Triton's own
L0_grpc_error_state_cleanup test, with a model of ours that fails its second request)."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from .server import ServerProcess, add_model

pytestmark = pytest.mark.timeout(60)

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 2, 2 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 2, 2 ] } ]
"""

MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.seen = 0

    def execute(self, requests):
        out = []
        for r in requests:
            self.seen += 1
            if self.seen % 2 == 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("every second request fails")))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("repo")
    add_model(repo, "fails_second", CONFIG, MODEL)
    s = ServerProcess(repo).wait_ready()
    yield s
    s.stop()


def _inputs() -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("IN", [2, 2], "FP32")
    x.set_data_from_numpy(np.ones((2, 2), np.float32))
    return [x]


def _send(server: ServerProcess, headers: dict[str, str] | None, count: int) -> list[object]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error if error is not None else result),
                        headers=headers)
    answers = []
    try:
        for _ in range(count):
            try:
                client.async_stream_infer("fails_second", _inputs())
            except InferenceServerException as e:  # the stream is over: the client refuses to send
                answers.append(e)
                break
            answers.append(got.get(timeout=20))
    finally:
        client.stop_stream()
        client.close()
    return answers


def test_with_triton_grpc_error_the_error_ends_the_stream_with_its_status(server: ServerProcess) -> None:
    answers = _send(server, {"triton_grpc_error": "true"}, 4)
    assert answers[0].as_numpy("OUT").tolist() == [[1, 1], [1, 1]]
    error = answers[1]
    assert isinstance(error, InferenceServerException)
    assert str(error.status()) == "StatusCode.INTERNAL" and "every second request fails" in error.message()
    assert len(answers) <= 3, "the stream went on after the error"  # then the client may refuse once


def test_without_it_the_error_is_a_message_and_the_stream_goes_on(server: ServerProcess) -> None:
    answers = _send(server, None, 4)
    assert len(answers) == 4
    errors = [a for a in answers if isinstance(a, InferenceServerException)]
    assert len(errors) == 2 and all("every second request fails" in e.message() for e in errors)
