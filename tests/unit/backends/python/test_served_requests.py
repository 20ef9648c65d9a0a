"""What a ``TritonPythonModel`` sees of a request the server hands it (``InferenceRequest._served``), what its
answer becomes, and the process state around the call (``sys.argv``, the server's hooks): a real
``PythonInstance`` on a model written to ``tmp_path``, called the way the instance actor calls it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triton_actor.backends.base import InstanceContext
from triton_actor.backends.python import backend
from triton_actor.backends.python.triton_python_backend_utils import serving
from triton_actor.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from triton_actor.protocol.dtypes import BY_WIRE
from triton_actor.repository.config import ModelConfig
from triton_actor.runtime import fastpath

MODEL = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils
from triton_python_backend_utils import serving

SEEN = []

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A")
            listed = request.inputs()
            SEEN.append({
                "a": a, "b": pb_utils.get_input_tensor_by_name(request, "B"),
                "missing": pb_utils.get_input_tensor_by_name(request, "C"),
                "names": [t.name() for t in listed], "fresh": listed is not request.inputs(),
                "asked": request.requested_output_names(), "id": request.request_id(),
                "correlation": request.correlation_id(), "flags": request.flags(),
                "timeout": request.timeout(), "parameters": request.parameters(),
                "model": (request.model_name(), request.model_version()),
                "argv": list(sys.argv), "hooks": serving.current(),
                "dlpack": np.from_dlpack(a).tolist(),
            })
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", a.as_numpy() * 2)]))
        return out
"""


@pytest.fixture(params=[True, False], ids=["fast", "slow"])
def instance(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(fastpath, "enabled", request.param)
    version = tmp_path / "served" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL)
    hooks = serving.ServerHooks()
    ctx = InstanceContext("served", 1, version.parent, version, ModelConfig(name="served"), "{}", "served_0", "CPU",
                          0, 0, server_hooks=hooks)
    before = list(sys.argv)
    made = backend.PythonInstance(ctx)
    yield made, hooks, before
    made.finalize()
    assert sys.argv == before  # the last model out gives the process its argv back


def _request(outputs: tuple[RequestedOutput, ...] | None, **fields: Any) -> InferRequest:
    fp32 = BY_WIRE["FP32"]
    a, b = np.arange(3, dtype=np.float32), np.ones(3, dtype=np.float32)
    inputs = {"A": InferInput("A", fp32, (3,), a), "B": InferInput("B", fp32, (3,), b)}
    return InferRequest("served", 1, "r-7", inputs, outputs, **fields)


def test_a_served_request_reads_as_tritons(instance: Any) -> None:
    made, hooks, _ = instance
    request = _request((RequestedOutput("OUT"),), parameters={"k": "v"}, correlation_id=42, flags=1,
                       timeout_us=500)
    [result] = made.execute([request])
    assert isinstance(result, InferResponse)
    [(name, array)] = result.outputs
    assert name == "OUT" and array.tolist() == [0.0, 2.0, 4.0]
    seen = sys.modules[made.model.__module__].SEEN[-1]
    assert seen["a"].as_numpy() is request.inputs["A"].data  # no copy of the server's array
    assert seen["b"].as_numpy() is request.inputs["B"].data
    assert seen["missing"] is None
    assert seen["names"] == ["A", "B"] and seen["fresh"]  # the request's order, a new list each call
    assert seen["asked"] == ["OUT"]
    assert (seen["id"], seen["correlation"], seen["flags"], seen["timeout"]) == ("r-7", 42, 1, 500)
    assert json.loads(seen["parameters"]) == {"k": "v"}
    assert seen["model"] == ("served", 1)
    assert seen["dlpack"] == [0.0, 1.0, 2.0]
    assert seen["hooks"] is hooks


def test_every_output_asked_reads_as_an_empty_list(instance: Any) -> None:
    made, _, _ = instance
    made.execute([_request(None)])
    assert sys.modules[made.model.__module__].SEEN[-1]["asked"] == []


def test_argv_is_the_stubs_while_the_model_is_loaded(instance: Any) -> None:
    """Triton's stub has ``['']`` for as long as the model lives, between calls too (a thread the model
    started reads it whenever it likes); the server's own comes back at ``finalize`` (the fixture checks)."""
    made, _, _ = instance
    assert sys.argv == [""]
    made.execute([_request(None)])
    assert sys.modules[made.model.__module__].SEEN[-1]["argv"] == [""]
    assert sys.argv == [""]


def test_a_call_runs_as_its_own_server_after_another_servers_call(instance: Any) -> None:
    """The hooks a call leaves set (fast paths on) never answer another server's model: each call makes
    its own server's current first."""
    made, hooks, _ = instance
    other = serving.ServerHooks()
    token = serving.enter(other)
    try:
        made.execute([_request(None)])
        assert sys.modules[made.model.__module__].SEEN[-1]["hooks"] is hooks
    finally:
        serving.leave(token)
