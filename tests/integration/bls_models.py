"""Python models for the BLS and rescheduling tests (written into a per-test repository by ``bls_repo``).

``caller`` runs one scenario per request, named by its ``MODE`` input, and answers a JSON text in
``OUT`` that the test checks: what the BLS responses held, or the error they carried.
"""

from __future__ import annotations

from pathlib import Path

from .server import add_model

ADDSUB_CONFIG = """
backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""

ADDSUB_PY = """
import json
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.delay = float(json.loads(args["model_config"]).get("parameters", {}).get("delay", {}).get("string_value", "0"))

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            params = json.loads(r.parameters())
            if "fifo" in params:  # tell a waiting test that this request is inside execute
                with open(params["fifo"], "w") as f:
                    f.write("started\\n")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)],
                                                  parameters={"seen": json.dumps(params, sort_keys=True)}))
        if self.delay:
            time.sleep(self.delay)  # a busy instance (native thread)
        return out
"""

# a decoupled model: IN = n -> n responses OUT = 0..n-1, then a flags-only final
SQUARE_CONFIG = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""

SQUARE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CALLER_CONFIG = """
backend: "python"
input [ { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: %d } ]
"""

CALLER_HEAD = """
import json
import numpy as np
from gevent import monkey
import triton_python_backend_utils as pb_utils

native_ident = monkey.get_original("_thread", "get_ident")
A = np.array([1, 2, 3, 4], np.float32)
B = np.array([4, 3, 2, 1], np.float32)


def addsub_request(model="addsub", names=None, **kw):
    return pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor("INPUT0", A), pb_utils.Tensor("INPUT1", B)],
                                     requested_output_names=names or ["OUTPUT0", "OUTPUT1"], **kw)


def describe(response):
    if response.has_error():
        return {"error": response.error().message(), "code": response.error().code()}
    return {"outputs": {t.name(): t.as_numpy().tolist() for t in response.output_tensors()},
            "parameters": json.loads(response.parameters())}


def answer(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(value).encode()], dtype=object))])


def mode_of(request):
    return pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
"""

CALLER_PY = CALLER_HEAD + """

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        return [answer(self.run(mode_of(r))) for r in requests]

    def run(self, mode):
        if mode == "plain":
            return {"tid": native_ident()}
        if mode == "sync":
            return describe(addsub_request(parameters={"k": "v", "n": 3}).exec()) | {"tid": native_ident()}
        if mode == "outputs":
            return describe(addsub_request(model=b"addsub", names=["OUTPUT1"]).exec())  # a name as bytes, as Triton accepts
        if mode == "version":
            return [describe(addsub_request(model_version=v).exec()) for v in (1, 7)]
        if mode == "unknown":
            return describe(addsub_request(model="nope").exec())
        if mode == "wrong_inputs":
            request = pb_utils.InferenceRequest(model_name="addsub", inputs=[pb_utils.Tensor("INPUT0", A)],
                                                requested_output_names=["OUTPUT0"])
            return describe(request.exec())
        if mode == "slow":
            return describe(addsub_request(model="slow").exec())
        if mode == "timeout":
            request = pb_utils.InferenceRequest(model_name="slow_queue", inputs=[pb_utils.Tensor("INPUT0", A[None]),
                                                pb_utils.Tensor("INPUT1", B[None])], timeout=1000)
            return describe(request.exec())
        if mode == "decoupled":
            request = pb_utils.InferenceRequest(model_name="square", inputs=[pb_utils.Tensor("IN", np.array([3], np.int32))],
                                                requested_output_names=["OUT"])
            return [describe(r) for r in request.exec(decoupled=True)]
        if mode == "cancel":  # read one response of five, cancel, and go on
            request = pb_utils.InferenceRequest(model_name="square", inputs=[pb_utils.Tensor("IN", np.array([5], np.int32))],
                                                requested_output_names=["OUT"])
            responses = request.exec(decoupled=True)
            first = describe(next(responses))
            responses.cancel()
            return {"first": first, "rest": [describe(r) for r in responses], "after": describe(addsub_request().exec())}
        if mode == "self":
            request = pb_utils.InferenceRequest(
                model_name=self.name, inputs=[pb_utils.Tensor("MODE", np.array([b"sync"], dtype=object))],
                requested_output_names=["OUT"])
            response = request.exec()
            if response.has_error():
                return describe(response)
            return {"inner": json.loads(response.output_tensors()[0].as_numpy()[0])}
        if mode.startswith("drain:"):  # a first call that signals the test, then a second one
            first = addsub_request(model="slow", parameters={"fifo": mode[len("drain:"):]}).exec()
            return [describe(first), describe(addsub_request().exec())]
        if mode.startswith("to:"):  # to:<model>:<mode for it>
            _, model, inner = mode.split(":", 2)
            request = pb_utils.InferenceRequest(
                model_name=model, inputs=[pb_utils.Tensor("MODE", np.array([inner.encode()], dtype=object))],
                requested_output_names=["OUT"])
            response = request.exec()
            if response.has_error():
                return describe(response)
            return {"inner": json.loads(response.output_tensors()[0].as_numpy()[0])}
        if mode == "fail_after_call":  # one call, then the model fails: the call must not be made twice
            addsub_request(model="counted").exec()
            raise RuntimeError("failed after a call")
        if mode == "ready":
            return {"addsub": pb_utils.is_model_ready("addsub"), "nope": pb_utils.is_model_ready("nope")}
        raise pb_utils.TritonModelException("unknown mode " + mode)
