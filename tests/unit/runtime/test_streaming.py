"""Streaming pieces: the generate extension's JSON codec, the ResponseChannel that carries a
decoupled model's responses across threads, and pb_utils' response sender."""

from __future__ import annotations

import json

import gevent
import numpy as np
import pytest
from gevent import monkey

from triton_actor.backends.python import triton_python_backend_utils as pb_utils
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferResponse
from triton_actor.protocol import generate
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.runtime.response_channel import ResponseChannel

FP32, INT32, BYTES = BY_WIRE["FP32"], BY_WIRE["INT32"], BY_WIRE["BYTES"]


def test_decode_maps_inputs_parameters_and_id() -> None:
    body = json.dumps({"text_input": "hi", "max_tokens": 3, "id": "r7", "temperature": 0.5,
                       "parameters": {"stream": True, "stop": ["a", "b"]}}).encode()
    req = generate.decode_request(body, "m", -1, [("text_input", BYTES, (1,)), ("max_tokens", INT32, (1,))], 0)
    assert req.id == "r7" and req.model_version == -1
    assert req.inputs["text_input"].data.tolist() == [b"hi"] and req.inputs["text_input"].shape == (1,)
    assert req.inputs["max_tokens"].data.dtype == np.int32 and req.inputs["max_tokens"].shape == (1,)
    assert req.parameters == {"temperature": 0.5, "stream": True, "stop": '["a","b"]'}


def test_decode_fills_the_variable_dim_and_the_batch_dim() -> None:
    req = generate.decode_request(b'{"X": [1, 2, 3, 4, 5, 6]}', "m", 1, [("X", FP32, (-1, 2))], 8)
    assert req.inputs["X"].shape == (1, 3, 2) and req.inputs["X"].data.dtype == np.float32


@pytest.mark.parametrize("body", [b"{bad", b'{"X": [1, 2, 3]}', b'{"X": [[1], [2]]}', b'{"X": ["a", "b"]}',
                                  b'{"parameters": 3}', b'{"triton_enable_empty_final_response": true}'])
def test_decode_rejects_bad_requests(body: bytes) -> None:
    with pytest.raises(TritonError) as e:
        generate.decode_request(body, "m", -1, [("X", FP32, (2,))], 0)
    assert e.value.code == Code.INVALID_ARG


def test_encode_scalars_lists_and_text() -> None:
    response = InferResponse([("one", np.array([[3]], np.int32)), ("many", np.array([1.5, 2.5], np.float32)),
                              ("text", np.array([b"tok"], dtype=np.object_))])
    assert json.loads(generate.encode_response("m", 2, "id1", response)) == {
        "id": "id1", "model_name": "m", "model_version": "2", "one": 3, "many": [1.5, 2.5], "text": "tok"}
    assert generate.sse_event(b"{}") == b"data: {}\n\n"


@pytest.mark.timeout(30)
def test_channel_carries_responses_from_a_native_thread_and_drops_after_final() -> None:
    channel = ResponseChannel()
    start = monkey.get_original("_thread", "start_new_thread")
    sleep = monkey.get_original("time", "sleep")

    def produce() -> None:
        for i in range(3):
            sleep(0.01)  # the producer's pace
            channel.send(i, False)
        channel.send("last", True)
        channel.send("too late", False)

    start(produce, ())
    got = [channel.receive(timeout=10) for _ in range(4)]
    assert got == [(0, False), (1, False), (2, False), ("last", True)] and channel.finished
    with pytest.raises(gevent.Timeout):
        channel.receive(timeout=0.05)
    channel.close()


def test_response_sender_rules() -> None:
    sent: list = []
    sender = pb_utils.InferenceResponseSender(lambda r, final: sent.append((r, final)), lambda: False)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
    with pytest.raises(TypeError):
        sender.send("not a response")
    response = pb_utils.InferenceResponse([])
    sender.send(response)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(response, False), (None, True)] and not sender.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(response)
