"""A decoupled model's BLS calls made after its ``execute`` returned (from a thread of the model's, before
the request's final answer) are traced as children of the request, in process and in a process of the
model's own (observability/otel.py ``SpanTrace.record`` keeps the compute span's id for them;
backends/python/isolated_session.py holds a decoupled request's trace token until its final answer)."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from .server import add_model
from .test_ensemble import _arith_config, pipeline
from .test_otel_traces import Receiver, _flags, _traceparent, receiver  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)

LATE_PY = """
import os
import threading
import time
import triton_python_backend_utils as pb_utils

GATE = {gate!r}

def answer(request):
    deadline = time.monotonic() + 60  # bounded: a test that fails never opens the gate
    while not os.path.exists(GATE) and time.monotonic() < deadline:
        time.sleep(0.01)  # model code polling the test's gate file
    x = pb_utils.get_input_tensor_by_name(request, "X")
    bls = pb_utils.InferenceRequest(model_name="inc", inputs=[x], requested_output_names=["Y"],
                                    trace=request.trace()).exec()
    sender = request.get_response_sender()
    sender.send(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(bls, "Y")]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:  # answered from a thread, once the test opens the gate: after execute returned
            threading.Thread(target=answer, args=(r,)).start()
        return None
"""


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_a_decoupled_models_bls_after_execute_is_a_child_of_its_request(tmp_path: Path, start_server,
                                                                        receiver: Receiver, isolated: bool) -> None:  # noqa: F811
    pipeline(tmp_path)
    gate = tmp_path / "gate"
    add_model(tmp_path, "late", _arith_config({}, "model_transaction_policy { decoupled: true }"),
              LATE_PY.format(gate=str(gate)))
    isolation = ("--backend-config=python,isolation=process",) if isolated else ()
    server = start_server(tmp_path, flags=(*_flags(receiver, rate=1), *isolation))
    header, trace_id, client_span = _traceparent()

    def named(name: str) -> list[dict]:
        return [s for s in receiver.of(trace_id) if s["name"] == name]

    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error or result), headers={"traceparent": header})
    try:
        x = grpcclient.InferInput("X", [1, 2], "FP32")
        x.set_data_from_numpy(np.ones((1, 2), np.float32))
        client.async_stream_infer("late", [x])
        # the model's span is recorded once its batch completed (execute returned): the BLS call comes after
        receiver.wait_for(lambda: len(named("late")) == 1)
        gate.touch()
        answer = got.get(timeout=60)
        assert not isinstance(answer, Exception), answer
        assert answer.as_numpy("Y").tolist() == [[2.0, 2.0]]
    finally:
        client.stop_stream()
        client.close()
    assert server.stop() == 0  # every span exported
    (root,), (late,), (inc,) = named("InferRequest"), named("late"), named("inc")
    computes = {c["parent"]: c for c in named("compute")}
    assert root["parent"] == client_span and late["parent"] == root["span_id"]
    assert set(computes) == {late["span_id"], inc["span_id"]}
    assert inc["parent"] == computes[late["span_id"]]["span_id"]  # a child of the request's compute span
    assert inc["attrs"]["triton.trace_parent_id"] == late["attrs"]["triton.trace_id"]
    assert late["end"] <= inc["start"]  # made after the request's own spans ended