"""

ASYNC_CALLER_PY = CALLER_HEAD + """
import asyncio


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for r in requests:
            mode = mode_of(r)
            if mode == "gather":
                responses = await asyncio.gather(*[addsub_request(parameters={"i": i}).async_exec() for i in range(4)])
                out.append(answer([describe(x) for x in responses]))
            elif mode == "decoupled":
                request = pb_utils.InferenceRequest(model_name="square", inputs=[pb_utils.Tensor("IN", np.array([2], np.int32))],
                                                    requested_output_names=["OUT"])
                responses = await request.async_exec(decoupled=True)
                out.append(answer([describe(x) for x in responses]))
            else:
                out.append(answer(describe(await addsub_request(model="nope").async_exec())))
        return out
"""

SLOW_QUEUE_CONFIG = ADDSUB_CONFIG + """
max_batch_size: 4
dynamic_batching { default_queue_policy { timeout_action: REJECT allow_timeout_override: true default_timeout_microseconds: 10000000 } }
parameters { key: "delay" value: { string_value: "1.0" } }
"""

RESCHEDULE_CONFIG = """
backend: "python"
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""

# non-decoupled: each request is rescheduled until execute has seen it IN times; OUT = times seen
RESCHEDULE_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}

    def execute(self, requests):
        out = []
        for r in requests:
            key = r.request_id()
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] < int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0]):
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.seen.pop(key)], np.int32))]))
        return out
"""

# decoupled: one response per execution, rescheduled until IN responses were sent (Triton's pattern)
RESCHEDULE_DECOUPLED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for r in requests:
            key = r.request_id()
            if key not in self.left:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            self.left[key] -= 1
            sender = r.get_response_sender()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.left[key]], np.int32))])
            if self.left[key] > 0:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
            else:
                del self.left[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# decoupled: the BLS call is made from a thread the model started (a greenlet on the instance thread
# once threading is patched), after execute() returned
DECOUPLED_CALLER_PY = CALLER_HEAD + """
import threading


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            threading.Thread(target=self.work, args=(r.get_response_sender(),), daemon=True).start()
        return None

    def work(self, sender):
        response = addsub_request().exec()
        sender.send(answer(describe(response)))
        for r in addsub_request().exec(decoupled=True):  # a plain target through the streaming call
            sender.send(answer(describe(r)))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

