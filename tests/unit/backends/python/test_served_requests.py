"""What a ``TritonPythonModel`` sees of a request the server hands it (``InferenceRequest._served``), what its
answer becomes, and the process state around the call (``sys.argv``, the server's hooks): a real
``PythonInstance`` on a model written to ``tmp_path``, called the way the instance actor calls it."""

from __future__ import annotations

import contextvars
import dataclasses
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from triton_actor.backends.base import RESCHEDULE, InstanceContext
from triton_actor.backends.python import backend
from triton_actor.backends.python.triton_python_backend_utils import serving
from triton_actor.backends.python.triton_python_backend_utils.pybind_args import pybind_repr
from triton_actor.errors import TritonError
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


def _loaded(tmp_path: Path, name: str, text: str) -> tuple[Any, serving.ServerHooks]:
    version = tmp_path / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(text)
    hooks = serving.ServerHooks()
    ctx = InstanceContext(name, 1, version.parent, version, ModelConfig(name=name), "{}", f"{name}_0", "CPU",
                          0, 0, server_hooks=hooks)
    return backend.PythonInstance(ctx), hooks


@pytest.fixture(params=[True, False], ids=["fast", "slow"])
def instance(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(fastpath, "enabled", request.param)
    before = list(sys.argv)
    made, hooks = _loaded(tmp_path, "served", MODEL)
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


# Every way a model may use a request it was handed, and every kind of answer, through the backend's
# one-request path (fast paths: the lean request of ``_ServedRequest``, its ``_InputTensor`` inputs, the usual
# answer taken in ``execute``'s frame) and the general path (fast paths off): the same answers both ways.

LEAN_MODEL = """
import json
import pickle
import numpy as np
import triton_python_backend_utils as pb_utils

SEEN = []


class Sub(pb_utils.Tensor):
    pass


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            case = json.loads(request.parameters())["case"]
            a = pb_utils.get_input_tensor_by_name(request, "A")
            x = a.as_numpy()
            seen = {"case": case}
            SEEN.append(seen)
            plain = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)])
            if case == "meta":
                seen.update(
                    flags=request.flags(), id=request.request_id(), correlation=request.correlation_id(),
                    model=(request.model_name(), request.model_version()), timeout=request.timeout(),
                    asked=request.requested_output_names(), cancelled=request.is_cancelled(),
                    span=request.trace()._span_trace, context=request.trace().get_context(),
                    repr=repr(request), objects=(request, a),
                    tensor=(a.name(), a.shape(), a.triton_dtype(), a.is_cpu(), repr(a)),
                    same=a is pb_utils.get_input_tensor_by_name(request, "A") is request.inputs()[0],
                    preferred=request.preferred_memory())
                request.set_flags(7)
                seen["flags_set"] = request.flags()
                seen["copy"] = pickle.loads(pickle.dumps(a.as_numpy())).tolist()
                out.append(plain)
            elif case == "dlpack":  # a read-only input is copied for export: its reads stay the same
                seen["exported"] = np.from_dlpack(a).tolist()
                seen["after"] = (a.name(), a.as_numpy().tolist(), a.triton_dtype())
                out.append(pb_utils.InferenceResponse([a]))
            elif case == "plain":
                out.append(plain)
            elif case == "passthrough":
                out.append(pb_utils.InferenceResponse([a]))
            elif case == "params":
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)], parameters={"p": 1}))
            elif case == "error":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad input")))
            elif case == "sub":
                out.append(pb_utils.InferenceResponse([Sub("OUT", x + 1)]))
            elif case == "two":
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x), pb_utils.Tensor("TWO", x - 1)]))
            elif case == "none":
                out.append(pb_utils.InferenceResponse([]))
            elif case == "reschedule":
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
            elif case == "sender":
                request.get_response_sender().send(plain, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
            elif case == "raise":
                raise ValueError("model failed")
            elif case == "tuple":
                return (plain,)
            elif case == "empty":
                return []
            elif case == "none_item":
                out.append(None)
        return out
"""


@pytest.fixture(params=[True, False], ids=["fast", "slow"])
def lean(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(fastpath, "enabled", request.param)
    made, _ = _loaded(tmp_path, "lean", LEAN_MODEL)
    yield made
    made.finalize()


def _call(made: Any, case: str, **fields: Any) -> tuple[Any, dict[str, Any]]:
    array = np.arange(3, dtype=np.float32)
    array.flags.writeable = False  # as the HTTP front end's views of a request body are
    inputs = {"A": InferInput("A", BY_WIRE["FP32"], (3,), array)}
    fields.setdefault("outputs", (RequestedOutput("OUT"),))
    request = InferRequest("lean", 1, "r-1", inputs, parameters={"case": case}, **fields)
    # in a context of its own, as a greenlet's or the instance thread's: the server's hooks a call leaves set
    # (fast paths) stay out of the test's
    [result] = contextvars.copy_context().run(made.execute, [request])
    return result, sys.modules[made.model.__module__].SEEN[-1]


def test_what_the_model_reads_of_a_request(lean: Any) -> None:
    span = object()
    result, seen = _call(lean, "meta", correlation_id="seq-1", flags=3, timeout_us=9,
                         is_cancelled=lambda: True, trace=span)
    assert result.outputs[0][1].tolist() == [0.0, 2.0, 4.0]
    assert (seen["flags"], seen["flags_set"], seen["id"], seen["correlation"]) == (3, 7, "r-1", "seq-1")
    assert (seen["model"], seen["timeout"], seen["asked"], seen["cancelled"]) == (("lean", 1), 9, ["OUT"], True)
    assert seen["span"] is span and seen["context"] is None and seen["preferred"] is None
    assert seen["repr"] == "InferenceRequest(request_id='r-1', model_name='lean', inputs=['A'])"
    assert [pybind_repr(o).split(" object at")[0] for o in seen["objects"]] == ["<c_python_backend_utils.InferenceRequest",
                                                                  "<c_python_backend_utils.Tensor"]
    assert seen["tensor"] == ("A", [3], 11, True, "Tensor(name='A', dtype=float32, shape=[3])")
    assert seen["same"] and seen["copy"] == [0.0, 1.0, 2.0]


def test_a_request_nobody_cancels_or_traces(lean: Any) -> None:
    _result, seen = _call(lean, "meta")
    assert (seen["cancelled"], seen["span"], seen["correlation"], seen["flags"]) == (False, None, 0, 0)


def test_a_read_only_input_exported_then_answered(lean: Any) -> None:
    result, seen = _call(lean, "dlpack")
    assert seen["exported"] == [0.0, 1.0, 2.0] and seen["after"] == ("A", [0.0, 1.0, 2.0], 11)
    [(name, array)] = result.outputs
    assert name == "A" and array.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(("case", "outputs", "parameters"), [
    ("plain", [("OUT", [0.0, 2.0, 4.0])], {}),
    ("passthrough", [("A", [0.0, 1.0, 2.0])], {}),
    ("params", [("OUT", [0.0, 1.0, 2.0])], {"p": 1}),
    ("sub", [("OUT", [1.0, 2.0, 3.0])], {}),
    ("two", [("OUT", [0.0, 1.0, 2.0]), ("TWO", [-1.0, 0.0, 1.0])], {}),
    ("none", [], {}),
    ("sender", [("OUT", [0.0, 2.0, 4.0])], {}),
])
def test_each_kind_of_answer(lean: Any, case: str, outputs: list[Any], parameters: dict[str, Any]) -> None:
    result, _ = _call(lean, case)
    assert isinstance(result, InferResponse)
    assert [getattr(result, f.name) for f in dataclasses.fields(InferResponse)]  # every field set (fast path)
    assert [(n, a.tolist()) for n, a in result.outputs] == outputs and result.parameters == parameters


@pytest.mark.parametrize(("case", "text"), [
    ("error", "bad input"),
    ("raise", "model failed"),
    ("tuple", "Expected a list in the execute return"),
    ("empty", "Number of InferenceResponse objects do not match"),
    ("none_item", "returned None and sent no response"),
])
def test_each_kind_of_failure(lean: Any, case: str, text: str) -> None:
    result, _ = _call(lean, case)
    assert isinstance(result, TritonError) and text in result.message


def test_a_rescheduled_request(lean: Any) -> None:
    result, _ = _call(lean, "reschedule")
    assert result is RESCHEDULE


def test_lean_objects_pickle_as_themselves(lean: Any) -> None:
    """What the model holds keeps its class through pickle (``__qualname__`` left as the class's)."""
    _result, seen = _call(lean, "meta")
    assert seen["copy"] == [0.0, 1.0, 2.0]
    request = backend._to_pb(InferRequest("lean", 1, "r", {"A": InferInput("A", BY_WIRE["FP32"], (1,),
                                                                           np.ones(1, np.float32))}))
    tensor = pickle.loads(pickle.dumps(request.inputs()[0]))
    assert tensor.name() == "A" and tensor.as_numpy().tolist() == [1.0]