CONTROLLER_PY = CALLER_HEAD + """
import base64


class TritonPythonModel:
    def execute(self, requests):
        return [answer(self.run(mode_of(r))) for r in requests]

    def run(self, mode):
        if mode == "load":
            pb_utils.load_model("addsub")
            return {"ready": pb_utils.is_model_ready("addsub"), "v1": pb_utils.is_model_ready("addsub", "1"),
                    "v2": pb_utils.is_model_ready("addsub", "2")}
        if mode == "load_files":
            config = json.dumps({"backend": "python", "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                                                                {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}],
                                 "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                                            {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]}]})
            files = {"file:1/model.py": ADDSUB_SOURCE.replace("a + b", "a * b").encode()}  # OUTPUT0 = product
            pb_utils.load_model("addsub", config=config, files=files)
            return {"ready": pb_utils.is_model_ready("addsub"), "answer": describe(addsub_request().exec())}
        if mode == "unload":
            pb_utils.unload_model("addsub")
            return {"unloaded": True}
        if mode == "bad_load":
            try:
                pb_utils.load_model("nope")
            except pb_utils.TritonModelException as e:
                return {"error": str(e)}
            return {"error": None}
        raise pb_utils.TritonModelException("unknown mode " + mode)
"""


# an ensemble of one step: a caller model (or another ensemble) with the caller's MODE → OUT
CALLER_ENSEMBLE_CONFIG = """
platform: "ensemble"
input [ { name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "%s" model_version: -1
                               input_map { key: "MODE" value: "MODE" } output_map { key: "OUT" value: "OUT" } } ] }
"""


def add_caller_ensemble(repo: Path, name: str, step: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CALLER_ENSEMBLE_CONFIG % step)


def caller_repo(repo: Path) -> Path:
    """Every model the BLS tests use, in ``repo``."""
    add_model(repo, "addsub", ADDSUB_CONFIG, ADDSUB_PY)
    add_model(repo, "slow", ADDSUB_CONFIG + 'parameters { key: "delay" value: { string_value: "0.3" } }', ADDSUB_PY)
    add_model(repo, "slow_queue", SLOW_QUEUE_CONFIG, ADDSUB_PY)
    add_model(repo, "square", SQUARE_CONFIG, SQUARE_PY)
    add_model(repo, "counted", ADDSUB_CONFIG, ADDSUB_PY)  # called by one test only: its statistics are that test's
    add_model(repo, "caller", CALLER_CONFIG % 1, CALLER_PY)
    add_model(repo, "caller_pair", CALLER_CONFIG % 2, CALLER_PY)
    add_model(repo, "caller_many", CALLER_CONFIG % 4, CALLER_PY)
    add_model(repo, "caller_inline", CALLER_CONFIG % 1, CALLER_PY)
    add_model(repo, "caller_async", CALLER_CONFIG % 1, ASYNC_CALLER_PY)
    add_model(repo, "caller_b", CALLER_CONFIG % 1, CALLER_PY)
    add_model(repo, "caller_decoupled", CALLER_CONFIG % 1 + "model_transaction_policy { decoupled: true }",
              DECOUPLED_CALLER_PY)
    add_model(repo, "reschedule", RESCHEDULE_CONFIG, RESCHEDULE_PY)
    add_model(repo, "reschedule_decoupled", RESCHEDULE_CONFIG + "model_transaction_policy { decoupled: true }",
              RESCHEDULE_DECOUPLED_PY)
    add_caller_ensemble(repo, "ens_caller", "caller")  # caller -> ens_caller -> caller: a cycle
    add_caller_ensemble(repo, "ens_nested", "ens_caller")
    add_caller_ensemble(repo, "ens_pair", "caller_pair")
    add_caller_ensemble(repo, "ens_b", "caller_b")
    return repo


def controller_repo(repo: Path) -> Path:
    add_model(repo, "addsub", ADDSUB_CONFIG, ADDSUB_PY)
    add_model(repo, "controller", CALLER_CONFIG % 1, CONTROLLER_PY.replace(
        "import base64", "import base64\nADDSUB_SOURCE = " + repr(ADDSUB_PY)))
    return repo
